package main

import (
	"fmt"
	"sort"
	"time"
)

// Violation kinds, one per invariant of the soak.
const (
	vTwoHashes    = "two_hashes"    // one revision accepted with two different state hashes
	vRevisionStep = "revision_step" // a session's revisions did not advance by exactly one (see synced)
	vRevisionGap  = "revision_gap"  // the group skipped a revision
	vDiverged     = "diverged"      // a synced peer's state lost the election: it had to fetch
	vWrongElement = "wrong_element" // an AllReduce element differs from the exact expected value
	vNotRestored  = "not_restored"  // a failed AllReduce left its buffer changed
	vStall        = "stall"         // no collective completed for too long with enough peers alive
	vHang         = "hang"          // a peer told to stop did not exit in time
	vLeak         = "leak"          // a peer's goroutines did not return to their baseline after Close
	vPanic        = "panic"         // a peer crashed (Go panic, fatal error or race report)
	vExit         = "exit"          // a peer exited on its own with a failure status
	vPeer         = "peer"          // a peer hit an error its loop does not expect
)

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

// checker holds the invariants of the soak. It is pure: every method takes the time of the event it
// records, and it starts no goroutine and reads no clock. The supervisor's goroutine owns it.
type checker struct {
	stallLimit time.Duration
	minPeers   int

	revs    map[uint64]acceptedRev // every accepted revision and its hash
	lastRev map[string]uint64      // session key -> last revision it synced
	restart map[string]int         // session key -> restarts when it last synced
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

// newChecker returns a checker that reports a stall after stallLimit without a completed collective
// while at least minPeers healthy peers are in the group.
func newChecker(stallLimit time.Duration, minPeers int) *checker {
	return &checker{stallLimit: stallLimit, minPeers: minPeers, revs: map[uint64]acceptedRev{}, lastRev: map[string]uint64{},
		restart: map[string]int{}}
}

func (c *checker) fail(now time.Time, kind string, rev uint64, peer, format string, args ...any) {
	c.violations = append(c.violations, Violation{Kind: kind, Revision: rev, Peer: peer, Detail: fmt.Sprintf(format, args...), Time: now})
}

// synced records that session sess (a peer's membership, from Connect to Close) finished a sync at
// rev holding state hash; fetched is how many entries it received, fresh whether it joined with no
// state (a newcomer's first sync).
func (c *checker) synced(now time.Time, sess string, rev, hash uint64, fetched int, fresh bool) {
	if a, ok := c.revs[rev]; ok {
		if a.hash != hash {
			c.fail(now, vTwoHashes, rev, sess, "hash %016x, but %s accepted %016x", hash, a.peer, a.hash)
		}
	} else {
		c.revs[rev] = acceptedRev{hash: hash, peer: sess}
	}
	c.maxRev = max(c.maxRev, rev)
	if last, ok := c.lastRev[sess]; ok && rev != last+1 {
		_, missedByRestart := c.revs[last+1]
		missedByRestart = missedByRestart && rev == last+2 && c.restarts > c.restart[sess]
		if !missedByRestart {
			c.fail(now, vRevisionStep, rev, sess, "synced revision %d after %d", rev, last)
		}
	}
	c.lastRev[sess] = rev
	c.restart[sess] = c.restarts
	if !fresh && fetched > 0 {
		c.fail(now, vDiverged, rev, sess, "a peer that held the state fetched %d entries: its content lost the election", fetched)
	}
}

// sessionEnded forgets a session: a peer that comes back is a new one.
func (c *checker) sessionEnded(sess string) {
	delete(c.lastRev, sess)
	delete(c.restart, sess)
}

// masterRestarted records that the master was restarted.
func (c *checker) masterRestarted() { c.restarts++ }

// completed records a collective completed with every element checked.
func (c *checker) completed(now time.Time) {
	c.lastProgress = now
	c.stalled = false
}

// wrongElement records an AllReduce element that differs from the exact expected value.
func (c *checker) wrongElement(now time.Time, sess string, rev uint64, detail string) {
	c.fail(now, vWrongElement, rev, sess, "%s", detail)
}

// aborted records a failed AllReduce; restored says whether its buffer was left as it was.
func (c *checker) aborted(now time.Time, sess string, rev uint64, restored bool, detail string) {
	if !restored {
		c.fail(now, vNotRestored, rev, sess, "buffer changed by a failed AllReduce: %s", detail)
	}
}

// tick checks for a stall: healthy is the number of peers in the group that are neither stopped nor
// cut off.
func (c *checker) tick(now time.Time, healthy int) {
	enough := healthy >= c.minPeers
	if enough && !c.enough {
		c.lastProgress = now // the clock starts when the group could make progress again
	}
	c.enough = enough
	if enough && !c.stalled && now.Sub(c.lastProgress) > c.stallLimit {
		c.stalled = true
		c.fail(now, vStall, c.maxRev, "", "no collective completed for %v with %d healthy peers", now.Sub(c.lastProgress).Round(time.Millisecond), healthy)
	}
}

// finish checks what can only be judged on the whole run: the accepted revisions form one unbroken
// sequence.
func (c *checker) finish(now time.Time) {
	revs := make([]uint64, 0, len(c.revs))
	for r := range c.revs {
		revs = append(revs, r)
	}
	sort.Slice(revs, func(i, j int) bool { return revs[i] < revs[j] })
	for i := 1; i < len(revs); i++ {
		if revs[i] != revs[i-1]+1 {
			c.fail(now, vRevisionGap, revs[i-1]+1, "", "revisions %d to %d were never accepted (next seen: %d)", revs[i-1]+1, revs[i]-1, revs[i])
			return
		}
	}
}
