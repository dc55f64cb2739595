package rdma

// Leaves (OptCC's schedule). A leaf is outside its part's ring: it sends its input for each block of
// every ring channel piece to the block's owner (the ring node that finishes it) and receives the
// finished block back, instead of forwarding in the ring. The owner adds the leaves' inputs, in the
// part's leaf order, to its own before the ring's last reduce-scatter step adds the others' partial
// sum, whatever order they arrive in: chunk by chunk, the last step's frames wait for the leaves'
// frames of the same range. Each result chunk goes back to a leaf as soon as it is final, so a leaf's
// input and its result stream at once in opposite directions.
//
// The leaves' inputs pace the ring's last reduce-scatter step. Were the ring to take its steps one
// after the other, its all-gather would start only once the last leaf input had arrived, and the
// all-gather of the whole part would be a tail that nothing overlaps. So the ring of a part with
// leaves loops over leafLoops slices of its blocks in a wavefront (loopedRingPlan): the first slices
// are gathered, and their results are back at the leaves, while the leaves' inputs for the last ones
// are still coming in.

// leafLoops is the number of slices the ring of a part with leaves loops over.
const leafLoops = 8

// lastFrames returns the indexes of the frames of a ring's incoming path that the owner's last
// reduction applies, in order: the frames the leaves' inputs are matched to, one for one.
func lastFrames(in []recvFrame) []int {
	var idx []int
	for i, f := range in {
		if f.mode == recvReduceLast {
			idx = append(idx, i)
		}
	}
	return idx
}

// leafPlans returns a leaf's paths of one ring channel piece: its input out to the owner of every
// block, and the result in from it, slice by slice of the ring's loops.
func (x *planExecutor) leafPlans(pc piece, c int, ring []int, loops int, in, out []uint16, boff, blen func(int) int) []channelPlan {
	var plans []channelPlan
	for p, owner := range ring {
		var sends []sendFrame
		var recvs []recvFrame
		slicedParts(boff(p+1), blen(p+1), loops, x.n.cfg.ChunkBytes, x.esz, func(off, n int) {
			sends = append(sends, sendFrame{off: off, n: n, dep: -1})
			recvs = append(recvs, recvFrame{off: off, n: n, mode: recvCopy})
		})
		nic := x.pathNIC(pc, c, x.me, owner)
		plans = append(plans,
			channelPlan{channel: in[p], routed: true, outNIC: nic, inNIC: nic, out: &outPlan{to: x.n.ring[owner], frames: sends}},
			channelPlan{channel: out[p], routed: true, outNIC: nic, inNIC: nic, in: &inPlan{from: x.n.ring[owner], frames: recvs}})
	}
	return plans
}

// ownerPlans returns a ring node's paths to and from the leaves for the block it owns in one ring
// channel piece (position rank owns block rank+1), and makes the ring's last reduce-scatter frames
// of cp wait for the last leaf's.
func (x *planExecutor) ownerPlans(cp *channelPlan, pc piece, c int, leaves []int, rank, loops int, in, out [][]uint16, boff, blen func(int) int) []channelPlan {
	last := lastFrames(cp.in.frames)
	if len(last) == 0 || blen(rank+1) == 0 {
		return nil // an empty block: nothing to add or send back
	}
	ringCh := cp.channel
	var plans []channelPlan
	for l, leaf := range leaves {
		var recvs []recvFrame
		var sends []sendFrame
		slicedParts(boff(rank+1), blen(rank+1), loops, x.n.cfg.ChunkBytes, x.esz, func(off, n int) {
			recvs = append(recvs, recvFrame{off: off, n: n, mode: recvReduce})
			sends = append(sends, sendFrame{off: off, n: n, dep: last[len(sends)]})
		})
		ip := &inPlan{from: x.n.ring[leaf], frames: recvs}
		if l > 0 {
			prev := in[l-1][rank]
			ip.waitOn = &prev
			ip.waitFor = make([]int, len(recvs))
			for i := range ip.waitFor {
				ip.waitFor[i] = i
			}
		}
		nic := x.pathNIC(pc, c, leaf, x.me)
		plans = append(plans,
			channelPlan{channel: in[l][rank], routed: true, outNIC: nic, inNIC: nic, in: ip},
			channelPlan{channel: out[l][rank], routed: true, outNIC: nic, inNIC: nic, out: &outPlan{to: x.n.ring[leaf], frames: sends, depOn: &ringCh}})
	}
	w := in[len(leaves)-1][rank]
	cp.in.waitOn = &w
	cp.in.waitFor = make([]int, len(cp.in.frames))
	for i := range cp.in.waitFor {
		cp.in.waitFor[i] = -1
	}
	for j, i := range last {
		cp.in.waitFor[i] = j
	}
	return plans
}
