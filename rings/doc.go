// Package rings implements ring collectives over an ordered set of links: the element-wise reduce
// kernels for every supported data type and operation, chunk partitioning, and a pipelined, abortable
// ring AllReduce (reduce-scatter followed by all-gather).
//
// # Buffers
//
// Every buffer is a []byte holding elements in the machine's little-endian layout (amd64, arm64).
// [Bytes] and [View] convert between typed slices and byte slices without copying.
//
// # Determinism
//
// Results are bit-identical on every peer: the final value of each chunk is computed by exactly one
// peer (its owner) in a fixed ring order, including the divide for [Avg], and every other peer copies
// those bytes. The kernels never fuse a product into an addition, so results do not depend on whether
// the compiler emits FMA instructions.
//
// # Message flow of AllReduce
//
// With W peers, the element range is split into W chunks ([Partition]) and every chunk into parts of at
// most [Options].PartBytes bytes. Rank r talks to rank r+1 (mod W) through Stream.Send and listens to
// rank r-1 through Stream.Recv:
//
//	reduce-scatter, step s = 0..W-2:  send chunk (r-s) mod W, receive chunk (r-s-1) mod W and fold the
//	                                  local contribution into it.
//	                                  Rank r then owns chunk (r+1) mod W and finalizes it.
//	all-gather, step W-1+k, k=0..W-2: send chunk (r+1-k) mod W (first the owned one), receive chunk
//	                                  (r-k) mod W.
//
// Every frame is named by a [ChunkID] (step, part). A part of step s+1 is sent as soon as the same part
// of step s has been received, so the ring streams instead of stepping in lock-step.
//
// With [Options].Quant set, the all-gather carries each part of a final chunk encoded once by the
// chunk's owner ([Quantize]); the owner adopts the decoded value itself and every other peer forwards
// the encoded bytes verbatim, so results stay bit-identical.
//
// # Failure
//
// The caller's buffers are written only after the local schedule has completed and the caller's commit
// function has agreed. Any error, abort or cancellation before that leaves them exactly as they were.
package rings
