// Package rings implements ring collectives over an ordered set of links: the element-wise reduce
// kernels for every supported data type and operation, chunk partitioning, pipelined and abortable ring
// ReduceScatter, AllGather and AllReduce (the first followed by the second), and a [Plan] that runs
// such phases in order on one staging buffer under one commit, which is how a hierarchical AllReduce
// (reduce-scatter in a site, all-reduce of each shard across sites, all-gather in the site) is built.
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
// of step s has been received, so the ring streams instead of stepping in lock-step. [ReduceScatter]
// takes the first W-1 steps alone and [AllGather] the last W-1 (starting from the chunk the rank
// owns, [OwnedChunk]), with the same frame names, so the two in a row send exactly the frames of
// AllReduce and compute the same bytes. [Options].Divisor says whether and by what the owner divides
// (Avg): a hierarchy divides once, by the total peer count.
//
// A Stream that is a [Retainer] may keep a payload until the receiver acknowledges the frame; the
// all-gather of an AllReduce then waits for the acknowledgement of the reduce-scatter frame that sent
// a region before it overwrites that region, and every phase waits for all its frames before it
// returns.
//
// With [Options].Quant set, the all-gather carries each part of a final chunk encoded once by the
// chunk's owner ([Quantize]); the owner adopts the decoded value itself and every other peer forwards
// the encoded bytes verbatim, so results stay bit-identical.
//
// # Failure
//
// The caller's buffers are written only after the local schedule (every phase of the plan) has
// completed and the caller's commit function has agreed. Any error, abort or cancellation before that
// leaves them exactly as they were. The sentinel errors are shared with package pccl.
package rings
