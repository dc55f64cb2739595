package tcp

import (
	"context"
	"math"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/netlab"
	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/plan"
)

// TestCalibrateOnRealNICs runs the runtime's NIC calibration over this provider on a netns test bed
// (3 nodes × 2 NICs shaped to 200 Mbit/s), healthy and then with NIC 1 of node 1 down: every node
// gets the same table, every NIC but the down one is measured, and the down one is left to the base
// topology. The figures are logged, not asserted: they are wall-clock measurements.
func TestCalibrateOnRealNICs(t *testing.T) {
	if err := netlab.Available(); err != nil {
		t.Skipf("netns testbed unavailable: %v (run as root)", err)
	}
	lab, err := netlab.New(netlab.Config{Nodes: 3, NICs: 2, NICMbit: 200})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("tear the lab down: %v", err)
		}
	})
	var ring []rdma.NodeID
	var eps []*Endpoint
	for i, ln := range lab.Nodes() {
		cfg := Config{Node: rdma.NodeID(i), NetNS: ln.Path(), UserTimeout: 5 * time.Second}
		for _, nic := range ln.NICs() {
			cfg.NICs = append(cfg.NICs, NICConfig{Interface: nic.Name, Addr: nic.Addr, NUMANode: -1, Bandwidth: 25e6})
		}
		ep, err := Listen(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ep.Close() }) // runs before lab.Close
		eps = append(eps, ep)
		ring = append(ring, rdma.NodeID(i))
	}
	for _, a := range eps {
		for _, b := range eps {
			if a != b {
				if err := a.SetPeer(b.Node(), b.ListenAddrs()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	var nodes []*rdma.Node
	for _, ep := range eps {
		// Deadlines for a shared machine, as bench/schedules sets them: the first chunks wait for the
		// connections to come up.
		n, err := rdma.NewNode(ep, ring, rdma.Config{ChunkBytes: 256 << 10, Repair: rdma.RepairConfig{MinAckTimeout: 5 * time.Second,
			MaxAckTimeout: 10 * time.Second, ProbeTimeout: 2 * time.Second, StallTimeout: 20 * time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	healthy := calibrateAll(t, nodes)
	for i := range 3 {
		for j := range 2 {
			a, b := healthy.Alpha[i][j], healthy.Beta[i][j]
			if !(a > 0) || !(b > 0) || math.IsInf(a, 0) || math.IsInf(b, 0) {
				t.Errorf("healthy: node %d NIC %d: alpha %g, beta %g; want both measured", i, j, a, b)
				continue
			}
			t.Logf("healthy: node %d NIC %d: %.0f Mbit/s, alpha %.0f µs", i, j, 8/b/1e6, a*1e6)
		}
	}

	// NIC 1 of node 1 goes down: its neighbours find out when their sends to it stall, and route
	// around it; it is left unmeasured, every other NIC is measured in a direction that avoids it.
	if err := lab.SetNIC(1, 1, false); err != nil {
		t.Fatal(err)
	}
	cal := calibrateAll(t, nodes)
	for i := range 3 {
		for j := range 2 {
			a, b := cal.Alpha[i][j], cal.Beta[i][j]
			if i == 1 && j == 1 {
				if a != 0 || b != 0 {
					t.Errorf("the down NIC got alpha %g, beta %g; want it unmeasured", a, b)
				}
				continue
			}
			if !(a > 0) || !(b > 0) || math.IsInf(a, 0) || math.IsInf(b, 0) {
				t.Errorf("degraded: node %d NIC %d: alpha %g, beta %g; want both measured", i, j, a, b)
			}
		}
	}
	base := plan.Uniform(3, 2, 1, 1e-4, 25e6)
	topo := cal.Apply(base)
	if err := topo.Validate(); err != nil {
		t.Fatal(err)
	}
	if topo.Nodes[1].NICs[1] != base.Nodes[1].NICs[1] {
		t.Errorf("the unmeasured NIC became %+v, want the base's", topo.Nodes[1].NICs[1])
	}
}

// calibrateAll calibrates every node at once and returns the table, which must be the same on all.
func calibrateAll(t *testing.T, nodes []*rdma.Node) rdma.Calibration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cals := make([]rdma.Calibration, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cals[i], errs[i] = n.Calibrate(ctx, rdma.CalibrateConfig{Bytes: 1 << 20, Reps: 2})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			for k, n := range nodes {
				n.Do(func() { t.Logf("node %d notes: %v", k, n.Stats().Notes) })
			}
			t.Fatalf("node %d: %v", i, err)
		}
	}
	for i := 1; i < len(cals); i++ {
		if !reflect.DeepEqual(cals[i], cals[0]) {
			t.Fatalf("node %d's table differs from node 0's:\n%+v\n%+v", i, cals[i], cals[0])
		}
	}
	return cals[0]
}
