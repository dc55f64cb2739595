package invariant

import (
	"slices"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func kinds(c *Checker) []string {
	var out []string
	for _, v := range c.Violations() {
		out = append(out, v.Kind)
	}
	return out
}

// TestCheckerAcceptsGoodLog feeds a log with churn that breaks nothing.
func TestCheckerAcceptsGoodLog(t *testing.T) {
	c := New(10*time.Second, 2)
	c.Tick(t0, 3)
	c.Synced(t0, "a/1", 1, 0xaa, 0, false)
	c.Synced(t0, "b/2", 1, 0xaa, 0, false)
	c.Completed(t0.Add(100 * time.Millisecond))
	c.Aborted(t0, "a/1", 2, true, "")
	c.Synced(t0.Add(time.Second), "a/1", 2, 0xbb, 0, false)
	c.Synced(t0.Add(time.Second), "c/3", 2, 0xbb, 1, true) // a newcomer fetches, and jumps
	c.SessionEnded("b/2")
	c.Synced(t0.Add(2*time.Second), "b/7", 3, 0xcc, 1, true) // the same process, rejoined
	c.Synced(t0.Add(2*time.Second), "a/1", 3, 0xcc, 0, false)
	c.Completed(t0.Add(2 * time.Second))
	c.Tick(t0.Add(11*time.Second), 3)
	c.Tick(t0.Add(30*time.Second), 1) // too few peers: no stall
	c.Tick(t0.Add(39*time.Second), 2) // the clock restarts when enough peers are back
	c.Finish(t0.Add(40 * time.Second))
	if len(c.Violations()) != 0 {
		t.Fatalf("violations on a good log: %v", c.Violations())
	}
}

// TestCheckerAllowsCommitLostWithMaster: the master dies after sending revision 6's commit to b only;
// the new master takes 6 as accepted (b reports it), so a's next sync is revision 7.
func TestCheckerAllowsCommitLostWithMaster(t *testing.T) {
	c := New(10*time.Second, 2)
	c.Synced(t0, "a/1", 5, 0xaa, 0, false)
	c.Synced(t0, "b/2", 5, 0xaa, 0, false)
	c.Synced(t0, "b/2", 6, 0xaa, 0, false)
	c.MasterRestarted()
	c.Synced(t0, "b/2", 7, 0xaa, 0, false)
	c.Synced(t0, "a/1", 7, 0xaa, 0, false)
	c.Finish(t0)
	if len(c.Violations()) != 0 {
		t.Fatalf("violations: %v", c.Violations())
	}
}

// TestCheckerCatchesEveryInvariant feeds one broken log per invariant: the checker cannot pass
// silently.
func TestCheckerCatchesEveryInvariant(t *testing.T) {
	for _, tc := range []struct {
		name string
		feed func(c *Checker)
		want string
		rev  uint64
	}{
		{"two hashes for one revision", func(c *Checker) {
			c.Synced(t0, "a/1", 5, 0xaa, 0, false)
			c.Synced(t0, "b/2", 5, 0xab, 0, false)
		}, TwoHashes, 5},
		{"skipped revision in a session", func(c *Checker) {
			c.Synced(t0, "a/1", 5, 0xaa, 0, false)
			c.Synced(t0, "a/1", 7, 0xac, 0, false)
		}, RevisionStep, 7},
		{"revision skipped across a master restart that nobody accepted", func(c *Checker) {
			c.Synced(t0, "a/1", 5, 0xaa, 0, false)
			c.MasterRestarted()
			c.Synced(t0, "a/1", 7, 0xac, 0, false)
		}, RevisionStep, 7},
		{"revision accepted elsewhere skipped without a master restart", func(c *Checker) {
			c.Synced(t0, "a/1", 5, 0xaa, 0, false)
			c.Synced(t0, "b/2", 5, 0xaa, 0, false)
			c.Synced(t0, "b/2", 6, 0xab, 0, false)
			c.Synced(t0, "a/1", 7, 0xac, 0, false)
		}, RevisionStep, 7},
		{"repeated revision in a session", func(c *Checker) {
			c.Synced(t0, "a/1", 5, 0xaa, 0, false)
			c.Synced(t0, "a/1", 5, 0xaa, 0, false)
		}, RevisionStep, 5},
		{"revision never accepted by the group", func(c *Checker) {
			c.Synced(t0, "a/1", 5, 0xaa, 0, false)
			c.Synced(t0, "b/2", 7, 0xac, 1, true)
			c.Finish(t0)
		}, RevisionGap, 6},
		{"holder fetched", func(c *Checker) {
			c.Synced(t0, "a/1", 5, 0xaa, 0, false)
			c.Synced(t0, "a/1", 6, 0xab, 1, false)
		}, Diverged, 6},
		{"wrong element", func(c *Checker) {
			c.WrongElement(t0, "a/1", 9, "tag 1 element 3: 7, want 8")
		}, WrongElement, 9},
		{"buffer not restored", func(c *Checker) {
			c.Aborted(t0, "a/1", 9, false, "tag 2 element 0")
		}, NotRestored, 9},
		{"stall", func(c *Checker) {
			c.Tick(t0, 2)
			c.Completed(t0.Add(time.Second))
			c.Tick(t0.Add(5*time.Second), 3)
			c.Tick(t0.Add(11500*time.Millisecond), 2)
			c.Tick(t0.Add(20*time.Second), 2) // reported once
		}, Stall, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(10*time.Second, 2)
			tc.feed(c)
			if got := kinds(c); !slices.Equal(got, []string{tc.want}) {
				t.Fatalf("violations %v, want exactly [%s]", c.Violations(), tc.want)
			}
			if got := c.Violations()[0].Revision; got != tc.rev {
				t.Fatalf("revision %d, want %d", got, tc.rev)
			}
		})
	}
}

// TestCheckerExcusesOneFetchAfterTheMasterDied: a step that the master's death left applied on
// some peers only may cost either side one fetch, at its first sync after the restart.
func TestCheckerExcusesOneFetchAfterTheMasterDied(t *testing.T) {
	c := New(10*time.Second, 2)
	c.Synced(t0, "a/1", 5, 0xaa, 0, false)
	c.Synced(t0, "b/2", 5, 0xaa, 0, false)
	c.MasterRestarted()
	c.Synced(t0, "a/1", 6, 0xab, 1, false)
	c.Synced(t0, "b/2", 6, 0xab, 0, false)
	if len(c.Violations()) != 0 || c.Excused() != 1 {
		t.Fatalf("violations %v, excused %d: want none and one", c.Violations(), c.Excused())
	}
	c.Synced(t0, "a/1", 7, 0xac, 1, false) // a second fetch is a divergence again
	if got := kinds(c); !slices.Equal(got, []string{Diverged}) {
		t.Fatalf("violations %v, want [%s]", got, Diverged)
	}
}

// TestCheckerAllowsLateReporterReadmitted: a peer cut off while the others went on reports to a
// restarted master after its rebuild window; it is wired in as a newcomer and fetches the group's
// state, so its revisions jump forward once, to the hash the others accepted. A jump without a fetch,
// or a second one without a restart, is still a violation.
func TestCheckerAllowsLateReporterReadmitted(t *testing.T) {
	c := New(10*time.Second, 2)
	c.Synced(t0, "a/1", 5, 0xa5, 0, false)
	for rev := uint64(5); rev <= 9; rev++ {
		c.Synced(t0, "b/2", rev, 0xa0+rev, 0, false)
	}
	c.MasterRestarted()
	c.Synced(t0, "b/2", 10, 0xb0, 0, false)
	c.Synced(t0, "a/1", 10, 0xb0, 1, false)
	if len(c.Violations()) != 0 || c.Excused() != 1 {
		t.Fatalf("violations %v, excused %d: want none and one", c.Violations(), c.Excused())
	}
	c.Synced(t0, "b/2", 11, 0xb1, 0, false)
	c.Synced(t0, "b/2", 12, 0xb2, 0, false)
	c.Synced(t0, "a/1", 12, 0xb2, 1, false)
	if got := kinds(c); !slices.Equal(got, []string{RevisionStep, Diverged}) {
		t.Fatalf("violations %v, want [%s %s]", got, RevisionStep, Diverged)
	}
}

// TestLinkKick: the master's reasons for removing an end of a link that could not be wired are
// recognised, other kicks are not.
func TestLinkKick(t *testing.T) {
	for detail, want := range map[string]bool{
		"pccl: kicked by the master: peer 1 could not dial this peer's advertised address h:1: i/o timeout": true,
		"pccl: kicked by the master: this peer could not dial peer 2 at h:2: refused":                       true,
		"pccl: kicked by the master: unreachable from its ring neighbour":                                   true,
		"pccl: kicked by the master: run token mismatch":                                                    false,
		"pccl: kicked by the master: no heartbeat for 1.5s":                                                 false,
	} {
		if got := LinkKick(detail); got != want {
			t.Errorf("LinkKick(%q) = %v, want %v", detail, got, want)
		}
	}
}
