package main

import (
	"testing"
	"time"

	"go.uber.org/goleak"
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
