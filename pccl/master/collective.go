package master

import (
	"fmt"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// op is one collective on a tag of a group.
type op struct {
	tag      uint64
	desc     wire.Desc
	descFrom PeerID
	voters   map[PeerID]bool // votes before it commenced
	seq      uint64          // 0 until it commenced
	epoch    uint64
	members  []PeerID        // participants once it commenced, ring order
	ring     []PeerID        // the ring it commenced on; unlike members, kept whole when one leaves
	pos      map[PeerID]int  // index in ring of each member still present
	done     map[PeerID]bool // participants that reported Done
	told     map[PeerID]bool // participants that received their Outcome
	failed   bool
	code     wire.Code
	detail   string
	next     []nextVote // votes that arrived for the next operation on this tag

	links map[PeerID][]wire.LinkTiming // link timings from the members' Done, for diagnosis
	voted map[PeerID]time.Time         // when each vote was counted, for diagnosis
}

type nextVote struct {
	peer PeerID
	msg  *wire.Initiate
}

// abortAll fails every collective of g the gone peer could be part of: all of them, since every
// accepted peer of a group takes part in every collective of the group.
func (m *Machine) abortAll(g *group, gone PeerID, detail string) {
	for _, tag := range g.tags() {
		o := g.ops[tag]
		if o.seq == 0 {
			// Not commenced: the ring it would run on is gone. Tell the voters; later votes are refused
			// with CodePeerLeft until the ring is re-wired.
			delete(o.voters, gone)
			if !o.failed {
				m.fail(g, o, wire.CodePeerLeft, detail)
			}
			m.dropVoting(g, o)
			continue
		}
		if o.isMember(gone) {
			o.members = slices.DeleteFunc(o.members, func(id PeerID) bool { return id == gone })
			delete(o.pos, gone)
			delete(o.done, gone)
			delete(o.told, gone)
		}
		if !o.failed {
			m.fail(g, o, wire.CodePeerLeft, detail)
		}
	}
}

// dropVoting removes a not-commenced op whose voters were all told its failure, and refuses the votes
// queued behind it.
func (m *Machine) dropVoting(g *group, o *op) {
	delete(g.ops, o.tag)
	for _, v := range o.next {
		if p := m.peers[v.peer]; p != nil {
			m.initiate(p, v.msg)
		}
	}
}

// fail marks o failed and sends the Outcome to everyone who voted or takes part and was not told yet.
func (m *Machine) fail(g *group, o *op, code wire.Code, detail string) {
	o.failed, o.code, o.detail = true, code, detail
	if o.seq != 0 {
		m.counters.OpsAborted++
		m.diagAborted(g)
		m.gnote(g, "aborted", 0, "tag %d seq %d: %s: %s", o.tag, o.seq, code, detail)
	}
	for _, id := range m.opPeers(g, o) {
		if !o.told[id] {
			o.told[id] = true
			m.send(id, &wire.Outcome{Tag: o.tag, Seq: o.seq, Code: code, Detail: detail})
		}
	}
}

// opPeers returns who is in o, an op of g: the voters before it commenced (sorted; every voter is an
// accepted peer of g), the members after.
func (m *Machine) opPeers(g *group, o *op) []PeerID {
	if o.seq != 0 {
		return o.members
	}
	ids := make([]PeerID, 0, len(o.voters))
	for _, id := range m.accepted(g) {
		if o.voters[id] {
			ids = append(ids, id)
		}
	}
	return ids
}

// isMember reports whether id takes part in o, which commenced, and is still present.
func (o *op) isMember(id PeerID) bool {
	_, ok := o.pos[id]
	return ok
}

// successor returns the member that follows id in o's ring, skipping members that left, or 0 when id
// is the last one present.
func (o *op) successor(id PeerID) PeerID {
	i, n := o.pos[id], len(o.ring)
	for k := 1; k < n; k++ {
		if q := o.ring[(i+k)%n]; o.isMember(q) {
			return q
		}
	}
	return 0
}

// busy reports whether p takes part in a commenced collective it has not finished.
func (m *Machine) busy(p *peer) bool {
	for _, o := range p.group.ops {
		if o.seq != 0 && o.isMember(p.id) && !o.done[p.id] {
			return true
		}
	}
	return false
}

func (m *Machine) initiate(p *peer, v *wire.Initiate) {
	g := p.group
	if p.state != Accepted {
		m.kick(p.id, "collective from a peer that is not accepted")
		return
	}
	if !m.withinOps(p, v.Tag) {
		return
	}
	if n := len(g.ring); n < m.cfg.MinPeers {
		m.send(p.id, &wire.Outcome{Tag: v.Tag, Code: wire.CodeTooFewPeers,
			Detail: fmt.Sprintf("%d peers in the ring, MinPeers is %d", n, m.cfg.MinPeers)})
		return
	}
	if g.ringDirty {
		m.send(p.id, &wire.Outcome{Tag: v.Tag, Code: wire.CodePeerLeft,
			Detail: "the ring lost a peer; call UpdateTopology"})
		return
	}
	o := g.ops[v.Tag]
	if o == nil {
		o = &op{tag: v.Tag, desc: v.Desc, descFrom: p.id, voters: map[PeerID]bool{},
			done: map[PeerID]bool{}, told: map[PeerID]bool{}}
		g.ops[v.Tag] = o
	}
	switch {
	case o.seq != 0 && o.isMember(p.id) && !o.done[p.id]:
		m.kick(p.id, fmt.Sprintf("collective on tag %d started while the previous one on it is running", v.Tag))
		return
	case o.seq != 0 || o.voters[p.id]:
		if o.seq == 0 && !o.failed {
			m.kick(p.id, fmt.Sprintf("second vote for tag %d", v.Tag))
			return
		}
		o.next = append(o.next, nextVote{peer: p.id, msg: v})
		return
	}
	o.voters[p.id] = true
	m.diagVote(o, p.id)
	m.noteContribution(g, o, p.id, v.Stats)
	if o.failed {
		o.told[p.id] = true
		m.send(p.id, &wire.Outcome{Tag: o.tag, Code: o.code, Detail: o.detail})
	} else if v.Desc != o.desc {
		m.gnote(g, "mismatch", p.id, "tag %d: %s", v.Tag, describeMismatch(o.desc, o.descFrom, v.Desc, p.id))
		m.fail(g, o, wire.CodeMismatch, describeMismatch(o.desc, o.descFrom, v.Desc, p.id))
	}
	m.checkOp(g, o)
}

func describeMismatch(a wire.Desc, pa PeerID, b wire.Desc, pb PeerID) string {
	return fmt.Sprintf("peer %d passed count %d dtype %d op %d quant %d part bytes %d, peer %d passed count %d dtype %d op %d quant %d part bytes %d",
		pa, a.Count, a.DType, a.Op, a.Quant, a.Part, pb, b.Count, b.DType, b.Op, b.Quant, b.Part)
}

// checkOp commences o when every accepted peer of g voted, and retires it when it is over.
func (m *Machine) checkOp(g *group, o *op) {
	if g.ops[o.tag] != o {
		return
	}
	if o.seq == 0 {
		// Every voter is an accepted peer of g (a voter that leaves is struck off), so counting the
		// votes tells whether all have voted.
		if len(o.voters) < len(m.accepted(g)) {
			return
		}
		if len(o.voters) == 0 {
			delete(g.ops, o.tag)
			return
		}
		if o.failed {
			// Everyone has heard of the failure; the next vote starts afresh.
			m.dropVoting(g, o)
			return
		}
		if m.guard(g, o) {
			return
		}
		if m.reorderHold(g) {
			return // it commences on the re-ordered ring (reorder.go)
		}
		alone := true
		for _, other := range g.ops {
			if other != o && other.seq != 0 {
				alone = false // commenced and not retired: some member has not reported it done
			}
		}
		g.seq++
		o.seq, o.epoch = g.seq, g.epoch
		o.ring = slices.Clone(g.ring)
		o.members = slices.Clone(g.ring)
		o.pos = make(map[PeerID]int, len(o.ring))
		for i, id := range o.ring {
			o.pos[id] = i
		}
		for _, id := range o.members {
			m.send(id, &wire.Commence{Tag: o.tag, Seq: o.seq, Epoch: o.epoch, Alone: alone})
		}
		return
	}
	if len(o.done) < len(o.members) {
		return // done counts members only, and each once
	}
	if !o.failed {
		m.counters.OpsDone++
		for _, id := range o.members {
			o.told[id] = true
			m.send(id, &wire.Outcome{Tag: o.tag, Seq: o.seq, Code: wire.CodeOK})
		}
	}
	delete(g.ops, o.tag)
	if !o.failed {
		m.diagnose(g, o)
	}
	for _, v := range o.next {
		if q := m.peers[v.peer]; q != nil {
			m.initiate(q, v.msg)
		}
	}
	if g.reorder != nil && g.reorder.ring != nil {
		m.reorderHeld(g) // collectives held for a new ring may have been waiting for this one
	}
}

func (m *Machine) done(p *peer, d *wire.Done) {
	g := p.group
	o := g.ops[d.Tag]
	if d.Seq == 0 {
		// Withdrawal of a vote whose Commence the peer has not seen.
		switch {
		case o == nil:
			return // the op already ended for this peer
		case o.seq == 0 && o.voters[p.id]:
			if !o.failed {
				m.fail(g, o, wire.CodeAborted, fmt.Sprintf("peer %d withdrew: %s", p.id, d.Detail))
			}
			m.checkOp(g, o)
			return
		case o.seq != 0 && o.isMember(p.id) && !o.done[p.id]:
			d = &wire.Done{Tag: d.Tag, Seq: o.seq, Code: wire.CodeAborted, Detail: d.Detail}
		default:
			return
		}
	}
	if o == nil || o.seq != d.Seq || !o.isMember(p.id) || o.done[p.id] {
		m.kick(p.id, fmt.Sprintf("Done for tag %d seq %d, which this peer is not running", d.Tag, d.Seq))
		return
	}
	o.done[p.id] = true
	if d.Code != wire.CodeOK && d.Silent.Peer != 0 && !o.failed {
		// Only the report that fails the operation names the culprit: once a link stops, every peer
		// downstream starves in turn, and the first to starve is the far end of that link; later
		// reports of silence are its echo.
		m.silentLink(g, p.id, d.Silent)
	}
	if d.Code == wire.CodeOK {
		m.observeLink(p.id, o.successor(p.id), d.LinkBytes, d.LinkNanos)
		m.diagReport(o, p.id, d)
		if len(d.SiteNICBytes) > 0 && d.SiteNanos > 0 {
			p.siteNICs = make([]float64, len(d.SiteNICBytes))
			for i, b := range d.SiteNICBytes {
				p.siteNICs[i] = float64(b) / (float64(d.SiteNanos) / 1e9)
			}
		}
	}
	if d.Code != wire.CodeOK && !o.failed {
		// A local failure (e.g. a non-finite quantized result) is passed on as it is, since a retry
		// cannot fix it; any other failure means the ring broke, which a retry after re-wiring can.
		code := d.Code
		if code != wire.CodeAborted && code != wire.CodeLocalFailure {
			code = wire.CodePeerLeft
		}
		m.fail(g, o, code, fmt.Sprintf("peer %d: %s", p.id, d.Detail))
	}
	m.checkOp(g, o)
}
