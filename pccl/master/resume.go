package master

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/sharedstate"
)

// Rebuilding the view after a restart.
//
// A master that starts knows nothing. Peers that lost their master keep their state and reconnect to
// the same address; their Hello carries a Resume report (wire.Resume): the incarnation that accepted
// them, their epoch and ring, their shared-state revision and digest, their step. The first report
// from an earlier incarnation opens a rebuild window of Config.ResumeGrace. While it is open no ring
// is wired in any group (newcomers wait as well), so that a group is not rebuilt from the first peer
// that happens to come back. The window closes when every peer of the ring that the majority of each
// group's reporters held has reported, or when the grace runs out. Then, in each group with reports:
//
//   - the ring is the one the majority held (most reporters, then the highest epoch), without the
//     peers that did not come back, followed by reporters it lacked (by id), except those that were
//     on an earlier ring and are missing from it: the old master had spliced them out, so they are
//     kicked and join again as new peers (their state missed the syncs since); a wiring round under the
//     new incarnation's first epoch connects them, and its Topology makes them accepted again;
//   - the last accepted shared state is the (revision, hashes) the majority holds, so that peers on
//     an older or a different revision fetch the majority's at the next sync; but when some reporters
//     hold the revision right after the majority's, that one is taken: a peer reports a revision only
//     once the old master committed it, so those reporters saw the commit of a sync whose result the
//     others lost with the master, and their state is the newest accepted one (a report further
//     ahead cannot come from the old master and does not count);
//   - each reporter's step counts as its last step report.
//
// Peers that report after the window are newcomers: they wait as registered peers and are wired in at
// the next UpdateTopology of their group, and fetch the state at their next sync. A report to the
// incarnation that accepted the peer (its connection broke, the master did not restart) is not a
// restart: the peer is a newcomer at once.

// resumeState is the rebuild window of a master that may have restarted.
type resumeState struct {
	open    bool
	closed  bool      // the window has been opened and closed; later reports are newcomers
	opened  time.Time // when the first report came
	reports map[PeerID]*wire.Resume
}

// resumeReport records the Resume report of peer p, which just joined, and opens the rebuild window
// at the first report from an earlier incarnation.
func (m *Machine) resumeReport(p *peer) {
	r := p.hello.Resume
	if r == nil || r.Incarnation == m.cfg.Incarnation || m.resume.closed {
		return
	}
	g := p.group
	if !m.resume.open && (len(g.ring) > 0 || g.wiring != nil) {
		m.lateReport(g, p.id, r) // this group runs already: the report is a newcomer's
		return
	}
	if !m.resume.open {
		m.resume = resumeState{open: true, opened: m.now, reports: map[PeerID]*wire.Resume{}}
		m.note("resume", 0, "rebuild window open for %v: peers of incarnation %d report", m.cfg.ResumeGrace, r.Incarnation)
	}
	m.resume.reports[p.id] = r
	p.step, p.hasStep = sharedstate.StepTag{Step: r.Step, InOptimizer: r.InOptimizer}, r.HasStep
	m.gnote(g, "resume", p.id, "reports epoch %d, ring %v, revision %d", r.Epoch, r.Ring, r.Revision)
	m.checkResume()
}

// lateReport takes the report r of peer id, which came after this incarnation had wired group g: a
// newcomer reached the restarted master before the peers of the old one, which then join as
// newcomers. Their shared state is still the run's: if it is later than what g has accepted, the
// group's next election starts from it (group.reported), so the peers that joined meanwhile fetch it
// rather than the run's peers being refused for their revisions.
func (m *Machine) lateReport(g *group, id PeerID, r *wire.Resume) {
	prior, _, ok := resumedState([]PeerID{id}, map[PeerID]*wire.Resume{id: r})
	if !ok {
		return
	}
	held := g.reported
	if held == nil {
		held = g.prior
	}
	if held != nil && prior.Revision <= held.Revision {
		return
	}
	g.reported = prior
	m.gnote(g, "resume", id, "reports shared state revision %d after the group was wired; the next election starts from it", prior.Revision)
}

// holding reports whether wiring rounds wait for the rebuild window to close.
func (m *Machine) holding() bool { return m.resume.open }

// checkResume closes the rebuild window once every group's majority ring has reported, or once the
// grace has run out, and rebuilds every group that has reports.
func (m *Machine) checkResume() {
	rs := &m.resume
	if !rs.open {
		return
	}
	byGroup := m.reportsByGroup()
	complete := true
	for _, gid := range slices.Sorted(maps.Keys(byGroup)) {
		ring, _ := majorityRing(byGroup[gid], rs.reports)
		for _, id := range ring {
			if rs.reports[id] == nil {
				complete = false
			}
		}
	}
	if !complete && m.now.Sub(rs.opened) < m.cfg.ResumeGrace {
		return
	}
	rs.open, rs.closed = false, true
	for _, gid := range m.gids {
		g := m.groups[gid]
		if ids := byGroup[gid]; len(ids) > 0 {
			m.rebuild(g, ids)
		} else if g.wiring == nil && len(g.ring) == 0 && len(m.registered(g)) > 0 {
			m.startRound(g, true)
		}
	}
	rs.reports = nil
}

// reportsByGroup returns the ids of the live reporters of each group, sorted.
func (m *Machine) reportsByGroup() map[GroupID][]PeerID {
	out := map[GroupID][]PeerID{}
	for _, id := range m.ids {
		p := m.peers[id]
		if m.resume.reports[id] != nil && p.state == Registered {
			out[p.group.id] = append(out[p.group.id], id)
		}
	}
	return out
}

// majorityRing returns the ring most of the reporters ids held (ties: the highest epoch) and its
// epoch.
func majorityRing(ids []PeerID, reports map[PeerID]*wire.Resume) ([]PeerID, uint64) {
	type cand struct {
		ring  []PeerID
		epoch uint64
		votes int
	}
	var cands []*cand
	for _, id := range ids {
		r := reports[id]
		i := slices.IndexFunc(cands, func(c *cand) bool { return c.epoch == r.Epoch && slices.Equal(c.ring, r.Ring) })
		if i < 0 {
			cands = append(cands, &cand{ring: r.Ring, epoch: r.Epoch})
			i = len(cands) - 1
		}
		cands[i].votes++
	}
	if len(cands) == 0 {
		return nil, 0
	}
	best := slices.MaxFunc(cands, func(a, b *cand) int {
		return cmp.Or(cmp.Compare(a.votes, b.votes), cmp.Compare(a.epoch, b.epoch))
	})
	return best.ring, best.epoch
}

// rebuild wires group g again from the reports of ids and remembers the last accepted shared state
// they show (resumedState).
func (m *Machine) rebuild(g *group, ids []PeerID) {
	reports := m.resume.reports
	held, heldEpoch := majorityRing(ids, reports)
	// A reporter that was on an earlier ring of the group and is missing from the one the majority
	// held was spliced out by the old master (kicked, or gone while cut off) and never heard of it:
	// it is not let back in with its old state, which missed the syncs since; it joins again as a
	// new peer and fetches the state then.
	var stale []PeerID
	ids = slices.DeleteFunc(slices.Clone(ids), func(id PeerID) bool {
		r := reports[id]
		if len(held) == 0 || slices.Contains(held, id) || !slices.Contains(r.Ring, id) || r.Epoch >= heldEpoch {
			return false
		}
		stale = append(stale, id)
		return true
	})
	// Kicked once the ring is rebuilt without them, so that their removal does not start a round.
	defer func() {
		for _, id := range stale {
			r := reports[id]
			m.kick(id, fmt.Sprintf("the previous master removed this peer from the ring (the ring of epoch %d the others held lacks it; this peer reports epoch %d, revision %d); join again as a new peer", heldEpoch, r.Epoch, r.Revision))
		}
	}()
	if len(ids) == 0 {
		return
	}
	var ring []PeerID
	for _, id := range held {
		if slices.Contains(ids, id) || slices.Contains(g.ring, id) {
			ring = append(ring, id)
		}
	}
	for _, id := range slices.Concat(g.ring, ids) {
		if !slices.Contains(ring, id) {
			ring = append(ring, id)
		}
	}
	if prior, votes, ok := resumedState(ids, reports); ok {
		g.prior = prior
		m.gnote(g, "resume", 0, "shared state revision %d held by %d of %d reporters", prior.Revision, votes, len(ids))
	}
	m.gnote(g, "resume", 0, "ring %v rebuilt from %d reports", ring, len(ids))
	if g.wiring != nil {
		g.wiring.ring = ring
	} else {
		g.wiring = &round{ring: ring}
	}
	m.restartRound(g)
}

// resumedState returns the last accepted shared state that the reports of ids show, as a Prior, and
// how many reporters hold it; ok is false when no reporter has synced yet. It is the state most
// reporters hold (ties: the highest revision), unless some hold the next revision: the old master
// committed that one, and its state is the one most of them hold.
func resumedState(ids []PeerID, reports map[PeerID]*wire.Resume) (prior *sharedstate.Prior, votes int, ok bool) {
	type cand struct {
		prior sharedstate.Prior
		votes int
	}
	var cands []*cand
	for _, id := range ids {
		r := reports[id]
		if len(r.Digest) == 0 {
			continue
		}
		d, err := sharedstate.DecodeDigest(r.Digest)
		if err != nil {
			continue // an unreadable report does not vote
		}
		p := sharedstate.Prior{Revision: r.Revision, Entries: slices.Clone(d.Entries)}
		for i := range p.Entries {
			if p.Entries[i].MayDiffer {
				p.Entries[i].Hash = 0
			}
		}
		i := slices.IndexFunc(cands, func(c *cand) bool {
			return c.prior.Revision == p.Revision && slices.Equal(c.prior.Entries, p.Entries)
		})
		if i < 0 {
			cands = append(cands, &cand{prior: p})
			i = len(cands) - 1
		}
		cands[i].votes++
	}
	if len(cands) == 0 {
		return nil, 0, false
	}
	byVotes := func(a, b *cand) int {
		return cmp.Or(cmp.Compare(a.votes, b.votes), cmp.Compare(a.prior.Revision, b.prior.Revision))
	}
	best := slices.MaxFunc(cands, byVotes)
	var next []*cand
	for _, c := range cands {
		if r := best.prior.Revision; r+1 > r && c.prior.Revision == r+1 {
			next = append(next, c)
		}
	}
	if len(next) > 0 {
		best = slices.MaxFunc(next, byVotes)
	}
	return &best.prior, best.votes, true
}
