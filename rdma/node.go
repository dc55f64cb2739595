package rdma

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// ErrBusy reports a collective started while another one runs on the same node.
var ErrBusy = errors.New("rdma: another collective is running")

// Stats are a node's hot-repair counters.
type Stats struct {
	// Failovers counts path moves to another NIC pair (handshakes completed as sender).
	Failovers int
	// RetransmittedBytes counts data bytes posted again after a failover rewound a path.
	RetransmittedBytes int64
	// NICBytes counts, per NIC of this node (its index), the data bytes posted on it as sender,
	// retransmissions included.
	NICBytes []int64
	// ChunkBytes is the configured chunk size.
	ChunkBytes int
	// FirstDetect is when this node first saw a failure (detection note), zero if never; FirstResume is
	// when it first resumed a path after a failover.
	FirstDetect, FirstResume time.Time
	// AffectedPaths lists the paths this node failed over as sender.
	AffectedPaths []PathID
	// Notes is the protocol's log, oldest first.
	Notes []string
}

// Node runs the intra-site collectives of one node over a fabric endpoint: multi-rail channels (one
// per NIC), and hot repair of every path.
//
// Every field is owned by the endpoint's event context. The Start methods, Stats and Repair must be
// called there (from an event handler, a Post callback, [Node.Do], or, with the sim provider, between
// runs); the blocking methods (AllReduce and the others taking a context) may be called from any
// goroutine, one at a time, and must not be called from the event context. One collective runs at a
// time: a Start method called while another runs returns [ErrBusy].
//
// A Start method that returns an error started nothing and never calls done; one that returns nil
// calls done exactly once, in the event context, possibly before it returns (a ring of one node has
// nothing to move). Each method says how long it reads or writes the caller's buffers; with
// Config.Direct the result buffer is written during the call and holds undefined bytes after an
// error.
type Node struct {
	ep    Endpoint
	cfg   Config
	ring  []NodeID
	rank  int
	nics  []NIC
	m     *Repair
	conns map[connKey]Conn
	dead  map[Conn]bool
	up    map[Conn]bool

	timer   Timer
	timerAt time.Time

	op      *operation
	pathOps map[PathID]uint64 // how often each path was opened: both ends count alike, so it numbers
	// the path's operations even when other nodes take no part in some of them (Send/Recv)
	early map[earlyKey][]early // chunks of operations not started here yet

	probeIndex map[connKey]uint32 // index of the current probe connection per (peer, NIC)

	// scratch is the working buffer of the last operation that borrowed one (see scratchBuffer), kept
	// for the next: allocating and first touching hundreds of MiB for every call costs as much CPU
	// as moving them. scratchFree says no operation uses it and no provider may still read it.
	scratch     []byte
	scratchFree bool
	// spare holds copies of chunks that were held back (early or gated) and applied, for the next
	// ones: at hundreds of MiB an operation, fresh copies cost more in page faults than in copying.
	spare      [][]byte
	spareBytes int

	stats Stats
}

type connKey struct {
	peer  NodeID
	nic   NICID
	class Class
}

type earlyKey struct {
	path PathID
	op   uint32 // low 16 bits of the path's operation number
}

type early struct {
	conn Conn
	seq  uint64
	data []byte
}

// NewNode returns the runtime of the endpoint's node in a group whose nodes form ring (every node
// lists the same ring; every node has the same number of NICs in the same order, and passes the same
// Config.ChannelWeights, since the collectives split their channels by them and every node must cut
// alike; the NICs' declared and measured bandwidths belong in the planner's topology, see
// [Node.Calibrate]). It connects to its ring neighbours on every NIC (data, control and probe
// connections: the backups exist from the start) and starts handling the endpoint's events: it calls
// ep.Start, so the endpoint must not have been started. Call it from any one goroutine; the Node
// belongs to the event context afterwards.
func NewNode(ep Endpoint, ring []NodeID, cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	rank := slices.Index(ring, ep.Node())
	if rank < 0 {
		return nil, fmt.Errorf("%w: node %d not in ring %v", ErrInvalid, ep.Node(), ring)
	}
	if cfg.ChannelWeights != nil && len(cfg.ChannelWeights) != len(ep.NICs()) {
		return nil, fmt.Errorf("%w: Config.ChannelWeights has %d weights for %d NICs", ErrInvalid, len(cfg.ChannelWeights), len(ep.NICs()))
	}
	if cfg.ChannelWeights == nil {
		cfg.ChannelWeights = slices.Repeat([]float64{1}, len(ep.NICs())) // an even split
	} else {
		cfg.ChannelWeights = slices.Clone(cfg.ChannelWeights)
	}
	n := &Node{ep: ep, cfg: cfg, ring: slices.Clone(ring), rank: rank, nics: ep.NICs(), conns: map[connKey]Conn{},
		dead: map[Conn]bool{}, up: map[Conn]bool{}, early: map[earlyKey][]early{}, pathOps: map[PathID]uint64{}, probeIndex: map[connKey]uint32{}}
	n.stats.ChunkBytes = cfg.ChunkBytes
	n.stats.NICBytes = make([]int64, len(n.nics))
	n.m = NewRepair(ep.Node(), ring, n.nics, cfg.Repair)
	for _, peer := range n.m.neighbours() {
		if err := n.connectPeer(peer, 0); err != nil {
			return nil, err
		}
	}
	if err := ep.Start(n.handle); err != nil {
		return nil, err
	}
	return n, nil
}

// connectPeer opens data, control and probe connections to peer on every rail-aligned NIC pair.
func (n *Node) connectPeer(peer NodeID, index uint32) error {
	for i := range n.nics {
		for _, cl := range []Class{DataClass, ControlClass, ProbeClass} {
			k := connKey{peer, NICID(i), cl}
			if _, ok := n.conns[k]; ok && index == 0 {
				continue
			}
			c, err := n.ep.Connect(ConnSpec{Peer: peer, Local: NICID(i), Remote: NICID(i), Class: cl, Index: index})
			if err != nil {
				return fmt.Errorf("node %d: %w", n.ep.Node(), err)
			}
			n.conns[k] = c
		}
	}
	return nil
}

// Stats returns a copy of the node's counters. Call it in the event context.
func (n *Node) Stats() Stats {
	s := n.stats
	s.AffectedPaths = slices.Clone(s.AffectedPaths)
	s.Notes = slices.Clone(s.Notes)
	s.NICBytes = slices.Clone(s.NICBytes)
	return s
}

// NICBytes returns a copy of Stats().NICBytes alone, for a caller that reads it around every
// collective. Call it in the event context.
func (n *Node) NICBytes() []int64 { return slices.Clone(n.stats.NICBytes) }

// Repair returns the node's hot-repair state machine, for inspection (health of NICs) only, in the
// event context; the caller must not step it.
func (n *Node) Repair() *Repair { return n.m }

// step feeds the machine, carries out its actions and returns them.
func (n *Node) step(in Input) []Action {
	// Actions may feed the machine again (a resumed path posts chunks): copy them first.
	acts := slices.Clone(n.m.Step(n.ep.Now(), in))
	for _, a := range acts {
		n.act(a)
	}
	n.arm()
	return acts
}

func (n *Node) arm() {
	d := n.m.Deadline()
	if d.IsZero() || (!n.timerAt.IsZero() && !d.Before(n.timerAt)) {
		return
	}
	if n.timer != nil {
		n.timer.Stop()
	}
	n.timerAt = d
	n.timer = n.ep.AfterFunc(max(d.Sub(n.ep.Now()), 0), func() {
		n.timerAt, n.timer = time.Time{}, nil
		n.step(Tick{})
	})
}

func (n *Node) act(a Action) {
	switch a := a.(type) {
	case Resume:
		if n.op != nil {
			n.op.resume(a)
		}
		if !n.stats.FirstDetect.IsZero() && n.stats.FirstResume.IsZero() && a.Epoch > 0 {
			n.stats.FirstResume = n.ep.Now()
		}
	case Pause:
		if n.op != nil {
			if s := n.op.out[a.Path]; s != nil {
				s.paused = true
			}
		}
	case Accept, Reject:
		// Answered synchronously in arrived.
	case SendMsg:
		n.sendControl(a)
	case ProbeNIC:
		n.probe(a)
	case Reconnect:
		n.reconnect(a)
	case PathFailed:
		if n.op != nil {
			n.op.finish(a.Err)
		}
	case Note:
		if n.stats.FirstDetect.IsZero() && a.Kind == "detect" {
			n.stats.FirstDetect = n.ep.Now()
		}
		if a.Kind == "repair" {
			n.stats.Failovers++
			if !slices.Contains(n.stats.AffectedPaths, a.Path) {
				n.stats.AffectedPaths = append(n.stats.AffectedPaths, a.Path)
			}
		}
		if a.Path == (PathID{}) {
			n.stats.Notes = append(n.stats.Notes, fmt.Sprintf("%s: %s", a.Kind, a.Text))
		} else {
			n.stats.Notes = append(n.stats.Notes, fmt.Sprintf("%s %v: %s", a.Kind, a.Path, a.Text))
		}
	}
}

func (n *Node) alive(c Conn) bool { return c != nil && !n.dead[c] }

// sendControl sends a control message on the two nearest NICs that are believed healthy at both ends,
// avoiding the failed pair's NIC where others exist: a second copy survives a NIC that fails while the
// first is in flight. Every message of the protocol is idempotent, so duplicates are harmless.
func (n *Node) sendControl(a SendMsg) {
	n.ensurePeer(a.To)
	b := AppendMessage(make([]byte, 0, MessageSize), a.Msg)
	order := make([]NICID, len(n.nics))
	for i := range order {
		order[i] = NICID(i)
	}
	slices.SortStableFunc(order, func(x, y NICID) int { return n.nics[x].Distance - n.nics[y].Distance })
	self := n.ep.Node()
	sent := 0
	for _, strict := range []bool{true, false} {
		for _, i := range order {
			if sent == 2 {
				return
			}
			if strict != (i != a.Avoid && n.ep.Health(i) != Down && n.m.Health(NICRef{self, i}) != Down &&
				n.m.Health(NICRef{a.To, i}) != Down && !n.m.links[linkKey(NICRef{self, i}, NICRef{a.To, i})]) {
				continue
			}
			if c := n.conns[connKey{a.To, i, ControlClass}]; n.alive(c) && c.Send(Chunk{Data: b}) == nil {
				sent++
			}
		}
		if sent > 0 {
			return
		}
	}
}

// probe posts a probe; without a probe connection to that NIC the machine's deadline counts it failed.
// A probe connection that failed (its NIC went down) is renewed first, with the peer's help: the probe
// is then answered once the NIC works again, which is how a healed NIC is found.
func (n *Node) probe(a ProbeNIC) {
	k := connKey{a.Peer, a.Local, ProbeClass}
	c := n.conns[k]
	if c == nil || c.Spec().Remote != a.Remote {
		return
	}
	if n.dead[c] {
		index := n.probeIndex[k] + 1
		n.renewProbe(k, a.Remote, index)
		n.sendControl(SendMsg{To: a.Peer, Avoid: a.Local, Msg: Message{Kind: MsgProbeConn, ID: uint64(index),
			A: NICRef{n.ep.Node(), a.Local}, B: NICRef{a.Peer, a.Remote}}})
		c = n.conns[k]
	}
	c.Probe(a.ID)
}

// renewProbe replaces the probe connection k (to remote NIC remote) with one of the given index, unless
// one with that index or a later one exists.
func (n *Node) renewProbe(k connKey, remote NICID, index uint32) {
	if index <= n.probeIndex[k] {
		return
	}
	c, err := n.ep.Connect(ConnSpec{Peer: k.peer, Local: k.nic, Remote: remote, Class: ProbeClass, Index: index})
	if err != nil {
		return
	}
	if old := n.conns[k]; old != nil {
		old.Close()
		n.dead[old] = true
	}
	n.conns[k] = c
	n.probeIndex[k] = index
}

func (n *Node) reconnect(a Reconnect) {
	for _, cl := range []Class{DataClass, ControlClass} {
		k := connKey{a.Peer, a.Local, cl}
		old := n.conns[k]
		c, err := n.ep.Connect(ConnSpec{Peer: a.Peer, Local: a.Local, Remote: a.Remote, Class: cl, Index: a.Index})
		if err != nil {
			continue
		}
		if old != nil {
			old.Close()
			n.dead[old] = true
		}
		n.conns[k] = c
	}
}

// ensurePeer opens connections to a node outside the neighbourhood (point-to-point operations).
func (n *Node) ensurePeer(peer NodeID) {
	if _, ok := n.conns[connKey{peer, 0, DataClass}]; !ok && peer != n.ep.Node() {
		n.connectPeer(peer, 0)
	}
}

// handle is the endpoint's event handler.
func (n *Node) handle(ev Event) {
	switch ev := ev.(type) {
	case ConnUp:
		n.up[ev.Conn] = true
	case ConnDown:
		n.dead[ev.Conn] = true
		s := ev.Conn.Spec()
		if s.Class == DataClass {
			n.step(LinkFailed{Peer: s.Peer, Local: s.Local, Remote: s.Remote, Err: ev.Err})
		}
	case PortChanged:
		n.step(PortState{NIC: ev.NIC, Health: ev.Health})
	case ProbeDone:
		n.step(ProbeResult{ID: ev.ID, OK: ev.Err == nil, Local: errors.Is(ev.Err, ErrNICDown), RTT: ev.RTT})
	case Completed:
		if ev.Conn.Spec().Class == DataClass && n.op != nil {
			n.op.completed(ev)
		}
	case Arrived:
		s := ev.Conn.Spec()
		switch s.Class {
		case ControlClass:
			m, err := DecodeMessage(ev.Data)
			if err != nil {
				return // a malformed control message harms no one
			}
			if m.Kind == MsgProbeConn {
				if m.B.Node == n.ep.Node() && int(m.B.NIC) < len(n.nics) && m.ID <= math.MaxUint32 {
					n.renewProbe(connKey{s.Peer, m.B.NIC, ProbeClass}, m.A.NIC, uint32(m.ID))
				}
				return
			}
			n.step(ControlIn{From: s.Peer, Msg: m})
		case DataClass:
			n.arrived(ev)
		}
	}
}

func (n *Node) arrived(ev Arrived) {
	id := PathID{Src: ev.Conn.Spec().Peer, Dst: n.ep.Node(), Channel: uint16(ev.Tag & 0xffff)}
	opTag := ev.Tag >> 16
	if n.op != nil {
		if in := n.op.in[id]; in != nil && opTag == uint32(in.op&0xffff) {
			n.op.arrived(ev.Conn, ev.Tag, ev.Seq, ev.Data)
			return
		}
	}
	// A chunk of an operation this node has not started yet: keep a copy until it starts. Chunks of
	// finished operations are duplicates and are dropped.
	if ahead := (opTag - uint32(n.pathOps[id]&0xffff)) & 0xffff; ahead >= 1 && ahead < 0x8000 {
		k := earlyKey{id, opTag}
		n.early[k] = append(n.early[k], early{ev.Conn, ev.Seq, n.hold(ev.Data)})
	}
}
