package master

import (
	"fmt"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/sharedstate"
)

// Input is an input to the Machine: Received, Closed or Tick.
type Input interface{ isInput() }

// Received is a control message from a peer's connection. The first message of a connection must be a
// Hello; the server numbers connections, and that number becomes the peer's id.
type Received struct {
	Peer PeerID
	Msg  wire.Message
}

// Closed reports that a peer's connection ended (EOF, reset, decode error). Err says why.
type Closed struct {
	Peer PeerID
	Err  string
}

// Tick lets the machine check heartbeat deadlines. The server sends one every HeartbeatInterval/4.
type Tick struct{}

func (Received) isInput() {}
func (Closed) isInput()   {}
func (Tick) isInput()     {}

// Action is an output of the Machine for the server to carry out, in order.
type Action interface{ isAction() }

// Send asks the server to send Msg to peer To.
type Send struct {
	To  PeerID
	Msg wire.Message
}

// Drop asks the server to close the peer's connection once the messages queued before it are sent.
type Drop struct {
	Peer   PeerID
	Reason string
}

// Note reports an Event for logs, metrics and the status page.
type Note struct{ Event Event }

func (Send) isAction() {}
func (Drop) isAction() {}
func (Note) isAction() {}

type peer struct {
	id       PeerID
	hello    wire.Hello
	state    PeerState
	joined   time.Time
	lastSeen time.Time

	voteTopo    bool // voted in UpdateTopology
	rewire      bool // asked for the links to be re-established
	votePending bool // voted in ArePeersPending

	voteOpt  bool           // voted in OptimizeTopology
	voteSync *wire.VoteSync // vote in SyncSharedState, nil if none
	digest   sharedstate.Digest
	step     sharedstate.StepTag // last reported training step
	hasStep  bool
}

// round is one ring-wiring phase: every member opens its links for epoch and reports LinksReady.
type round struct {
	epoch    uint64
	ring     []PeerID
	reported map[PeerID]*wire.LinksReady
}

// op is one collective on a tag.
type op struct {
	tag      uint64
	desc     wire.Desc
	descFrom PeerID
	voters   map[PeerID]bool // votes before it commenced
	seq      uint64          // 0 until it commenced
	epoch    uint64
	members  []PeerID        // participants once it commenced, ring order
	done     map[PeerID]bool // participants that reported Done
	told     map[PeerID]bool // participants that received their Outcome
	failed   bool
	code     wire.Code
	detail   string
	next     []nextVote // votes that arrived for the next operation on this tag
}

type nextVote struct {
	peer PeerID
	msg  *wire.Initiate
}

// Machine is the master's protocol logic: a pure state machine. It owns no sockets, goroutines or
// clocks: Step takes an event and the current time and returns the actions to carry out. It is not safe
// for concurrent use; the server calls it from one goroutine.
//
// Consensus rules: UpdateTopology, ArePeersPending and each collective complete when every accepted
// peer has voted; a registered peer waits and is accepted only through a wiring round. Every change of
// ring or membership bumps the epoch. When an accepted peer leaves, every collective it could take part
// in is aborted at once with CodePeerLeft, and collectives are refused with CodePeerLeft until an
// UpdateTopology re-wires the ring.
type Machine struct {
	cfg   Config
	now   time.Time
	peers map[PeerID]*peer
	ids   []PeerID // sorted ids of peers, for deterministic iteration

	ring      []PeerID // ring in force, all accepted peers in ring order
	epoch     uint64
	ringDirty bool   // a ring member left since the ring was wired
	wiring    *round // the wiring round in progress, or nil
	seq       uint64 // last collective sequence number handed out
	ops       map[uint64]*op
	sync      *syncRound         // the shared-state sync in progress, or nil
	prior     *sharedstate.Prior // the last accepted shared state; kept when every peer leaves

	bw       map[edge]float64       // bandwidth estimates, bytes/s, from tests and real collectives
	lat      map[edge]time.Duration // one-way latency estimates from tests
	opt      *optRound              // OptimizeTopology in progress, or nil
	solveSeq uint64
	proposal []PeerID // better ring found in the background, applied at the next OptimizeTopology
	forced   []PeerID // ring installed by the next OptimizeTopology (ForceRing)

	counters Counters
	events   []Event
	out      []Action
}

// maxEvents bounds the event history kept for the status page.
const maxEvents = 200

// New returns a Machine with no peers.
func New(cfg Config) *Machine {
	return &Machine{cfg: cfg.withDefaults(), peers: map[PeerID]*peer{}, ops: map[uint64]*op{}, bw: map[edge]float64{},
		lat: map[edge]time.Duration{}}
}

// Step applies one input at time now and returns the actions to carry out in order.
func (m *Machine) Step(now time.Time, ev Input) []Action {
	m.now = now
	m.out = nil
	switch ev := ev.(type) {
	case Received:
		m.receive(ev.Peer, ev.Msg)
	case Closed:
		if _, ok := m.peers[ev.Peer]; ok {
			m.remove(ev.Peer, "left", "connection closed: "+ev.Err)
		}
	case Tick:
		m.tick()
	case Solved:
		m.solved(ev)
	case Improved:
		m.improved(ev)
	case ForceRing:
		m.forced = slices.Clone(ev.Ring)
	}
	return m.out
}

func (m *Machine) send(to PeerID, msg wire.Message) { m.out = append(m.out, Send{To: to, Msg: msg}) }

func (m *Machine) note(kind string, p PeerID, format string, args ...any) {
	e := Event{Time: m.now, Kind: kind, Peer: p, Detail: fmt.Sprintf(format, args...)}
	m.events = append(m.events, e)
	if len(m.events) > maxEvents {
		m.events = slices.Delete(m.events, 0, len(m.events)-maxEvents)
	}
	m.out = append(m.out, Note{Event: e})
}

// kick tells a peer why it is removed, closes its connection and removes it.
func (m *Machine) kick(id PeerID, reason string) {
	m.send(id, &wire.Kick{Reason: reason})
	m.out = append(m.out, Drop{Peer: id, Reason: reason})
	if _, ok := m.peers[id]; ok {
		m.counters.Kicked++
		m.remove(id, "kicked", reason)
	}
}

func (m *Machine) accepted() []PeerID   { return m.inState(Accepted) }
func (m *Machine) registered() []PeerID { return m.inState(Registered) }

// inState returns the ids of the peers in state st, sorted.
func (m *Machine) inState(st PeerState) []PeerID {
	var ids []PeerID
	for _, id := range m.ids {
		if m.peers[id].state == st {
			ids = append(ids, id)
		}
	}
	return ids
}

func (m *Machine) receive(id PeerID, msg wire.Message) {
	p := m.peers[id]
	if p == nil {
		if h, ok := msg.(*wire.Hello); ok {
			m.join(id, h)
			return
		}
		// Not registered: the first message must be a Hello.
		m.send(id, &wire.Kick{Reason: fmt.Sprintf("first message is %T, want Hello", msg)})
		m.out = append(m.out, Drop{Peer: id, Reason: "no hello"})
		return
	}
	p.lastSeen = m.now
	switch msg := msg.(type) {
	case *wire.Heartbeat:
		m.send(id, &wire.HeartbeatAck{Seq: msg.Seq})
	case *wire.Bye:
		m.remove(id, "left", "said bye")
	case *wire.VoteTopology:
		m.voteTopology(p, msg)
	case *wire.LinksReady:
		m.linksReady(p, msg)
	case *wire.VotePending:
		m.votePending(p)
	case *wire.Initiate:
		m.initiate(p, msg)
	case *wire.Done:
		m.done(p, msg)
	case *wire.VoteSync:
		m.voteSync(p, msg)
	case *wire.SyncDone:
		m.syncDone(p, msg)
	case *wire.VoteOptimize:
		m.voteOptimize(p)
	case *wire.MeasureReport:
		m.measureReport(p, msg)
	case *wire.StepReport:
		p.step, p.hasStep = sharedstate.StepTag{Step: msg.Step, InOptimizer: msg.InOptimizer}, true
	default:
		m.kick(id, fmt.Sprintf("illegal message %T from a peer", msg))
	}
}

func (m *Machine) join(id PeerID, h *wire.Hello) {
	if h.Token != m.cfg.Token {
		m.send(id, &wire.Kick{Reason: "run token mismatch"})
		m.out = append(m.out, Drop{Peer: id, Reason: "run token mismatch"})
		m.counters.Kicked++
		m.note("kicked", id, "run token mismatch")
		return
	}
	if h.Addr == "" {
		m.send(id, &wire.Kick{Reason: "hello without a p2p address"})
		m.out = append(m.out, Drop{Peer: id, Reason: "no address"})
		m.counters.Kicked++
		return
	}
	m.peers[id] = &peer{id: id, hello: *h, state: Registered, joined: m.now, lastSeen: m.now}
	i, _ := slices.BinarySearch(m.ids, id)
	m.ids = slices.Insert(m.ids, i, id)
	m.counters.Joined++
	m.note("joined", id, "addr %s site %q", h.Addr, h.Site)
	m.send(id, &wire.Welcome{
		Peer:              id,
		HeartbeatInterval: uint64(m.cfg.HeartbeatInterval),
		HeartbeatTimeout:  uint64(m.cfg.HeartbeatTimeout),
	})
	// Bootstrap: with nobody accepted there is nobody to vote, so wire the newcomers at once.
	if m.wiring == nil && len(m.ring) == 0 {
		m.startRound()
	}
}

func (m *Machine) tick() {
	for _, id := range slices.Clone(m.ids) {
		p := m.peers[id]
		if p == nil {
			continue
		}
		if silent := m.now.Sub(p.lastSeen); silent > m.cfg.HeartbeatTimeout {
			m.counters.Timeouts++
			reason := fmt.Sprintf("no heartbeat for %v", silent.Round(time.Millisecond))
			m.note("timeout", id, "%s", reason)
			m.kick(id, reason)
		}
	}
}

// remove forgets a peer and repairs everything it was part of.
func (m *Machine) remove(id PeerID, kind, reason string) {
	p := m.peers[id]
	delete(m.peers, id)
	if i, ok := slices.BinarySearch(m.ids, id); ok {
		m.ids = slices.Delete(m.ids, i, i+1)
	}
	m.counters.Left++
	m.note(kind, id, "%s", reason)

	if i := slices.Index(m.ring, id); i >= 0 {
		// Splice it out: the ring keeps its order and only the gone peer's neighbours need new links.
		m.ring = slices.Delete(slices.Clone(m.ring), i, i+1)
		m.ringDirty = true
		m.epoch++
		m.note("ring", 0, "epoch %d: peer %d spliced out, ring %v", m.epoch, id, m.ring)
	}
	if p.state == Accepted {
		m.abortAll(id, fmt.Sprintf("peer %d left: %s", id, reason))
	}
	if m.wiring != nil && slices.Contains(m.wiring.ring, id) {
		m.wiring.ring = slices.DeleteFunc(slices.Clone(m.wiring.ring), func(x PeerID) bool { return x == id })
		m.restartRound()
	}
	m.checkTopology()
	m.checkPending()
	m.leaveSync(id)
	m.leaveOptimize(id)
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
	for _, tag := range m.tags() {
		if o := m.ops[tag]; o != nil {
			m.checkOp(o)
		}
	}
	if m.wiring == nil && len(m.ring) == 0 && len(m.registered()) > 0 {
		m.startRound()
	}
}

func (m *Machine) tags() []uint64 {
	tags := make([]uint64, 0, len(m.ops))
	for t := range m.ops {
		tags = append(tags, t)
	}
	slices.Sort(tags)
	return tags
}

// abortAll fails every collective the gone peer could be part of: all of them, since every accepted
// peer takes part in every collective.
func (m *Machine) abortAll(gone PeerID, detail string) {
	for _, tag := range m.tags() {
		o := m.ops[tag]
		if o.seq == 0 {
			// Not commenced: the ring it would run on is gone. Tell the voters; later votes are refused
			// with CodePeerLeft until the ring is re-wired.
			delete(o.voters, gone)
			if !o.failed {
				m.fail(o, wire.CodePeerLeft, detail)
			}
			m.dropVoting(o)
			continue
		}
		if i := slices.Index(o.members, gone); i >= 0 {
			o.members = slices.Delete(o.members, i, i+1)
			delete(o.done, gone)
			delete(o.told, gone)
		}
		if !o.failed {
			m.fail(o, wire.CodePeerLeft, detail)
		}
	}
}

// dropVoting removes a not-commenced op whose voters were all told its failure, and refuses the votes
// queued behind it.
func (m *Machine) dropVoting(o *op) {
	delete(m.ops, o.tag)
	for _, v := range o.next {
		if p := m.peers[v.peer]; p != nil {
			m.initiate(p, v.msg)
		}
	}
}

// fail marks o failed and sends the Outcome to everyone who voted or takes part and was not told yet.
func (m *Machine) fail(o *op, code wire.Code, detail string) {
	o.failed, o.code, o.detail = true, code, detail
	if o.seq != 0 {
		m.counters.OpsAborted++
		m.note("aborted", 0, "tag %d seq %d: %s: %s", o.tag, o.seq, code, detail)
	}
	for _, id := range m.opPeers(o) {
		if !o.told[id] {
			o.told[id] = true
			m.send(id, &wire.Outcome{Tag: o.tag, Seq: o.seq, Code: code, Detail: detail})
		}
	}
}

// opPeers returns who is in o: the voters before it commenced, the members after.
func (m *Machine) opPeers(o *op) []PeerID {
	if o.seq != 0 {
		return o.members
	}
	var ids []PeerID
	for _, id := range m.ids {
		if o.voters[id] {
			ids = append(ids, id)
		}
	}
	return ids
}

// busy reports whether p takes part in a commenced collective it has not finished.
func (m *Machine) busy(p *peer) bool {
	for _, o := range m.ops {
		if o.seq != 0 && slices.Contains(o.members, p.id) && !o.done[p.id] {
			return true
		}
	}
	return false
}

func (m *Machine) voteTopology(p *peer, v *wire.VoteTopology) {
	switch {
	case p.state != Accepted:
		m.kick(p.id, "UpdateTopology vote from a peer that is not accepted")
		return
	case p.voteTopo:
		m.kick(p.id, "second UpdateTopology vote in one round")
		return
	case m.wiring != nil && slices.Contains(m.wiring.ring, p.id):
		m.kick(p.id, "UpdateTopology vote while wiring the ring")
		return
	case m.busy(p):
		m.kick(p.id, "UpdateTopology vote while a collective of this peer is running")
		return
	case m.sync != nil && slices.Contains(m.sync.members, p.id):
		m.kick(p.id, "UpdateTopology vote while a shared-state sync of this peer is running")
		return
	case m.opt != nil && slices.Contains(m.opt.members, p.id):
		m.kick(p.id, "UpdateTopology vote while OptimizeTopology runs")
		return
	}
	p.voteTopo = true
	p.rewire = p.rewire || v.Rewire
	m.checkTopology()
}

// checkTopology completes UpdateTopology once every accepted peer has voted.
func (m *Machine) checkTopology() {
	if m.wiring != nil || m.opt != nil {
		return
	}
	acc := m.accepted()
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
	if len(m.registered()) == 0 && !m.ringDirty && !rewire {
		for _, id := range acc {
			m.send(id, &wire.Topology{Epoch: m.epoch, Changed: false, Ring: slices.Clone(m.ring)})
		}
		return
	}
	m.startRound()
}

// startRound begins wiring a ring made of the ring in force plus every registered peer.
func (m *Machine) startRound() {
	ring := slices.Clone(m.ring)
	for _, id := range m.registered() {
		ring = m.placeNewcomer(ring, id)
	}
	if len(ring) == 0 {
		return
	}
	m.wiring = &round{ring: ring}
	m.restartRound()
}

// restartRound (re)sends Connect for the current wiring round under a new epoch.
func (m *Machine) restartRound() {
	r := m.wiring
	if len(r.ring) == 0 {
		m.wiring = nil
		return
	}
	m.epoch++
	m.counters.Rounds++
	r.epoch = m.epoch
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
	r := m.wiring
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
		switch {
		case target != 0 && m.peers[target] != nil && m.peers[target].state == Registered:
			victims = append(victims, target)
		case m.peers[id].state == Registered:
			victims = append(victims, id)
		case target != 0 && m.peers[target] != nil:
			victims = append(victims, target)
		default:
			victims = append(victims, id)
		}
	}
	if len(victims) > 0 {
		slices.Sort(victims)
		victims = slices.Compact(victims)
		for _, v := range victims {
			if m.peers[v] != nil {
				m.kick(v, "unreachable from its ring neighbour")
			}
		}
		return
	}
	m.wiring = nil
	m.ring = r.ring
	m.ringDirty = false
	for _, id := range r.ring {
		q := m.peers[id]
		if q.state == Registered {
			q.state = Accepted
			m.counters.Accepted++
			m.note("accepted", id, "epoch %d, rank %d of %d", r.epoch, slices.Index(r.ring, id), len(r.ring))
		}
	}
	m.note("ring", 0, "epoch %d: ring %v", r.epoch, r.ring)
	m.checkOptimize()
	for _, id := range r.ring {
		m.send(id, &wire.Topology{Epoch: r.epoch, Changed: true, Ring: slices.Clone(r.ring)})
	}
	// Votes cast while the ring was being wired (pending queries) may now be complete.
	m.checkPending()
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
	m.checkPending()
}

// checkPending answers ArePeersPending once every accepted peer has voted; all get the same answer.
func (m *Machine) checkPending() {
	acc := m.accepted()
	if len(acc) == 0 {
		return
	}
	for _, id := range acc {
		if !m.peers[id].votePending {
			return
		}
	}
	answer := len(m.registered()) > 0
	for _, id := range acc {
		m.peers[id].votePending = false
		m.send(id, &wire.Pending{Answer: answer})
	}
}

func (m *Machine) initiate(p *peer, v *wire.Initiate) {
	if p.state != Accepted {
		m.kick(p.id, "collective from a peer that is not accepted")
		return
	}
	if n := len(m.ring); n < m.cfg.MinPeers {
		m.send(p.id, &wire.Outcome{Tag: v.Tag, Code: wire.CodeTooFewPeers,
			Detail: fmt.Sprintf("%d peers in the ring, MinPeers is %d", n, m.cfg.MinPeers)})
		return
	}
	if m.ringDirty {
		m.send(p.id, &wire.Outcome{Tag: v.Tag, Code: wire.CodePeerLeft,
			Detail: "the ring lost a peer; call UpdateTopology"})
		return
	}
	o := m.ops[v.Tag]
	if o == nil {
		o = &op{tag: v.Tag, desc: v.Desc, descFrom: p.id, voters: map[PeerID]bool{},
			done: map[PeerID]bool{}, told: map[PeerID]bool{}}
		m.ops[v.Tag] = o
	}
	switch {
	case o.seq != 0 && slices.Contains(o.members, p.id) && !o.done[p.id]:
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
	if o.failed {
		o.told[p.id] = true
		m.send(p.id, &wire.Outcome{Tag: o.tag, Code: o.code, Detail: o.detail})
	} else if v.Desc != o.desc {
		m.note("mismatch", p.id, "tag %d: %s", v.Tag, describeMismatch(o.desc, o.descFrom, v.Desc, p.id))
		m.fail(o, wire.CodeMismatch, describeMismatch(o.desc, o.descFrom, v.Desc, p.id))
	}
	m.checkOp(o)
}

func describeMismatch(a wire.Desc, pa PeerID, b wire.Desc, pb PeerID) string {
	return fmt.Sprintf("peer %d passed count %d dtype %d op %d quant %d, peer %d passed count %d dtype %d op %d quant %d",
		pa, a.Count, a.DType, a.Op, a.Quant, pb, b.Count, b.DType, b.Op, b.Quant)
}

// checkOp commences o when every accepted peer voted, and retires it when it is over.
func (m *Machine) checkOp(o *op) {
	if m.ops[o.tag] != o {
		return
	}
	if o.seq == 0 {
		for _, id := range m.accepted() {
			if !o.voters[id] {
				return
			}
		}
		if len(o.voters) == 0 {
			delete(m.ops, o.tag)
			return
		}
		if o.failed {
			// Everyone has heard of the failure; the next vote starts afresh.
			m.dropVoting(o)
			return
		}
		m.seq++
		o.seq, o.epoch = m.seq, m.epoch
		o.members = slices.Clone(m.ring)
		for _, id := range o.members {
			m.send(id, &wire.Commence{Tag: o.tag, Seq: o.seq, Epoch: o.epoch})
		}
		return
	}
	for _, id := range o.members {
		if !o.done[id] {
			return
		}
	}
	if !o.failed {
		m.counters.OpsDone++
		for _, id := range o.members {
			o.told[id] = true
			m.send(id, &wire.Outcome{Tag: o.tag, Seq: o.seq, Code: wire.CodeOK})
		}
	}
	delete(m.ops, o.tag)
	for _, v := range o.next {
		if q := m.peers[v.peer]; q != nil {
			m.initiate(q, v.msg)
		}
	}
}

func (m *Machine) done(p *peer, d *wire.Done) {
	o := m.ops[d.Tag]
	if d.Seq == 0 {
		// Withdrawal of a vote whose Commence the peer has not seen.
		switch {
		case o == nil:
			return // the op already ended for this peer
		case o.seq == 0 && o.voters[p.id]:
			if !o.failed {
				m.fail(o, wire.CodeAborted, fmt.Sprintf("peer %d withdrew: %s", p.id, d.Detail))
			}
			m.checkOp(o)
			return
		case o.seq != 0 && slices.Contains(o.members, p.id) && !o.done[p.id]:
			d = &wire.Done{Tag: d.Tag, Seq: o.seq, Code: wire.CodeAborted, Detail: d.Detail}
		default:
			return
		}
	}
	if o == nil || o.seq != d.Seq || !slices.Contains(o.members, p.id) || o.done[p.id] {
		m.kick(p.id, fmt.Sprintf("Done for tag %d seq %d, which this peer is not running", d.Tag, d.Seq))
		return
	}
	o.done[p.id] = true
	if d.Code == wire.CodeOK {
		m.observeLink(p.id, o.members, d.LinkBytes, d.LinkNanos)
	}
	if d.Code != wire.CodeOK && !o.failed {
		code := d.Code
		if code != wire.CodeAborted {
			code = wire.CodePeerLeft
		}
		m.fail(o, code, fmt.Sprintf("peer %d: %s", p.id, d.Detail))
	}
	m.checkOp(o)
}

// Snapshot returns a copy of the state for observers.
func (m *Machine) Snapshot(now time.Time) Snapshot {
	s := Snapshot{Time: now, Epoch: m.epoch, MinPeers: m.cfg.MinPeers, Ring: slices.Clone(m.ring),
		Counters: m.counters, Events: slices.Clone(m.events), Bandwidth: m.bandwidthMatrix()}
	for _, id := range m.ids {
		p := m.peers[id]
		s.Peers = append(s.Peers, PeerInfo{ID: id, Addr: p.hello.Addr, Site: p.hello.Site, State: p.state,
			Joined: p.joined, LastSeen: p.lastSeen})
	}
	for _, tag := range m.tags() {
		o := m.ops[tag]
		info := OpInfo{Tag: tag, Seq: o.seq, Count: o.desc.Count, Voted: len(o.voters), Done: len(o.done),
			Peers: len(o.members), Failed: o.failed}
		if o.failed {
			info.FailCause = o.code.String() + ": " + o.detail
		}
		s.Ops = append(s.Ops, info)
	}
	return s
}
