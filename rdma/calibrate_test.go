package rdma_test

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/plan"
	"github.com/concord-ccl/concord/rdma/sim"
)

// calibrationCluster is 4 simulated nodes × 4 NICs of 50 MB/s at 100 µs, except NIC 1 of the node at
// ring position 2, which runs at half that rate.
func calibrationCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{net: sim.New(sim.Config{Latency: 100 * time.Microsecond})}
	for i := range 4 {
		c.ring = append(c.ring, rdma.NodeID(i+1))
	}
	for i, id := range c.ring {
		desc := make([]rdma.NIC, 4)
		for j := range desc {
			desc[j] = rdma.NIC{Bandwidth: 50e6}
		}
		if i == 2 {
			desc[1].Bandwidth = 25e6
		}
		c.net.AddNode(id, desc)
	}
	for _, id := range c.ring {
		n, err := rdma.NewNode(c.net.Node(id), c.ring, rdma.Config{ChunkBytes: 256 << 10})
		if err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, n)
	}
	c.net.Run()
	return c
}

// calibrate runs a calibration on every node of c and returns each node's table.
func (c *cluster) calibrate(t *testing.T, cfg rdma.CalibrateConfig) []rdma.Calibration {
	t.Helper()
	out := make([]rdma.Calibration, len(c.nodes))
	errs := make([]error, len(c.nodes))
	done := make([]bool, len(c.nodes))
	for i, n := range c.nodes {
		if err := n.StartCalibrate(cfg, func(cal rdma.Calibration, err error) { out[i], errs[i], done[i] = cal, err, true }); err != nil {
			t.Fatal(err)
		}
	}
	limit := c.net.Now() + time.Minute
	c.net.RunWhile(func() bool { return c.net.Now() < limit && slices.Contains(done, false) })
	for i := range c.nodes {
		if !done[i] || errs[i] != nil {
			t.Fatalf("node %d: done %v, %v", i, done[i], errs[i])
		}
	}
	return out
}

func TestCalibrateMeasuresEveryNIC(t *testing.T) {
	c := calibrationCluster(t)
	cals := c.calibrate(t, rdma.CalibrateConfig{Bytes: 2 << 20, Reps: 2})
	for i := 1; i < len(cals); i++ {
		if !reflect.DeepEqual(cals[i], cals[0]) {
			t.Fatalf("node %d's table differs from node 0's:\n%+v\n%+v", i, cals[i], cals[0])
		}
	}
	cal := cals[0]
	for i := range 4 {
		for j := range 4 {
			want := 50e6
			if i == 2 && j == 1 {
				want = 25e6
			}
			bw := 1 / cal.Beta[i][j]
			if math.Abs(bw-want)/want > 0.05 {
				t.Errorf("node %d NIC %d: measured %.4g B/s, want %.4g within 5%%", i, j, bw, want)
			}
			// A tiny message's round trip: two latencies and a little serialization.
			if a := cal.Alpha[i][j]; a < 200e-6 || a > 1e-3 {
				t.Errorf("node %d NIC %d: alpha %.3g s, want 200 µs .. 1 ms", i, j, a)
			}
		}
	}
	// The planner's view: the nominal topology said 100 MB/s everywhere; the measured one knows
	// better, the slow NIC included.
	topo := cal.Apply(plan.Uniform(4, 4, 1, 0, 100e6))
	for i := range 4 {
		want := 200e6
		if i == 2 {
			want = 175e6
		}
		if got := topo.NodeBandwidth(i); math.Abs(got-want)/want > 0.05 {
			t.Errorf("node %d: measured topology has %.4g B/s, want %.4g", i, got, want)
		}
	}
	if err := topo.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestCalibrateAroundADownNIC: a NIC that is down is not measured (the base topology keeps its
// figures), its neighbours' NICs of that rail are measured in the direction that avoids it, and
// every node still gets the same table.
func TestCalibrateAroundADownNIC(t *testing.T) {
	c := calibrationCluster(t)
	c.net.SetPort(c.ring[2], 1, false)
	cals := c.calibrate(t, rdma.CalibrateConfig{Bytes: 1 << 20, Reps: 1})
	for i := 1; i < len(cals); i++ {
		if !reflect.DeepEqual(cals[i], cals[0]) {
			t.Fatalf("node %d's table differs from node 0's", i)
		}
	}
	cal := cals[0]
	if cal.Beta[2][1] != 0 || cal.Alpha[2][1] != 0 {
		t.Errorf("the down NIC got alpha %g, beta %g; want it unmeasured", cal.Alpha[2][1], cal.Beta[2][1])
	}
	for i := range 4 {
		for j := range 4 {
			if i == 2 && j == 1 {
				continue
			}
			if bw := 1 / cal.Beta[i][j]; math.Abs(bw-50e6)/50e6 > 0.05 {
				t.Errorf("node %d NIC %d: measured %.4g B/s, want 50 MB/s within 5%%", i, j, bw)
			}
		}
	}
	base := plan.Uniform(4, 4, 1, 7e-6, 80e6)
	topo := cal.Apply(base)
	if topo.Nodes[2].NICs[1] != base.Nodes[2].NICs[1] {
		t.Errorf("the unmeasured NIC became %+v, want the base's %+v", topo.Nodes[2].NICs[1], base.Nodes[2].NICs[1])
	}
	if base.Nodes[0].NICs[0].Beta != 1/80e6 {
		t.Error("Apply changed its argument")
	}
}

func TestCalibrateRejectsBadCalls(t *testing.T) {
	c := newCluster(t, 2, 2, rdma.Config{})
	for _, cfg := range []rdma.CalibrateConfig{{Bytes: 100}, {Bytes: 2 << 30}, {Reps: -1}, {Reps: 1000}} {
		if err := c.nodes[0].StartCalibrate(cfg, func(rdma.Calibration, error) {}); !errors.Is(err, rdma.ErrInvalid) {
			t.Errorf("%+v: got %v, want ErrInvalid", cfg, err)
		}
	}
	solo := newCluster(t, 1, 2, rdma.Config{})
	if err := solo.nodes[0].StartCalibrate(rdma.CalibrateConfig{}, func(rdma.Calibration, error) {}); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("a ring of one: got %v, want ErrInvalid", err)
	}
	if err := c.nodes[0].StartSend(make([]byte, 1<<20), c.ring[1], func(error) {}); err != nil {
		t.Fatal(err)
	}
	if err := c.nodes[0].StartCalibrate(rdma.CalibrateConfig{}, func(rdma.Calibration, error) {}); !errors.Is(err, rdma.ErrBusy) {
		t.Errorf("while a collective runs: got %v, want ErrBusy", err)
	}
}
