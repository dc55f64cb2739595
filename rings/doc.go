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
// the encoded bytes verbatim, so results stay bit-identical. With a both-phase encoding
// ([MinMaxU8Both], [MinMaxU16Both]) every reduce-scatter frame is encoded too: the sender of step 0
// encodes its own contribution, and the receiver of every later hop decodes the partial reduction,
// folds in its own contribution in the computing type (float32 for F16, BF16 and F32, float64 for F64)
// and encodes the result for the next hop; the owner of a chunk finalizes in the computing type,
// rounds to the element type, and then encodes for the all-gather as above. Partial reductions need
// not agree anywhere: only the owner's final value reaches every peer, encoded once, so results stay
// bit-identical. [SentTraffic] counts the bytes each rank sends.
//
// # Quantization error
//
// Take one element of an AllReduce over W peers with contributions x_1..x_W (exact values of the
// element type) and a MinMax encoding with top code L (255 or 65535). Let (lo_i, s_i), i = 1..H, be
// the headers (minimum, step) of the parts the element travelled in, in order: with a both-phase
// encoding H = W (the W-1 reduce-scatter hops, then the all-gather), with an all-gather-only one H = 1.
// Let R_i = |lo_i| + L*s_i, X = |x_1| + ... + |x_W|, u the unit roundoff of the computing type (2^-24
// for F16, BF16 and F32, 2^-53 for F64) and σ its smallest positive subnormal, and u_o, σ_o those of
// the element type for F16 (2^-11, 2^-24) and BF16 (2^-8, 2^-133), both 0 for F32 and F64. Then every
// peer's result satisfies, for Sum (exact = x_1 + ... + x_W), Min and Max (exact = the smallest or
// largest x_r):
//
//	|result - exact| <= s_1/2 + ... + s_H/2 + E
//
// and for Avg (exact = (x_1 + ... + x_W)/W), whose reduce-scatter errors are divided with the sum:
//
//	|result - exact| <= (s_1/2 + ... + s_(H-1)/2)/W + s_H/2 + E
//
// where E = (6u + 3u_o)*(R_1 + ... + R_H + W*X) + 2W*(L+2)*(σ + σ_o) bounds the floating-point
// rounding of the encodings, decodings, additions and narrowings (it is about 1e-6 of the magnitudes
// for F32 and dominated by u_o for F16 and BF16). Each encoding contributes at most half its step
// because codes are rounded to nearest, not truncated; a reduce-scatter hop's step is that of the
// partial reduction, whose range grows along the ring, so the both-phase encodings add W-1 such terms
// to the all-gather-only error in exchange for a quarter (u8) or half (u16) of the F32 bytes in every
// frame.
// Prod is not supported by the both-phase encodings, as a product multiplies a quantization error by
// every later factor.
//
// Values to be encoded must be finite: a NaN or an infinity in a contribution or a partial or final
// reduction that is encoded fails the operation with ErrNonFinite (the caller's buffers untouched).
// Decoding computes lo + code*s with the product rounded before the addition, and every kernel writes
// its roundings as explicit conversions, so no compiler can fuse them into a multiply-add and every
// machine decodes the same bytes to the same bits.
//
// # Failure
//
// The caller's buffers are written only after the local schedule (every phase of the plan) has
// completed and the caller's commit function has agreed. Any error, abort or cancellation before that
// leaves them exactly as they were. The sentinel errors are shared with package pccl.
package rings
