package rdma_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/plan"
	"github.com/concord-ccl/concord/rdma/sim"
	"github.com/concord-ccl/concord/rings"
)

// TestPlannerPredictionAtTestbedScale is TestPlannerPredictionVersusSimulation on a simulated copy of
// the netns testbed (4 nodes × 4 NICs at 400 Mbit/s, 100 µs latency, the benchmark's deadlines) with
// NIC 1 of node 1 down: it logs the model's and the simulator's times and asserts a factor of three.
func TestPlannerPredictionAtTestbedScale(t *testing.T) {
	for _, st := range []plan.Strategy{plan.HotRepair, plan.Balance, plan.R2CCL} {
		c := &cluster{net: sim.New(sim.Config{Latency: 100 * time.Microsecond})}
		for i := range 4 {
			c.ring = append(c.ring, rdma.NodeID(i+1))
		}
		desc := make([]rdma.NIC, 4)
		for i := range desc {
			desc[i] = rdma.NIC{Bandwidth: 50e6}
		}
		for _, id := range c.ring {
			c.net.AddNode(id, desc)
		}
		for _, id := range c.ring {
			n, err := rdma.NewNode(c.net.Node(id), c.ring, rdma.Config{Repair: rdma.RepairConfig{MinAckTimeout: 5 * time.Second,
				MaxAckTimeout: 10 * time.Second, ProbeTimeout: 2 * time.Second, StallTimeout: 20 * time.Second}})
			if err != nil {
				t.Fatal(err)
			}
			c.nodes = append(c.nodes, n)
		}
		c.net.RunUntil(c.net.Now() + time.Millisecond)
		c.net.SetPort(c.ring[1], 1, false)
		topo := plan.Uniform(4, 4, 1, 100e-6, 50e6)
		topo.GPUsPerNode = 1
		topo.Nodes[1].NICs[1].Down = true
		const size = 4 << 20
		e, _ := plan.Cost(topo, st, size, plan.Model{})
		p, _ := plan.Build(topo, e, size, 4, plan.Model{})
		p.Routes = rdma.RoutesFor(topo, st, desc)
		in := integerInputs(rand.New(rand.NewPCG(1, 1)), 4, size/4)
		out := make([][]byte, 4)
		errs := make([]error, 4)
		done := make([]bool, 4)
		start := c.net.Now()
		for i, n := range c.nodes {
			out[i] = make([]byte, size)
			if err := n.StartAllReduceWithPlan(topo, p, in[i], out[i], rings.F32, rings.Sum, func(err error) { errs[i], done[i] = err, true }); err != nil {
				t.Fatal(err)
			}
		}
		c.net.RunWhile(func() bool { return !(done[0] && done[1] && done[2] && done[3]) && c.net.Now()-start < 60*time.Second })
		took := (c.net.Now() - start).Seconds()
		for i := range errs {
			if !done[i] || errs[i] != nil {
				t.Fatalf("%v: node %d: done %v, %v", st, i, done[i], errs[i])
			}
		}
		t.Logf("%-16v predicted %7.1f ms  simulated %7.1f ms  error %+5.1f%%", st, e.Seconds*1e3, took*1e3, 100*(e.Seconds-took)/took)
		if e.Seconds > 3*took || took > 3*e.Seconds {
			t.Errorf("%v: prediction %v s and simulation %v s differ by more than 3x", st, e.Seconds, took)
		}
	}
}
