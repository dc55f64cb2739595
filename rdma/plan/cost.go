package plan

import (
	"fmt"
	"math"
	"slices"
	"sort"
)

// Strategy names an AllReduce schedule the planner can choose.
type Strategy int

const (
	// Ring is the standard ring AllReduce (reduce-scatter then all-gather over all n·g ranks), with
	// channel c on NIC c. It applies only when no NIC is down.
	Ring Strategy = iota
	// HotRepair keeps the standard ring and moves each failed NIC's channels onto its backup NIC (the
	// nearest healthy one), which then carries double load.
	HotRepair
	// Balance keeps the standard ring and spreads every node's inter-node bytes over its healthy NICs
	// in proportion to their bandwidth (R²CCL-Balance).
	Balance
	// R2CCL is R²CCL-AllReduce: a global ring over all nodes on a (1−Y) share, concurrently with a
	// partial ring over the fastest nodes on the Y share, then a pipelined broadcast of the partial
	// result to the slower nodes.
	R2CCL
	// Recursive is recursive R²CCL-AllReduce: the slowest nodes are peeled off into ever faster
	// sub-rings, shares proportional to incremental bandwidth, reductions in parallel, broadcasts in
	// dependency order.
	Recursive
	// OptCC is a schedule that attains OptCC's O(1/p) overhead bound in this model; see [costOptCC].
	OptCC
	// Weighted is the standard ring with reduce-scatter blocks sized to the nodes' bandwidths, alone
	// or beside a second ring in the opposite direction: see [costWeighted].
	Weighted
)

// AllStrategies lists every strategy in the planner's tie-break order (earlier wins a tie).
var AllStrategies = []Strategy{Ring, Balance, HotRepair, R2CCL, Recursive, OptCC, Weighted}

// R2CCLStrategies lists the strategies of the R²CCL paper, without [OptCC].
var R2CCLStrategies = []Strategy{Ring, Balance, HotRepair, R2CCL, Recursive}

// String returns the strategy's name as it appears in benchmark output.
func (s Strategy) String() string {
	switch s {
	case Ring:
		return "ring"
	case HotRepair:
		return "hot_repair"
	case Balance:
		return "balance"
	case R2CCL:
		return "r2ccl_allreduce"
	case Recursive:
		return "recursive"
	case OptCC:
		return "optcc"
	case Weighted:
		return "weighted_ring"
	}
	return fmt.Sprintf("strategy(%d)", int(s))
}

// Model holds the modelling choices of the cost model. The zero value is the R²CCL paper's model.
type Model struct {
	// BroadcastAtDegraded charges the broadcast stage of R²CCL-AllReduce and of the recursive schedule
	// at the receiving (slower) nodes' own bandwidth, as R²CCL's code documentation models it, instead
	// of at the faster group's residual (incremental) bandwidth as in the paper's Appendix A. With it
	// R²CCL-AllReduce beats the standard ring for every X > 0 at large sizes; without it the crossover
	// is X = ng/(3ng−2).
	BroadcastAtDegraded bool
	// SplitEqualsLoss fixes R²CCL-AllReduce's partial share Y to the lost fraction X, as R²CCL's code
	// does, instead of Appendix A's Y*.
	SplitEqualsLoss bool
	// NoRerank disables bridge-based re-ranking of the rings.
	NoRerank bool
	// LevelTolerance is the relative bandwidth difference below which two nodes count as one level in
	// the recursive schedule. Zero means 0.01.
	LevelTolerance float64
	// GatherFirst charges R²CCL-AllReduce and the recursive schedule as package rdma runs them: a
	// faster ring starts on its share only once the slower nodes' inputs for it have arrived whole
	// (one gate per share, not per chunk), and those inputs leave a slow node over the links its own
	// ring traffic uses, each flow getting half while both run. Shares are then chosen for this
	// model rather than by Appendix A.
	GatherFirst bool
}

// Estimate is the model's prediction for one strategy on one topology and message size, with the
// schedule's shape: which rings run, on which fraction of the message.
type Estimate struct {
	// Strategy is the schedule estimated.
	Strategy Strategy
	// Seconds is the predicted completion time; +Inf when the strategy does not apply.
	Seconds float64
	// Reranked reports whether bridge-based re-ranking changed a ring of the schedule.
	Reranked bool
	// Rings lists the node rings of the schedule in ring order: the global ring first, then each
	// faster sub-ring.
	Rings [][]int
	// Shares is the fraction of the message each ring of Rings reduces; they sum to 1.
	Shares []float64
	// Leaves lists, for OptCC, the nodes that hand their input for the last ring's share to its owners
	// and receive the result, instead of forwarding in that ring.
	Leaves []int
	// Y is the fraction of the message not reduced by the global ring (R²CCL's partial share).
	Y float64
	// Owners gives, for the weighted rings, the fraction of the message each position of each ring
	// of Rings owns in its reduce-scatter; nil means equal blocks.
	Owners [][]float64
	// LinkRails gives, for the weighted rings on a degraded topology, how the bytes of each ring's
	// link from position p to p+1 spread over the rails both ends have healthy: LinkRails[k][p] for
	// ring k of Rings. Nil means the runtime's routes decide.
	LinkRails [][][]RailShare
}

// RailShare is the fraction of a link's bytes that one rail carries.
type RailShare struct {
	Rail  int
	Share float64
}

// volume returns a = 2(N−1)/N, the bytes per byte of message a node of a flat ring over N ranks sends
// (and receives) across the network.
func volume(ranks int) float64 {
	if ranks <= 1 {
		return 0
	}
	return 2 * float64(ranks-1) / float64(ranks)
}

// Cost returns the model's estimate of strategy s for an AllReduce of bytes bytes on t.
func Cost(t Topology, s Strategy, bytes float64, m Model) (Estimate, error) {
	if err := t.check(); err != nil {
		return Estimate{}, err
	}
	var e Estimate
	switch s {
	case Ring:
		e = costRing(t, bytes, false)
	case HotRepair:
		e = costRing(t, bytes, true)
	case Balance:
		e = bestOrder(t, m, func(o []int) Estimate { return costBalance(t, o, bytes) })
	case R2CCL:
		e = bestOrder(t, m, func(o []int) Estimate { return costR2CCL(t, o, bytes, m) })
	case Recursive:
		e = bestOrder(t, m, func(o []int) Estimate { return costRecursive(t, o, bytes, m) })
	case OptCC:
		e = bestOrder(t, m, func(o []int) Estimate { return costOptCC(t, o, bytes, m) })
	case Weighted:
		e = bestOrder(t, m, func(o []int) Estimate { return costWeighted(t, o, bytes) })
	default:
		return Estimate{}, fmt.Errorf("plan: unknown strategy %d", int(s))
	}
	e.Strategy = s
	return e, nil
}

// Reprice returns what the decomposed schedule e (R²CCL-AllReduce or the recursive schedule: its
// rings and shares kept as they are) costs under model m, so that a plan whose shares one model
// chose can be priced by another: Appendix A's shares priced the way package rdma runs them
// ([Model].GatherFirst), for instance. For e's own model it returns e.Seconds.
func Reprice(t Topology, e Estimate, bytes float64, m Model) (float64, error) {
	if err := t.check(); err != nil {
		return 0, err
	}
	if e.Strategy != R2CCL && e.Strategy != Recursive {
		return 0, fmt.Errorf("plan: Reprice prices R²CCL-AllReduce and recursive estimates, not %v", e.Strategy)
	}
	if math.IsInf(e.Seconds, 1) {
		return e.Seconds, nil
	}
	if len(e.Rings) < 2 || len(e.Shares) != len(e.Rings) {
		return 0, fmt.Errorf("plan: a %v estimate with %d rings and %d shares", e.Strategy, len(e.Rings), len(e.Shares))
	}
	gs := make([]group, len(e.Rings))
	prev := 0.0
	for k, ring := range e.Rings {
		for _, v := range ring {
			if v < 0 || v >= len(t.Nodes) {
				return 0, fmt.Errorf("plan: ring %v names node %d of %d", ring, v, len(t.Nodes))
			}
		}
		gs[k] = newGroup(t, ring, prev)
		prev = gs[k].rate
	}
	return decomposed(t, gs, e.Shares, bytes, m), nil
}

// bestOrder evaluates f on the topology's ring order and, unless disabled, on its re-ranked order,
// and returns the cheaper (the original on a tie).
func bestOrder(t Topology, m Model, f func([]int) Estimate) Estimate {
	o := t.order()
	e := f(o)
	if m.NoRerank {
		return e
	}
	r := Rerank(o, t.railSets())
	if slices.Equal(r, o) {
		return e
	}
	if e2 := f(r); e2.Seconds < e.Seconds {
		e2.Reranked = true
		return e2
	}
	return e
}

// rerankSub re-ranks a sub-ring unless disabled, reporting whether it changed.
func rerankSub(t Topology, ring []int, m Model) ([]int, bool) {
	if m.NoRerank {
		return ring, false
	}
	r := Rerank(ring, t.railSets())
	return r, !slices.Equal(r, ring)
}

// channelNIC returns the NIC that carries channel c on node u: NIC c when healthy, otherwise (hot
// repair) its backup, the nearest healthy NIC by distance, ties to the lower index.
func channelNIC(n Node, c int) int {
	c %= len(n.NICs)
	if !n.NICs[c].Down {
		return c
	}
	best, bd := -1, 0
	for j, nic := range n.NICs {
		if nic.Down {
			continue
		}
		if d := distance(n, c, j); best < 0 || d < bd {
			best, bd = j, d
		}
	}
	return best
}

// costRing costs the standard ring with the message split equally over one channel per NIC. Without
// repair it applies only when no NIC is down; with repair each failed NIC's channels move to its backup
// NIC. Every channel proceeds at the slowest channel's pace, as in NCCL, where each channel gets an
// equal slice of the data.
//
//	T = 2(N−1)·α + a·(D/C)/r_min,  a = 2(N−1)/N, N = n·g, C = NICs per node,
//
// r_min the slowest channel's rate on any ring edge. A channel's path from u to v runs on the NIC
// pair that package rdma gives it (see [edgeNIC]), and a NIC that k paths leave (or k paths enter)
// gives each 1/k of its bandwidth in that direction.
func costRing(t Topology, bytes float64, repair bool) Estimate {
	inf := Estimate{Seconds: math.Inf(1)}
	if !repair && t.Degraded() {
		return inf
	}
	o := t.order()
	chans := len(t.Nodes[0].NICs)
	type path struct{ u, v, j int }
	var paths []path
	out, in := map[[2]int]int{}, map[[2]int]int{} // paths per (node, NIC), leaving and entering
	for i, u := range o {
		v := o[(i+1)%len(o)]
		for c := range chans {
			j := edgeNIC(t.Nodes[u], t.Nodes[v], c)
			if j < 0 {
				return inf
			}
			paths = append(paths, path{u, v, j})
			out[[2]int{u, j}]++
			in[[2]int{v, j}]++
		}
	}
	rmin := math.Inf(1)
	for _, p := range paths {
		rmin = min(rmin, t.Nodes[p.u].NICs[p.j].Bandwidth()/float64(out[[2]int{p.u, p.j}]),
			t.Nodes[p.v].NICs[p.j].Bandwidth()/float64(in[[2]int{p.v, p.j}]))
	}
	ranks := len(o) * t.ranks()
	sec := t.RingLatency(o) + volume(ranks)*bytes/float64(chans)/rmin
	return Estimate{Seconds: sec, Rings: [][]int{o}, Shares: []float64{1}}
}

// edgeNIC returns the NIC index (the same at both ends: one rail) that channel c uses from node u to
// node v under hot repair, as package rdma pairs them: u's backup when u moved the channel off its
// NIC, else v's; when that NIC is down at the other end, the runtime fails over to the first NIC
// healthy at both. It returns -1 when no NIC is.
func edgeNIC(u, v Node, c int) int {
	j := channelNIC(u, c)
	if j == c%len(u.NICs) {
		j = channelNIC(v, c)
	}
	if j >= 0 && !u.NICs[j].Down && !v.NICs[j].Down {
		return j
	}
	for k := range u.NICs {
		if !u.NICs[k].Down && !v.NICs[k].Down {
			return k
		}
	}
	return -1
}

// costBalance costs the standard ring under R²CCL-Balance: each node's traffic is spread over its
// healthy NICs in proportion to bandwidth, so the ring runs at its slowest edge's bandwidth R (an
// edge sums the rails both ends have healthy). When the topology's CPU link is limited, the detours
// that cross it bound the time as well.
//
//	T = 2(N−1)·α + max(a·D/R, max_node a·D·f_cross/B_cpu)
func costBalance(t Topology, o []int, bytes float64) Estimate {
	ranks := len(o) * t.ranks()
	a := volume(ranks)
	beta := max(a*bytes/t.ringRate(o), cpuLinkTime(t, a*bytes))
	return Estimate{Seconds: t.RingLatency(o) + beta, Rings: [][]int{o}, Shares: []float64{1}}
}

// cpuLinkTime returns the seconds the busiest CPU link takes for the share of sent bytes a node's
// Balance routes put across it, each node sending sent bytes; 0 without a CPU-link limit.
func cpuLinkTime(t Topology, sent float64) float64 {
	if t.CPULinkBandwidth <= 0 {
		return 0
	}
	m := 0.0
	for u := range t.Nodes {
		m = max(m, sent*crossFraction(t.Nodes[u], t.ranks())/t.CPULinkBandwidth)
	}
	return m
}

// group is one ring of a decomposed schedule.
type group struct {
	ring  []int
	rate  float64 // the ring's bandwidth R_k
	delta float64 // incremental bandwidth R_k − R_{k−1}
	a     float64 // volume factor of the ring
	alpha float64 // latency term 2(N_k−1)·α
}

// levels returns the distinct node bandwidths of t, ascending, merging values within tolerance.
func levels(t Topology, m Model) []float64 {
	tol := m.LevelTolerance
	if tol <= 0 {
		tol = 0.01
	}
	bw := make([]float64, len(t.Nodes))
	for i := range bw {
		bw[i] = t.NodeBandwidth(i)
	}
	sort.Float64s(bw)
	var lv []float64
	for _, b := range bw {
		if len(lv) == 0 || b > lv[len(lv)-1]*(1+tol) {
			lv = append(lv, b)
		}
	}
	return lv
}

// groups builds the rings of a decomposition: ring k holds the nodes (in the order o, re-ranked) whose
// bandwidth reaches threshold k. It returns nil when a ring is not strictly faster than the previous.
func groups(t Topology, o []int, thresholds []float64, m Model) ([]group, bool) {
	var gs []group
	reranked := false
	prev := 0.0
	bw := make([]float64, len(t.Nodes))
	for i := range bw {
		bw[i] = t.NodeBandwidth(i)
	}
	var rails [][]int
	if !m.NoRerank {
		rails = t.railSets()
	}
	for _, th := range thresholds {
		var ring []int
		for _, v := range o {
			if bw[v] >= th*(1-1e-9) {
				ring = append(ring, v)
			}
		}
		if rails != nil {
			r := Rerank(ring, rails)
			reranked = reranked || !slices.Equal(r, ring)
			ring = r
		}
		g := newGroup(t, ring, prev)
		if g.rate <= prev*(1+1e-12) {
			return nil, false
		}
		gs = append(gs, g)
		prev = g.rate
	}
	return gs, reranked
}

// newGroup returns ring as a ring of a decomposition whose previous (slower) ring runs at prev.
func newGroup(t Topology, ring []int, prev float64) group {
	r := t.ringRate(ring)
	return group{ring: ring, rate: r, delta: r - prev, a: volume(len(ring) * t.ranks()), alpha: t.RingLatency(ring)}
}

// fillShares returns the shares s_k (summing to 1) that minimize max_k(α_k + a_k·s_k·D/Δ_k): the
// reductions of all rings run in parallel and finish together (a ring whose latency alone exceeds
// that time gets nothing). With α = 0 this is s_k ∝ Δ_k/a_k, the
// incremental bandwidth over the ring's volume factor (a_k is within 2/N_k of 2).
func fillShares(gs []group, bytes float64) ([]float64, float64) {
	c := make([]float64, len(gs))
	for k, g := range gs {
		c[k] = max(g.a*bytes/g.delta, 1e-300)
	}
	// Σ_k max(0, (T−α_k)/c_k) = 1 is piecewise linear and increasing in T: find T by adding rings in
	// order of their latency.
	idx := make([]int, len(gs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(i, j int) bool { return gs[idx[i]].alpha < gs[idx[j]].alpha })
	var sumInv, sumAlpha float64
	T := 0.0
	for j, k := range idx {
		sumInv += 1 / c[k]
		sumAlpha += gs[k].alpha / c[k]
		T = (1 + sumAlpha) / sumInv
		if j+1 == len(idx) || T <= gs[idx[j+1]].alpha {
			break
		}
	}
	s := make([]float64, len(gs))
	sum := 0.0
	for k := range gs {
		s[k] = max(0, (T-gs[k].alpha)/c[k])
		sum += s[k]
	}
	for k := range s {
		s[k] /= sum
	}
	return s, T
}

// decomposed costs a schedule of rings gs with shares s: the reductions run in parallel; then the
// result of each faster ring's share is broadcast (pipelined) to the nodes outside that ring, whose
// own input for the share is reduced in first, chunk by chunk.
//
// Appendix A's model (the default) charges the broadcast of share s_k at ring k's incremental
// bandwidth Δ_k, and the broadcasts of different rings proceed concurrently down the dependency chain.
// A node outside ring k must also receive the share over its own links, which bounds the stage from
// below once the slower ring j has less bandwidth than the residual (X > 1/2 for two rings):
//
//	T = max_k(α_k + a_k·s_k·D/Δ_k) + 2(n−1)·α + max(max_{k≥2} s_k·D/Δ_k, max_{j<K} (Σ_{k>j} s_k)·D/R_j)
//
// With [Model].BroadcastAtDegraded only the second (receive) term remains. The 2(n−1)·α is the
// latency of the pipelined reduce-in and broadcast chains. Like Appendix A, the model does not charge
// the bytes of the slower nodes' input on its way in: with pipelining they travel in the direction
// opposite to the broadcast.
//
// For two rings with R_1 = (1−X)B, R_2 = B and X ≤ 1/2 this is Appendix A's T(Y) = max(T1, T2) + T3.
func decomposed(t Topology, gs []group, s []float64, bytes float64, m Model) float64 {
	red := 0.0
	for k, g := range gs {
		// Every ring of the schedule runs, so each pays its latency even on an empty share.
		red = max(red, g.alpha+g.a*s[k]*bytes/g.delta)
	}
	if m.GatherFirst {
		red = max(red, gatedReduce(t, gs, s, bytes))
	}
	bc := 0.0
	for j := 0; j+1 < len(gs); j++ {
		rest := 0.0
		for k := j + 1; k < len(gs); k++ {
			rest += s[k]
		}
		bc = max(bc, rest*bytes/gs[j].rate)
	}
	if !m.BroadcastAtDegraded {
		for k := 1; k < len(gs); k++ {
			bc = max(bc, s[k]*bytes/gs[k].delta)
		}
	}
	if bc > 0 {
		bc += 2 * float64(len(t.Nodes)-1) * t.alpha(gs[0].ring)
	}
	return red + bc
}

// costR2CCL costs R²CCL-AllReduce: the global ring over all nodes, at the slowest node's bandwidth
// R_1 = (1−X)·B, on a (1−Y) share, concurrently with a partial ring over the fastest nodes (bandwidth
// B) on the Y share, using their residual bandwidth X·B; then the Y share is broadcast to the other
// nodes. Y is where the two reductions finish together; with α = 0 and one degraded node this is
// Appendix A's
//
//	Y* = X + X(1−X)/(X + (g(n−1)−1)·n),
//
// and R²CCL-AllReduce beats the standard ring exactly when X > ng/(3ng−2).
func costR2CCL(t Topology, o []int, bytes float64, m Model) Estimate {
	lv := levels(t, m)
	if len(lv) < 2 {
		return Estimate{Seconds: math.Inf(1)}
	}
	gs, rr := groups(t, o, []float64{lv[0], lv[len(lv)-1]}, m)
	if gs == nil {
		return Estimate{Seconds: math.Inf(1)}
	}
	var s []float64
	if m.SplitEqualsLoss {
		x := 1 - gs[0].rate/gs[1].rate
		s = []float64{1 - x, x}
	} else {
		s, _ = fillShares(gs, bytes)
	}
	return bestScaled(t, gs, s, bytes, m, rr)
}

// shareSteps is how many scalings of the faster rings' shares bestScaled tries under GatherFirst.
const shareSteps = 20

// bestScaled returns the estimate for shares s or, under [Model].GatherFirst (unless the split is
// fixed by SplitEqualsLoss), for s with every faster ring's share scaled by the same factor in
// (0, 1], whichever is cheapest: gating makes a smaller faster share pay off sooner than Appendix A's
// optimum assumes.
func bestScaled(t Topology, gs []group, s []float64, bytes float64, m Model, rr bool) Estimate {
	best := estimateOf(t, gs, s, bytes, m, rr)
	if !m.GatherFirst || m.SplitEqualsLoss {
		return best
	}
	for i := 1; i < shareSteps; i++ {
		f := float64(i) / shareSteps
		sc := make([]float64, len(s))
		sc[0] = 1
		for k := 1; k < len(s); k++ {
			sc[k] = s[k] * f
			sc[0] -= sc[k]
		}
		if e := estimateOf(t, gs, sc, bytes, m, rr); e.Seconds < best.Seconds {
			best = e
		}
	}
	return best
}

// gatedReduce is the reduction stage under [Model].GatherFirst. A node b sends E_b bytes in the
// rings it belongs to and G_b bytes of its input to the hosts of the rings it is outside of, over its
// bandwidth R_b shared evenly between the two flows: its gather ends at 2·G_b/R_b when G_b ≤ E_b,
// else at (E_b + G_b)/R_b, and its ring traffic cannot end before (E_b + G_b)/R_b. A faster ring
// starts when the last of its outside nodes' gathers ends.
func gatedReduce(t Topology, gs []group, s []float64, bytes float64) float64 {
	n := len(t.Nodes)
	member := make([][]bool, len(gs))
	for k, g := range gs {
		member[k] = make([]bool, n)
		for _, u := range g.ring {
			member[k][u] = true
		}
	}
	gatherEnd := make([]float64, n)
	red := 0.0
	for b := range n {
		var e, gv float64
		for k, g := range gs {
			if member[k][b] {
				e += g.a * s[k] * bytes
			} else {
				gv += s[k] * bytes
			}
		}
		r := t.NodeBandwidth(b)
		if gv == 0 || r <= 0 {
			continue
		}
		if gv <= e {
			gatherEnd[b] = 2 * gv / r
		} else {
			gatherEnd[b] = (e + gv) / r
		}
		red = max(red, (e+gv)/r)
	}
	for k, g := range gs {
		start := 0.0
		for b := range n {
			if !member[k][b] {
				start = max(start, gatherEnd[b])
			}
		}
		red = max(red, start+g.alpha+g.a*s[k]*bytes/g.delta)
	}
	return red
}

// estimateOf assembles an Estimate from a decomposition.
func estimateOf(t Topology, gs []group, s []float64, bytes float64, m Model, rr bool) Estimate {
	e := Estimate{Seconds: decomposed(t, gs, s, bytes, m), Shares: s, Reranked: rr}
	for _, g := range gs {
		e.Rings = append(e.Rings, g.ring)
	}
	e.Y = 1 - s[0]
	return e
}

// maxLevels bounds the levels the recursive schedule enumerates groupings of (2^(L−1) groupings).
const maxLevels = 10

// costRecursive costs recursive R²CCL-AllReduce. The distinct node bandwidths form levels; every way
// of grouping consecutive levels into at least two rings is evaluated (a grouped node runs at its
// group's slowest rate), shares follow [fillShares], and the cheapest grouping wins.
func costRecursive(t Topology, o []int, bytes float64, m Model) Estimate {
	lv := levels(t, m)
	for len(lv) > maxLevels { // merge the two closest adjacent levels
		bi := 1
		for i := 2; i < len(lv); i++ {
			if lv[i]/lv[i-1] < lv[bi]/lv[bi-1] {
				bi = i
			}
		}
		lv = slices.Delete(lv, bi, bi+1)
	}
	best := Estimate{Seconds: math.Inf(1)}
	if len(lv) < 2 {
		return best
	}
	for mask := 1; mask < 1<<(len(lv)-1); mask++ {
		th := []float64{lv[0]}
		for i := 1; i < len(lv); i++ {
			if mask&(1<<(i-1)) != 0 {
				th = append(th, lv[i])
			}
		}
		gs, rr := groups(t, o, th, m)
		if gs == nil {
			continue
		}
		s, _ := fillShares(gs, bytes)
		if e := bestScaled(t, gs, s, bytes, m, rr); e.Seconds < best.Seconds {
			best = e
		}
	}
	return best
}

// OptCCSplit returns the share Y of the message that the degraded nodes handle as leaves in the OptCC
// schedule, for volume factors a (global ring) and b (core ring), lost fraction x of the slowest node
// relative to the core, and leaves/core node counts:
//
//	Y = a·X / (a − 1 + (1 − X)·s),   s = b − a + leaves/core,
//
// clamped to [0, 1]. This formula is this package's own derivation, not OptCC's text: see
// [costOptCC].
func OptCCSplit(a, b, x float64, leaves, core int) float64 {
	if x <= 0 || core == 0 {
		return 0
	}
	s := b - a + float64(leaves)/float64(core)
	d := a - 1 + (1-x)*s
	if d <= 0 {
		return 1
	}
	return min(1, max(0, a*x/d))
}

// costOptCC costs a schedule that attains OptCC's lower bound in this model. OptCC (arXiv 2606.01680)
// shows that when the degraded node keeps at least half its bandwidth the unavoidable overhead over
// the fault-free ring is O(1/p). The schedule and formulas below are this package's own derivation.
//
// The degraded ("leaf") nodes give up their reduce-scatter ownership of a share Y of the message:
// on that share a ring over the healthy ("core") nodes does the reduction, each leaf sends its input
// for the share once to the core node that owns each piece and receives the finished piece once.
// Everything is pipelined and runs concurrently, so a node's time is its bytes over its bandwidth.
// Per byte of message, each direction:
//
//	leaf:  a(1−Y) + Y                            over R_slow = (1−X)·R_core
//	core:  a(1−Y) + b·Y + (leaves/core)·Y         over R_core
//
// with a = 2(N−1)/N for the global ring over all N = n·g ranks and b the core ring's factor. Since
// a > 1 the leaf load falls with Y while the core load rises with slope s = b − a + leaves/core; the
// optimum equalizes them, Y = aX/(a − 1 + (1−X)s) ([OptCCSplit]). At that Y the time is
// (a + s·Y)·D/R_core: the overhead over the fault-free a·D/B is s·Y/a ≤ s/a = O(1/n) for a single
// leaf, as long as Y ≤ 1, that is X ≤ (a − 1 + s)/(a + s) ≈ 1/2: the degraded node keeps about half
// its bandwidth. Beyond that Y = 1 and the leaf's own D/R_slow dominates, which no schedule avoids.
func costOptCC(t Topology, o []int, bytes float64, m Model) Estimate {
	e, _ := optccAt(t, o, bytes, -1, m)
	return e
}

// OptCCAt returns the cost of OptCC's schedule on ring order o (an OptCC Estimate's Rings[0]) with
// the leaves' share forced to y, clamped to [0, 1], and latency, the part of the time that does not
// depend on the message size. A runtime that knows better than this model how its NICs share the
// load (the model pools each node's NICs) prices other shares with it.
func OptCCAt(t Topology, o []int, bytes, y float64, m Model) (e Estimate, latency float64) {
	e, latency = optccAt(t, o, bytes, min(1, max(0, y)), m)
	e.Strategy = OptCC
	return e, latency
}

// optccAt is costOptCC with share y, or the optimal share when y < 0.
func optccAt(t Topology, o []int, bytes, y float64, m Model) (Estimate, float64) {
	lv := levels(t, m)
	if len(lv) < 2 {
		e := costBalance(t, o, bytes)
		return e, t.RingLatency(o)
	}
	top := lv[len(lv)-1]
	var core, leaves []int
	rslow := t.ringRate(o)
	for _, v := range o {
		if t.NodeBandwidth(v) >= top*(1-1e-9) {
			core = append(core, v)
		} else {
			leaves = append(leaves, v)
			rslow = min(rslow, t.NodeBandwidth(v))
		}
	}
	core, rr := rerankSub(t, core, m)
	rcore := t.ringRate(core)
	g := t.ranks()
	a := volume(len(o) * g)
	b := volume(len(core) * g)
	x := 1 - rslow/rcore
	if y < 0 {
		y = OptCCSplit(a, b, x, len(leaves), len(core))
	}
	leafLoad := (a*(1-y) + y) * bytes / rslow
	coreLoad := (a*(1-y) + b*y + float64(len(leaves))/float64(len(core))*y) * bytes / rcore
	lat := t.RingLatency(o) + 2*t.alpha(leaves)
	return Estimate{Seconds: lat + max(leafLoad, coreLoad), Rings: [][]int{o, core}, Shares: []float64{1 - y, y},
		Leaves: leaves, Y: y, Reranked: rr}, lat
}

// FaultFree returns the time of the best standard ring on t with every NIC up: the reference every
// degraded case is compared with.
func FaultFree(t Topology, bytes float64, m Model) (float64, error) {
	h := t.Clone()
	for i := range h.Nodes {
		for j := range h.Nodes[i].NICs {
			h.Nodes[i].NICs[j].Down = false
		}
	}
	if err := h.check(); err != nil {
		return 0, err
	}
	r := costRing(h, bytes, false).Seconds
	b := bestOrder(h, m, func(o []int) Estimate { return costBalance(h, o, bytes) }).Seconds
	return min(r, b), nil
}

// Ideal returns the model's lower bound for an AllReduce of bytes bytes on t:
//
//	Ideal = 2⌈log₂ n⌉·α_min + max(n·a·D / Σ_i R_i,  D / R_min),
//
// with R_i node i's remaining bandwidth and a = 2(N−1)/N the flat ring's volume factor. Every
// schedule of this model moves n·a·D bytes across the network in total (R²CCL-AllReduce, the recursive
// schedule and OptCC move bytes between nodes, but the total is conserved), and no node sends faster
// than R_i, so no schedule beats the total over the sum of bandwidths; every node must receive the
// whole result at least once, which takes the slowest node D/R_min; and a reduction followed by a
// broadcast among n nodes takes at least ⌈log₂ n⌉ rounds each, α_min being the smallest NIC latency.
// On a homogeneous topology that lost the fraction X of one node's bandwidth, the first term is the
// fault-free ring's time × (1 + X/(n−X)).
func Ideal(t Topology, bytes float64) (float64, error) {
	if err := t.check(); err != nil {
		return 0, err
	}
	amin := math.Inf(1)
	rmin := math.Inf(1)
	sum := 0.0
	for i, n := range t.Nodes {
		for _, nic := range n.NICs {
			amin = min(amin, nic.Alpha)
		}
		r := t.NodeBandwidth(i)
		rmin = min(rmin, r)
		sum += r
	}
	n := float64(len(t.Nodes))
	a := volume(len(t.Nodes) * t.ranks())
	rounds := math.Ceil(math.Log2(n))
	return 2*rounds*amin + max(n*a*bytes/sum, bytes/rmin), nil
}

// YStar returns Appendix A's optimal partial share for n nodes of g GPUs with one node having lost the
// fraction x of its bandwidth: Y* = X + X(1−X)/(X + (g(n−1)−1)·n).
func YStar(x float64, n, g int) float64 {
	return x + x*(1-x)/(x+float64(g*(n-1)-1)*float64(n))
}

// Crossover returns ng/(3ng−2): above this lost fraction R²CCL-AllReduce beats the standard ring for
// large messages (Appendix A).
func Crossover(n, g int) float64 {
	ng := float64(n * g)
	return ng / (3*ng - 2)
}
