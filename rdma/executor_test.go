package rdma_test

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/plan"
	"github.com/concord-ccl/concord/rings"
)

const (
	stNodes = 4
	stNICs  = 4
	stBW    = 12.5e9
	stCount = 1 << 18 // float32 elements: 1 MiB
)

// stTopology is the planner's view of newCluster's fabric, with the given (node, NIC) pairs down.
func stTopology(down [][2]int) plan.Topology {
	t := plan.Uniform(stNodes, stNICs, 2, 2e-6, stBW)
	t.GPUsPerNode = 1
	for _, d := range down {
		t.Nodes[d[0]].NICs[d[1]].Down = true
	}
	return t
}

// integerInputs are float32 inputs whose sums are exact in any order.
func integerInputs(rng *rand.Rand, nodes, count int) [][]byte {
	in := make([][]byte, nodes)
	for i := range in {
		v := make([]float32, count)
		for j := range v {
			v[j] = float32(rng.IntN(2001) - 1000)
		}
		in[i] = rings.Bytes(v)
	}
	return in
}

// runPlanned runs the AllReduce of strategy st on a fresh cluster with the NICs of down taken down,
// and returns the results and the virtual time it took.
func runPlanned(t *testing.T, st plan.Strategy, down [][2]int, inputs [][]byte) ([][]byte, plan.Plan, time.Duration) {
	t.Helper()
	return runPlannedWith(t, rdma.Config{ChunkBytes: 64 << 10, Window: 4}, false, st, down, inputs)
}

// runPlannedWith is runPlanned on a cluster with configuration cfg; with inPlace every node's result
// buffer is a copy of its input, passed as both send and recv.
func runPlannedWith(t *testing.T, cfg rdma.Config, inPlace bool, st plan.Strategy, down [][2]int, inputs [][]byte) ([][]byte, plan.Plan, time.Duration) {
	t.Helper()
	_, out, p, d := plannedCluster(t, cfg, inPlace, st, down, inputs)
	return out, p, d
}

// plannedCluster is runPlannedWith that also returns the cluster it ran on.
func plannedCluster(t *testing.T, cfg rdma.Config, inPlace bool, st plan.Strategy, down [][2]int, inputs [][]byte) (*cluster, [][]byte, plan.Plan, time.Duration) {
	t.Helper()
	c := newCluster(t, stNodes, stNICs, cfg)
	for _, d := range down {
		c.net.SetPort(c.ring[d[0]], rdma.NICID(d[1]), false)
	}
	topo := stTopology(down)
	e, err := plan.Cost(topo, st, float64(len(inputs[0])), plan.Model{})
	if err != nil {
		t.Fatal(err)
	}
	if math.IsInf(e.Seconds, 1) {
		t.Fatalf("%v does not apply", st)
	}
	p, err := plan.Build(topo, e, int64(len(inputs[0])), 4, plan.Model{})
	if err != nil {
		t.Fatal(err)
	}
	p.Routes = rdma.RoutesFor(topo, st, c.net.Node(c.ring[0]).NICs())
	out := make([][]byte, stNodes)
	start := c.net.Now()
	c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
		out[i] = make([]byte, len(inputs[i]))
		send := inputs[i]
		if inPlace {
			copy(out[i], send)
			send = out[i]
		}
		return n.StartAllReduceWithPlan(topo, p, send, out[i], rings.F32, rings.Sum, done)
	})
	return c, out, p, c.net.Now() - start
}

var stCases = []struct {
	name  string
	st    plan.Strategy
	down  [][2]int
	exact bool // equal to the standard ring for any floats, not only exact sums
}{
	{"ring", plan.Ring, nil, true},
	{"hot_repair_x25", plan.HotRepair, [][2]int{{1, 2}}, true},
	{"balance_x25", plan.Balance, [][2]int{{1, 2}}, true},
	{"r2ccl_x25", plan.R2CCL, [][2]int{{1, 2}}, false},
	{"balance_x50", plan.Balance, [][2]int{{2, 0}, {2, 1}}, true},
	{"r2ccl_x50", plan.R2CCL, [][2]int{{2, 0}, {2, 1}}, false},
	{"recursive_two_nodes", plan.Recursive, [][2]int{{1, 0}, {3, 1}}, false},
	{"recursive_three_levels", plan.Recursive, [][2]int{{0, 3}, {2, 0}, {2, 1}}, false},
	{"optcc_x25", plan.OptCC, [][2]int{{1, 2}}, false},
	{"optcc_x50", plan.OptCC, [][2]int{{2, 0}, {2, 1}}, false},
	{"optcc_two_leaves", plan.OptCC, [][2]int{{1, 0}, {3, 1}}, false},
	{"weighted_x25", plan.Weighted, [][2]int{{1, 2}}, false},
	{"weighted_x50", plan.Weighted, [][2]int{{2, 0}, {2, 1}}, false},
	{"weighted_neighbours_two_rails", plan.Weighted, [][2]int{{1, 1}, {2, 2}}, false},
}

func TestPlannedStrategiesMatchStandardRing(t *testing.T) {
	for _, integer := range []bool{false, true} {
		var inputs [][]byte
		if integer {
			inputs = integerInputs(rand.New(rand.NewPCG(3, 1)), stNodes, stCount)
		} else {
			inputs = randomInputs(rand.New(rand.NewPCG(3, 2)), stNodes, stCount)
		}
		ref := newCluster(t, stNodes, stNICs, rdma.Config{ChunkBytes: 64 << 10, Window: 4})
		want, errs := ref.allReduce(t, inputs, rings.F32, rings.Sum)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("standard ring, node %d: %v", i, err)
			}
		}
		for _, tc := range stCases {
			if !integer && !tc.exact {
				continue
			}
			out, p, _ := runPlanned(t, tc.st, tc.down, inputs)
			for i := range out {
				if !bytes.Equal(out[i], want[0]) {
					g, w := rings.View[float32](out[i]), rings.View[float32](want[0])
					for j := range g {
						if math.Float32bits(g[j]) != math.Float32bits(w[j]) {
							t.Fatalf("%s (integer %v, parts %d): node %d element %d: %v, want %v", tc.name, integer, len(p.Parts), i, j, g[j], w[j])
						}
					}
				}
			}
		}
	}
}

func TestPlannedStrategiesAgreeOnEveryNode(t *testing.T) {
	inputs := randomInputs(rand.New(rand.NewPCG(5, 5)), stNodes, stCount)
	for _, tc := range stCases {
		out, _, _ := runPlanned(t, tc.st, tc.down, inputs)
		w := rings.View[float32](inputs[0])
		for i := range out {
			if !bytes.Equal(out[i], out[0]) {
				t.Fatalf("%s: node %d differs from node 0", tc.name, i)
			}
		}
		got := rings.View[float32](out[0])
		for j := range got {
			var sum float64
			for k := range inputs {
				sum += float64(rings.View[float32](inputs[k])[j])
			}
			if math.Abs(float64(got[j])-sum) > 1e-4*(1+math.Abs(sum)) {
				t.Fatalf("%s: element %d: %v, want about %v (first input %v)", tc.name, j, got[j], sum, w[j])
			}
		}
	}
}

// TestPlannerPredictionVersusSimulation logs the planner's predicted time and the simulator's
// measured (virtual) time of every strategy and asserts only that they are within a factor of three.
func TestPlannerPredictionVersusSimulation(t *testing.T) {
	inputs := integerInputs(rand.New(rand.NewPCG(9, 1)), stNodes, stCount)
	for _, tc := range stCases {
		_, p, took := runPlanned(t, tc.st, tc.down, inputs)
		measured := took.Seconds()
		errPct := 100 * (p.Seconds - measured) / measured
		t.Logf("%-24s predicted %8.1f µs  simulated %8.1f µs  error %+6.1f%%", tc.name, p.Seconds*1e6, measured*1e6, errPct)
		if p.Seconds > 3*measured || measured > 3*p.Seconds {
			t.Errorf("%s: prediction %v s and simulation %v s differ by more than 3x", tc.name, p.Seconds, measured)
		}
	}
}

// TestReplannerFollowsNICHealth runs planned calls while a NIC fails and heals: each node's planner
// learns the failure from the runtime's hot-repair view (Sync), re-plans away from the standard ring,
// and returns to it once the NIC has healed.
func TestReplannerFollowsNICHealth(t *testing.T) {
	c := newCluster(t, stNodes, stNICs, scConfig())
	ps := make([]*rdma.Replanner, stNodes)
	for i, n := range c.nodes {
		p, err := rdma.NewReplanner(n, stTopology(nil), plan.Config{Align: 4})
		if err != nil {
			t.Fatal(err)
		}
		ps[i] = p
	}
	inputs := integerInputs(rand.New(rand.NewPCG(4, 4)), stNodes, stCount)
	call := func(want func(plan.Strategy) bool) {
		t.Helper()
		out := make([][]byte, stNodes)
		chosen := make([]plan.Strategy, stNodes)
		c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
			out[i] = make([]byte, len(inputs[i]))
			p, err := ps[i].StartAllReduce(inputs[i], out[i], rings.F32, rings.Sum, done)
			chosen[i] = p.Strategy
			return err
		})
		for i := range out {
			if chosen[i] != chosen[0] || !want(chosen[i]) {
				t.Fatalf("node %d chose %v (node 0 %v)", i, chosen[i], chosen[0])
			}
			got, a := rings.View[float32](out[i]), make([]float32, stCount)
			for k := range inputs {
				for j, v := range rings.View[float32](inputs[k]) {
					a[j] += v
				}
			}
			for j := range got {
				if got[j] != a[j] {
					t.Fatalf("%v: node %d element %d: %v, want %v", chosen[i], i, j, got[j], a[j])
				}
			}
		}
	}
	sync := func() {
		for _, p := range ps {
			p.Sync()
		}
	}
	sync()
	call(func(s plan.Strategy) bool { return s == plan.Ring })

	c.net.SetPort(c.ring[1], 2, false)
	c.net.RunUntil(c.net.Now() + 2*time.Millisecond)
	sync()
	for i, p := range ps {
		if !p.Planner().Topology().Nodes[1].NICs[2].Down {
			t.Fatalf("node %d's planner does not know that NIC 2 of node 1 is down", i)
		}
	}
	call(func(s plan.Strategy) bool { return s != plan.Ring })

	c.net.SetPort(c.ring[1], 2, true)
	healed := func() bool {
		for _, n := range c.nodes {
			if n.Repair().Health(rdma.NICRef{Node: c.ring[1], NIC: 2}) == rdma.Down {
				return false
			}
		}
		return true
	}
	limit := c.net.Now() + 50*time.Millisecond
	c.net.RunWhile(func() bool { return !healed() && c.net.Now() < limit })
	if !healed() {
		t.Fatal("the runtime did not see NIC 2 of node 1 heal")
	}
	sync()
	call(func(s plan.Strategy) bool { return s == plan.Ring })
}

// TestPlannedBackToBack runs one planned call after another on the same nodes, with strategies
// whose gathers need different room after the message and new inputs each time: the working buffer
// a node keeps between calls must never leak one call's data into the next.
func TestPlannedBackToBack(t *testing.T) {
	c := newCluster(t, stNodes, stNICs, rdma.Config{ChunkBytes: 64 << 10, Window: 4})
	rng := rand.New(rand.NewPCG(6, 6))
	order := []int{5, 0, 8, 3, 7, 9, 1, 6, 10, 5, 2}
	for round, k := range order {
		tc := stCases[k]
		topo := stTopology(tc.down) // plans avoid the NICs they take as down; the fabric is healthy
		e, err := plan.Cost(topo, tc.st, float64(stCount*4), plan.Model{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := plan.Build(topo, e, stCount*4, 4, plan.Model{})
		if err != nil {
			t.Fatal(err)
		}
		p.Routes = rdma.RoutesFor(topo, tc.st, c.net.Node(c.ring[0]).NICs())
		inputs := integerInputs(rng, stNodes, stCount)
		out := make([][]byte, stNodes)
		c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
			out[i] = bytes.Repeat([]byte{0xff}, len(inputs[i])) // NaN everywhere
			return n.StartAllReduceWithPlan(topo, p, inputs[i], out[i], rings.F32, rings.Sum, done)
		})
		want := make([]float32, stCount)
		for _, in := range inputs {
			for j, v := range rings.View[float32](in) {
				want[j] += v
			}
		}
		for i := range out {
			for j, v := range rings.View[float32](out[i]) {
				if v != want[j] {
					t.Fatalf("round %d (%s, %d parts): node %d element %d: %v, want %v", round, tc.name, len(p.Parts), i, j, v, want[j])
				}
			}
		}
	}
}

// TestOptCCLevelsNICLoads runs OptCC's schedule with one node degraded and checks how evenly every
// node's healthy NICs share what it sends: within 10% of their mean at every node. A degraded leaf
// lacks the rails of its failed NICs, so its exchanges with the owners crowd the owners' other rails;
// split over the channels by NIC bandwidth alone, the owners' busiest NIC would send 17% (one NIC down)
// to 20% (two down) more than their mean.
func TestOptCCLevelsNICLoads(t *testing.T) {
	inputs := integerInputs(rand.New(rand.NewPCG(4, 4)), stNodes, 4*stCount)
	for _, down := range [][][2]int{{{1, 2}}, {{2, 0}, {2, 1}}} {
		c, out, _, _ := plannedCluster(t, rdma.Config{ChunkBytes: 64 << 10, Window: 4}, false, plan.OptCC, down, inputs)
		for i := range out {
			if !bytes.Equal(out[i], out[0]) {
				t.Fatalf("down %v: node %d's result differs from node 0's", down, i)
			}
		}
		for i, id := range c.ring {
			var sent []float64
			for nic := range stNICs {
				if !slices.Contains(down, [2]int{i, nic}) {
					sent = append(sent, float64(c.net.Node(id).SentBytes(rdma.NICID(nic))))
				}
			}
			mean := 0.0
			for _, b := range sent {
				mean += b / float64(len(sent))
			}
			if m := slices.Max(sent); m > 1.1*mean {
				t.Errorf("down %v: node %d's busiest NIC sends %.0f bytes, %.2f× its healthy NICs' mean", down, i, m, m/mean)
			}
		}
	}
}

// TestReplannerPricesOptCCOnNICs: the runtime's planner prices OptCC's schedule as the Node runs it on
// rail-matched NICs, not only by the pooled model. With one NIC of one node down it gives the leaf the
// whole message (Y = 1: the leaf then stays out of the ring, whose hops next to it would have lost a
// rail), at a price no lower than the model's; the run is correct and its busiest NIC sends less than
// with the model's share. With two nodes degraded on different rails, OptCC's leaves crowd the rails
// the core nodes have left: among R²CCL's strategies and OptCC the planner picks Balance, where the
// pooled model alone picks OptCC.
func TestReplannerPricesOptCCOnNICs(t *testing.T) {
	const bytes = 4 * stCount
	cfg := plan.Config{Align: 4}
	planned := func(down [][2]int) (*cluster, *rdma.Replanner) {
		c := newCluster(t, stNodes, stNICs, rdma.Config{ChunkBytes: 64 << 10, Window: 4})
		for _, d := range down {
			c.net.SetPort(c.ring[d[0]], rdma.NICID(d[1]), false)
		}
		p, err := rdma.NewReplanner(c.nodes[0], stTopology(nil), cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range down {
			if err := p.SetNICDown(d[0], d[1], true); err != nil {
				t.Fatal(err)
			}
		}
		return c, p
	}
	busiest := func(c *cluster, p plan.Plan, down [][2]int) uint64 {
		inputs := integerInputs(rand.New(rand.NewPCG(8, 8)), stNodes, stCount)
		out := make([][]byte, stNodes)
		c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
			out[i] = make([]byte, bytes)
			return n.StartAllReduceWithPlan(stTopology(down), p, inputs[i], out[i], rings.F32, rings.Sum, done)
		})
		for i := range out {
			for j, v := range rings.View[float32](out[i]) {
				var want float32
				for k := range inputs {
					want += rings.View[float32](inputs[k])[j]
				}
				if v != want {
					t.Fatalf("%v y=%.2f: node %d element %d: %v, want %v", p.Strategy, p.Y, i, j, v, want)
				}
			}
		}
		var m uint64
		for _, id := range c.ring {
			for nic := range stNICs {
				m = max(m, c.net.Node(id).SentBytes(rdma.NICID(nic)))
			}
		}
		return m
	}

	down := [][2]int{{1, 2}}
	c, p := planned(down)
	priced, err := p.PlanStrategy(plan.OptCC, bytes, 4)
	if err != nil {
		t.Fatal(err)
	}
	e, err := plan.Cost(stTopology(down), plan.OptCC, bytes, plan.Model{GatherFirst: true})
	if err != nil {
		t.Fatal(err)
	}
	if priced.Y != 1 || priced.Seconds < e.Seconds {
		t.Fatalf("one NIC down: priced OptCC has Y = %.2f and %.3g s, want Y = 1 and at least the model's %.3g s", priced.Y, priced.Seconds, e.Seconds)
	}
	model, err := plan.Build(stTopology(down), e, bytes, 4, plan.Model{GatherFirst: true})
	if err != nil {
		t.Fatal(err)
	}
	model.Routes = rdma.RoutesFor(stTopology(down), plan.OptCC, c.net.Node(c.ring[0]).NICs())
	if a, b := busiest(c, priced, down), busiest(c, model, down); a >= b {
		t.Errorf("one NIC down: the busiest NIC sends %d bytes at Y = 1, %d at the model's Y = %.2f", a, b, e.Y)
	}

	down = [][2]int{{1, 0}, {3, 1}}
	cfg.Strategies = append(slices.Clone(plan.R2CCLStrategies), plan.OptCC)
	c, p = planned(down)
	chosen, err := p.Plan(bytes, 4)
	if err != nil {
		t.Fatal(err)
	}
	pooled, err := plan.Choose(stTopology(down), bytes, plan.Config{Align: 4, Strategies: cfg.Strategies, Model: plan.Model{GatherFirst: true}})
	if err != nil {
		t.Fatal(err)
	}
	if chosen.Strategy != plan.Balance || pooled.Strategy != plan.OptCC {
		t.Fatalf("two nodes down: the runtime picks %v and the pooled model %v, want Balance and OptCC", chosen.Strategy, pooled.Strategy)
	}
	busiest(c, chosen, down)
}

// pricedCluster is a simulated cluster of stNodes nodes with stNICs NICs of bandwidth bw each, the
// latency the planner is given, and the (node, NIC) pairs of down taken down.
func pricedCluster(t *testing.T, bw float64, down [][2]int) (*cluster, plan.Topology) {
	t.Helper()
	desc := make([]rdma.NIC, stNICs)
	for i := range desc {
		desc[i] = rdma.NIC{Bandwidth: bw}
	}
	c := newClusterOf(t, stNodes, desc, 100*time.Microsecond, rdma.Config{ChunkBytes: 256 << 10, Window: 4})
	topo := plan.Uniform(stNodes, stNICs, 1, 100e-6, bw)
	topo.GPUsPerNode = 1
	for _, d := range down {
		c.net.SetPort(c.ring[d[0]], rdma.NICID(d[1]), false)
		topo.Nodes[d[0]].NICs[d[1]].Down = true
	}
	return c, topo
}

// TestPricedPlansFollowRuns runs, on a bandwidth-bound simulated fabric, Balance, OptCC's schedule
// and the weighted rings as the runtime prices them (rdma.Replanner.PlanStrategy), with one NIC down
// and with two neighbouring nodes each missing a NIC on different rails. Every result must be exact
// on every node; in both cases the weighted rings (two rings, every link split over rails by the
// program) must be the fastest and the planner's choice, and within 10% of the bound; Balance and
// the weighted rings must run within 5% of their prices, and OptCC's schedule no faster than its
// price (which carries leafRunFactor).
func TestPricedPlansFollowRuns(t *testing.T) {
	const bw = 50e6 // 400 Mbit/s, as bench/schedules
	inputs := integerInputs(rand.New(rand.NewPCG(11, 3)), stNodes, 2<<20)
	want := make([]float32, len(inputs[0])/4)
	for _, in := range inputs {
		for j, v := range rings.View[float32](in) {
			want[j] += v
		}
	}
	for _, tc := range []struct {
		name   string
		down   [][2]int
		chosen plan.Strategy
	}{
		{"one_nic_x25", [][2]int{{1, 1}}, plan.Weighted},
		{"neighbours_two_rails", [][2]int{{1, 1}, {2, 2}}, plan.Weighted},
	} {
		took := map[plan.Strategy]float64{}
		var ideal float64
		for _, st := range []plan.Strategy{plan.Balance, plan.OptCC, plan.Weighted} {
			c, topo := pricedCluster(t, bw, tc.down)
			pd, err := rdma.NewReplanner(c.nodes[0], topo, plan.Config{Align: 4})
			if err != nil {
				t.Fatal(err)
			}
			p, err := pd.PlanStrategy(st, int64(len(inputs[0])), 4)
			if err != nil {
				t.Fatal(err)
			}
			if st == plan.Balance {
				chosen, err := pd.Plan(int64(len(inputs[0])), 4)
				if err != nil {
					t.Fatal(err)
				}
				if chosen.Strategy != tc.chosen {
					t.Errorf("%s: the planner chose %v at %.4f s, want %v", tc.name, chosen.Strategy, chosen.Seconds, tc.chosen)
				}
			}
			out := make([][]byte, stNodes)
			start := c.net.Now()
			c.runAllWithin(t, time.Minute, func(i int, n *rdma.Node, done func(error)) error {
				out[i] = make([]byte, len(inputs[i]))
				return n.StartAllReduceWithPlan(topo, p, inputs[i], out[i], rings.F32, rings.Sum, done)
			})
			took[st] = (c.net.Now() - start).Seconds()
			for i := range out {
				for j, v := range rings.View[float32](out[i]) {
					if v != want[j] {
						t.Fatalf("%s %v: node %d element %d: %v, want %v", tc.name, st, i, j, v, want[j])
					}
				}
			}
			ratio := took[st] / p.Seconds
			ideal = p.IdealSeconds
			t.Logf("%s %-14v price %.4f s, simulated %.4f s (%.3f×), %.3f× the bound", tc.name, st, p.Seconds, took[st], ratio, took[st]/p.IdealSeconds)
			switch {
			case st == plan.OptCC && ratio < 0.99:
				t.Errorf("%s: OptCC ran at %.3f× its price, faster than priced", tc.name, ratio)
			case st != plan.OptCC && (ratio > 1.05 || ratio < 0.95):
				t.Errorf("%s %v: ran at %.3f× its price, want within 5%%", tc.name, st, ratio)
			}
		}
		if took[plan.Weighted] >= took[plan.Balance] || took[plan.Weighted] >= took[plan.OptCC] {
			t.Errorf("%s: weighted rings %.4f s, Balance %.4f s, OptCC %.4f s: want the weighted rings fastest", tc.name, took[plan.Weighted], took[plan.Balance], took[plan.OptCC])
		}
		if r := took[plan.Weighted] / ideal; r > 1.10 {
			t.Errorf("%s: weighted rings at %.3f× the bound, want within 1.10", tc.name, r)
		}
	}
}

// measuredTopology is stTopology with every NIC's bandwidth drawn within ±2.5% of stBW, as a
// calibration (Node.Calibrate) reports a healthy fabric: the nodes' bandwidths differ a little, so
// that the planner's levels can make one node the only fastest.
func measuredTopology(rng *rand.Rand, down [][2]int) plan.Topology {
	t := stTopology(down)
	for i := range t.Nodes {
		for j := range t.Nodes[i].NICs {
			t.Nodes[i].NICs[j].Beta = 1 / (stBW * (0.975 + 0.05*rng.Float64()))
		}
	}
	return t
}

// On measured figures every strategy the planner prices makes a plan that runs and gives the exact
// sum on every node, except OptCC's with a single fastest node as its core, which the runtime does
// not run: rdma.Replanner neither chooses it nor builds it (it chose it on the netns testbed once, and
// the call failed), and its choice runs.
func TestPlansOnMeasuredTopologiesRun(t *testing.T) {
	inputs := integerInputs(rand.New(rand.NewPCG(3, 1)), stNodes, stCount)
	ref := newCluster(t, stNodes, stNICs, rdma.Config{ChunkBytes: 64 << 10, Window: 4})
	want, errs := ref.allReduce(t, inputs, rings.F32, rings.Sum)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("standard ring, node %d: %v", i, err)
		}
	}
	check := func(what string, out [][]byte) {
		t.Helper()
		for i := range out {
			if !bytes.Equal(out[i], want[0]) {
				t.Fatalf("%s: node %d's result differs from the exact sum", what, i)
			}
		}
	}
	rng := rand.New(rand.NewPCG(9, 9))
	singleCore := 0
	for trial := range 8 {
		var down [][2]int
		if trial%2 == 1 {
			down = [][2]int{{rng.IntN(stNodes), rng.IntN(stNICs)}}
		}
		topo := measuredTopology(rng, down)
		for _, st := range plan.AllStrategies {
			e, err := plan.Cost(topo, st, float64(len(inputs[0])), plan.Model{})
			if err != nil {
				t.Fatal(err)
			}
			if math.IsInf(e.Seconds, 1) {
				continue
			}
			if len(e.Leaves) > 0 && len(e.Rings[len(e.Rings)-1]) < 2 {
				// A single core node: the runtime's planner does not run this schedule (below).
				singleCore++
				continue
			}
			p, err := plan.Build(topo, e, int64(len(inputs[0])), 4, plan.Model{})
			if err != nil {
				t.Fatalf("trial %d, %v: %v", trial, st, err)
			}
			c := newCluster(t, stNodes, stNICs, rdma.Config{ChunkBytes: 64 << 10, Window: 4})
			for _, d := range down {
				c.net.SetPort(c.ring[d[0]], rdma.NICID(d[1]), false)
			}
			p.Routes = rdma.RoutesFor(topo, st, c.net.Node(c.ring[0]).NICs())
			out := make([][]byte, stNodes)
			c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
				out[i] = make([]byte, len(inputs[i]))
				return n.StartAllReduceWithPlan(topo, p, inputs[i], out[i], rings.F32, rings.Sum, done)
			})
			check(fmt.Sprintf("trial %d, %v", trial, st), out)
		}
		c := newCluster(t, stNodes, stNICs, rdma.Config{ChunkBytes: 64 << 10, Window: 4})
		for _, d := range down {
			c.net.SetPort(c.ring[d[0]], rdma.NICID(d[1]), false)
		}
		out := make([][]byte, stNodes)
		c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
			ps, err := rdma.NewReplanner(n, topo, plan.Config{Align: 4, Margin: 0.02})
			if err != nil {
				return err
			}
			e, err := plan.Cost(topo, plan.OptCC, float64(len(inputs[0])), plan.Model{})
			if err != nil {
				return err
			}
			if _, err := ps.PlanStrategy(plan.OptCC, int64(len(inputs[0])), 4); len(e.Leaves) > 0 && len(e.Rings[1]) < 2 && !errors.Is(err, rdma.ErrInvalid) {
				t.Fatalf("trial %d: OptCC with a single core node: %v, want ErrInvalid", trial, err)
			}
			out[i] = make([]byte, len(inputs[i]))
			_, err = ps.StartAllReduce(inputs[i], out[i], rings.F32, rings.Sum, done)
			return err
		})
		check(fmt.Sprintf("trial %d, the planner's choice", trial), out)
	}
	if singleCore == 0 {
		t.Fatal("no trial had a single fastest node: the test does not exercise OptCC's refusal")
	}
}

// TestPlannedWithNICsDeclaringDifferentBandwidths: a planned AllReduce starts from the same channel
// weights as the plain collectives, so nodes whose NICs declare different bandwidths (one at half
// speed, one reporting none) still cut alike, with Balance around a failed NIC as on a healthy ring.
func TestPlannedWithNICsDeclaringDifferentBandwidths(t *testing.T) {
	descs := make([][]rdma.NIC, stNodes)
	for i := range descs {
		descs[i] = make([]rdma.NIC, stNICs)
		for j := range descs[i] {
			descs[i][j] = rdma.NIC{Bandwidth: stBW}
		}
	}
	descs[2][1].Bandwidth = stBW / 2
	descs[3][0].Bandwidth = 0
	inputs := integerInputs(rand.New(rand.NewPCG(5, 6)), stNodes, 9001)
	want := make([]float32, 9001)
	for _, in := range inputs {
		for j, v := range rings.View[float32](in) {
			want[j] += v
		}
	}
	for _, c := range []struct {
		st   plan.Strategy
		down [][2]int
	}{{plan.Ring, nil}, {plan.Balance, [][2]int{{1, 2}}}} {
		cl := newClusterEach(t, descs, 2*time.Microsecond, rdma.Config{ChunkBytes: 4096})
		for _, d := range c.down {
			cl.net.SetPort(cl.ring[d[0]], rdma.NICID(d[1]), false)
		}
		topo := stTopology(c.down)
		e, err := plan.Cost(topo, c.st, float64(len(inputs[0])), plan.Model{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := plan.Build(topo, e, int64(len(inputs[0])), 4, plan.Model{})
		if err != nil {
			t.Fatal(err)
		}
		p.Routes = rdma.RoutesFor(topo, c.st, descs[0])
		out := make([][]byte, stNodes)
		cl.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
			out[i] = make([]byte, len(inputs[i]))
			return n.StartAllReduceWithPlan(topo, p, inputs[i], out[i], rings.F32, rings.Sum, done)
		})
		for i := range out {
			for j, v := range rings.View[float32](out[i]) {
				if v != want[j] {
					t.Fatalf("%v: node %d element %d: %v, want %v", c.st, i, j, v, want[j])
				}
			}
		}
	}
}
