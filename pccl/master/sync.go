package master

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/sharedstate"
)

// syncRound is a group's shared-state sync after the election: members fetch what their plan lists and
// report SyncDone; when all have, the master remembers the elected state and tells everyone.
type syncRound struct {
	plan    sharedstate.Plan
	members []PeerID
	member  map[PeerID]bool // the peers of members
	done    map[PeerID]bool // members that reported SyncDone
	failed  bool
	detail  string
}

func peerKey(id PeerID) string { return strconv.FormatUint(id, 10) }

func (m *Machine) voteSync(p *peer, v *wire.VoteSync) {
	g := p.group
	switch {
	case p.state != Accepted:
		m.kick(p.id, "SyncSharedState vote from a peer that is not accepted")
		return
	case p.voteSync != nil:
		m.kick(p.id, "second SyncSharedState vote in one round")
		return
	case g.sync != nil && g.sync.member[p.id]:
		m.kick(p.id, "SyncSharedState vote while the previous sync is running")
		return
	case m.busy(p):
		m.kick(p.id, "SyncSharedState vote while a collective of this peer is running")
		return
	case !sharedstate.Strategy(v.Strategy).Valid():
		m.kick(p.id, fmt.Sprintf("unknown sync strategy %d", v.Strategy))
		return
	}
	d, err := sharedstate.DecodeDigest(v.Digest)
	if err != nil {
		m.kick(p.id, "malformed state digest: "+err.Error())
		return
	}
	p.voteSync, p.digest = v, d
	g.syncVotes++
	m.checkSync(g)
}

// checkSync runs g's election once every accepted peer of g has voted.
func (m *Machine) checkSync(g *group) {
	if g.sync != nil {
		return
	}
	acc := m.accepted(g)
	if len(acc) == 0 || g.syncVotes < len(acc) {
		return
	}
	cands := make([]sharedstate.Candidate, 0, len(acc))
	for _, id := range acc {
		p := m.peers[id]
		cands = append(cands, sharedstate.Candidate{Peer: peerKey(id), Strategy: sharedstate.Strategy(p.voteSync.Strategy), Digest: p.digest})
		p.voteSync = nil
	}
	g.syncVotes = 0
	if rp := g.reported; rp != nil {
		// A state reported late (lateReport) counts once a voter holds it or the one after it; until
		// then the group syncs from its own.
		for _, c := range cands {
			if c.Digest.Revision == rp.Revision || c.Digest.Revision == rp.Revision+1 {
				g.prior, g.reported = rp, nil
				break
			}
		}
	}
	plan, err := sharedstate.Elect(cands, g.prior)
	if err != nil {
		m.gnote(g, "sync", 0, "election failed: %v", err)
		for _, id := range acc {
			m.send(id, &wire.SyncPlan{Code: wire.CodeRejected, Detail: err.Error()})
		}
		return
	}
	rejected := map[PeerID]bool{}
	for _, r := range plan.Rejected {
		id, _ := strconv.ParseUint(r.Peer, 10, 64)
		rejected[id] = true
		m.gnote(g, "sync", id, "rejected: %v", r.Err)
		m.send(id, &wire.SyncPlan{Revision: plan.Revision, Code: wire.CodeRejected, Detail: r.Err.Error()})
	}
	round := &syncRound{plan: plan, member: map[PeerID]bool{}, done: map[PeerID]bool{}}
	var fetched, outliers int
	for _, id := range acc {
		if rejected[id] {
			continue
		}
		round.members = append(round.members, id)
		round.member[id] = true
		msg := &wire.SyncPlan{Revision: plan.Revision, Code: wire.CodeOK}
		for _, f := range plan.Fetch[peerKey(id)] {
			item := wire.FetchItem{Name: f.Name, Hash: f.Hash, Bytes: uint64(f.Bytes)}
			for _, d := range f.Donors {
				did, _ := strconv.ParseUint(d, 10, 64)
				if q := m.peers[did]; q != nil {
					item.Donors = append(item.Donors, m.info(q))
				}
			}
			msg.Fetch = append(msg.Fetch, item)
			fetched += int(f.Bytes)
		}
		if len(msg.Fetch) > 0 {
			outliers++
		}
		m.send(id, msg)
	}
	g.sync = round
	m.gnote(g, "sync", 0, "revision %d: %d peers, the state of %v elected, %d outliers fetch %d bytes", plan.Revision, len(round.members), plan.Holders, outliers, fetched)
	m.checkSyncDone(g)
}

func (m *Machine) syncDone(p *peer, v *wire.SyncDone) {
	g := p.group
	s := g.sync
	if s == nil || !s.member[p.id] || s.done[p.id] {
		m.kick(p.id, "SyncDone outside a sync")
		return
	}
	s.done[p.id] = true
	if !v.OK && !s.failed {
		s.failed, s.detail = true, fmt.Sprintf("peer %d: %s", p.id, v.Detail)
	}
	m.checkSyncDone(g)
}

// checkSyncDone ends g's sync once every member reported.
func (m *Machine) checkSyncDone(g *group) {
	s := g.sync
	if s == nil {
		return
	}
	if len(s.done) < len(s.members) {
		return // done counts members only, and each once
	}
	g.sync = nil
	if len(s.members) == 0 {
		return
	}
	msg := &wire.SyncComplete{Revision: s.plan.Revision, Code: wire.CodeOK}
	if s.failed {
		msg.Code, msg.Detail = wire.CodeAborted, s.detail
		m.gnote(g, "sync", 0, "revision %d failed: %s", s.plan.Revision, s.detail)
	} else {
		g.prior = s.plan.Prior()
		var tags []sharedstate.StepTag
		for _, id := range s.members {
			if p := m.peers[id]; p.hasStep {
				tags = append(tags, p.step)
			}
		}
		msg.ResumeStep = sharedstate.ResumeStep(tags)
		m.counters.Syncs++
	}
	for _, id := range s.members {
		m.send(id, msg)
	}
}

// leaveSync removes a gone peer from g's sync in progress or from the votes.
func (m *Machine) leaveSync(g *group, id PeerID) {
	if s := g.sync; s != nil {
		if s.member[id] {
			s.members = slices.DeleteFunc(s.members, func(x PeerID) bool { return x == id })
			delete(s.member, id)
			delete(s.done, id)
		}
		m.checkSyncDone(g)
	}
	m.checkSync(g)
}
