package rdma

import (
	"testing"

	"github.com/concord-ccl/concord/rings"
)

// TestLoopedRingPlanRuns plays the ring schedule of every position at once, for several ring sizes and
// loop counts, with frames moving only when their dependencies allow (a send after the receive it
// forwards, receives applied in order): every frame must get through, and every receive must match,
// range for range, the frame its predecessor sent.
func TestLoopedRingPlanRuns(t *testing.T) {
	const esz, chunk = 4, 64
	for _, world := range []int{2, 3, 4, 7} {
		for _, loops := range []int{1, 2, 3, 8} {
			count := 1000 + world // blocks of unequal length
			outs := make([][]sendFrame, world)
			ins := make([][]recvFrame, world)
			for rank := range world {
				p := planAllReduceLooped(rank, world, count, esz, chunk, loops)
				outs[rank], ins[rank] = p.out.frames, p.in.frames
			}
			sent := make([]int, world)    // frames sent, by sender
			applied := make([]int, world) // frames applied, by receiver
			for progress := true; progress; {
				progress = false
				for r := range world {
					for sent[r] < len(outs[r]) {
						f := outs[r][sent[r]]
						if f.dep >= applied[r] {
							break // waits for the receive it forwards
						}
						if f.dep >= 0 {
							if g := ins[r][f.dep]; g.off != f.off || g.n != f.n {
								t.Fatalf("world %d loops %d rank %d: frame %d forwards [%d,+%d) but depends on [%d,+%d)", world, loops, r, sent[r], f.off, f.n, g.off, g.n)
							}
						}
						sent[r]++
						progress = true
					}
				}
				for r := range world {
					pred := (r + world - 1) % world
					for applied[r] < sent[pred] {
						g, f := ins[r][applied[r]], outs[pred][applied[r]]
						if g.off != f.off || g.n != f.n {
							t.Fatalf("world %d loops %d rank %d: receive %d is [%d,+%d), predecessor sent [%d,+%d)", world, loops, r, applied[r], g.off, g.n, f.off, f.n)
						}
						applied[r]++
						progress = true
					}
				}
			}
			for r := range world {
				if sent[r] != len(outs[r]) || applied[r] != len(ins[r]) {
					t.Fatalf("world %d loops %d: rank %d stuck after %d of %d sends and %d of %d receives", world, loops, r, sent[r], len(outs[r]), applied[r], len(ins[r]))
				}
			}
			// Rank 0's reduce-scatter receives every block but its own contribution's (block 0) once,
			// and its all-gather every block but the one it owns and finalizes (block 1) once.
			blocks := rings.Partition(count, world)
			rs, ag := make([]int, count), make([]int, count)
			for _, f := range ins[0] {
				for e := f.off / esz; e < (f.off+f.n)/esz; e++ {
					if f.mode == recvCopy {
						ag[e]++
					} else {
						rs[e]++
					}
				}
			}
			for b, bl := range blocks {
				wantRS, wantAG := 1, 1
				if b == 0 {
					wantRS = 0
				}
				if b == 1 {
					wantAG = 0
				}
				for e := bl.Off; e < bl.Off+bl.Len; e++ {
					if rs[e] != wantRS || ag[e] != wantAG {
						t.Fatalf("world %d loops %d: element %d of block %d received %d times in the reduce-scatter, %d in the all-gather; want %d and %d", world, loops, e, b, rs[e], ag[e], wantRS, wantAG)
					}
				}
			}
		}
	}
}

// planAllReduceLooped is planAllReduce for one channel of count elements, with loops slices.
func planAllReduceLooped(rank, world, count, esz, chunk, loops int) channelPlan {
	blocks := rings.Partition(count, world)
	boff := func(b int) int { return blocks[mod(b, world)].Off * esz }
	blen := func(b int) int { return blocks[mod(b, world)].Len * esz }
	out, in := allReduceRing(rank, world, loops, boff, blen, chunk, esz)
	return channelPlan{out: &outPlan{frames: out}, in: &inPlan{frames: in}}
}
