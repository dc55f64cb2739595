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
	reported map[PeerID]*wire.LinksReady
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
	case g.wiring != nil && slices.Contains(g.wiring.ring, p.id):
		m.kick(p.id, "UpdateTopology vote while wiring the ring")
		return
	case m.busy(p):
		m.kick(p.id, "UpdateTopology vote while a collective of this peer is running")
		return
	case g.sync != nil && slices.Contains(g.sync.members, p.id):
		m.kick(p.id, "UpdateTopology vote while a shared-state sync of this peer is running")
		return
	case g.opt != nil && slices.Contains(g.opt.members, p.id):
		m.kick(p.id, "UpdateTopology vote while OptimizeTopology runs")
		return
	}
	p.voteTopo = true
	p.rewire = p.rewire || v.Rewire
	m.checkTopology(g)
}

// checkTopology completes UpdateTopology once every accepted peer of g has voted.
func (m *Machine) checkTopology(g *group) {
	if g.wiring != nil || g.opt != nil {
		return
	}
	acc := m.accepted(g)
	if len(acc) == 0 {
		return
	}
	rewire := false
	for _, id := range acc {
		p := m.peers[id]
		if !p.voteTopo {
			return
		}
		rewire = rewire || p.rewire
	}
	for _, id := range acc {
		m.peers[id].voteTopo, m.peers[id].rewire = false, false
	}
	if len(m.registered(g)) == 0 && !g.ringDirty && !rewire {
		for _, id := range acc {
			m.send(id, &wire.Topology{Epoch: g.epoch, Changed: false, Ring: slices.Clone(g.ring)})
		}
		return
	}
	m.startRound(g)
}

// startRound begins wiring a ring made of g's ring in force plus every registered peer of g.
func (m *Machine) startRound(g *group) {
	if m.holding() {
		return // the rebuild window after a restart wires every group when it closes
	}
	ring := slices.Clone(g.ring)
	for _, id := range m.registered(g) {
		ring = m.placeNewcomer(ring, id)
	}
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
	r.reported = map[PeerID]*wire.LinksReady{}
	infos := make([]wire.PeerInfo, len(r.ring))
	for i, id := range r.ring {
		p := m.peers[id]
		infos[i] = wire.PeerInfo{ID: id, Addr: p.hello.Addr, Site: p.hello.Site}
	}
	for _, id := range r.ring {
		m.send(id, &wire.Connect{Epoch: r.epoch, Ring: infos})
	}
}

func (m *Machine) linksReady(p *peer, l *wire.LinksReady) {
	g := p.group
	r := g.wiring
	if r == nil || l.Epoch != r.epoch || !slices.Contains(r.ring, p.id) {
		return // a report for a round that was restarted or ended: harmless
	}
	if r.reported[p.id] != nil {
		m.kick(p.id, fmt.Sprintf("second LinksReady for epoch %d", l.Epoch))
		return
	}
	r.reported[p.id] = l
	for _, id := range r.ring {
		if r.reported[id] == nil {
			return
		}
	}
	// Everyone reported. Remove whoever cannot be reached, newcomers first, and try again.
	var victims []PeerID
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
		switch {
		case q != nil && q.group == g && q.state == Registered:
			victims = append(victims, target)
		case m.peers[id].state == Registered:
			victims = append(victims, id)
		case q != nil && q.group == g:
			victims = append(victims, target)
		default:
			victims = append(victims, id)
		}
	}
	if len(victims) > 0 {
		slices.Sort(victims)
		victims = slices.Compact(victims)
		// Take them all out of the round first, so that the retry costs one epoch however many go.
		r.ring = slices.DeleteFunc(slices.Clone(r.ring), func(x PeerID) bool { return slices.Contains(victims, x) })
		for _, v := range victims {
			m.kick(v, "unreachable from its ring neighbour")
		}
		if g.wiring == r {
			m.restartRound(g)
		}
		return
	}
	g.wiring = nil
	g.ring = r.ring
	g.ringDirty = false
	for _, id := range r.ring {
		q := m.peers[id]
		if q.state == Registered {
			q.state = Accepted
			m.counters.Accepted++
			m.gnote(g, "accepted", id, "epoch %d, rank %d of %d", r.epoch, slices.Index(r.ring, id), len(r.ring))
		}
	}
	m.gnote(g, "ring", 0, "epoch %d: ring %v", r.epoch, r.ring)
	m.checkOptimize(g)
	for _, id := range r.ring {
		m.send(id, &wire.Topology{Epoch: r.epoch, Changed: true, Ring: slices.Clone(r.ring)})
	}
	// Votes cast while the ring was being wired (pending queries) may now be complete.
	m.checkPending(g)
}

func (m *Machine) votePending(p *peer) {
	switch {
	case p.state != Accepted:
		m.kick(p.id, "ArePeersPending vote from a peer that is not accepted")
		return
	case p.votePending:
		m.kick(p.id, "second ArePeersPending vote in one round")
		return
	}
	p.votePending = true
	m.checkPending(p.group)
}

// checkPending answers ArePeersPending once every accepted peer of g has voted; all get the same
// answer: whether g has registered peers waiting to be accepted.
func (m *Machine) checkPending(g *group) {
	acc := m.accepted(g)
	if len(acc) == 0 {
		return
	}
	for _, id := range acc {
		if !m.peers[id].votePending {
			return
		}
	}
	answer := len(m.registered(g)) > 0
	for _, id := range acc {
		m.peers[id].votePending = false
		m.send(id, &wire.Pending{Answer: answer})
	}
}
