package rdma

import (
	"github.com/concord-ccl/concord/rings"
)

// A schedule is one node's share of a collective: per channel, the chunks it sends on each outgoing
// path and the chunks it receives on each incoming path, as byte ranges of the operation's working
// buffer. Schedules are pure functions of (rank, world, sizes, channel split), so every node derives
// the same numbering of chunks as its peers.

// recvMode says what a received chunk does to its range of the working buffer.
type recvMode uint8

const (
	recvCopy       recvMode = iota // overwrite the range
	recvReduce                     // fold the chunk into the range with the operation's op
	recvReduceLast                 // fold, then finalize (the owner's last reduction)
)

type sendFrame struct {
	off, n int
	dep    int // index of the frame of the schedule's incoming path that must be applied first, or -1
}

type recvFrame struct {
	off, n int
	mode   recvMode
}

type channelPlan struct {
	channel uint16
	out     *outPlan
	in      *inPlan
	// routed paths start on outNIC (outgoing) and inNIC (incoming) rather than on NIC channel.
	routed        bool
	outNIC, inNIC NICID
	// gate, when not zero, holds the plan's out path and the application of its received chunks until
	// gate gate opens; feeds, when not zero, counts the plan's in path towards opening gate feeds.
	gate, feeds int
}

type outPlan struct {
	to     NodeID
	frames []sendFrame
	// depOn, when set, names the channel whose incoming path the frames' dep indexes refer to,
	// instead of this plan's own incoming path.
	depOn *uint16
}

type inPlan struct {
	from   NodeID
	frames []recvFrame
	// waitOn, when set, names the channel of another incoming path of the same operation: frame i is
	// applied only after that path's frame waitFor[i] (when waitFor[i] ≥ 0; received frames wait, in
	// order). It fixes the order in which contributions to one range are reduced, whatever order
	// they arrive in.
	waitOn  *uint16
	waitFor []int
}

// splitChannels divides count elements among channels in proportion to weights (largest share to
// no-one in particular: cumulative rounding, so the spans are contiguous, in channel order, and sum to
// count).
func splitChannels(count int, weights []float64) []rings.Span {
	var total float64
	for _, w := range weights {
		total += w
	}
	spans := make([]rings.Span, len(weights))
	var acc float64
	prev := 0
	for i, w := range weights {
		acc += w
		end := count
		if i < len(weights)-1 && total > 0 {
			end = int(float64(count) * acc / total)
		} else if total <= 0 {
			end = count * (i + 1) / len(weights)
		}
		end = min(max(end, prev), count)
		spans[i] = rings.Span{Off: prev, Len: end - prev}
		prev = end
	}
	return spans
}

// parts splits n bytes into pieces of at most chunk bytes, each a whole number of elements of size esz.
func parts(off, n, chunk, esz int, f func(off, n int)) {
	per := max(chunk/esz, 1) * esz
	for p := 0; p < n; p += per {
		f(off+p, min(per, n-p))
	}
}

func mod(a, m int) int { return ((a % m) + m) % m }

// ringPlan builds one channel's ring schedule over world positions: at step s the node sends block
// sendBlock(s) and receives block recvBlock(s) in mode mode(s); block b of the channel is the byte range
// blockOff(b)+[0, blockLen(b)). Send step s > 0 depends on receive step s-1 of the same part: the block
// it forwards is the one just received.
func ringPlan(steps int, sendBlock, recvBlock func(s int) int, mode func(s int) recvMode,
	blockOff, blockLen func(b int) int, chunk, esz int) ([]sendFrame, []recvFrame) {
	return loopedRingPlan(steps, 1, sendBlock, recvBlock, mode, blockOff, blockLen, chunk, esz)
}

// loopedRingPlan is ringPlan with every block cut into loops contiguous slices (see loopParts), each
// slice a ring of its own, as NCCL's ring loops over slices of the buffer. The frames are ordered as a
// wavefront: slot t holds step s of slice t−s for every s, in step order, so that a step's input was
// sent by the predecessor one slot earlier and the first slices are final while the last ones are
// still being reduced. With one loop the order is plain step after step.
func loopedRingPlan(steps, loops int, sendBlock, recvBlock func(s int) int, mode func(s int) recvMode,
	blockOff, blockLen func(b int) int, chunk, esz int) ([]sendFrame, []recvFrame) {
	var out []sendFrame
	var in []recvFrame
	start := make(map[[2]int]int) // (step, slice) -> index of its first receive frame
	for t := range steps + loops - 1 {
		for s := max(0, t-loops+1); s <= min(t, steps-1); s++ {
			l := t - s
			start[[2]int{s, l}] = len(in)
			sb, rb := sendBlock(s), recvBlock(s)
			i := 0
			loopParts(blockOff(sb), blockLen(sb), loops, l, chunk, esz, func(off, n int) {
				dep := -1
				if s > 0 {
					dep = start[[2]int{s - 1, l}] + i
				}
				out = append(out, sendFrame{off: off, n: n, dep: dep})
				i++
			})
			loopParts(blockOff(rb), blockLen(rb), loops, l, chunk, esz, func(off, n int) {
				in = append(in, recvFrame{off: off, n: n, mode: mode(s)})
			})
		}
	}
	return out, in
}

// loopParts calls f, like parts, for the chunks of slice l of loops equal element-aligned slices of the
// byte range off+[0, n).
func loopParts(off, n, loops, l, chunk, esz int, f func(off, n int)) {
	elems := n / esz
	lo, hi := elems*l/loops, elems*(l+1)/loops
	parts(off+lo*esz, (hi-lo)*esz, chunk, esz, f)
}

// slicedParts calls f for the chunks of every slice of loops of the byte range off+[0, n), slice by
// slice: the order in which a looped ring (loopedRingPlan) reaches them.
func slicedParts(off, n, loops, chunk, esz int, f func(off, n int)) {
	for l := range loops {
		loopParts(off, n, loops, l, chunk, esz, f)
	}
}

// allReduceRing returns one channel's ring AllReduce schedule at position rank of world, over the
// blocks that blockOff and blockLen locate, each block cut into loops slices (loopedRingPlan):
// position r sends block r−s at reduce-scatter step s and ends owning block r+1, which it finalizes
// in the last reduce-scatter step; the all-gather forwards final blocks.
func allReduceRing(rank, world, loops int, blockOff, blockLen func(b int) int, chunk, esz int) ([]sendFrame, []recvFrame) {
	rs := world - 1
	return loopedRingPlan(2*world-2, loops,
		func(s int) int {
			if s < rs {
				return rank - s
			}
			return rank + 1 - (s - rs)
		},
		func(s int) int {
			if s < rs {
				return rank - s - 1
			}
			return rank - (s - rs)
		},
		func(s int) recvMode {
			switch {
			case s < rs-1:
				return recvReduce
			case s == rs-1:
				return recvReduceLast
			}
			return recvCopy
		}, blockOff, blockLen, chunk, esz)
}

// planAllReduce: the ring AllReduce (allReduceRing) on each channel's span of the buffer.
func planAllReduce(rank, world int, spans []rings.Span, esz, chunk int, succ, pred NodeID) []channelPlan {
	plans := make([]channelPlan, 0, len(spans))
	for c, sp := range spans {
		blocks := rings.Partition(sp.Len, world)
		boff := func(b int) int { return (sp.Off + blocks[mod(b, world)].Off) * esz }
		blen := func(b int) int { return blocks[mod(b, world)].Len * esz }
		out, in := allReduceRing(rank, world, 1, boff, blen, chunk, esz)
		plans = append(plans, channelPlan{channel: uint16(c), out: &outPlan{to: succ, frames: out},
			in: &inPlan{from: pred, frames: in}})
	}
	return plans
}

// planReduceScatter: the reduce-scatter half, shifted by one block so that position r ends owning
// block r. Block b is the b-th count-element block of the input; each channel handles its span of
// every block.
func planReduceScatter(rank, world int, spans []rings.Span, count, esz, chunk int, succ, pred NodeID) []channelPlan {
	plans := make([]channelPlan, 0, len(spans))
	for c, sp := range spans {
		boff := func(b int) int { return (mod(b, world)*count + sp.Off) * esz }
		blen := func(int) int { return sp.Len * esz }
		out, in := ringPlan(world-1,
			func(s int) int { return rank - s - 1 },
			func(s int) int { return rank - s - 2 },
			func(s int) recvMode {
				if s == world-2 {
					return recvReduceLast
				}
				return recvReduce
			}, boff, blen, chunk, esz)
		plans = append(plans, channelPlan{channel: uint16(c), out: &outPlan{to: succ, frames: out},
			in: &inPlan{from: pred, frames: in}})
	}
	return plans
}

// planAllGather: position r starts with block r and forwards what it receives.
func planAllGather(rank, world int, spans []rings.Span, count, esz, chunk int, succ, pred NodeID) []channelPlan {
	plans := make([]channelPlan, 0, len(spans))
	for c, sp := range spans {
		boff := func(b int) int { return (mod(b, world)*count + sp.Off) * esz }
		blen := func(int) int { return sp.Len * esz }
		out, in := ringPlan(world-1,
			func(s int) int { return rank - s },
			func(s int) int { return rank - s - 1 },
			func(int) recvMode { return recvCopy }, boff, blen, chunk, esz)
		plans = append(plans, channelPlan{channel: uint16(c), out: &outPlan{to: succ, frames: out},
			in: &inPlan{from: pred, frames: in}})
	}
	return plans
}

// planBroadcast: a pipelined chain from the root along the ring; position q (root = 0) receives every
// part from its predecessor and forwards it, the last position only receives.
func planBroadcast(q, world int, spans []rings.Span, esz, chunk int, succ, pred NodeID) []channelPlan {
	plans := make([]channelPlan, 0, len(spans))
	for c, sp := range spans {
		cp := channelPlan{channel: uint16(c)}
		var out []sendFrame
		var in []recvFrame
		i := 0
		parts(sp.Off*esz, sp.Len*esz, chunk, esz, func(off, n int) {
			dep := -1
			if q > 0 {
				dep = i
				in = append(in, recvFrame{off: off, n: n, mode: recvCopy})
			}
			out = append(out, sendFrame{off: off, n: n, dep: dep})
			i++
		})
		if q < world-1 {
			cp.out = &outPlan{to: succ, frames: out}
		}
		if q > 0 {
			cp.in = &inPlan{from: pred, frames: in}
		}
		plans = append(plans, cp)
	}
	return plans
}

// planPointToPoint: the sender's buffer goes to the receiver, every channel carrying its span.
func planPointToPoint(sender bool, peer NodeID, spans []rings.Span, esz, chunk int) []channelPlan {
	plans := make([]channelPlan, 0, len(spans))
	for c, sp := range spans {
		cp := channelPlan{channel: uint16(c)}
		var out []sendFrame
		var in []recvFrame
		parts(sp.Off*esz, sp.Len*esz, chunk, esz, func(off, n int) {
			out = append(out, sendFrame{off: off, n: n, dep: -1})
			in = append(in, recvFrame{off: off, n: n, mode: recvCopy})
		})
		if sender {
			cp.out = &outPlan{to: peer, frames: out}
		} else {
			cp.in = &inPlan{from: peer, frames: in}
		}
		plans = append(plans, cp)
	}
	return plans
}
