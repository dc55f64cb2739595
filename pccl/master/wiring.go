package master

import (
	"fmt"
	"slices"

	"github.com/concord-ccl/concord/internal/wire"
)

// round is one ring-wiring phase of a group: every member opens its links for epoch and reports
// LinksReady.
type round struct {
	epoch    uint64
	ring     []PeerID
	member   map[PeerID]bool // the peers of ring
	reported map[PeerID]*wire.LinksReady
	auto     bool // started by the master to re-order the ring (reorder.go), not by a vote
}

func (m *Machine) voteTopology(p *peer, v *wire.VoteTopology) {
	g := p.group
	switch {
	case p.state != Accepted:
		m.kick(p.id, "UpdateTopology vote from a peer that is not accepted")
		return
	case p.voteTopo:
		m.kick(p.id, "second UpdateTopology vote in one round")
		return
	case g.wiring != nil && g.wiring.member[p.id] && !g.wiring.auto:
		// A round the master started on its own is no vote of the peer's: the vote counts once it
		// is over.
		m.kick(p.id, "UpdateTopology vote while wiring the ring")
		return
	case m.busy(p):
		m.kick(p.id, "UpdateTopology vote while a collective of this peer is running")
		return
	case g.sync != nil && g.sync.member[p.id]:
		m.kick(p.id, "UpdateTopology vote while a shared-state sync of this peer is running")
		return
	case g.opt != nil && slices.Contains(g.opt.members, p.id):
		m.kick(p.id, "UpdateTopology vote while OptimizeTopology runs")
		return
	}
	p.voteTopo = true
	g.topoVotes++
	p.rewire = p.rewire || v.Rewire
	p.noAdmit = v.NoAdmit
	m.checkTopology(g)
}

// checkTopology completes UpdateTopology once every accepted peer of g has voted.
func (m *Machine) checkTopology(g *group) {
	if g.wiring != nil || g.opt != nil {
		return
	}
	acc := m.accepted(g)
	if len(acc) == 0 || g.topoVotes < len(acc) {
		return
	}
	rewire, admit := false, true
	for _, id := range acc {
		p := m.peers[id]
		rewire = rewire || p.rewire
		admit = admit && !p.noAdmit
		p.voteTopo, p.rewire, p.noAdmit = false, false, false
	}
	g.topoVotes = 0
	if (!admit || len(m.registered(g)) == 0) && !g.ringDirty && !rewire {
		// One copy of the ring, shared by every message: receivers only read it.
		ring, run := slices.Clone(g.ring), m.runSize()
		for _, id := range acc {
			m.send(id, &wire.Topology{Epoch: g.epoch, Changed: false, Ring: ring, Run: run})
		}
		return
	}
	m.startRound(g, admit)
}

// startRound begins wiring a ring made of g's ring in force plus, if admit, every registered peer of
// g.
func (m *Machine) startRound(g *group, admit bool) {
	if m.holding() {
		return // the rebuild window after a restart wires every group when it closes
	}
	ring := slices.Clone(g.ring)
	if admit {
		ring = m.placeNewcomers(ring, m.registered(g))
	}
	ring = m.avoidCuts(g, ring)
	if len(ring) == 0 {
		return
	}
	g.wiring = &round{ring: ring}
	m.restartRound(g)
}

// restartRound (re)sends Connect for g's wiring round under a new epoch.
func (m *Machine) restartRound(g *group) {
	r := g.wiring
	if len(r.ring) == 0 {
		g.wiring = nil
		return
	}
	r.epoch = m.bump(g)
	m.counters.Rounds++
	r.reported = make(map[PeerID]*wire.LinksReady, len(r.ring))
	r.member = make(map[PeerID]bool, len(r.ring))
	for _, id := range r.ring {
		r.member[id] = true
	}
	infos := make([]wire.PeerInfo, len(r.ring))
	for i, id := range r.ring {
		p := m.peers[id]
		infos[i] = m.info(p)
	}
	for _, id := range r.ring {
		m.send(id, &wire.Connect{Epoch: r.epoch, Ring: infos})
	}
}

func (m *Machine) linksReady(p *peer, l *wire.LinksReady) {
	g := p.group
	r := g.wiring
	if r == nil || l.Epoch != r.epoch || !r.member[p.id] {
		return // a report for a round that was restarted or ended: harmless
	}
	if r.reported[p.id] != nil {
		m.kick(p.id, fmt.Sprintf("second LinksReady for epoch %d", l.Epoch))
		return
	}
	r.reported[p.id] = l
	if len(r.reported) < len(r.ring) {
		return // only members report, and each once
	}
	// Everyone reported. A link that failed between two accepted peers is avoided if a ring without
	// it exists; otherwise remove whoever cannot be reached, newcomers first, and try again.
	if m.cutUnreachable(g, r) {
		return
	}
	var victims []PeerID
	reasons := map[PeerID]string{}
	for _, id := range r.ring {
		rep := r.reported[id]
		if rep.OK {
			continue
		}
		target := PeerID(0)
		if len(rep.Failed) > 0 {
			target = rep.Failed[0]
		}
		q := m.peers[target]
		victim := id
		switch {
		case q != nil && q.group == g && q.state == Registered:
			victim = target
		case m.peers[id].state == Registered:
		case q != nil && q.group == g:
			victim = target
		}
		victims = append(victims, victim)
		if _, ok := reasons[victim]; ok {
			continue
		}
		if victim == target {
			reasons[victim] = m.unreachable(id, target, rep.Detail)
		} else if q != nil {
			reasons[victim] = fmt.Sprintf("this peer could not dial peer %d at %s: %s", target, q.hello.Addr, rep.Detail)
		} else {
			reasons[victim] = fmt.Sprintf("this peer could not wire the ring: %s", rep.Detail)
		}
	}
	if len(victims) > 0 {
		slices.Sort(victims)
		victims = slices.Compact(victims)
		// Take them all out of the round first, so that the retry costs one epoch however many go.
		r.ring = slices.DeleteFunc(slices.Clone(r.ring), func(x PeerID) bool { return slices.Contains(victims, x) })
		for _, v := range victims {
			delete(r.member, v)
		}
		for _, v := range victims {
			m.kick(v, reasons[v])
		}
		if g.wiring == r {
			m.restartRound(g)
		}
		return
	}
	g.wiring = nil
	g.ring = r.ring
	g.ringDirty = false
	var admitted []PeerID
	for rank, id := range r.ring {
		q := m.peers[id]
		if q.state == Registered {
			q.state = Accepted
			admitted = append(admitted, id)
			m.counters.Accepted++
			m.gnote(g, "accepted", id, "epoch %d, rank %d of %d", r.epoch, rank, len(r.ring))
		}
	}
	g.admit(admitted)
	m.gnote(g, "ring", 0, "epoch %d: ring %v", r.epoch, r.ring)
	m.checkOptimize(g)
	ring, run := slices.Clone(r.ring), m.runSize() // shared by every message, as in checkTopology
	for _, id := range r.ring {
		m.send(id, &wire.Topology{Epoch: r.epoch, Changed: true, Ring: ring, Run: run})
	}
	// Votes cast while the ring was being wired (pending queries) may now be complete.
	m.checkPending(g)
	if r.auto {
		// The collectives that waited for the re-ordering commence on the new ring, and the
		// UpdateTopology votes cast meanwhile count.
		m.reorderHeld(g)
		m.checkTopology(g)
	}
}

// votePending counts p's ArePeersPending vote; with leave, p leaves the group at this safe point
// (see checkPending).
func (m *Machine) votePending(p *peer, leave bool) {
	switch {
	case p.state != Accepted:
		m.kick(p.id, "ArePeersPending vote from a peer that is not accepted")
		return
	case p.votePending:
		m.kick(p.id, "second ArePeersPending vote in one round")
		return
	}
	if leave && m.busyGroup(p.group) {
		// The others are not at the safe point: a collective runs or waits for votes. Leave now, as
		// a peer that says bye does; the group pays an abort, which waiting could not avoid.
		m.send(p.id, &wire.Pending{Answer: true})
		m.remove(p.id, "left", "left at once: a collective of its group was under way")
		return
	}
	p.votePending, p.leaving = true, leave
	p.group.pendingVotes++
	m.checkPending(p.group)
}

// busyGroup reports whether a collective of g is voting or running.
func (m *Machine) busyGroup(g *group) bool {
	for _, o := range g.ops {
		if o != nil && (o.seq != 0 || len(o.voters) > 0) {
			return true
		}
	}
	return false
}

// checkPending answers ArePeersPending once every accepted peer of g has voted; all get the same
// answer: whether g has registered peers waiting to be accepted, or its ring lost a peer. Peers that
// voted to leave are answered too, then removed: a clean departure at a safe point, which the others'
// UpdateTopology wires around without aborting anything.
func (m *Machine) checkPending(g *group) {
	acc := m.accepted(g)
	if len(acc) == 0 || g.pendingVotes < len(acc) {
		return
	}
	g.pendingVotes = 0
	var leavers []PeerID
	for _, id := range acc {
		if m.peers[id].leaving {
			leavers = append(leavers, id)
		}
	}
	answer := len(m.registered(g)) > 0 || g.ringDirty || len(leavers) > 0
	for _, id := range acc {
		m.peers[id].votePending = false
		m.send(id, &wire.Pending{Answer: answer})
	}
	for _, id := range leavers {
		m.remove(id, "left", "left gracefully at a safe point")
	}
}
