package main

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/netlab"
	"github.com/concord-ccl/concord/internal/wanemu"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBenchSmall runs the whole benchmark on a small buffer over unshaped-fast links: both AllReduces
// are correct, the hierarchical one sends fewer bytes between sites, and the peer kill aborts cleanly.
func TestBenchSmall(t *testing.T) {
	b := &bench{sites: 2, per: 3, size: 3<<16 + 12, iters: 1}
	out, err := b.run(shape{nic: 1e9, wan: 2e8, lanRTT: 100 * time.Microsecond, wanRTT: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if out["correct"] != true || out["peer_kill_aborted"] != true {
		t.Fatalf("correct %v, peer_kill_aborted %v", out["correct"], out["peer_kill_aborted"])
	}
	if f, h := out["flat_wan_bytes"].(int64), out["hier_wan_bytes"].(int64); h <= 0 || h >= f {
		t.Fatalf("WAN bytes: flat %d, hierarchical %d", f, h)
	}
}

// TestBenchFabric runs the benchmark as it runs by default as root: the site phases on the
// intra-site tier of a netns test bed, the sites in namespaces of their own joined by the emulated
// WAN link. The AllReduces run on the fabric and are correct, the hierarchical one sends fewer bytes
// across the WAN link, a NIC taken down mid-AllReduce is absorbed, and the peer kill (its sockets
// reset) aborts cleanly.
func TestBenchFabric(t *testing.T) {
	if err := netlab.Available(); err != nil {
		t.Skipf("skipping: the fabric run builds network namespaces: %v", err)
	}
	if err := wanemu.Available(); err != nil {
		t.Skipf("skipping: the sites' WAN link needs a TUN device: %v", err)
	}
	b := &bench{sites: 2, per: 2, size: 8 << 20, iters: 1, nics: 2, fabric: true, nsWAN: true}
	out, err := b.run(shape{nic: 25e6, wan: 50e6, lanRTT: 100 * time.Microsecond, wanRTT: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if out["site_tier"] != "rdma" || out["site_collectives"].(uint64) == 0 || out["wan"] != "netns" {
		t.Fatalf("site tier %v, %v collectives on the fabric, WAN %v", out["site_tier"], out["site_collectives"], out["wan"])
	}
	if f, h := out["flat_wan_bytes"].(int64), out["hier_wan_bytes"].(int64); h <= 0 || h >= f {
		t.Fatalf("WAN bytes: flat %d, hierarchical %d", f, h)
	}
	if out["correct"] != true || out["nic_fault_correct"] != true || out["peer_kill_aborted"] != true {
		t.Fatalf("correct %v, nic_fault_correct %v, peer_kill_aborted %v", out["correct"], out["nic_fault_correct"], out["peer_kill_aborted"])
	}
	if out["nic_fault_failovers"].(uint64) == 0 {
		t.Fatal("no path failed over after the NIC went down")
	}
}

// TestBenchDegraded runs the degraded-fabric measurement on a small buffer: with a NIC of four down
// on one peer, the one-site group runs by the planner with results right on every peer, and the
// group on hot repair only does not plan.
func TestBenchDegraded(t *testing.T) {
	if err := netlab.Available(); err != nil {
		t.Skipf("skipping: the fabric run builds network namespaces: %v", err)
	}
	b := &bench{sites: 2, per: 3, size: 4 << 20, iters: 1, mtu: 9000, degMbit: 200}
	out, err := b.degradedOnly()
	if err != nil {
		t.Fatal(err)
	}
	if out["nic_degraded_correct"] != true {
		t.Fatalf("nic_degraded_correct %v", out["nic_degraded_correct"])
	}
	if s := out["nic_degraded_strategy"]; s == "" || s == "hot_repair" || s == "ring" {
		t.Fatalf("the planner ran %q on the degraded fabric", s)
	}
	for _, k := range []string{"nic_degraded_seconds", "nic_degraded_hot_repair_seconds", "nic_degraded_ideal_seconds"} {
		if v, ok := out[k].(float64); !ok || v <= 0 {
			t.Fatalf("%s = %v", k, out[k])
		}
	}
}
