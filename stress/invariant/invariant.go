// Package invariant holds the invariants of Concord's churn soaks, the real-process one (stress) and
// the simulated one (stress/sim): a pure Checker that is fed what the peers report and the time of
// each report, and records every broken invariant as a Violation.
//
// The invariants: each shared-state revision is accepted with one state hash across all peers; each
// peer session's revisions advance by exactly one from sync to sync (a newcomer's first sync may
// jump; a restart of the master may skip the one revision whose commit it lost), and the group skips
// none; a session that held the state never has to fetch it; no AllReduce element differs from the
// exact reduction; a failed AllReduce leaves its buffer unchanged; no collective completes for too
// long while enough healthy peers are in the group. The harnesses add their own (hangs, leaks, panics,
// unexpected errors) through Fail, so that one list holds them all.
package invariant

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Violation kinds, one per invariant.
const (
	TwoHashes    = "two_hashes"    // one revision accepted with two different state hashes
	RevisionStep = "revision_step" // a session's revisions did not advance by exactly one (see Synced)
	RevisionGap  = "revision_gap"  // the group skipped a revision
	Diverged     = "diverged"      // a synced peer's state lost the election: it had to fetch
	WrongElement = "wrong_element" // an AllReduce element differs from the exact expected value
	NotRestored  = "not_restored"  // a failed AllReduce left its buffer changed
	Stall        = "stall"         // no collective completed for too long with enough peers alive
	Hang         = "hang"          // a peer told to stop did not exit in time
	Leak         = "leak"          // a peer's goroutines did not return to their baseline after Close
	Panic        = "panic"         // a peer crashed (Go panic, fatal error or race report)
	Exit         = "exit"          // a peer exited on its own with a failure status
	Peer         = "peer"          // a peer hit an error its loop does not expect
)

// PartitionKick is a violation only the simulated soak can see (stress/sim): a master that heard
// fewer than half of a group when a partition cut it kicked a peer of the other side for silence
// before PartitionTimeout.
const PartitionKick = "partition_kick"

// Violation is one broken invariant, with what is needed to find it in the event log.
type Violation struct {
	Kind     string    `json:"kind"`
	Revision uint64    `json:"revision,omitempty"`
	Peer     string    `json:"peer,omitempty"`
	Detail   string    `json:"detail"`
	Time     time.Time `json:"time"`
}

func (v Violation) String() string {
	return fmt.Sprintf("%s at revision %d (%s): %s", v.Kind, v.Revision, v.Peer, v.Detail)
}

// acceptedRev is the first report of one revision.
type acceptedRev struct {
	hash uint64
	peer string
}

// Checker holds the invariants of a soak. It is pure: every method takes the time of the event it
// records, and it starts no goroutine and reads no clock. It is not safe for concurrent use: one
// goroutine (the harness's supervisor) owns it.
type Checker struct {
	stallLimit time.Duration
	minPeers   int

	revs    map[uint64]acceptedRev // every accepted revision and its hash
	lastRev map[string]uint64      // session key -> last revision it synced
	restart map[string]int         // session key -> restarts when it last synced
	excused int                    // fetches excused by a master restart (see Synced)
	maxRev  uint64
	// restarts counts the master's restarts: a sync whose result the master sent to some peers
	// only, as it died, is the last accepted revision for the new master (the peers that got it
	// report it), so the others' next sync takes them one revision further.
	restarts int

	lastProgress time.Time // last completed collective, or when enough peers became alive
	enough       bool      // at least minPeers healthy peers at the last tick
	stalled      bool      // a stall was reported and no progress happened since

	violations []Violation
}

// New returns a checker that reports a stall after stallLimit without a completed collective while
// at least minPeers healthy peers are in the group. The stall clock starts at the first Tick that
// sees that many.
func New(stallLimit time.Duration, minPeers int) *Checker {
	return &Checker{stallLimit: stallLimit, minPeers: minPeers, revs: map[uint64]acceptedRev{}, lastRev: map[string]uint64{},
		restart: map[string]int{}}
}

// Violations returns the violations recorded so far, in order. The caller must not change them.
func (c *Checker) Violations() []Violation { return c.violations }

// MaxRevision returns the highest revision any session synced.
func (c *Checker) MaxRevision() uint64 { return c.maxRev }

// Fail records a violation of kind (one of the kinds above) found by the harness itself.
func (c *Checker) Fail(now time.Time, kind string, rev uint64, peer, format string, args ...any) {
	c.violations = append(c.violations, Violation{Kind: kind, Revision: rev, Peer: peer, Detail: fmt.Sprintf(format, args...), Time: now})
}

// Synced records that session sess (a peer's membership, from Connect to Close) finished a sync at
// rev holding state hash; fetched is how many entries it received, fresh whether it joined with no
// state (a newcomer's first sync). A session that held the state may fetch at its first sync after
// a master restart: the dead master's outcome of the step in flight may have reached some peers
// only, or its report came after the new master's rebuild window and it was wired in as a newcomer.
func (c *Checker) Synced(now time.Time, sess string, rev, hash uint64, fetched int, fresh bool) {
	if a, ok := c.revs[rev]; ok {
		if a.hash != hash {
			c.Fail(now, TwoHashes, rev, sess, "hash %016x, but %s accepted %016x", hash, a.peer, a.hash)
		}
	} else {
		c.revs[rev] = acceptedRev{hash: hash, peer: sess}
	}
	c.maxRev = max(c.maxRev, rev)
	restarted := c.restarts > c.restart[sess]
	if last, ok := c.lastRev[sess]; ok && rev != last+1 {
		_, missedByRestart := c.revs[last+1]
		missedByRestart = missedByRestart && rev == last+2 && restarted
		// A peer whose report reached a restarted master after its rebuild window is wired in as a
		// newcomer and fetches the group's state at its next sync: its revisions jump forward, once,
		// to a state the hash check holds to the others'.
		readmitted := restarted && !fresh && fetched > 0 && rev > last
		if !missedByRestart && !readmitted {
			c.Fail(now, RevisionStep, rev, sess, "synced revision %d after %d", rev, last)
		}
	}
	_, held := c.lastRev[sess]
	c.lastRev[sess] = rev
	c.restart[sess] = c.restarts
	if !fresh && fetched > 0 && held && restarted {
		// A collective completes on the master's outcome, which a master that died sent to some
		// peers only: those applied the step, the others did not, and the first sync after the
		// restart elects one side's state. The other side fetches it, once.
		c.excused++
		return
	}
	if !fresh && fetched > 0 {
		c.Fail(now, Diverged, rev, sess, "a peer that held the state fetched %d entries: its content lost the election", fetched)
	}
}

// SessionEnded forgets a session: a peer that comes back is a new one.
func (c *Checker) SessionEnded(sess string) {
	delete(c.lastRev, sess)
	delete(c.restart, sess)
}

// Excused returns how many fetches of the first sync after a master restart were excused (see
// Synced).
func (c *Checker) Excused() int { return c.excused }

// MasterRestarted records that the master was restarted.
func (c *Checker) MasterRestarted() { c.restarts++ }

// Completed records a collective completed with every element checked.
func (c *Checker) Completed(now time.Time) {
	c.lastProgress = now
	c.stalled = false
}

// WrongElement records an AllReduce element that differs from the exact expected value.
func (c *Checker) WrongElement(now time.Time, sess string, rev uint64, detail string) {
	c.Fail(now, WrongElement, rev, sess, "%s", detail)
}

// Aborted records a failed AllReduce; restored says whether its buffer was left as it was.
func (c *Checker) Aborted(now time.Time, sess string, rev uint64, restored bool, detail string) {
	if !restored {
		c.Fail(now, NotRestored, rev, sess, "buffer changed by a failed AllReduce: %s", detail)
	}
}

// Tick checks for a stall: healthy is the number of peers in the group that are neither stopped nor
// cut off.
func (c *Checker) Tick(now time.Time, healthy int) {
	enough := healthy >= c.minPeers
	if enough && !c.enough {
		c.lastProgress = now // the clock starts when the group could make progress again
	}
	c.enough = enough
	if enough && !c.stalled && now.Sub(c.lastProgress) > c.stallLimit {
		c.stalled = true
		c.Fail(now, Stall, c.maxRev, "", "no collective completed for %v with %d healthy peers", now.Sub(c.lastProgress).Round(time.Millisecond), healthy)
	}
}

// Finish checks what can only be judged on the whole run: the accepted revisions form one unbroken
// sequence.
func (c *Checker) Finish(now time.Time) {
	revs := make([]uint64, 0, len(c.revs))
	for r := range c.revs {
		revs = append(revs, r)
	}
	sort.Slice(revs, func(i, j int) bool { return revs[i] < revs[j] })
	for i := 1; i < len(revs); i++ {
		if revs[i] != revs[i-1]+1 {
			c.Fail(now, RevisionGap, revs[i-1]+1, "", "revisions %d to %d were never accepted (next seen: %d)", revs[i-1]+1, revs[i]-1, revs[i])
			return
		}
	}
}

// LinkKick reports whether detail, the error of a kicked peer, says the master removed it because a
// ring link to or from it could not be wired: the end of a black-holed link is removed so when no ring
// avoids the link, which the soaks excuse while the hole lasts and for a grace after it.
func LinkKick(detail string) bool {
	for _, s := range []string{"could not dial this peer's advertised address", "this peer could not dial peer", "unreachable from its ring neighbour"} {
		if strings.Contains(detail, s) {
			return true
		}
	}
	return false
}
