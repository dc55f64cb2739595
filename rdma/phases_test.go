package rdma_test

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/plan"
	"github.com/concord-ccl/concord/rings"
)

// phaseRun runs a planned reduce-scatter then a planned all-gather of inputs on a fresh cluster with
// the NICs of down taken down, each node planning with its own Replanner fed the runtime's health.
// It returns the plan, the gathered results, and the virtual time of the reduce-scatter.
func phaseRun(t *testing.T, down [][2]int, inputs [][]byte, force *plan.Strategy) (plan.Plan, [][]byte, [][]byte, time.Duration) {
	t.Helper()
	c := newCluster(t, stNodes, stNICs, rdma.Config{ChunkBytes: 64 << 10, Window: 4})
	for _, d := range down {
		c.net.SetPort(c.ring[d[0]], rdma.NICID(d[1]), false)
	}
	ps := make([]*rdma.Replanner, stNodes)
	for i, n := range c.nodes {
		p, err := rdma.NewReplanner(n, stTopology(nil), plan.Config{Align: 4})
		if err != nil {
			t.Fatal(err)
		}
		ps[i] = p
	}
	// Port events reach the NICs' own nodes first; the others learn them through the repair
	// protocol's verdicts.
	c.net.RunUntil(c.net.Now() + 2*time.Millisecond)
	for _, p := range ps {
		p.Sync()
	}
	msg := len(inputs[0])
	plans := make([]plan.Plan, stNodes)
	for i, p := range ps {
		var err error
		if force != nil {
			plans[i], err = p.PlanStrategy(*force, int64(msg), 4)
		} else {
			plans[i], err = p.PhasePlan(int64(msg), 4)
		}
		if err != nil {
			t.Fatal(err)
		}
		if plans[i].Strategy != plans[0].Strategy || !slices.Equal(plans[i].Parts[0].Ring, plans[0].Parts[0].Ring) {
			t.Fatalf("node %d planned %v on %v, node 0 %v on %v", i, plans[i].Strategy, plans[i].Parts[0].Ring, plans[0].Strategy, plans[0].Parts[0].Ring)
		}
	}
	topo := ps[0].Planner().Topology()
	blk := msg / stNodes
	scattered := make([][]byte, stNodes)
	start := c.net.Now()
	c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
		scattered[i] = make([]byte, blk)
		return n.StartReduceScatterWithPlan(topo, plans[i], inputs[i], scattered[i], rings.F32, rings.Sum, done)
	})
	took := c.net.Now() - start
	gathered := make([][]byte, stNodes)
	c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
		gathered[i] = make([]byte, msg)
		return n.StartAllGatherWithPlan(topo, plans[i], scattered[i], gathered[i], rings.F32, done)
	})
	return plans[0], scattered, gathered, took
}

// TestPlannedPhases checks the planned reduce-scatter and all-gather element by element on a healthy
// fabric, with one NIC down, and with two neighbours down on different rails, where the planner's
// bridge re-ranking reorders the ring: block r of the sum lands on the node at ring position r
// whatever the plan's ring order, and every node gathers the same bytes.
func TestPlannedPhases(t *testing.T) {
	inputs := integerInputs(rand.New(rand.NewPCG(45, 1)), stNodes, stCount)
	want := make([]float32, stCount)
	for _, in := range inputs {
		for j, v := range rings.View[float32](in) {
			want[j] += v
		}
	}
	for _, tc := range []struct {
		name     string
		down     [][2]int
		st       plan.Strategy
		reranked bool
	}{
		{"healthy", nil, plan.Ring, false},
		{"one_nic_down", [][2]int{{1, 2}}, plan.Balance, false},
		{"neighbours_on_different_rails", [][2]int{{0, 1}, {1, 2}}, plan.Balance, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, scattered, gathered, _ := phaseRun(t, tc.down, inputs, nil)
			if p.Strategy != tc.st || p.Reranked != tc.reranked {
				t.Fatalf("planned %v (reranked %v) on ring %v, want %v (reranked %v)", p.Strategy, p.Reranked, p.Parts[0].Ring, tc.st, tc.reranked)
			}
			if tc.reranked && slices.Equal(p.Parts[0].Ring, []int{0, 1, 2, 3}) {
				t.Fatalf("re-ranked plan keeps ring %v", p.Parts[0].Ring)
			}
			blk := stCount / stNodes
			for i := range scattered {
				got := rings.View[float32](scattered[i])
				for j, v := range got {
					if v != want[i*blk+j] {
						t.Fatalf("node %d: reduce-scatter element %d = %v, want %v", i, j, v, want[i*blk+j])
					}
				}
				g := rings.View[float32](gathered[i])
				for j, v := range g {
					if v != want[j] {
						t.Fatalf("node %d: all-gather element %d = %v, want %v", i, j, v, want[j])
					}
				}
				if !bytes.Equal(gathered[i], gathered[0]) {
					t.Fatalf("node %d gathered other bytes than node 0", i)
				}
			}
		})
	}
}

// TestPlannedPhasesBeatHotRepair runs the reduce-scatter with one NIC of four down by the planner's
// choice and by hot repair: spreading the degraded node's bytes over its three healthy NICs takes
// less virtual time than doubling one NIC's load.
func TestPlannedPhasesBeatHotRepair(t *testing.T) {
	inputs := integerInputs(rand.New(rand.NewPCG(45, 2)), stNodes, stCount)
	down := [][2]int{{2, 0}}
	p, _, _, planned := phaseRun(t, down, inputs, nil)
	hr := plan.HotRepair
	_, _, _, repaired := phaseRun(t, down, inputs, &hr)
	if p.Strategy == plan.HotRepair || planned >= repaired {
		t.Fatalf("planned %v in %v, hot repair in %v", p.Strategy, planned, repaired)
	}
	t.Logf("%v %v, hot repair %v", p.Strategy, planned, repaired)
}

// TestPlannedPhasesRefuseOtherSchedules: plans without reduce-scatter halves, and ring plans whose
// ring is not an order of every node, are refused.
func TestPlannedPhasesRefuseOtherSchedules(t *testing.T) {
	c := newCluster(t, stNodes, stNICs, scConfig())
	topo := stTopology([][2]int{{1, 2}})
	e, err := plan.Cost(topo, plan.R2CCL, float64(stCount*4), plan.Model{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := plan.Build(topo, e, stCount*4, 4, plan.Model{})
	if err != nil {
		t.Fatal(err)
	}
	p.Routes = rdma.RoutesFor(topo, p.Strategy, c.net.Node(c.ring[0]).NICs())
	send, recv := make([]byte, stCount*4), make([]byte, stCount)
	if err := c.nodes[0].StartReduceScatterWithPlan(topo, p, send, recv, rings.F32, rings.Sum, func(error) {}); err == nil {
		t.Fatal("an R²CCL plan ran as a reduce-scatter")
	}
	// A ring plan whose ring misses a node, or names one twice, is refused too.
	e, err = plan.Cost(topo, plan.Balance, float64(stCount*4), plan.Model{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ring := range [][]int{{0, 1, 2}, {0, 1, 2, 2}} {
		p, err := plan.Build(topo, e, stCount*4, 4, plan.Model{})
		if err != nil {
			t.Fatal(err)
		}
		p.Routes = rdma.RoutesFor(topo, p.Strategy, c.net.Node(c.ring[0]).NICs())
		p.Parts[0].Ring = ring
		if err := c.nodes[0].StartAllGatherWithPlan(topo, p, recv, send, rings.F32, func(error) {}); err == nil {
			t.Fatalf("a plan on ring %v ran", ring)
		}
	}
}
