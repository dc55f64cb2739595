package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/cluster"
)

func TestMain(m *testing.M) {
	cluster.Main(roles) // the peers are this test binary, re-executed
	goleak.VerifyTestMain(m)
}

var t0 = time.Unix(1_700_000_000, 0)

func kinds(c *checker) []string {
	var out []string
	for _, v := range c.violations {
		out = append(out, v.Kind)
	}
	return out
}

// TestCheckerAcceptsGoodLog feeds a log with churn that breaks nothing.
func TestCheckerAcceptsGoodLog(t *testing.T) {
	c := newChecker(10*time.Second, 2)
	c.tick(t0, 3)
	c.synced(t0, "a/1", 1, 0xaa, 0, false)
	c.synced(t0, "b/2", 1, 0xaa, 0, false)
	c.completed(t0.Add(100 * time.Millisecond))
	c.aborted(t0, "a/1", 2, true, "")
	c.synced(t0.Add(time.Second), "a/1", 2, 0xbb, 0, false)
	c.synced(t0.Add(time.Second), "c/3", 2, 0xbb, 1, true) // a newcomer fetches, and jumps
	c.sessionEnded("b/2")
	c.synced(t0.Add(2*time.Second), "b/7", 3, 0xcc, 1, true) // the same process, rejoined
	c.synced(t0.Add(2*time.Second), "a/1", 3, 0xcc, 0, false)
	c.completed(t0.Add(2 * time.Second))
	c.tick(t0.Add(11*time.Second), 3)
	c.tick(t0.Add(30*time.Second), 1) // too few peers: no stall
	c.tick(t0.Add(39*time.Second), 2) // the clock restarts when enough peers are back
	c.finish(t0.Add(40 * time.Second))
	if len(c.violations) != 0 {
		t.Fatalf("violations on a good log: %v", c.violations)
	}
}

// TestCheckerAllowsCommitLostWithMaster: the master dies after sending revision 6's commit to b only;
// the new master takes 6 as accepted (b reports it), so a's next sync is revision 7.
func TestCheckerAllowsCommitLostWithMaster(t *testing.T) {
	c := newChecker(10*time.Second, 2)
	c.synced(t0, "a/1", 5, 0xaa, 0, false)
	c.synced(t0, "b/2", 5, 0xaa, 0, false)
	c.synced(t0, "b/2", 6, 0xaa, 0, false)
	c.masterRestarted()
	c.synced(t0, "b/2", 7, 0xaa, 0, false)
	c.synced(t0, "a/1", 7, 0xaa, 0, false)
	c.finish(t0)
	if len(c.violations) != 0 {
		t.Fatalf("violations: %v", c.violations)
	}
}

// TestCheckerCatchesEveryInvariant feeds one broken log per invariant: the checker cannot pass
// silently.
func TestCheckerCatchesEveryInvariant(t *testing.T) {
	for _, tc := range []struct {
		name string
		feed func(c *checker)
		want string
		rev  uint64
	}{
		{"two hashes for one revision", func(c *checker) {
			c.synced(t0, "a/1", 5, 0xaa, 0, false)
			c.synced(t0, "b/2", 5, 0xab, 0, false)
		}, vTwoHashes, 5},
		{"skipped revision in a session", func(c *checker) {
			c.synced(t0, "a/1", 5, 0xaa, 0, false)
			c.synced(t0, "a/1", 7, 0xac, 0, false)
		}, vRevisionStep, 7},
		{"revision skipped across a master restart that nobody accepted", func(c *checker) {
			c.synced(t0, "a/1", 5, 0xaa, 0, false)
			c.masterRestarted()
			c.synced(t0, "a/1", 7, 0xac, 0, false)
		}, vRevisionStep, 7},
		{"revision accepted elsewhere skipped without a master restart", func(c *checker) {
			c.synced(t0, "a/1", 5, 0xaa, 0, false)
			c.synced(t0, "b/2", 5, 0xaa, 0, false)
			c.synced(t0, "b/2", 6, 0xab, 0, false)
			c.synced(t0, "a/1", 7, 0xac, 0, false)
		}, vRevisionStep, 7},
		{"repeated revision in a session", func(c *checker) {
			c.synced(t0, "a/1", 5, 0xaa, 0, false)
			c.synced(t0, "a/1", 5, 0xaa, 0, false)
		}, vRevisionStep, 5},
		{"revision never accepted by the group", func(c *checker) {
			c.synced(t0, "a/1", 5, 0xaa, 0, false)
			c.synced(t0, "b/2", 7, 0xac, 1, true)
			c.finish(t0)
		}, vRevisionGap, 6},
		{"holder fetched", func(c *checker) {
			c.synced(t0, "a/1", 5, 0xaa, 0, false)
			c.synced(t0, "a/1", 6, 0xab, 1, false)
		}, vDiverged, 6},
		{"wrong element", func(c *checker) {
			c.wrongElement(t0, "a/1", 9, "tag 1 element 3: 7, want 8")
		}, vWrongElement, 9},
		{"buffer not restored", func(c *checker) {
			c.aborted(t0, "a/1", 9, false, "tag 2 element 0")
		}, vNotRestored, 9},
		{"stall", func(c *checker) {
			c.tick(t0, 2)
			c.completed(t0.Add(time.Second))
			c.tick(t0.Add(5*time.Second), 3)
			c.tick(t0.Add(11500*time.Millisecond), 2)
			c.tick(t0.Add(20*time.Second), 2) // reported once
		}, vStall, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newChecker(10*time.Second, 2)
			tc.feed(c)
			if got := kinds(c); !slices.Equal(got, []string{tc.want}) {
				t.Fatalf("violations %v, want exactly [%s]", c.violations, tc.want)
			}
			if got := c.violations[0].Revision; got != tc.rev {
				t.Fatalf("revision %d, want %d", got, tc.rev)
			}
		})
	}
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
}

// TestSoakCatchesStaleUpdate runs the soak with peers that apply the state update after a failed
// step, as a bug would: the soak must report that their states diverged.
func TestSoakCatchesStaleUpdate(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: skipped with -short")
	}
	sum := soakTest(t, 15*time.Second, "stale-update")
	if sum.Violations == 0 {
		t.Fatalf("no violation with stale updates: %+v", sum)
	}
	for _, v := range sum.ViolationList {
		if v.Kind != vDiverged && v.Kind != vTwoHashes {
			t.Errorf("unexpected violation %s", v)
		}
	}
}
