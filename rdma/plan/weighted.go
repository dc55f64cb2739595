package plan

import (
	"math"
	"slices"
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
// A ring ties each node's load to its neighbours' blocks, so it cannot load every node in proportion
// to its bandwidth. A mesh can: if every node sends its input for each other node's share straight to
// that owner and gets the result straight back, node u sends (and receives) 1 + (n−2)·O_u, which the
// same kind of program sizes to the bound on both cases above (at X = 0.25 the degraded node owns
// 1/10, the others 3/10 each). There is no such schedule here because it did not run faster: built
// on the Node's paths (a path per pair and rail, each owner folding its inputs in a fixed order), it
// came close to the bound on the simulator but ran slower than the weighted rings on bench/schedules
// (docs/results/schedules.md): a NIC carrying several pairs' flows shares itself evenly among them,
// and an owner whose slowest input trickles in leaves its results, and its NICs, waiting.
//
// A node with g ranks scales the node-level volume 2(n−1)/n to the flat ring's 2(ng−1)/(ng), so that
// with equal blocks the estimate is Balance's.

// weightedMaxNodes bounds the rings the weighted schedule is costed for: its linear program grows
// with the square of the node count, and a planner that costs every call must stay cheap.
const weightedMaxNodes = 16

// evenBlocks weighs the smallest block against T in the weighted rings' program: small enough that T
// stays optimal to a few parts in 10⁴.
const evenBlocks = 1e-3

// secondRingMargin is how much cheaper in the model a pair of rings must be than the single ring to
// be chosen. The pair's blocks are more uneven and its pieces more numerous, and a NIC that both
// rings use carries two connections, which share it about evenly whatever the program's split. On
// bench/schedules a modelled gain of 4.5% (one NIC down: 9/22 against 3/7) did not show and one of 10%
// (two neighbouring nodes on different rails: 9/20 against 1/2) did; docs/results/schedules.md has
// the figures, and those of capping each connection at its planned share, which did not help.
const secondRingMargin = 0.06

// costWeighted returns the cheapest of the single weighted ring over o, the pair of weighted rings
// over o and its reverse, and, on a degraded topology, each pair of o and o with two neighbours
// swapped, one of them degraded (swapped). With rails, the second ring of such a pair leads the
// degraded node's traffic to and from other neighbours over other rails: on 4 nodes with one NIC
// down it takes 9/22 D/B against the single ring's 3/7, and for two neighbouring nodes each missing
// a NIC on different rails 9/20 against 1/2 (the reverse ring cannot help there once the program
// knows the rails).
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
	if n > 3 && onRails(t, n) {
		for _, s := range swapped(t, o) {
			cands = append(cands, [][]int{o, s})
		}
	}
	single := math.Inf(1) // the single ring's seconds
	for _, rs := range cands {
		owners, rails, per, ok := weightedOwners(t, rs)
		if !ok {
			continue
		}
		beta := max(scale*per*bytes, cpuLinkTime(t, volume(ranks)*bytes))
		s := lat + beta
		if len(rs) == 1 {
			single = s
		} else if s >= single*(1-secondRingMargin) {
			continue
		}
		if s < best.Seconds*(1-1e-9) {
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
					if rails != nil {
						best.LinkRails = append(best.LinkRails, rails[k])
					}
				}
			}
		}
	}
	return best
}

// railShares returns fs as fractions of their sum, without the empty ones, in rail order; nil when
// they sum to nothing (a link the program left empty).
func railShares(fs []RailShare) []RailShare {
	total := 0.0
	for _, f := range fs {
		total += f.Share
	}
	if total <= 0 {
		return nil
	}
	var out []RailShare
	for _, f := range fs {
		if f.Share/total > 1e-9 {
			out = append(out, RailShare{f.Rail, f.Share / total})
		}
	}
	return out
}

// swapped returns o with the nodes at positions i and i+1 swapped, for every i where one of the two
// has a NIC down.
func swapped(t Topology, o []int) [][]int {
	degraded := func(v int) bool { return slices.ContainsFunc(t.Nodes[v].NICs, func(n NIC) bool { return n.Down }) }
	var out [][]int
	for i := range len(o) - 1 {
		if degraded(o[i]) || degraded(o[i+1]) {
			s := slices.Clone(o)
			s[i], s[i+1] = s[i+1], s[i]
			out = append(out, s)
		}
	}
	return out
}

func reversed(o []int) []int {
	r := slices.Clone(o)
	slices.Reverse(r)
	// Keep the first node first, so that the reverse ring starts where the forward one does.
	return append(r[len(r)-1:], r[:len(r)-1]...)
}

// railProgramMax bounds nodes × rails for the program with rail flows: its size grows with their
// product and its solver's time faster (BenchmarkWeightedOnRails; docs/results/schedules.md). Beyond
// it the program pools each node's NICs.
const railProgramMax = 16

// program is the weighted rings' linear program under construction: inequalities g·x ≤ h, equalities
// eq·x = 0, and Σ O = 1.
type program struct {
	n, nv int           // ring length; variables so far
	rs    [][]int       // the rings
	pos   []map[int]int // node -> position, per ring
	g, eq [][]float64
	h     []float64
	tIdx  int
	rmax  float64 // bandwidths are in units of the fastest node's
	flows [][][]flow
	mIdx  int
}

// flow is one rail-flow variable: the bytes of a link on one rail.
type flow struct{ rail, idx int }

func (pr *program) row() []float64 { return make([]float64, pr.nv) }

// load adds, to r, ring k's bytes (fractions) of the link leaving position p: 2·P_k − O_p − O_{p+1}.
func (pr *program) load(r []float64, k, p int, sign float64) {
	n := pr.n
	for q := range n {
		r[k*n+q] += 2 * sign
	}
	r[k*n+p] -= sign
	r[k*n+(p+1)%n] -= sign
}

// pooledRows adds the constraints of the program without rail flows: every node sends, and receives,
// at most T times its pooled bandwidth, and every directed link carries at most T times its
// bandwidth, summed over the rings that use it.
func (pr *program) pooledRows(t Topology) {
	n := pr.n
	for _, v := range pr.rs[0] {
		rate := t.NodeBandwidth(v) / pr.rmax
		send, recv := pr.row(), pr.row()
		for k := range pr.rs {
			p := pr.pos[k][v]
			pr.load(send, k, p, 1)
			pr.load(recv, k, (p+n-1)%n, 1)
		}
		send[pr.tIdx], recv[pr.tIdx] = -rate, -rate
		pr.g, pr.h = append(pr.g, send, recv), append(pr.h, 0, 0)
	}
	links := map[[2]int][]float64{}
	var order [][2]int
	for k, r := range pr.rs {
		for p, u := range r {
			e := [2]int{u, r[(p+1)%n]}
			if links[e] == nil {
				links[e] = pr.row()
				order = append(order, e)
			}
			pr.load(links[e], k, p, 1)
		}
	}
	for _, e := range order {
		r := links[e]
		r[pr.tIdx] = -t.EdgeBandwidth(e[0], e[1]) / pr.rmax
		pr.g, pr.h = append(pr.g, r), append(pr.h, 0)
	}
}

// railRows adds the constraints with rail flows: a link's flows sum to its bytes, and every NIC (node
// and rail) sends, and receives, at most T times its bandwidth. Together they bound the nodes and
// links as pooledRows does, and more tightly.
func (pr *program) railRows(t Topology) {
	n := pr.n
	for k := range pr.rs {
		for p := range n {
			r := pr.row()
			for _, f := range pr.flows[k][p] {
				r[f.idx] = 1
			}
			pr.load(r, k, p, -1)
			pr.eq = append(pr.eq, r)
		}
	}
	for _, v := range pr.rs[0] {
		for _, rail := range t.Rails(v) {
			send, recv := pr.row(), pr.row()
			for k := range pr.rs {
				p := pr.pos[k][v]
				for _, f := range pr.flows[k][p] {
					if f.rail == rail {
						send[f.idx] = 1
					}
				}
				for _, f := range pr.flows[k][(p+n-1)%n] {
					if f.rail == rail {
						recv[f.idx] = 1
					}
				}
			}
			bw := t.railBandwidth(v, rail) / pr.rmax
			send[pr.tIdx], recv[pr.tIdx] = -bw, -bw
			pr.g, pr.h = append(pr.g, send, recv), append(pr.h, 0, 0)
		}
	}
}

// solve solves the program in standard form (every variable non-negative, a slack per inequality),
// minimizing T less a small reward for m, and returns the variables.
func (pr *program) solve() ([]float64, bool) {
	rows, cols := len(pr.g)+1+len(pr.eq), pr.nv+len(pr.g)
	am := make([][]float64, rows)
	b := make([]float64, rows)
	for i, r := range pr.g {
		am[i] = make([]float64, cols)
		copy(am[i], r)
		am[i][pr.nv+i] = 1
		b[i] = pr.h[i]
	}
	sum := make([]float64, cols)
	for j := range pr.tIdx {
		sum[j] = 1
	}
	am[len(pr.g)], b[len(pr.g)] = sum, 1
	for i, r := range pr.eq {
		am[len(pr.g)+1+i] = make([]float64, cols)
		copy(am[len(pr.g)+1+i], r)
	}
	c := make([]float64, cols)
	c[pr.tIdx], c[pr.mIdx] = 1, -evenBlocks
	x, err := simplex(c, am, b)
	if err != nil {
		return nil, false
	}
	if tv := x[pr.tIdx]; !(tv > 0) || math.IsInf(tv, 0) {
		return nil, false
	}
	return x, true
}

// onRails reports whether the weighted rings' program models t's rails (railProgramMax).
func onRails(t Topology, nodes int) bool {
	rails := map[int]bool{}
	for _, nd := range t.Nodes {
		for _, nic := range nd.NICs {
			rails[nic.Rail] = true
		}
	}
	return t.Degraded() && nodes*len(rails) <= railProgramMax
}

// weightedOwners solves the weighted rings' linear program for rings rs over the same nodes. It
// returns, per ring and ring position, the fraction of the message owned there (summing to 1 over
// all), and the optimal seconds per byte of message. ok is false when no finite solution exists.
//
// On a degraded topology (within railProgramMax) the program also routes every link's bytes over the
// rails both of its ends have healthy, and rails gives, per ring and position, the link's split: a
// variable per link and common rail carries that rail's bytes, the link's bytes are their sum, and
// every NIC (node and rail) sends and receives at most T times its bandwidth. Pooling a node's NICs
// instead would promise a node's full bandwidth to neighbours that share only some of its rails.
func weightedOwners(t Topology, rs [][]int) (owners [][]float64, rails [][][]RailShare, secPerByte float64, ok bool) {
	n := len(rs[0])
	pr := &program{n: n, rs: rs, nv: len(rs)*n + 2} // O^k_p for every ring k and position p, then T, then m, then the rail flows
	pr.tIdx, pr.mIdx = pr.nv-2, pr.nv-1
	for _, v := range rs[0] {
		pr.rmax = max(pr.rmax, t.NodeBandwidth(v))
	}
	if pr.rmax <= 0 {
		return nil, nil, 0, false
	}
	pr.pos = make([]map[int]int, len(rs))
	for k, r := range rs {
		pr.pos[k] = map[int]int{}
		for p, v := range r {
			pr.pos[k][v] = p
		}
	}
	if onRails(t, n) {
		// flows[k][p]: the rail flows of ring k's link leaving position p, one per rail both ends
		// have healthy, in rail order.
		pr.flows = make([][][]flow, len(rs))
		for k, r := range rs {
			pr.flows[k] = make([][]flow, n)
			for p, u := range r {
				v := r[(p+1)%n]
				for _, rail := range t.Rails(u) {
					if t.railBandwidth(v, rail) > 0 {
						pr.flows[k][p] = append(pr.flows[k][p], flow{rail, pr.nv})
						pr.nv++
					}
				}
			}
		}
		pr.railRows(t)
	} else {
		pr.pooledRows(t)
	}
	// m is at most every block: the objective's small reward for m evens the blocks out among the
	// optimal solutions (the program's vertices leave many blocks empty), which shortens the pipeline
	// bubbles of a ring whose steps carry blocks of different sizes.
	for i := range pr.tIdx {
		r := pr.row()
		r[pr.mIdx], r[i] = 1, -1
		pr.g, pr.h = append(pr.g, r), append(pr.h, 0)
	}
	x, ok := pr.solve()
	if !ok {
		return nil, nil, 0, false
	}
	if pr.flows != nil {
		rails = make([][][]RailShare, len(rs))
		for k := range rs {
			rails[k] = make([][]RailShare, n)
			for p := range n {
				var fs []RailShare
				for _, f := range pr.flows[k][p] {
					fs = append(fs, RailShare{Rail: f.rail, Share: max(0, x[f.idx])})
				}
				rails[k][p] = railShares(fs)
			}
		}
	}
	owners = make([][]float64, len(rs))
	for k := range rs {
		owners[k] = make([]float64, n)
		for p := range n {
			owners[k][p] = max(0, x[k*n+p])
		}
	}
	return owners, rails, x[pr.tIdx] / pr.rmax, true
}
