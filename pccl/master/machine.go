package master

import (
	"fmt"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/sharedstate"
)

// ConnID numbers a peer's control connection. The server assigns one per accepted connection; it is
// how the Machine's inputs name their sender and how its actions name their recipient. A peer's id
// (PeerID) is another thing: chosen by the peer in its Hello, or assigned by the master.
type ConnID = uint64

// Input is an input to the Machine: Received, Closed, Tick, Stalled, Solved, Improved or ForceRing.
type Input interface{ isInput() }

// Received is a control message from a connection. The first message of a connection must be a
// Hello.
type Received struct {
	Conn ConnID
	Msg  wire.Message
}

// Closed reports that a connection ended (EOF, reset, decode error). Err says why.
type Closed struct {
	Conn ConnID
	Err  string
}

// Tick lets the machine check heartbeat deadlines. The server sends one every HeartbeatInterval/4.
type Tick struct{}

// Opened reports a new connection before its first message: Remote is the address its packets come
// from, as the master sees it ("ip:port", or empty where the transport has none). The machine compares
// it with the address the peer advertises in its Hello, to warn of NAT.
type Opened struct {
	Conn   ConnID
	Remote string
}

func (Received) isInput() {}
func (Closed) isInput()   {}
func (Tick) isInput()     {}
func (Opened) isInput()   {}

// Action is an output of the Machine for the server to carry out, in order.
type Action interface{ isAction() }

// Send asks the server to send Msg on connection To.
type Send struct {
	To  ConnID
	Msg wire.Message
}

// Drop asks the server to close a connection once the messages queued before it are sent.
type Drop struct {
	Conn   ConnID
	Reason string
}

// Note reports an Event for logs, metrics and the status page.
type Note struct{ Event Event }

func (Send) isAction() {}
func (Drop) isAction() {}
func (Note) isAction() {}

// Machine is the master's protocol logic: a pure state machine. It owns no sockets, goroutines or
// clocks: Step takes an input and the current time and returns the actions to carry out. It is not
// safe for concurrent use; the server calls it from one goroutine.
//
// Membership (the peer table, heartbeats, kicks) is global; everything else lives in the group each
// peer joined (see group). The package documentation describes the message flow and the states.
//
// An input costs O(1) amortized in the number of peers n, not a scan of them: votes are counted, the
// members of a wiring round, a sync and a collective are indexed, and the heartbeat deadlines sit in
// a heap. What answers every peer costs O(n): the vote that completes a round, a departure (its
// aborts), a wiring round; so does placing a newcomer in the ring (O(1) while nothing was measured
// and the newcomer names no site). A Hello or a departure also moves up to 8n bytes to keep the
// sorted id lists. bench/scale measures these costs from 100 to 10,000 peers.
type Machine struct {
	cfg   Config
	now   time.Time
	peers map[PeerID]*peer
	ids   []PeerID // sorted ids of peers, for deterministic iteration
	conns map[ConnID]PeerID

	remotes map[ConnID]string // where connections without a Hello yet come from (Opened)
	removed removals          // why recently removed peers went, for the ones that come back

	silence silenceHeap // peers by last sign of life, for the heartbeat deadline

	groups map[GroupID]*group
	gids   []GroupID // sorted ids of groups, for deterministic iteration

	bw       map[edge]float64       // bandwidth estimates, bytes/s, from tests and real collectives
	lat      map[edge]time.Duration // one-way latency estimates from tests
	cuts     map[edge]linkCut       // links cut on the data path (pairOf keys) (cuts.go)
	doubted  map[edge]time.Time     // links whose inferred cut a dial failure overruled, until when (cuts.go)
	solveSeq uint64                 // last Solve request id, unique across groups

	resume  resumeState                 // the rebuild window after a restart (resume.go)
	contrib map[guardKey]*contributions // contributions reported for the contribution guard (guard.go)

	counters Counters
	events   []Event
	out      []Action

	// hearsSilent is a bug planted by the simulated soak (simhook.HearsSilent) to show that its
	// invariants catch it: tick counts every peer of a group as heard, however long it has been
	// silent. It is never set outside the simulator.
	hearsSilent bool
}

// maxEvents bounds the event history kept for the status page.
const maxEvents = 200

// New returns a Machine with no peers.
func New(cfg Config) *Machine {
	return &Machine{cfg: cfg.withDefaults(), peers: map[PeerID]*peer{}, conns: map[ConnID]PeerID{}, remotes: map[ConnID]string{},
		groups: map[GroupID]*group{}, bw: map[edge]float64{}, lat: map[edge]time.Duration{}, cuts: map[edge]linkCut{}, doubted: map[edge]time.Time{},
		contrib: map[guardKey]*contributions{}}
}

// Step applies one input at time now and returns the actions to carry out in order.
func (m *Machine) Step(now time.Time, ev Input) []Action {
	m.now = now
	m.out = nil
	switch ev := ev.(type) {
	case Received:
		m.receive(ev.Conn, ev.Msg)
	case Opened:
		if len(m.remotes) < maxPendingRemotes {
			m.remotes[ev.Conn] = ev.Remote
		}
	case Closed:
		delete(m.remotes, ev.Conn)
		if id, ok := m.conns[ev.Conn]; ok {
			m.remove(id, "left", "connection closed: "+ev.Err)
		}
	case Tick:
		m.tick()
		m.checkResume()
	case Dead:
		m.dead(ev)
	case Stalled:
		m.stalled(ev.Gap)
	case Solved:
		m.solved(ev)
	case Improved:
		m.improved(ev)
	case ForceRing:
		if g := m.groups[ev.Group]; g != nil {
			g.forced = slices.Clone(ev.Ring)
		}
	}
	return m.out
}

// send queues msg for peer to.
func (m *Machine) send(to PeerID, msg wire.Message) {
	if p := m.peers[to]; p != nil {
		m.out = append(m.out, Send{To: p.conn, Msg: msg})
	}
}

// refuse tells a connection why it is closed, and closes it. The peer may join again.
func (m *Machine) refuse(c ConnID, reason, short string) {
	delete(m.remotes, c)
	m.out = append(m.out, Send{To: c, Msg: &wire.Kick{Reason: reason}}, Drop{Conn: c, Reason: short})
}

// refuseFinal is refuse for a cause that joining again cannot fix (wire.Kick.Final).
func (m *Machine) refuseFinal(c ConnID, reason, short string) {
	delete(m.remotes, c)
	m.out = append(m.out, Send{To: c, Msg: &wire.Kick{Reason: reason, Final: true}}, Drop{Conn: c, Reason: short})
}

func (m *Machine) note(kind string, p PeerID, format string, args ...any) {
	m.noteEvent(Event{Time: m.now, Kind: kind, Peer: p, Detail: fmt.Sprintf(format, args...)})
}

// gnote notes an event of group g; its detail names the group unless it is the default group.
func (m *Machine) gnote(g *group, kind string, p PeerID, format string, args ...any) {
	d := fmt.Sprintf(format, args...)
	if g.id != 0 {
		d = fmt.Sprintf("group %d: %s", g.id, d)
	}
	m.noteEvent(Event{Time: m.now, Kind: kind, Peer: p, Group: g.id, Detail: d})
}

func (m *Machine) noteEvent(e Event) {
	m.events = append(m.events, e)
	if len(m.events) > maxEvents {
		m.events = slices.Delete(m.events, 0, len(m.events)-maxEvents)
	}
	m.out = append(m.out, Note{Event: e})
}

func (m *Machine) receive(c ConnID, msg wire.Message) {
	id, ok := m.conns[c]
	if !ok {
		if h, ok := msg.(*wire.Hello); ok {
			m.join(c, h)
			return
		}
		// Not registered: the first message must be a Hello.
		m.refuse(c, fmt.Sprintf("first message is %T, want Hello", msg), "no hello")
		return
	}
	p := m.peers[id]
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
		m.votePending(p, msg.Leave)
	case *wire.Rendezvous:
		m.rendezvous(p, msg)
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

// Snapshot returns a copy of the state for observers.
func (m *Machine) Snapshot(now time.Time) Snapshot {
	pol := m.cfg.Diagnosis.Reorder.withDefaults()
	s := Snapshot{Time: now, Incarnation: m.cfg.Incarnation, MinPeers: m.cfg.MinPeers,
		Counters: m.counters, Events: slices.Clone(m.events),
		Policy: PolicyInfo{Reorder: !pol.Off, ReorderMinConfidence: pol.MinConfidence, ReorderMinRatio: pol.MinRatio,
			ReorderInterval: pol.Interval, EvictAfter: m.cfg.Diagnosis.EvictAfter}}
	for _, id := range m.ids {
		p := m.peers[id]
		s.Peers = append(s.Peers, PeerInfo{ID: id, Group: p.group.id, Addr: p.hello.Addr, Site: p.hello.Site, NICs: slices.Clone(p.hello.NICs),
			State: p.state, Joined: p.joined, LastSeen: p.lastSeen, Step: p.step.Step, InOptimizer: p.step.InOptimizer, HasStep: p.hasStep,
			SiteNICRates: slices.Clone(p.siteNICs)})
	}
	for _, gid := range m.gids {
		g := m.groups[gid]
		gi := GroupInfo{ID: gid, Epoch: g.epoch, Ring: slices.Clone(g.ring)}
		if len(g.ring) <= MaxMatrixPeers {
			gi.Bandwidth = m.bandwidthMatrix(g.ring)
		}
		for _, tag := range g.tags() {
			o := g.ops[tag]
			info := OpInfo{Tag: tag, Seq: o.seq, Count: o.desc.Count, Voted: len(o.voters), Done: len(o.done),
				Peers: len(o.members), Failed: o.failed}
			if o.failed {
				info.FailCause = o.code.String() + ": " + o.detail
			}
			gi.Ops = append(gi.Ops, info)
		}
		m.diagSnapshot(g, &gi)
		if gid == 0 {
			s.Epoch, s.Ring, s.Ops, s.Bandwidth, s.Delay = gi.Epoch, gi.Ring, gi.Ops, gi.Bandwidth, gi.Delay
		}
		s.Groups = append(s.Groups, gi)
	}
	return s
}
