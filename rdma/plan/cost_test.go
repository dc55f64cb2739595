package plan

import (
	"errors"
	"math"
	"testing"
)

// degradedNode returns an n-node topology with g NICs of 50 GB/s per node and α = 0, with node 0's
// NICs slowed so that it has lost the fraction x of its bandwidth.
func degradedNode(n, g int, x float64) Topology {
	t := Uniform(n, g, 2, 0, 50e9)
	for j := range t.Nodes[0].NICs {
		t.Nodes[0].NICs[j].Beta /= 1 - x
	}
	return t
}

func mustCost(t *testing.T, tp Topology, s Strategy, d float64, m Model) Estimate {
	t.Helper()
	e, err := Cost(tp, s, d, m)
	if err != nil {
		t.Fatalf("Cost(%v): %v", s, err)
	}
	return e
}

func TestCrossoverIsExact(t *testing.T) {
	const d = 1 << 34
	for _, c := range []struct{ n, g int }{{2, 8}, {4, 4}, {8, 8}, {64, 8}, {3, 2}} {
		xc := Crossover(c.n, c.g)
		if want := float64(c.n*c.g) / float64(3*c.n*c.g-2); xc != want {
			t.Fatalf("Crossover(%d,%d) = %v, want %v", c.n, c.g, xc, want)
		}
		for _, x := range []float64{0.05, xc / 2, xc - 1e-6, xc + 1e-6, (1 + xc) / 2, 0.9} {
			tp := degradedNode(c.n, c.g, x)
			std := mustCost(t, tp, Balance, d, Model{}).Seconds
			r2 := mustCost(t, tp, R2CCL, d, Model{}).Seconds
			if x < xc && !(std < r2) {
				t.Errorf("n=%d g=%d X=%.7f below crossover %.7f: standard %.9g, R²CCL %.9g: want standard faster",
					c.n, c.g, x, xc, std, r2)
			}
			if x > xc && !(r2 < std) {
				t.Errorf("n=%d g=%d X=%.7f above crossover %.7f: standard %.9g, R²CCL %.9g: want R²CCL faster",
					c.n, c.g, x, xc, std, r2)
			}
		}
		tp := degradedNode(c.n, c.g, xc)
		std := mustCost(t, tp, Balance, d, Model{}).Seconds
		r2 := mustCost(t, tp, R2CCL, d, Model{}).Seconds
		if math.Abs(std-r2) > 1e-12*std {
			t.Errorf("n=%d g=%d at the crossover: standard %.15g, R²CCL %.15g, want equal", c.n, c.g, std, r2)
		}
	}
}

// appendixT is Appendix A's T(Y) with B = D = 1.
func appendixT(y, x float64, n, g int) float64 {
	ng := float64(n * g)
	hg := float64((n - 1) * g)
	a := 2 * (ng - 1) / ng
	b := 2 * (hg - 1) / hg
	return max(a*(1-y)/(1-x), b*y/x) + y/x
}

func TestYStarClosedFormAndArgmin(t *testing.T) {
	for _, c := range []struct{ n, g int }{{2, 8}, {4, 8}, {16, 4}, {64, 8}} {
		for _, x := range []float64{0.1, 0.3, 0.4, 0.6, 0.85} {
			tp := degradedNode(c.n, c.g, x)
			d := float64(c.g) * 50e9 // D/B = 1, as in Appendix A
			e := mustCost(t, tp, R2CCL, d, Model{})
			ys := YStar(x, c.n, c.g)
			if math.Abs(e.Y-ys) > 1e-12 {
				t.Errorf("n=%d g=%d X=%v: model Y = %.15g, closed form Y* = %.15g", c.n, c.g, x, e.Y, ys)
			}
			if got, want := e.Seconds, appendixT(ys, x, c.n, c.g); x <= 0.5 && math.Abs(got-want) > 1e-9*want {
				t.Errorf("n=%d g=%d X=%v: T(Y*) = %.12g, Appendix A gives %.12g", c.n, c.g, x, got, want)
			}
			// The model's cost as a function of Y, minimized on a fine grid.
			gs, _ := groups(tp, tp.order(), levels(tp, Model{}), Model{})
			const steps = 5000
			bestY, bestT := 0.0, math.Inf(1)
			for i := 0; i <= steps; i++ {
				y := float64(i) / steps
				if v := decomposed(tp, gs, []float64{1 - y, y}, d, Model{}); v < bestT {
					bestY, bestT = y, v
				}
			}
			if x > Crossover(c.n, c.g) {
				if math.Abs(bestY-ys) > 2.0/steps {
					t.Errorf("n=%d g=%d X=%v: numerical argmin %.6f, Y* %.6f", c.n, c.g, x, bestY, ys)
				}
				if e.Seconds > bestT*(1+1e-12) {
					t.Errorf("n=%d g=%d X=%v: T(Y*) %.12g above the grid minimum %.12g", c.n, c.g, x, e.Seconds, bestT)
				}
			} else if bestY != 0 {
				t.Errorf("n=%d g=%d X=%v below the crossover: argmin %.6f, want 0 (standard ring)", c.n, c.g, x, bestY)
			}
		}
	}
}

func TestSingleFailureRetention(t *testing.T) {
	// One of 8 NICs down on one of 2 nodes, α = 0: hot repair halves the node, Balance keeps 7/8.
	tp := Uniform(2, 8, 2, 0, 50e9).WithNICDown(1, 3, true)
	const d = 1 << 34
	ff, err := FaultFree(tp, d, Model{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		s    Strategy
		want float64
	}{{HotRepair, 0.5}, {Balance, 7.0 / 8}} {
		if got := ff / mustCost(t, tp, c.s, d, Model{}).Seconds; math.Abs(got-c.want) > 1e-12 {
			t.Errorf("%v retention %.6f, want %.6f", c.s, got, c.want)
		}
	}
	if e := mustCost(t, tp, Ring, d, Model{}); !math.IsInf(e.Seconds, 1) {
		t.Errorf("standard ring with a NIC down: %v s, want +Inf (does not apply)", e.Seconds)
	}
	// R²CCL's code model: Y = X, broadcast at the degraded node's rate: T/T_ff = 1 + X/((1−X)·a).
	m := Model{BroadcastAtDegraded: true, SplitEqualsLoss: true}
	a := volume(16)
	want := 1 / (1 + 0.125/(0.875*a))
	if got := ff / mustCost(t, tp, R2CCL, d, m).Seconds; math.Abs(got-want) > 1e-12 {
		t.Errorf("R²CCL (code model) retention %.6f, want %.6f", got, want)
	}
}

func TestRecursiveSharesFollowIncrementalBandwidth(t *testing.T) {
	tp := Uniform(16, 8, 2, 0, 25e9)
	for _, j := range []int{0, 1, 2, 3, 4} { // node 0 keeps 3 of 8 NICs
		tp.Nodes[0].NICs[j].Down = true
	}
	tp.Nodes[5].NICs[6].Down = true // node 5 keeps 7
	tp.Nodes[9].NICs[2].Down = true
	tp.Nodes[9].NICs[3].Down = true // node 9 keeps 6
	lv := levels(tp, Model{})
	if len(lv) != 4 {
		t.Fatalf("levels %v, want 4", lv)
	}
	gs, _ := groups(tp, tp.order(), lv, Model{NoRerank: true})
	if len(gs) != 4 {
		t.Fatalf("groups: %d rings, want 4", len(gs))
	}
	s, _ := fillShares(gs, 1<<30)
	sum := 0.0
	for k, g := range gs {
		sum += s[k]
		ratio := s[k] * g.a / g.delta
		ratio0 := s[0] * gs[0].a / gs[0].delta
		if math.Abs(ratio-ratio0) > 1e-12*ratio0 {
			t.Errorf("ring %d: s·a/Δ = %.15g, ring 0: %.15g: shares not proportional to incremental bandwidth", k, ratio, ratio0)
		}
	}
	if math.Abs(sum-1) > 1e-12 {
		t.Errorf("shares sum to %v", sum)
	}
	wantMembers := []int{16, 15, 14, 13}
	for k, g := range gs {
		if len(g.ring) != wantMembers[k] {
			t.Errorf("ring %d has %d nodes, want %d", k, len(g.ring), wantMembers[k])
		}
	}
	// The recursive schedule is never worse than R²CCL-AllReduce, which is one of its groupings.
	for _, d := range []float64{1 << 20, 1 << 34} {
		r := mustCost(t, tp, Recursive, d, Model{}).Seconds
		r2 := mustCost(t, tp, R2CCL, d, Model{}).Seconds
		if r > r2*(1+1e-12) {
			t.Errorf("D=%v: recursive %.9g slower than R²CCL-AllReduce %.9g", d, r, r2)
		}
	}
}

func TestOptCCAttainsTheBound(t *testing.T) {
	const n, g = 64, 8
	for _, lost := range []int{1, 2, 3, 4} { // up to half of the node's NICs
		tp := Uniform(n, g, 2, 0, 25e9)
		for j := range lost {
			tp.Nodes[7].NICs[j].Down = true
		}
		const d = 1 << 34
		ff, err := FaultFree(tp, d, Model{})
		if err != nil {
			t.Fatal(err)
		}
		e := mustCost(t, tp, OptCC, d, Model{})
		a, b := volume(n*g), volume((n-1)*g)
		s := b - a + 1.0/(n-1)
		if over := e.Seconds/ff - 1; over > s/a+1e-12 || over > 1.0/n {
			t.Errorf("%d NICs lost: OptCC overhead %.5f, want <= s/a = %.5f and <= 1/n", lost, over, s/a)
		}
		id, err := Ideal(tp, d)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range AllStrategies {
			if c := mustCost(t, tp, st, d, Model{}).Seconds; c < id*(1-1e-12) {
				t.Errorf("%d NICs lost: %v %.9g below Ideal %.9g", lost, st, c, id)
			}
		}
	}
}

func TestOptCCSplitBalancesLoads(t *testing.T) {
	a, b := volume(64*8), volume(63*8)
	for _, x := range []float64{0.1, 0.25, 0.4} {
		y := OptCCSplit(a, b, x, 1, 63)
		leaf := (a*(1-y) + y) / (1 - x)
		core := a*(1-y) + b*y + y/63
		if math.Abs(leaf-core) > 1e-12 {
			t.Errorf("X=%v: leaf load %.15g, core load %.15g", x, leaf, core)
		}
	}
	if y := OptCCSplit(a, b, 0.9, 1, 63); y != 1 {
		t.Errorf("X=0.9: Y=%v, want 1 (clamped)", y)
	}
}

func TestValidate(t *testing.T) {
	tp := Uniform(4, 4, 2, 1e-6, 1e9)
	if err := tp.Validate(); err != nil {
		t.Fatalf("valid topology: %v", err)
	}
	bad := tp.Clone()
	bad.Nodes[2].NICs = bad.Nodes[2].NICs[:3]
	if err := bad.Validate(); !errors.Is(err, ErrInvalidTopology) {
		t.Errorf("NIC count mismatch: %v", err)
	}
	bad = tp.Clone()
	bad.Ring = []int{0, 1, 1, 3}
	if err := bad.Validate(); !errors.Is(err, ErrInvalidTopology) {
		t.Errorf("ring not a permutation: %v", err)
	}
	bad = tp.Clone()
	bad.Nodes[1].NICs[0].Beta = 0
	if err := bad.Validate(); !errors.Is(err, ErrInvalidTopology) {
		t.Errorf("zero beta: %v", err)
	}
	dead := tp.Clone()
	for j := range dead.Nodes[3].NICs {
		dead.Nodes[3].NICs[j].Down = true
	}
	if _, err := Cost(dead, Balance, 1e6, Model{}); !errors.Is(err, ErrNoPath) {
		t.Errorf("node without NICs: %v, want ErrNoPath", err)
	}
}

// TestGatherFirstCost checks the gated reduction stage on a hand-computed case: node 1 keeps two of
// four 50 MB/s NICs, the shares are one half each, D = 10^8 bytes, α = 0.
//
//	node 1: ring bytes out E = 1.5·0.5·D, gather G = 0.5·D ≤ E: gather ends at 2G/R = 1 s; its ring
//	        traffic ends no earlier than (E+G)/R = 1.25 s
//	global ring: 1.5·0.5·D / 10^8 = 0.75 s;  faster ring: starts at 1 s, 4/3·0.5·D / 10^8 later
//	broadcast: 0.5·D / 10^8 = 0.5 s
func TestGatherFirstCost(t *testing.T) {
	tp := Uniform(4, 4, 1, 0, 50e6)
	tp.Nodes[1].NICs[1].Down = true
	tp.Nodes[1].NICs[2].Down = true
	gs := []group{
		{ring: []int{0, 1, 2, 3}, rate: 100e6, delta: 100e6, a: 1.5},
		{ring: []int{0, 2, 3}, rate: 200e6, delta: 100e6, a: 4.0 / 3},
	}
	s := []float64{0.5, 0.5}
	const d = 1e8
	if got, want := decomposed(tp, gs, s, d, Model{}), 0.75+0.5; math.Abs(got-want) > 1e-9 {
		t.Errorf("paper model: %v s, want %v", got, want)
	}
	if got, want := decomposed(tp, gs, s, d, Model{GatherFirst: true}), 1+2.0/3+0.5; math.Abs(got-want) > 1e-9 {
		t.Errorf("gather first: %v s, want %v", got, want)
	}
	// A gather larger than the node's ring traffic ends with it: G = 0.9·D > E = 1.5·0.1·D.
	s = []float64{0.1, 0.9}
	if got, want := gatedReduce(tp, gs, s, d), (0.15*d+0.9*d)/100e6+4.0/3*0.9*d/100e6; math.Abs(got-want) > 1e-9 {
		t.Errorf("large gather: %v s, want %v", got, want)
	}
}

// twoDownOnNode1 returns four nodes of four 400 Mbit/s NICs (one rank each, α = 100 µs) with NICs 1
// and 2 of node 1 down: bench/schedules' two_nics_x50 case.
func twoDownOnNode1() Topology {
	tp := Uniform(4, 4, 1, 100e-6, 50e6)
	tp.GPUsPerNode = 1
	tp.Nodes[1].NICs[1].Down = true
	tp.Nodes[1].NICs[2].Down = true
	return tp
}

// TestGatherFirstPlannerAvoidsGatedR2CCL: with two of node 1's four NICs down, the paper's model
// prefers R²CCL-AllReduce to Balance at 256 MiB, while gating the faster ring behind the gather
// makes Balance the cheaper (as measured on the netns testbed).
func TestGatherFirstPlannerAvoidsGatedR2CCL(t *testing.T) {
	tp := twoDownOnNode1()
	const d = 256 << 20
	cost := func(s Strategy, m Model) float64 {
		e, err := Cost(tp, s, d, m)
		if err != nil {
			t.Fatal(err)
		}
		return e.Seconds
	}
	if r, b := cost(R2CCL, Model{}), cost(Balance, Model{}); r >= b {
		t.Errorf("paper model: R²CCL %v s, Balance %v s: want R²CCL cheaper", r, b)
	}
	if r, b := cost(R2CCL, Model{GatherFirst: true}), cost(Balance, Model{GatherFirst: true}); r < b {
		t.Errorf("gather first: R²CCL %v s, Balance %v s: want Balance cheaper", r, b)
	}
}

// TestReprice: Reprice gives a decomposed estimate's own seconds under its own model, and Appendix
// A's shares priced the way package rdma runs them: with two of node 1's four NICs down, Y* ≈ 0.53
// puts half the message through node 1's gather before the faster ring may start, which costs more
// than Balance (bench/schedules runs these shares as its r2ccl_allreduce strategy).
func TestReprice(t *testing.T) {
	tp := twoDownOnNode1()
	const d = 256 << 20
	gated := Model{GatherFirst: true}
	for _, s := range []Strategy{R2CCL, Recursive} {
		for _, m := range []Model{{}, gated, {BroadcastAtDegraded: true}} {
			e := mustCost(t, tp, s, d, m)
			got, err := Reprice(tp, e, d, m)
			if err != nil {
				t.Fatalf("%v: %v", s, err)
			}
			if math.Abs(got-e.Seconds) > 1e-12*e.Seconds {
				t.Errorf("%v %+v: Reprice %v s, Cost %v s", s, m, got, e.Seconds)
			}
		}
	}
	paper := mustCost(t, tp, R2CCL, d, Model{})
	if paper.Y < 0.5 {
		t.Fatalf("Appendix A's Y = %v, want above 0.5", paper.Y)
	}
	got, err := Reprice(tp, paper, d, gated)
	if err != nil {
		t.Fatal(err)
	}
	if b := mustCost(t, tp, Balance, d, gated).Seconds; got <= b || got <= 1.5*paper.Seconds {
		t.Errorf("Y* gated: %v s; want above Balance's %v s and 1.5× the paper's %v s", got, b, paper.Seconds)
	}
	if _, err := Reprice(tp, mustCost(t, tp, Balance, d, gated), d, gated); err == nil {
		t.Error("Reprice of a Balance estimate: no error")
	}
	bad := paper
	bad.Shares = bad.Shares[:1]
	if _, err := Reprice(tp, bad, d, gated); err == nil {
		t.Error("Reprice with one share for two rings: no error")
	}
	bad = paper
	bad.Rings = [][]int{{0, 1, 2, 7}, {0, 2, 3}}
	if _, err := Reprice(tp, bad, d, gated); err == nil {
		t.Error("Reprice with a ring naming node 7 of 4: no error")
	}
}

// TestHotRepairPairsAcrossNodes: with NIC 1 of node 1 and NIC 2 of node 2 down, both move their
// channel to NIC 0, and the path from node 1 to node 2 on channel 2 takes node 2's backup, so NIC 0
// of node 1 sends three channels: the ring runs at a third of a NIC per channel, not a half.
func TestHotRepairPairsAcrossNodes(t *testing.T) {
	tp := Uniform(4, 4, 1, 0, 50e6)
	tp.GPUsPerNode = 1
	tp.Nodes[1].NICs[1].Down = true
	tp.Nodes[2].NICs[2].Down = true
	const d = 1e8
	e := mustCost(t, tp, HotRepair, d, Model{})
	if want := 1.5 * d / 4 / (50e6 / 3); math.Abs(e.Seconds-want) > 1e-9 {
		t.Errorf("hot repair: %v s, want %v", e.Seconds, want)
	}
	one := Uniform(4, 4, 1, 0, 50e6)
	one.GPUsPerNode = 1
	one.Nodes[1].NICs[1].Down = true
	if e, want := mustCost(t, one, HotRepair, d, Model{}), 1.5*d/4/(50e6/2); math.Abs(e.Seconds-want) > 1e-9 {
		t.Errorf("one NIC down: %v s, want %v", e.Seconds, want)
	}
}
