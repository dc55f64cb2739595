package rdma

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
	"unsafe"

	"github.com/concord-ccl/concord/internal/hugemem"
	"github.com/concord-ccl/concord/rings"
)

// Config tunes a Node. The zero value works.
type Config struct {
	// ChunkBytes is the size of one numbered chunk on a channel (the unit of acknowledgement and of
	// retransmission after a failover). Zero means 256 KiB.
	ChunkBytes int
	// Window is how many chunks of one path may be in flight unacknowledged. It bounds what a failover
	// resends: at most Window chunks per affected path. Zero means 2.
	//
	// Providers complete a chunk when it reaches the receiver's memory, before the receiver's handler
	// reduces it (see [Completed]), so the unacknowledged chunks are those on the wire and in transport
	// buffers: what a failure can lose, and what any lossless transport must send again. A path keeps
	// its NIC busy only if Window × ChunkBytes covers the NIC's rate times the time from a chunk leaving
	// to the next being posted: the round trip plus the sender's delay in handling the completion.
	// Raising ChunkBytes rather than Window keeps the bound at Window chunks; raising Window keeps the
	// chunk small (a shorter pipeline fill) and resends more chunks, though no more bytes than are in
	// flight.
	Window int
	// Direct makes collectives work in the caller's result buffer instead of the node's scratch
	// buffer, as NCCL does: the input is not copied into a working buffer, nor the result out of one,
	// which saves two passes over the message per call. The price is the failure guarantee. recv is
	// written during the call, and after an error it holds undefined bytes (send is never written
	// when it is a different slice; send and recv must then not overlap). After an error, or after a
	// call in which a path failed over, a connection the call left behind may still read recv for a
	// while; the receiver drops what it sends. Off by default: recv is written only on success. A
	// caller that stages its buffers itself (pccl's hierarchical plans) loses nothing by turning it
	// on. Planned AllReduces that gather inputs need room beyond the message, so they keep the
	// scratch buffer and its copies.
	Direct bool
	// Repair tunes failure detection and hot repair.
	Repair RepairConfig
	// ChannelWeights, one per NIC in NIC order, sets each channel's share of the plain collectives
	// (AllReduce, ReduceScatter, AllGather, Broadcast, Send/Recv), in proportion to the weights. Every
	// node of the ring must pass the same weights, since each cuts the message alone. Nil splits
	// evenly, which every node does alike whatever its NICs declare: a NIC that came up at a lower
	// speed on one node does not make the nodes cut differently. Give the NICs' bandwidths here when
	// a node's NICs differ by design and every node's do alike. Planned AllReduces start from the
	// same weights, and plans with leaves or weighted rings level them on the plan's topology.
	ChannelWeights []float64
}

// Validate names the first invalid field.
func (c Config) Validate() error {
	if c.ChunkBytes < 0 {
		return fmt.Errorf("%w: Config.ChunkBytes is %d, must be >= 0", ErrInvalid, c.ChunkBytes)
	}
	if c.Window < 0 {
		return fmt.Errorf("%w: Config.Window is %d, must be >= 0", ErrInvalid, c.Window)
	}
	total := 0.0
	for i, w := range c.ChannelWeights {
		if !(w >= 0) || math.IsInf(w, 1) {
			return fmt.Errorf("%w: Config.ChannelWeights[%d] is %v, must be finite and >= 0", ErrInvalid, i, w)
		}
		total += w
	}
	if c.ChannelWeights != nil && !(total > 0 && !math.IsInf(total, 1)) {
		return fmt.Errorf("%w: Config.ChannelWeights %v must have a positive, finite sum", ErrInvalid, c.ChannelWeights)
	}
	return c.Repair.Validate()
}

func (c Config) withDefaults() Config {
	if c.ChunkBytes == 0 {
		c.ChunkBytes = 256 << 10
	}
	if c.Window == 0 {
		c.Window = 2
	}
	return c
}

// ErrBusy reports a collective started while another one runs on the same node.
var ErrBusy = errors.New("rdma: another collective is running")

// Stats are a node's hot-repair counters.
type Stats struct {
	// Failovers counts path moves to another NIC pair (handshakes completed as sender).
	Failovers int
	// RetransmittedBytes counts data bytes posted again after a failover rewound a path.
	RetransmittedBytes int64
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
// Every field is owned by the endpoint's event context. The Start methods must be called there (from
// an event handler, a Post callback, or, with the sim provider, between runs); the blocking methods
// (AllReduce and the others taking a context) may be called from any goroutine, one at a time, and
// must not be called from the event context.
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

// scratchBuffer lends the node's working buffer, grown to size bytes, to the operation about to start.
// The operation gives it back in finish (see operation.scratch).
func (n *Node) scratchBuffer(size int) []byte {
	if !n.scratchFree || cap(n.scratch) < size {
		n.scratch = hugemem.Make(size, size)
	}
	n.scratchFree = false
	return n.scratch[:size]
}

// maxSpareBytes bounds the capacity the node keeps in spare chunk copies.
const maxSpareBytes = 64 << 20

// hold returns a copy of a chunk that must wait, in a recycled buffer when one is large enough.
func (n *Node) hold(data []byte) []byte {
	for i := len(n.spare) - 1; i >= 0; i-- {
		if b := n.spare[i]; cap(b) >= len(data) {
			n.spare = slices.Delete(n.spare, i, i+1)
			n.spareBytes -= cap(b)
			return append(b[:0], data...)
		}
	}
	return slices.Clone(data)
}

// release takes back a copy made by hold once nothing reads it.
func (n *Node) release(b []byte) {
	if n.spareBytes+cap(b) > maxSpareBytes {
		return
	}
	n.spare = append(n.spare, b)
	n.spareBytes += cap(b)
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

// Stats returns a copy of the node's counters.
func (n *Node) Stats() Stats {
	s := n.stats
	s.AffectedPaths = slices.Clone(s.AffectedPaths)
	s.Notes = slices.Clone(s.Notes)
	return s
}

// Repair returns the node's hot-repair state machine, for inspection (health of NICs) only.
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

// operation is a running collective at one node.
type operation struct {
	n      *Node
	work   []byte
	region *Region
	dt     rings.DType
	rop    rings.Op
	world  int
	out    map[PathID]*outStream
	in     map[PathID]*inStream
	outs   []*outStream
	open   int // paths of the operation (zero: nothing to move)
	done   func(error)
	over   bool
	commit func()
	gates  map[int]*opGate
	// scratch says work is the node's scratch buffer. moved says some path resumed after posting
	// chunks: the connection they were posted on may still hold some that point into work.
	scratch bool
	moved   bool
	// src, when set, is the caller's input that work starts as a copy of. It is copied lazily, one
	// fillPage at a time just before a chunk first reads or writes that part of work (filled marks the
	// pages done), so the first chunks leave without waiting for a copy of the whole buffer and the
	// copy overlaps the transfer. A page that an arriving chunk covers whole is not copied at all: a
	// fold reads the input from src as it writes the page, and an all-gather chunk overwrites it.
	src    []byte
	filled []bool
	// sent, when set, runs once every outgoing path is acknowledged, before the incoming ones may
	// be complete: a calibration times its sends with it.
	sent func()
}

// fillPage is the unit of the lazy copy of an operation's input into its working buffer.
const fillPage = 64 << 10

// fill makes work[off:off+n] hold the input, copying the pages of it not copied yet.
func (o *operation) fill(off, n int) {
	if o.src == nil || n <= 0 {
		return
	}
	for p := off / fillPage; p <= (off+n-1)/fillPage; p++ {
		if !o.filled[p] {
			lo, hi := p*fillPage, min((p+1)*fillPage, len(o.work))
			copy(o.work[lo:hi], o.src[lo:hi])
			o.filled[p] = true
		}
	}
}

// cover prepares work[off:off+n] to be overwritten whole: a page of it not copied yet that the range
// covers whole needs no copy (it is marked done), and the pages it covers in part are filled.
func (o *operation) cover(off, n int) {
	o.eachPage(off, n, func(lo, hi int, whole bool) {
		if whole {
			o.filled[lo/fillPage] = true
		} else {
			o.fill(lo, hi-lo)
		}
	})
}

// fold stores in work[off:off+len(data)] the input folded with data (input op data). Where a page of
// the range was not copied yet and the range covers it whole, the fold reads the input straight from
// src and writes the page once (rings.AccumulateInto), instead of copying it and folding in place.
func (o *operation) fold(off int, data []byte) {
	if o.src == nil {
		rings.Accumulate(o.dt, o.rop, o.work[off:off+len(data)], data)
		return
	}
	o.eachPage(off, len(data), func(lo, hi int, whole bool) {
		in := data[lo-off : hi-off]
		if whole {
			rings.AccumulateInto(o.dt, o.rop, o.work[lo:hi], o.src[lo:hi], in)
			o.filled[lo/fillPage] = true
			return
		}
		o.fill(lo, hi-lo)
		rings.Accumulate(o.dt, o.rop, o.work[lo:hi], in)
	})
}

// eachPage calls f for each fillPage that work[off:off+n] overlaps, in order, with the overlap
// [lo, hi) and whether the page is not copied yet and lies wholly inside the range. Without a src it
// does nothing.
func (o *operation) eachPage(off, n int, f func(lo, hi int, whole bool)) {
	if o.src == nil {
		return
	}
	for lo, end := off, off+n; lo < end; {
		p := lo / fillPage
		pageEnd := min((p+1)*fillPage, len(o.work))
		hi := min(pageEnd, end)
		f(lo, hi, !o.filled[p] && lo == p*fillPage && hi == pageEnd)
		lo = hi
	}
}

// fillFrom makes the operation's input src, copied into work lazily. It must be called before the
// operation posts or applies anything.
func (o *operation) fillFrom(src []byte) {
	o.src = src
	o.filled = make([]bool, (len(src)+fillPage-1)/fillPage)
}

// opGate holds gated paths until every in path feeding it is complete; fold runs as it opens.
type opGate struct {
	need  int
	open  bool
	fold  func()
	outs  []*outStream
	ins   []*inStream
	feeds []*inStream
}

type outStream struct {
	op            uint64 // the path's operation number
	path          PathID
	plan          *outPlan
	dep           *inStream
	next          int // next frame to post
	acked         int // frames acknowledged
	high          int // one past the highest frame ever posted
	paused        bool
	local, remote NICID
	conn          Conn
	gate          *opGate
}

type inStream struct {
	op      uint64 // the path's operation number
	path    PathID
	plan    *inPlan
	got     int
	gate    *opGate
	feeds   *opGate
	pending []pendingChunk // accepted before its gate opened
	// wait, when set, is the incoming path whose frame plan.waitFor[i] must be applied before frame i
	// of this one; held keeps, in order, the accepted frames that wait. waiters are the paths that
	// wait on this one.
	wait    *inStream
	held    []pendingChunk
	waiters []*inStream
}

// waiting reports whether frame seq of in waits for a frame of in.wait not applied yet.
func (in *inStream) waiting(seq int) bool {
	if in.wait == nil || seq >= len(in.plan.waitFor) {
		return false
	}
	i := in.plan.waitFor[seq]
	return i >= 0 && i < len(in.wait.plan.frames) && in.wait.got <= i
}

// mustHold reports whether accepted frame seq of in has to wait before it is applied: it waits, or
// an earlier frame does (frames are applied in order).
func (in *inStream) mustHold(seq int) bool {
	return len(in.held) > 0 || in.waiting(seq)
}

type pendingChunk struct {
	seq  uint64
	data []byte
}

// start begins an operation with the given channel plans on working buffer work. commit runs on
// success before done.
func (n *Node) start(work []byte, dt rings.DType, op rings.Op, plans []channelPlan, commit func(), done func(error)) error {
	return n.startGated(work, dt, op, plans, nil, commit, done)
}

// startScratch is startFilled on a work buffer from scratchBuffer: the operation gives the buffer
// back when it ends, or at once when it does not start.
func (n *Node) startScratch(work, src []byte, dt rings.DType, op rings.Op, plans []channelPlan, folds map[int]func(), commit func(), done func(error)) error {
	if err := n.startFilled(work, src, dt, op, plans, folds, commit, done); err != nil {
		n.scratch, n.scratchFree = nil, false
		return err
	}
	if o := n.op; o != nil && !o.over {
		o.scratch = true
	} else {
		n.scratchFree = true // it finished inside start (nothing to move): nothing reads work
	}
	return nil
}

// startGated is start with gates: folds[g] runs when gate g opens (see channelPlan.gate).
func (n *Node) startGated(work []byte, dt rings.DType, op rings.Op, plans []channelPlan, folds map[int]func(), commit func(), done func(error)) error {
	return n.startFilled(work, nil, dt, op, plans, folds, commit, done)
}

// startFilled is startGated with work filled lazily from src (see operation.fillFrom); nil src means
// work is ready. Folds must not be used with a src.
func (n *Node) startFilled(work, src []byte, dt rings.DType, op rings.Op, plans []channelPlan, folds map[int]func(), commit func(), done func(error)) error {
	if n.op != nil {
		return ErrBusy
	}
	o := &operation{n: n, work: work, dt: dt, rop: op, world: len(n.ring), out: map[PathID]*outStream{},
		in: map[PathID]*inStream{}, done: done, commit: commit, gates: map[int]*opGate{}}
	if src != nil {
		o.fillFrom(src)
	}
	gate := func(g int) *opGate {
		if g == 0 {
			return nil
		}
		if o.gates[g] == nil {
			o.gates[g] = &opGate{fold: folds[g]}
		}
		return o.gates[g]
	}
	region, err := n.ep.Register(work)
	if err != nil {
		return err
	}
	o.region = region
	n.op = o
	var opens []Open
	for _, cp := range plans {
		outNIC, inNIC := NICID(cp.channel), NICID(cp.channel)
		if cp.routed {
			outNIC, inNIC = cp.outNIC, cp.inNIC
		}
		var in *inStream
		if cp.in != nil && len(cp.in.frames) > 0 {
			id := PathID{Src: cp.in.from, Dst: n.ep.Node(), Channel: cp.channel}
			n.pathOps[id]++
			in = &inStream{path: id, plan: cp.in, op: n.pathOps[id], gate: gate(cp.gate), feeds: gate(cp.feeds)}
			if in.gate != nil {
				in.gate.ins = append(in.gate.ins, in)
			}
			if in.feeds != nil {
				in.feeds.need++
				in.feeds.feeds = append(in.feeds.feeds, in)
			}
			o.in[id] = in
			o.open++
			opens = append(opens, Open{Path: id, Op: in.op, Primary: inNIC, Chunks: uint64(len(cp.in.frames))})
			n.ensurePeer(cp.in.from)
		}
		if cp.out != nil && len(cp.out.frames) > 0 {
			id := PathID{Src: n.ep.Node(), Dst: cp.out.to, Channel: cp.channel}
			n.pathOps[id]++
			s := &outStream{path: id, plan: cp.out, dep: in, paused: true, op: n.pathOps[id], gate: gate(cp.gate)}
			if s.gate != nil {
				s.gate.outs = append(s.gate.outs, s)
			}
			o.out[id] = s
			o.outs = append(o.outs, s)
			o.open++
			opens = append(opens, Open{Path: id, Op: s.op, Primary: outNIC, Chunks: uint64(len(cp.out.frames))})
			n.ensurePeer(cp.out.to)
		}
	}
	// Cross-path links: an out path whose frames depend on another channel's incoming path, and an
	// incoming path whose frames wait for another's.
	byChannel := map[uint16]*inStream{}
	for _, in := range o.in {
		byChannel[in.path.Channel] = in
	}
	unlinked := func(ch, other uint16) error {
		o.over, n.op = true, nil
		n.ep.Deregister(region)
		return fmt.Errorf("%w: channel %d is linked to channel %d, which has no incoming path here", ErrInvalid, ch, other)
	}
	for _, cp := range plans {
		if cp.out != nil && cp.out.depOn != nil && len(cp.out.frames) > 0 {
			s := o.out[PathID{Src: n.ep.Node(), Dst: cp.out.to, Channel: cp.channel}]
			if s.dep = byChannel[*cp.out.depOn]; s.dep == nil {
				return unlinked(cp.channel, *cp.out.depOn)
			}
		}
		if cp.in != nil && cp.in.waitOn != nil && len(cp.in.frames) > 0 {
			in := byChannel[cp.channel]
			if in.wait = byChannel[*cp.in.waitOn]; in.wait == nil {
				return unlinked(cp.channel, *cp.in.waitOn)
			}
			in.wait.waiters = append(in.wait.waiters, in)
		}
	}
	for _, g := range o.gates {
		g.open = g.need == 0
		if g.open && g.fold != nil {
			g.fold()
		}
	}
	for _, in := range opens {
		n.step(in)
	}
	// Replay chunks that arrived before the operation started here.
	for _, in := range o.in {
		k := earlyKey{in.path, uint32(in.op & 0xffff)}
		for _, e := range n.early[k] {
			if n.op == o {
				o.arrived(e.conn, tag(in.op, in.path.Channel), e.seq, e.data)
			}
			n.release(e.data) // arrived applied it or kept its own copy
		}
		delete(n.early, k)
	}
	if n.op == o && o.open == 0 {
		o.finish(nil)
	}
	return nil
}

// tag names a path's operation on the wire: the low 16 bits of its number, and the channel.
func tag(op uint64, channel uint16) uint32 { return uint32(op&0xffff)<<16 | uint32(channel) }

func (o *operation) resume(a Resume) {
	s := o.out[a.Path]
	if s == nil {
		return
	}
	conn := o.n.conns[connKey{a.Path.Dst, a.Local, DataClass}]
	if s.high > 0 {
		o.moved = true // chunks posted before the pause may still be queued where they were posted
	}
	s.local, s.remote = a.Local, a.Remote
	s.conn = conn
	s.next = int(a.From)
	s.acked = int(a.From) // the receiver's word: chunks from there on are sent and acknowledged anew
	s.paused = false
	if a.Epoch > 0 && a.From > 0 || s.high > int(a.From) {
		o.n.stats.Notes = append(o.n.stats.Notes, fmt.Sprintf("resume %v epoch %d from %d", a.Path, a.Epoch, a.From))
	}
	o.pump(s)
	o.check()
}

// pump posts the ready frames of s within the window.
func (o *operation) pump(s *outStream) {
	n := o.n
	for !s.paused && !o.over && (s.gate == nil || s.gate.open) && s.next < len(s.plan.frames) && s.next-s.acked < n.cfg.Window {
		f := s.plan.frames[s.next]
		if f.dep >= 0 && (s.dep == nil || s.dep.got <= f.dep) {
			return
		}
		if !n.alive(s.conn) {
			// The pair's connection failed earlier (perhaps while no path used it): that is a failure
			// of this path too.
			n.step(LinkFailed{Peer: s.path.Dst, Local: s.local, Remote: s.remote, Err: ErrClosed})
			return
		}
		o.fill(f.off, f.n)
		if err := s.conn.Send(Chunk{Tag: tag(s.op, s.path.Channel), Seq: uint64(s.next), Data: o.work[f.off : f.off+f.n]}); err != nil {
			return
		}
		if s.next < s.high {
			n.stats.RetransmittedBytes += int64(f.n)
		}
		seq := s.next
		s.next++
		s.high = max(s.high, s.next)
		n.step(Posted{Path: s.path, Seq: uint64(seq), Local: s.local, Remote: s.remote})
	}
}

func (o *operation) completed(ev Completed) {
	sp := ev.Conn.Spec()
	id := PathID{Src: o.n.ep.Node(), Dst: sp.Peer, Channel: uint16(ev.Tag & 0xffff)}
	s := o.out[id]
	if s == nil || ev.Tag>>16 != uint32(s.op&0xffff) || s.paused || sp.Local != s.local || int(ev.Seq) < s.acked {
		return // a completion of a pair this path has left
	}
	s.acked = int(ev.Seq) + 1
	o.n.step(Acked{Path: id, Seq: ev.Seq, Local: sp.Local, Remote: sp.Remote})
	o.pump(s)
	o.check()
}

func (o *operation) arrived(c Conn, tag uint32, seq uint64, data []byte) {
	n := o.n
	sp := c.Spec()
	id := PathID{Src: sp.Peer, Dst: n.ep.Node(), Channel: uint16(tag & 0xffff)}
	in := o.in[id]
	if in == nil {
		return
	}
	accept := false
	for _, a := range n.step(Received{Path: id, Seq: seq, Local: sp.Local, Remote: sp.Remote}) {
		if _, ok := a.(Accept); ok {
			accept = true
		}
	}
	if !accept || o.over || int(seq) >= len(in.plan.frames) {
		return
	}
	if in.gate != nil && !in.gate.open {
		in.pending = append(in.pending, pendingChunk{seq, o.n.hold(data)})
		return
	}
	o.deliver(in, seq, data)
}

// deliver applies an accepted chunk of in, or keeps a copy of it while it must wait for another path.
func (o *operation) deliver(in *inStream, seq uint64, data []byte) {
	if in.mustHold(int(seq)) {
		in.held = append(in.held, pendingChunk{seq, o.n.hold(data)})
		return
	}
	o.apply(in, seq, data)
}

// releaseWaiters applies the held chunks of the paths waiting on in that no longer have to wait.
func (o *operation) releaseWaiters(in *inStream) {
	for _, w := range in.waiters {
		for len(w.held) > 0 && !o.over {
			pc := w.held[0]
			if w.waiting(int(pc.seq)) {
				break
			}
			w.held = w.held[1:]
			o.apply(w, pc.seq, pc.data)
			o.n.release(pc.data)
		}
	}
}

// apply applies an accepted chunk of in to the working buffer and moves what waited for it.
func (o *operation) apply(in *inStream, seq uint64, data []byte) {
	f := in.plan.frames[seq]
	if len(data) != f.n {
		o.finish(fmt.Errorf("%w: path %v chunk %d has %d bytes, want %d", ErrInvalid, in.path, seq, len(data), f.n))
		return
	}
	dst := o.work[f.off : f.off+f.n]
	switch f.mode {
	case recvCopy:
		o.cover(f.off, f.n)
		copy(dst, data)
	case recvReduce:
		o.fold(f.off, data)
	case recvReduceLast:
		o.fold(f.off, data)
		rings.Finalize(o.dt, o.rop, dst, o.world)
	}
	in.got++
	if len(in.waiters) > 0 {
		o.releaseWaiters(in)
	}
	for _, s := range o.outs {
		if s.dep == in {
			o.pump(s)
		}
	}
	if g := in.feeds; g != nil && in.got == len(in.plan.frames) && !g.open {
		g.need--
		if g.need == 0 {
			o.openGate(g)
		}
	}
	o.check()
}

// openGate runs the gate's fold, applies the chunks its in paths held back and starts its out paths.
func (o *operation) openGate(g *opGate) {
	g.open = true
	if g.fold != nil {
		g.fold()
	}
	for _, in := range g.ins {
		pend := in.pending
		in.pending = nil
		for _, pc := range pend {
			if o.over {
				return
			}
			o.deliver(in, pc.seq, pc.data)
			o.n.release(pc.data)
		}
	}
	for _, s := range g.outs {
		o.pump(s)
	}
}

// check finishes the operation when every path is complete.
func (o *operation) check() {
	if o.over {
		return
	}
	for _, s := range o.out {
		if s.acked < len(s.plan.frames) {
			return
		}
	}
	if f := o.sent; f != nil {
		o.sent = nil
		f()
	}
	for _, in := range o.in {
		if in.got < len(in.plan.frames) {
			return
		}
	}
	o.finish(nil)
}

func (o *operation) finish(err error) {
	if o.over {
		return
	}
	o.over = true
	n := o.n
	if n.op == o {
		n.op = nil
	}
	n.ep.Deregister(o.region)
	if err == nil {
		o.fill(0, len(o.work)) // a direct operation's commit is a no-op: work is the result
		if o.commit != nil {
			o.commit()
		}
	}
	o.src = nil
	if o.scratch {
		// After a success with no path moved, every chunk posted from work was completed, so no
		// provider reads it any more and the next operation may reuse it. Otherwise a connection
		// left behind may still send from it: it stays with that connection and the next operation
		// gets a fresh buffer.
		if err == nil && !o.moved {
			n.scratchFree = true
		} else {
			n.scratch, n.scratchFree = nil, false
		}
	}
	if o.done != nil {
		o.done(err)
	}
}

// weights returns a copy of the channels' shares (Config.ChannelWeights, even by default): planned
// AllReduces level their copy in place.
func (n *Node) weights() []float64 { return slices.Clone(n.cfg.ChannelWeights) }

func (n *Node) neighbours() (succ, pred NodeID) {
	w := len(n.ring)
	return n.ring[(n.rank+1)%w], n.ring[(n.rank+w-1)%w]
}

func checkBuffers(dt rings.DType, op rings.Op, bufs ...[]byte) error {
	if !dt.Valid() || !op.Valid() {
		return fmt.Errorf("%w: dtype %v op %v", ErrInvalid, dt, op)
	}
	for _, b := range bufs {
		if len(b)%dt.Size() != 0 {
			return fmt.Errorf("%w: %d bytes is not a whole number of %v elements", ErrInvalid, len(b), dt)
		}
	}
	return nil
}

// StartAllReduce starts a ring AllReduce of send into recv (same length) split over one channel per
// NIC (evenly, or by Config.ChannelWeights), and calls done in the event context when it ends. recv is
// written only on success, unless Config.Direct is set. send is read until done (it is copied into
// the working buffer piece by piece as the transfer reaches each piece), must not change before then,
// and is not retained after. Call it in the event context.
func (n *Node) StartAllReduce(send, recv []byte, dt rings.DType, op rings.Op, done func(error)) error {
	if err := checkBuffers(dt, op, send, recv); err != nil {
		return err
	}
	if len(send) != len(recv) {
		return fmt.Errorf("%w: send has %d bytes, recv %d", ErrInvalid, len(send), len(recv))
	}
	if n.op != nil {
		return ErrBusy
	}
	world := len(n.ring)
	var plans []channelPlan
	if world > 1 {
		succ, pred := n.neighbours()
		plans = planAllReduce(n.rank, world, splitChannels(len(send)/dt.Size(), n.weights()), dt.Size(), n.cfg.ChunkBytes, succ, pred)
	}
	if n.cfg.Direct {
		if err := checkDirect(send, recv); err != nil {
			return err
		}
		src := send
		if sameBytes(send, recv) {
			src = nil // in place: recv already holds the input
		}
		if world == 1 {
			copy(recv, send)
			rings.Finalize(dt, op, recv, 1)
			src = nil
		}
		return n.startFilled(recv, src, dt, op, plans, nil, nil, done)
	}
	work := n.scratchBuffer(len(send))
	if world == 1 {
		copy(work, send)
		rings.Finalize(dt, op, work, 1)
		send = nil
	}
	return n.startScratch(work, send, dt, op, plans, nil, func() { copy(recv, work) }, done)
}

// checkDirect refuses, for a direct operation (Config.Direct), an input and a result that overlap
// without being the same slice: the lazy copy of the input would read bytes already overwritten.
func checkDirect(send, recv []byte) error {
	if len(send) == 0 || len(recv) == 0 || sameBytes(send, recv) {
		return nil
	}
	s0, r0 := uintptr(unsafe.Pointer(unsafe.SliceData(send))), uintptr(unsafe.Pointer(unsafe.SliceData(recv)))
	if s0 < r0+uintptr(len(recv)) && r0 < s0+uintptr(len(send)) {
		return fmt.Errorf("%w: with Config.Direct, send and recv must be the same slice or not overlap", ErrInvalid)
	}
	return nil
}

// sameBytes reports whether a and b are the same non-empty slice (same start and length).
func sameBytes(a, b []byte) bool {
	return len(a) == len(b) && len(a) > 0 && &a[0] == &b[0]
}

// StartReduceScatter reduces send (world blocks of len(recv) bytes) so that this node's recv holds the
// reduction of block rank. send is read until done and must not change before then. Call it in the
// event context.
func (n *Node) StartReduceScatter(send, recv []byte, dt rings.DType, op rings.Op, done func(error)) error {
	if err := checkBuffers(dt, op, send, recv); err != nil {
		return err
	}
	world := len(n.ring)
	if len(send) != world*len(recv) {
		return fmt.Errorf("%w: send has %d bytes, want %d × %d", ErrInvalid, len(send), world, len(recv))
	}
	if n.op != nil {
		return ErrBusy
	}
	work := n.scratchBuffer(len(send))
	count := len(recv) / dt.Size()
	var plans []channelPlan
	if world == 1 {
		copy(work, send)
		rings.Finalize(dt, op, work, 1)
		send = nil
	} else {
		succ, pred := n.neighbours()
		plans = planReduceScatter(n.rank, world, splitChannels(count, n.weights()), count, dt.Size(), n.cfg.ChunkBytes, succ, pred)
	}
	own := n.rank * len(recv)
	return n.startScratch(work, send, dt, op, plans, nil, func() { copy(recv, work[own:own+len(recv)]) }, done)
}

// StartAllGather gathers every node's send (same length everywhere) into recv, block r from the node
// at ring position r. Call it in the event context.
func (n *Node) StartAllGather(send, recv []byte, dt rings.DType, done func(error)) error {
	if err := checkBuffers(dt, rings.Sum, send, recv); err != nil {
		return err
	}
	world := len(n.ring)
	if len(recv) != world*len(send) {
		return fmt.Errorf("%w: recv has %d bytes, want %d × %d", ErrInvalid, len(recv), world, len(send))
	}
	if n.cfg.Direct {
		if err := checkDirect(send, recv); err != nil {
			return err
		}
	}
	work, commit := recv, func() {}
	if !n.cfg.Direct {
		work = make([]byte, len(recv))
		commit = func() { copy(recv, work) }
	}
	copy(work[n.rank*len(send):], send)
	count := len(send) / dt.Size()
	var plans []channelPlan
	if world > 1 {
		succ, pred := n.neighbours()
		plans = planAllGather(n.rank, world, splitChannels(count, n.weights()), count, dt.Size(), n.cfg.ChunkBytes, succ, pred)
	}
	return n.start(work, dt, rings.Sum, plans, commit, done)
}

// StartBroadcast copies the root's buf into every node's buf. Call it in the event context.
func (n *Node) StartBroadcast(buf []byte, dt rings.DType, root NodeID, done func(error)) error {
	if err := checkBuffers(dt, rings.Sum, buf); err != nil {
		return err
	}
	r := slices.Index(n.ring, root)
	if r < 0 {
		return fmt.Errorf("%w: root %d not in ring", ErrInvalid, root)
	}
	world := len(n.ring)
	q := mod(n.rank-r, world)
	work, commit := buf, func() {}
	if !n.cfg.Direct {
		work = slices.Clone(buf)
		commit = func() { copy(buf, work) }
	}
	succ, pred := n.neighbours()
	plans := planBroadcast(q, world, splitChannels(len(buf)/dt.Size(), n.weights()), dt.Size(), n.cfg.ChunkBytes, succ, pred)
	return n.start(work, dt, rings.Sum, plans, commit, done)
}

// StartSend sends buf to node to, over every NIC; the receiver calls StartRecv with a buffer of the
// same length. Call it in the event context.
func (n *Node) StartSend(buf []byte, to NodeID, done func(error)) error {
	plans := planPointToPoint(true, to, splitChannels(len(buf), n.weights()), 1, n.cfg.ChunkBytes)
	work := buf // read only; without Direct a copy, so that the caller may reuse buf at once on failure
	if !n.cfg.Direct {
		work = slices.Clone(buf)
	}
	return n.start(work, rings.U8, rings.Sum, plans, nil, done)
}

// StartRecv receives into buf what node from sends with StartSend. Call it in the event context.
func (n *Node) StartRecv(buf []byte, from NodeID, done func(error)) error {
	work, commit := buf, func() {}
	if !n.cfg.Direct {
		work = make([]byte, len(buf))
		commit = func() { copy(buf, work) }
	}
	plans := planPointToPoint(false, from, splitChannels(len(buf), n.weights()), 1, n.cfg.ChunkBytes)
	return n.start(work, rings.U8, rings.Sum, plans, commit, done)
}

// run posts start to the event context and waits for its completion or ctx.
func (n *Node) run(ctx context.Context, start func(done func(error)) error) error {
	ch := make(chan error, 1)
	n.ep.Post(func() {
		if err := start(func(err error) { ch <- err }); err != nil {
			ch <- err
		}
	})
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// AllReduce is the blocking form of StartAllReduce, for providers whose event context is a goroutine
// of their own. If ctx ends first it returns ctx.Err(); the operation keeps running to its end and may
// still write recv, so the caller must not reuse recv before a later operation has returned.
func (n *Node) AllReduce(ctx context.Context, send, recv []byte, dt rings.DType, op rings.Op) error {
	return n.run(ctx, func(done func(error)) error { return n.StartAllReduce(send, recv, dt, op, done) })
}

// ReduceScatter is the blocking form of StartReduceScatter (see AllReduce for the rules).
func (n *Node) ReduceScatter(ctx context.Context, send, recv []byte, dt rings.DType, op rings.Op) error {
	return n.run(ctx, func(done func(error)) error { return n.StartReduceScatter(send, recv, dt, op, done) })
}

// AllGather is the blocking form of StartAllGather (see AllReduce for the rules).
func (n *Node) AllGather(ctx context.Context, send, recv []byte, dt rings.DType) error {
	return n.run(ctx, func(done func(error)) error { return n.StartAllGather(send, recv, dt, done) })
}

// Broadcast is the blocking form of StartBroadcast (see AllReduce for the rules).
func (n *Node) Broadcast(ctx context.Context, buf []byte, dt rings.DType, root NodeID) error {
	return n.run(ctx, func(done func(error)) error { return n.StartBroadcast(buf, dt, root, done) })
}

// Send is the blocking form of StartSend (see AllReduce for the rules).
func (n *Node) Send(ctx context.Context, buf []byte, to NodeID) error {
	return n.run(ctx, func(done func(error)) error { return n.StartSend(buf, to, done) })
}

// Recv is the blocking form of StartRecv (see AllReduce for the rules).
func (n *Node) Recv(ctx context.Context, buf []byte, from NodeID) error {
	return n.run(ctx, func(done func(error)) error { return n.StartRecv(buf, from, done) })
}
