package plan

import (
	"math"
	"slices"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// The weighted ring: a standard ring whose reduce-scatter blocks are not equal.
//
// In a ring AllReduce over n nodes where the node at position p finalizes (owns) the fraction O_p of
// the message, the node at p sends every block but its own in the reduce-scatter and every block but
// its successor's in the all-gather, and receives every block but its predecessor's and its own:
//
//	send_p = 2 − O_p − O_{p+1},    recv_p = 2 − O_{p−1} − O_p    (fractions of the message D)
//
// With equal blocks this is the familiar 2(n−1)/n. Unequal blocks move traffic off a degraded node and
// its links onto faster ones, at no cost in total bytes: a slower node owns more, so that it and its
// neighbours forward less. A schedule may run two such rings at once, the second in the opposite
// direction on its own share of the message; each node's load is then the sum over both. The
// fractions come from a linear program: minimize T subject to, for every node v, send_v ≤ T·R_v and
// recv_v ≤ T·R_v, and for every directed link of a ring its bytes ≤ T·(the link's bandwidth), the
// fractions non-negative and summing to 1. Its optimum is the schedule's time over D.
//
// On 4 nodes with one NIC of 4 down (X = 0.25) the single weighted ring takes 3/7 D/B per NIC against
// Balance's 1/2 and the bound (Ideal) 2/5; with two neighbouring nodes each missing a NIC, two rings
// in opposite directions reach the bound, 3/7, where Balance and a single weighted ring both need 1/2.
// The model pools each node's NICs, as costBalance does; the runtime prices the plan on its rails.
//
// A node with g ranks scales the node-level volume 2(n−1)/n to the flat ring's 2(ng−1)/(ng), so that
// with equal blocks the estimate is Balance's.

// weightedMaxNodes bounds the rings the weighted schedule is costed for: its linear program grows
// with the square of the node count, and a planner that costs every call must stay cheap.
const weightedMaxNodes = 16

// evenBlocks weighs the smallest block against T in the weighted rings' program: small enough that T
// stays optimal to a few parts in 10⁴.
const evenBlocks = 1e-3

// costWeighted returns the cheaper of the single weighted ring over o and the pair of weighted rings
// over o and its reverse.
func costWeighted(t Topology, o []int, bytes float64) Estimate {
	best := Estimate{Seconds: math.Inf(1)}
	n := len(o)
	if n < 2 || n > weightedMaxNodes {
		return best
	}
	ranks := n * t.ranks()
	scale := volume(ranks) / volume(n)
	lat := t.RingLatency(o)
	cands := [][][]int{{o}}
	if n > 2 {
		cands = append(cands, [][]int{o, reversed(o)})
	}
	for _, rs := range cands {
		owners, per, ok := weightedOwners(t, rs)
		if !ok {
			continue
		}
		beta := max(scale*per*bytes, cpuLinkTime(t, volume(ranks)*bytes))
		if s := lat + beta; s < best.Seconds*(1-1e-9) {
			best = Estimate{Seconds: s}
			for k := range rs {
				share := 0.0
				for _, f := range owners[k] {
					share += f
				}
				if share > 1e-6 { // a ring the program left (almost) empty does not run
					best.Rings = append(best.Rings, rs[k])
					best.Shares = append(best.Shares, share)
					best.Owners = append(best.Owners, owners[k])
				}
			}
		}
	}
	return best
}

func reversed(o []int) []int {
	r := slices.Clone(o)
	slices.Reverse(r)
	// Keep the first node first, so that the reverse ring starts where the forward one does.
	return append(r[len(r)-1:], r[:len(r)-1]...)
}

// weightedOwners solves the weighted rings' linear program for rings rs over the same nodes. It
// returns, per ring and ring position, the fraction of the message owned there (summing to 1 over
// all), and the optimal seconds per byte of message. ok is false when no finite solution exists.
func weightedOwners(t Topology, rs [][]int) (owners [][]float64, secPerByte float64, ok bool) {
	n := len(rs[0])
	nv := len(rs)*n + 2 // O^k_p for every ring k and position p, then T, then m
	tIdx, mIdx := nv-2, nv-1
	rmax := 0.0
	for _, v := range rs[0] {
		rmax = max(rmax, t.NodeBandwidth(v))
	}
	if rmax <= 0 {
		return nil, 0, false
	}
	pos := make([]map[int]int, len(rs)) // node -> position, per ring
	for k, r := range rs {
		pos[k] = map[int]int{}
		for p, v := range r {
			pos[k][v] = p
		}
	}
	var g [][]float64
	var h []float64
	row := func() []float64 { return make([]float64, nv) }
	// load adds, to row, ring k's bytes (fractions) of the link leaving position p: 2·P_k − O_p − O_{p+1}.
	load := func(r []float64, k, p int) {
		for q := range n {
			r[k*n+q] += 2
		}
		r[k*n+p]--
		r[k*n+(p+1)%n]--
	}
	for _, v := range rs[0] {
		rate := t.NodeBandwidth(v) / rmax
		send, recv := row(), row()
		for k := range rs {
			p := pos[k][v]
			load(send, k, p)
			load(recv, k, (p+n-1)%n)
		}
		send[tIdx], recv[tIdx] = -rate, -rate
		g, h = append(g, send, recv), append(h, 0, 0)
	}
	// Every directed link carries at most T times its bandwidth, summed over the rings that use it.
	links := map[[2]int][]float64{}
	var order [][2]int
	for k, r := range rs {
		for p, u := range r {
			e := [2]int{u, r[(p+1)%n]}
			if links[e] == nil {
				links[e] = row()
				order = append(order, e)
			}
			load(links[e], k, p)
		}
	}
	for _, e := range order {
		r := links[e]
		r[tIdx] = -t.EdgeBandwidth(e[0], e[1]) / rmax
		g, h = append(g, r), append(h, 0)
	}
	// m is at most every block: the objective's small reward for m evens the blocks out among the
	// optimal solutions (the program's vertices leave many blocks empty), which shortens the pipeline
	// bubbles of a ring whose steps carry blocks of different sizes.
	for i := range tIdx {
		r := row()
		r[mIdx], r[i] = 1, -1
		g, h = append(g, r), append(h, 0)
	}
	// Standard form: every variable is non-negative; a slack per inequality; Σ O = 1.
	rows, cols := len(g)+1, nv+len(g)
	am := mat.NewDense(rows, cols, nil)
	b := make([]float64, rows)
	for i, r := range g {
		for j, v := range r {
			if v != 0 {
				am.Set(i, j, v)
			}
		}
		am.Set(i, nv+i, 1)
		b[i] = h[i]
	}
	for j := range tIdx {
		am.Set(len(g), j, 1)
	}
	b[len(g)] = 1
	c := make([]float64, cols)
	c[tIdx], c[mIdx] = 1, -evenBlocks
	_, x, err := lp.Simplex(c, am, b, 1e-10, nil)
	if err != nil {
		return nil, 0, false
	}
	tv := x[tIdx]
	if !(tv > 0) || math.IsInf(tv, 0) {
		return nil, 0, false
	}
	owners = make([][]float64, len(rs))
	for k := range rs {
		owners[k] = make([]float64, n)
		for p := range n {
			owners[k][p] = max(0, x[k*n+p])
		}
	}
	return owners, tv / rmax, true
}
