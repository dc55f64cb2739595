package master

import (
	"fmt"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/sharedstate"
)

// peer is one registered or accepted peer.
type peer struct {
	id       PeerID
	conn     ConnID
	group    *group
	hello    wire.Hello
	state    PeerState
	joined   time.Time
	lastSeen time.Time
	observed string // where its connection comes from, as the master sees it (Opened); may be empty
	inbound  bool   // others can dial its advertised address (address.go)
	// placedAgain: a ring neighbour could not dial this newcomer while wiring, and the ring was
	// re-wired around that link once (cutUnreachable); the next such failure evicts it.
	placedAgain bool

	voteTopo    bool // voted in UpdateTopology
	rewire      bool // asked for the links to be re-established
	noAdmit     bool // voted to keep the registered peers waiting (a repair, not a membership step)
	votePending bool // voted in ArePeersPending
	leaving     bool // its pending vote was its last: it leaves when the vote completes

	voteOpt  bool           // voted in OptimizeTopology
	voteSync *wire.VoteSync // vote in SyncSharedState, nil if none
	digest   sharedstate.Digest
	step     sharedstate.StepTag // last reported training step
	hasStep  bool
	// siteNICs is the intra-site fabric's per-NIC rate (bytes per second, by NIC index) over the
	// last collective the peer reported with per-NIC figures (wire.Done.SiteNICBytes), nil if none.
	siteNICs []float64
}

// join registers the peer that sent Hello h on connection c.
func (m *Machine) join(c ConnID, h *wire.Hello) {
	if h.Token != m.cfg.Token {
		m.refuseFinal(c, "run token mismatch: start the peer with the master's --token", "run token mismatch")
		m.counters.Kicked++
		m.note("kicked", c, "run token mismatch")
		return
	}
	if h.Addr == "" {
		m.refuseFinal(c, "hello without a p2p address", "no address")
		m.counters.Kicked++
		return
	}
	if r := h.Resume; r != nil && r.Incarnation == m.cfg.Incarnation && h.Peer != 0 && m.peers[h.Peer] == nil {
		// A peer of this very master that lost its session: this master removed it (and aborted what
		// it took part in), so its ring and operations are gone. It comes back as a newcomer.
		reason := fmt.Sprintf("this master removed peer %d (%s); join again as a new peer", h.Peer, m.removed.why(h.Peer))
		m.refuse(c, reason, "removed")
		m.counters.Kicked++
		m.note("kicked", h.Peer, "connection %d refused: %s", c, reason)
		return
	}
	if !m.admit(c) {
		return
	}
	id := h.Peer
	switch {
	case id != 0 && m.peers[id] != nil:
		reason := fmt.Sprintf("peer id %d is held by a live peer", id)
		m.refuse(c, reason, "duplicate peer id")
		m.counters.Kicked++
		m.note("kicked", 0, "connection %d refused: %s", c, reason)
		return
	case id == 0:
		id = m.assignID(c)
	}
	g := m.group(h.Group)
	p := &peer{id: id, conn: c, group: g, hello: *h, state: Registered, joined: m.now, lastSeen: m.now, observed: m.remotes[c]}
	delete(m.remotes, c)
	m.peers[id] = p
	m.conns[c] = id
	m.ids = insertSorted(m.ids, id)
	g.reg = insertSorted(g.reg, id)
	m.watch(p)
	m.counters.Joined++
	m.gnote(g, "joined", id, "addr %s site %q", h.Addr, h.Site)
	p.inbound = m.checkNAT(p)
	m.send(id, &wire.Welcome{
		Peer:              id,
		HeartbeatInterval: uint64(m.cfg.HeartbeatInterval),
		HeartbeatTimeout:  uint64(m.cfg.HeartbeatTimeout),
		Incarnation:       m.cfg.Incarnation,
		Public:            p.observed,
		Inbound:           p.inbound,
	})
	m.noteNAT(p)
	m.resumeReport(m.peers[id])
	// Bootstrap: with nobody accepted there is nobody to vote, so wire the newcomers at once.
	if g.wiring == nil && len(g.ring) == 0 {
		m.startRound(g, true)
	}
}

// assignID picks the id of a peer that did not choose one: its connection number, as connection
// numbers are never reused, unless a peer that chose its id holds that number; then the next free one.
func (m *Machine) assignID(c ConnID) PeerID {
	id := c
	for id == 0 || m.peers[id] != nil {
		id++
	}
	return id
}

// kick tells a peer why it is removed, closes its connection and removes it.
func (m *Machine) kick(id PeerID, reason string) {
	p := m.peers[id]
	if p == nil {
		return
	}
	m.refuse(p.conn, reason, reason)
	m.counters.Kicked++
	m.remove(id, "kicked", reason)
}

// remove forgets a peer and repairs everything of its group it was part of. A departure costs the
// group exactly one epoch: the ring is spliced now, under the epoch in force (no collective can start
// on a spliced ring, and the epoch is sent to nobody), and the wiring round that repairs it hands out
// the next epoch.
func (m *Machine) remove(id PeerID, kind, reason string) {
	p := m.peers[id]
	g := p.group
	delete(m.peers, id)
	delete(m.conns, p.conn)
	m.ids = deleteSorted(m.ids, id)
	if p.state == Accepted {
		g.acc = deleteSorted(g.acc, id)
	} else {
		g.reg = deleteSorted(g.reg, id)
	}
	if p.voteTopo {
		g.topoVotes--
	}
	if p.votePending {
		g.pendingVotes--
	}
	if p.voteSync != nil {
		g.syncVotes--
	}
	m.counters.Left++
	m.gnote(g, kind, id, "%s", reason)
	m.removed.add(id, fmt.Sprintf("%s at %s: %s", kind, m.now.UTC().Format(time.TimeOnly), reason))

	if i := slices.Index(g.ring, id); i >= 0 {
		// Splice it out: the ring keeps its order and only the gone peer's neighbours need new links.
		g.ring = slices.Delete(slices.Clone(g.ring), i, i+1)
		g.ringDirty = true
		m.gnote(g, "ring", 0, "epoch %d: peer %d spliced out, ring %v", g.epoch, id, g.ring)
	}
	if p.state == Accepted {
		m.abortAll(g, id, fmt.Sprintf("peer %d left: %s", id, reason))
	}
	if g.wiring != nil && g.wiring.member[id] {
		g.wiring.ring = slices.DeleteFunc(slices.Clone(g.wiring.ring), func(x PeerID) bool { return x == id })
		delete(g.wiring.member, id)
		m.restartRound(g)
	}
	m.checkTopology(g)
	m.checkPending(g)
	m.leaveSync(g, id)
	m.leaveOptimize(g, id)
	m.diagForget(g, id)
	m.forgetCuts(id)
	for e := range m.lat {
		if e.from == id || e.to == id {
			delete(m.lat, e)
		}
	}
	for e := range m.bw {
		if e.from == id || e.to == id {
			delete(m.bw, e)
		}
	}
	for _, tag := range g.tags() {
		if o := g.ops[tag]; o != nil {
			m.checkOp(g, o)
		}
	}
	if g.wiring == nil && len(g.ring) == 0 && len(m.registered(g)) > 0 {
		m.startRound(g, true)
	}
}
