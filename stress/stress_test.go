package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/stress/invariant"
)

func TestMain(m *testing.M) {
	cluster.Main(roles) // the peers are this test binary, re-executed
	goleak.VerifyTestMain(m)
}

func TestPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	for _, tc := range []struct{ p, want float64 }{{50, 3}, {90, 5}, {99, 5}, {100, 5}, {0, 1}, {20, 1}, {21, 2}} {
		if got := percentile(xs, tc.p); got != tc.want {
			t.Errorf("percentile(%v) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("percentile of nothing = %v, want 0", got)
	}
}

// TestContributionsExact checks that the expected values the peers compare with are exact: sums of
// the largest contributions of 16 peers fit the element types without rounding or overflow.
func TestContributionsExact(t *testing.T) {
	var f float64
	var i int64
	for id := uint64(1); id <= 16; id++ {
		f += float64(contribF32(id, 1<<20, 1023))
		i += contribI64(id, 1<<20, 2047)
		if v := contribI64(id, 1<<20, 2047); v < 0 || v >= 1<<40 {
			t.Fatalf("I64 contribution %d out of [0, 2^40)", v)
		}
	}
	if f >= 1<<24 {
		t.Fatalf("F32 sum %v not exact", f)
	}
	if i < 0 {
		t.Fatalf("I64 sum overflowed: %d", i)
	}
}

// soakTest runs the soak in this process for d with faults every 300 to 600 ms.
func soakTest(t *testing.T, d time.Duration, brk string) Summary {
	t.Helper()
	o := defaultOptions()
	o.Duration, o.Seed, o.Break = d, 20261121, brk
	return soakWith(t, o)
}

// soakWith runs the soak in this process with o, faults every 300 to 600 ms.
func soakWith(t *testing.T, o options) Summary {
	t.Helper()
	d, brk := o.Duration, o.Break
	o.FaultMin, o.FaultMax = 300*time.Millisecond, 600*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	var log strings.Builder
	sum, err := run(ctx, o, &log)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if testing.Verbose() || (sum.Violations > 0 && brk == "") {
		t.Log(log.String())
	}
	return sum
}

// TestSoakShort runs the soak briefly: no violation, faults of several classes, collectives done.
func TestSoakShort(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: skipped with -short")
	}
	sum := soakTest(t, 15*time.Second, "")
	if sum.Violations != 0 {
		t.Fatalf("%d violations: %v", sum.Violations, sum.ViolationList)
	}
	classes := 0
	for _, n := range sum.Faults {
		if n > 0 {
			classes++
		}
	}
	if classes < 3 || sum.OpsCompleted == 0 {
		t.Fatalf("faults %v (want >= 3 classes), ops %d", sum.Faults, sum.OpsCompleted)
	}
	junkReachedPeers(t, sum)
}

// junkReachedPeers checks that junk faults, when several were dealt, reached peers' own ports.
func junkReachedPeers(t *testing.T, sum Summary) {
	t.Helper()
	if sum.Faults["junk"] >= 3 && sum.JunkPeerConns == 0 {
		t.Errorf("%d junk faults, none reached a peer's port", sum.Faults["junk"])
	}
}

// TestSoakGossip runs the soak briefly with the gossip failure detector on: no violation (a healthy
// peer the gossip verdict removes is one), collectives done.
func TestSoakGossip(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: skipped with -short")
	}
	o := defaultOptions()
	o.Duration, o.Seed, o.Gossip = 15*time.Second, 20261128, true
	sum := soakWith(t, o)
	if sum.Violations != 0 {
		t.Fatalf("%d violations: %v", sum.Violations, sum.ViolationList)
	}
	if !sum.Gossip || sum.OpsCompleted == 0 {
		t.Fatalf("gossip %v, ops %d", sum.Gossip, sum.OpsCompleted)
	}
	junkReachedPeers(t, sum)
}

// TestSoakCatchesStaleUpdate runs the soak with peers that apply the state update after a failed
// step, as a bug would: the soak must report that their states diverged. Only a step that fails
// while two or more of its peers stay in the group shows the bug, and when the first such step comes
// depends on how the kernel schedules the processes; the soak ends at its first violation, so the
// long limit costs time only when no such step comes early.
func TestSoakCatchesStaleUpdate(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: skipped with -short")
	}
	sum := soakTest(t, time.Minute, "stale-update")
	if sum.Violations == 0 {
		t.Fatalf("no violation with stale updates: %+v", sum)
	}
	t.Logf("caught after %.1f s, %d aborted steps: %s", sum.DurationS, sum.Aborts, sum.ViolationList[0])
	for _, v := range sum.ViolationList {
		if v.Kind != invariant.Diverged && v.Kind != invariant.TwoHashes {
			t.Errorf("unexpected violation %s", v)
		}
	}
}
