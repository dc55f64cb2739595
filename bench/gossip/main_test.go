package main

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/internal/hosts"
)

func TestMain(m *testing.M) {
	cluster.Main(roles)
	// memberlist does not wait for a probe in flight when it shuts down (internal/gossip's Close).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

// TestGossipSmall runs the benchmark small: three peers, a short window, one round of each detection
// case of the lan timing. Gossip must cost something measurable, the peers must send bytes, and the
// stopped peer must be removed both ways, by the heartbeat rule without gossip.
func TestGossipSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("runs processes on a test bed")
	}
	if err := hosts.Available(); err != nil {
		t.Skipf("runs on network namespaces, which need root: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b := &bench{peers: 3, lifetime: 5 * time.Minute}
	res, err := b.run(ctx, 3*time.Second, 1, []string{"lan"})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	t.Logf("%+v", res)
	if res.BytesOff <= 0 || res.BytesOn <= res.BytesOff {
		t.Errorf("bytes per second per peer: %v without gossip, %v with: want some, and more with gossip", res.BytesOff, res.BytesOn)
	}
	if len(res.Detect) != 2 {
		t.Fatalf("%d detection cases, want 2", len(res.Detect))
	}
	for _, d := range res.Detect {
		if len(d.KickS) != 1 || d.KickS[0] <= 0 {
			t.Errorf("%+v: want one positive removal time", d)
		}
		if !d.Gossip && d.By["heartbeat"] != 1 {
			t.Errorf("without gossip the stopped peer was removed by %v", d.By)
		}
	}
	if res.GossipBoundS <= 0 {
		t.Errorf("gossip_bound_s %v", res.GossipBoundS)
	}
}
