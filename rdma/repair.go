package rdma

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"
)

// RepairConfig tunes hot repair. The zero value works; every duration is a floor or a default that
// measured round trips adapt.
type RepairConfig struct {
	// MinAckTimeout is the smallest per-chunk acknowledgement deadline. The deadline adapts to measured
	// round trips like TCP's retransmission timeout (smoothed RTT plus four deviations) and never goes
	// below this. Zero means 2 ms.
	MinAckTimeout time.Duration
	// MaxAckTimeout caps the acknowledgement deadline. Zero means 1 s.
	MaxAckTimeout time.Duration
	// ProbeTimeout is how long a probe may go unanswered before it counts as failed. Zero means 2 ms.
	ProbeTimeout time.Duration
	// StallTimeout is how long a receiver waits for the next chunk of an active path before probing its
	// sender. Zero means 4 × MinAckTimeout.
	StallTimeout time.Duration
	// HandshakeTimeout is how long a sender waits for a FailAck before it asks again on another control
	// NIC, or moves on. Zero means 4 × ProbeTimeout.
	HandshakeTimeout time.Duration
	// HandshakeTries is how often a failover request is sent before the path fails. Zero means 3.
	HandshakeTries int
	// ReprobeMin and ReprobeMax bound the backoff between probes of a failed element; the interval
	// doubles from min to max while it stays failed. Zero means 10 ms and 1 s.
	ReprobeMin, ReprobeMax time.Duration
}

func (c RepairConfig) withDefaults() RepairConfig {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.MinAckTimeout, 2*time.Millisecond)
	def(&c.MaxAckTimeout, time.Second)
	def(&c.ProbeTimeout, 2*time.Millisecond)
	def(&c.StallTimeout, 4*c.MinAckTimeout)
	def(&c.HandshakeTimeout, 4*c.ProbeTimeout)
	def(&c.ReprobeMin, 10*time.Millisecond)
	def(&c.ReprobeMax, time.Second)
	if c.HandshakeTries == 0 {
		c.HandshakeTries = 3
	}
	return c
}

// Validate names the first invalid field.
func (c RepairConfig) Validate() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"MinAckTimeout", c.MinAckTimeout}, {"MaxAckTimeout", c.MaxAckTimeout}, {"ProbeTimeout", c.ProbeTimeout},
		{"StallTimeout", c.StallTimeout}, {"HandshakeTimeout", c.HandshakeTimeout}, {"ReprobeMin", c.ReprobeMin},
		{"ReprobeMax", c.ReprobeMax}} {
		if f.d < 0 {
			return fmt.Errorf("%w: RepairConfig.%s is %v, must be >= 0", ErrInvalid, f.name, f.d)
		}
	}
	if c.HandshakeTries < 0 {
		return fmt.Errorf("%w: RepairConfig.HandshakeTries is %d, must be >= 0", ErrInvalid, c.HandshakeTries)
	}
	return nil
}

// ErrNoPath reports that every NIC pair of a path's backup chain has failed.
var ErrNoPath = errors.New("rdma: no healthy NIC pair left")

// Input is something that happened, fed to [Repair.Step].
type Input interface{ input() }

// Open starts a path for one operation: Chunks chunks will flow from Path.Src to Path.Dst on the
// channel whose primary NIC is Primary (the same index on both nodes). Op numbers the operation; it
// grows from one operation to the next and is the same on both ends.
type Open struct {
	Path    PathID
	Op      uint64
	Primary NICID
	Chunks  uint64
}

// Posted says the sender posted chunk Seq of a path on the pair Local-Remote.
type Posted struct {
	Path          PathID
	Seq           uint64
	Local, Remote NICID
}

// Acked says the sender got chunk Seq's completion on the pair Local-Remote.
type Acked struct {
	Path          PathID
	Seq           uint64
	Local, Remote NICID
}

// Received says the receiver got chunk Seq of a path on the pair Local-Remote (receiver's NIC first).
// The machine answers with an Accept or a Reject action.
type Received struct {
	Path          PathID
	Seq           uint64
	Local, Remote NICID
}

// LinkFailed says a connection to Peer on the pair Local-Remote failed (provider error).
type LinkFailed struct {
	Peer          NodeID
	Local, Remote NICID
	Err           error
}

// PortState says a local NIC's port changed state.
type PortState struct {
	NIC    NICID
	Health Health
}

// ControlIn is a control message that arrived from node From.
type ControlIn struct {
	From NodeID
	Msg  Message
}

// ProbeResult is the outcome of a Probe action: OK, or failed (Local says the local NIC is down).
type ProbeResult struct {
	ID    uint64
	OK    bool
	Local bool
	RTT   time.Duration
}

// Tick says time passed; deadlines up to now fire.
type Tick struct{}

func (Open) input()        {}
func (Posted) input()      {}
func (Acked) input()       {}
func (Received) input()    {}
func (LinkFailed) input()  {}
func (PortState) input()   {}
func (ControlIn) input()   {}
func (ProbeResult) input() {}
func (Tick) input()        {}

// Action is something the runtime must do, returned by [Repair.Step].
type Action interface{ action() }

// Resume tells a path's sender to (re)start posting at chunk From on the pair Local-Remote. Chunks
// before From are delivered.
type Resume struct {
	Path          PathID
	Local, Remote NICID
	Epoch         uint32
	From          uint64
}

// Pause tells a path's sender to stop posting until the next Resume.
type Pause struct{ Path PathID }

// Accept tells a path's receiver to consume the chunk of a Received input; Reject to drop it.
type Accept struct {
	Path PathID
	Seq  uint64
}

// Reject tells a path's receiver to drop the chunk of a Received input (a duplicate, or a late chunk
// of a retired pair).
type Reject struct {
	Path PathID
	Seq  uint64
}

// SendMsg tells the runtime to send a control message to node To, on a NIC other than Avoid where
// possible (Avoid is the NIC of the failed pair; NoNIC when none).
type SendMsg struct {
	To    NodeID
	Avoid NICID
	Msg   Message
}

// NoNIC is the Avoid value of a control message that may use any NIC.
const NoNIC NICID = 0xffff

// ProbeNIC tells the runtime to probe Peer's NIC Remote from the local NIC Local and report a
// ProbeResult with the same ID (the machine keeps the deadline).
type ProbeNIC struct {
	ID            uint64
	Peer          NodeID
	Local, Remote NICID
}

// Reconnect tells the runtime to open fresh data connections to Peer on the pair Local-Remote (the
// old ones failed), with connection Index Index.
type Reconnect struct {
	Peer          NodeID
	Local, Remote NICID
	Index         uint32
}

// PathFailed tells the runtime that a path has no healthy pair left: its operation fails with Err.
type PathFailed struct {
	Path PathID
	Err  error
}

// Note reports a step of the protocol, for logs, statistics and scenario transcripts. Kind is one of
// "detect", "repair", "verdict", "healed".
type Note struct {
	Kind string
	Path PathID
	Text string
}

func (Resume) action()     {}
func (Pause) action()      {}
func (Accept) action()     {}
func (Reject) action()     {}
func (SendMsg) action()    {}
func (ProbeNIC) action()   {}
func (Reconnect) action()  {}
func (PathFailed) action() {}
func (Note) action()       {}

// Repair is the hot-repair protocol of one node as a pure state machine: it takes inputs and the
// current time and returns actions. It owns no goroutine, socket or clock; a runtime feeds it provider
// events and carries its actions out. It is not safe for concurrent use.
//
// Per path, the sender is authoritative: whoever sees a failure first (either end) makes sure the
// sender knows (a Notice over a control connection on another NIC), and the sender numbers the failover
// with a new epoch, picks the next healthy pair of the channel's backup chain, tells the receiver
// (FailReq) and resumes there at once from its first unacknowledged chunk. The receiver retires the
// old pair, so late chunks from it are dropped, and answers with the next chunk it expects (FailAck);
// the sender rewinds to it if it is behind where the sender resumed. Messages of an older epoch are
// ignored.
// In parallel the sender localizes the failure with probes from both ends and a third node, and the
// verdict goes to every node of the group, which move their own paths off the failed element; failed
// elements are re-probed with backoff and taken back when they answer again.
type Repair struct {
	self  NodeID
	ring  []NodeID
	nics  []NIC
	cfg   RepairConfig
	now   time.Time
	out   []Action
	paths map[PathID]*path
	order []*path // paths sorted by id, for deterministic iteration

	health  map[NICRef]Health
	links   map[[2]NICRef]bool
	seen    map[[2]uint64]bool // verdicts already applied: (origin, id)
	nextID  uint64
	locs    map[uint64]*localization // by localization id
	asks    map[uint64]*thirdProbe   // probes run for another node's localization, by probe id
	probes  map[uint64]probeWait     // outstanding probes: what they are for and their deadline
	watches []*watch                 // failed elements this node re-probes
	srtt    map[NodeID]*rttEstimate
}

type path struct {
	id            PathID
	primary       NICID
	local, remote NICID // current pair: at Src and at Dst
	epoch         uint32
	chunks        uint64
	op            uint64
	open          bool
	// sender side
	acked      uint64 // first chunk not acknowledged
	posted     uint64 // one past the highest chunk posted
	postedAt   map[uint64]time.Time
	ackBy      time.Time // zero: no deadline
	probing    uint64    // id of the stall probe in flight, or 0
	awaiting   bool      // FailReq outstanding
	ahead      bool      // resumed at the failover, before the FailAck: from chunk resumed
	reqTries   int
	reqBy      time.Time
	avoid      NICID          // the NIC of the pair given up last: control messages go elsewhere
	tried      map[NICID]bool // pairs that failed during this op
	resumed    uint64
	retired    map[NICID]bool // at the receiver: pairs given up at a failover (by receiver NIC)
	expect     uint64         // receiver: next chunk expected
	stallBy    time.Time
	stallProbe uint64
}

type rttEstimate struct {
	srtt, rttvar time.Duration
}

// localization is a three-point probe of the pair a (local) - b run by this node.
type localization struct {
	id        uint64
	a, b      NICRef
	pairDone  bool // this node's probe of b finished
	pairOK    bool
	third     NodeID
	hasThird  bool
	thirdDone bool // the third node reported (or there is none)
	okA, okB  bool // what the third node saw
	by        time.Time
	path      PathID // the path whose failure started it, for notes
}

// thirdProbe is this node's part in another node's localization.
type thirdProbe struct {
	asker        NodeID
	locID        uint64
	avoid        NICID // the rail under investigation: the report goes on another one
	okA, okB     bool
	doneA, doneB bool
}

type probeWait struct {
	kind string // "pair", "third-a", "third-b", "stall", "watch"
	ref  uint64
	path PathID
	by   time.Time
}

type watch struct {
	fault    FaultClass
	a, b     NICRef
	next     time.Time
	interval time.Duration
	probe    uint64
	portUp   bool
	turn     int // probes sent: a watch of a local NIC asks its neighbours in turn
}

// NewRepair returns the machine of node self in a group whose nodes form ring (in order; it fixes
// neighbours and third nodes), where every node has the NICs nics (same count and order on every node).
func NewRepair(self NodeID, ring []NodeID, nics []NIC, cfg RepairConfig) *Repair {
	return &Repair{self: self, ring: slices.Clone(ring), nics: nics, cfg: cfg.withDefaults(),
		paths: map[PathID]*path{}, health: map[NICRef]Health{}, links: map[[2]NICRef]bool{},
		seen: map[[2]uint64]bool{}, locs: map[uint64]*localization{}, asks: map[uint64]*thirdProbe{},
		probes: map[uint64]probeWait{}, srtt: map[NodeID]*rttEstimate{}}
}

// Health returns what this node knows about NIC r (Healthy unless a verdict or port event said else).
func (m *Repair) Health(r NICRef) Health { return m.health[r] }

// Pair returns a path's current NIC pair and epoch.
func (m *Repair) Pair(id PathID) (local, remote NICID, epoch uint32, ok bool) {
	p := m.paths[id]
	if p == nil {
		return 0, 0, 0, false
	}
	return p.local, p.remote, p.epoch, true
}

// Step feeds one input at time now and returns the actions it caused. The returned slice is valid
// until the next call.
func (m *Repair) Step(now time.Time, in Input) []Action {
	m.now = now
	m.out = m.out[:0]
	switch in := in.(type) {
	case Open:
		m.open(in)
	case Posted:
		m.posted(in)
	case Acked:
		m.acked(in)
	case Received:
		m.received(in)
	case LinkFailed:
		m.linkFailed(in)
	case PortState:
		m.portState(in)
	case ControlIn:
		m.control(in.From, in.Msg)
	case ProbeResult:
		m.probeResult(in)
	case Tick:
	}
	m.timers()
	return m.out
}

// Deadline returns the earliest time at which a Tick would do something, or the zero time.
func (m *Repair) Deadline() time.Time {
	var d time.Time
	min := func(t time.Time) {
		if !t.IsZero() && (d.IsZero() || t.Before(d)) {
			d = t
		}
	}
	for _, p := range m.sortedPaths() {
		// An ack or stall deadline waits while its probe is out: the probe's deadline stands for it.
		if p.probing == 0 {
			min(p.ackBy)
		}
		min(p.reqBy)
		if p.stallProbe == 0 {
			min(p.stallBy)
		}
	}
	for _, w := range m.probes {
		min(w.by)
	}
	for _, l := range m.locs {
		min(l.by)
	}
	for _, w := range m.watches {
		if w.probe == 0 && w.portUp {
			min(w.next)
		}
	}
	return d
}

func (m *Repair) emit(a Action) { m.out = append(m.out, a) }

func (m *Repair) note(kind string, p PathID, format string, args ...any) {
	m.emit(Note{Kind: kind, Path: p, Text: fmt.Sprintf(format, args...)})
}

func (m *Repair) sortedPaths() []*path { return m.order }

// addPath records a new path, keeping order sorted.
func (m *Repair) addPath(p *path) {
	m.paths[p.id] = p
	i, _ := slices.BinarySearchFunc(m.order, p, func(a, b *path) int {
		return cmp.Or(cmp.Compare(a.id.Src, b.id.Src), cmp.Compare(a.id.Dst, b.id.Dst), cmp.Compare(a.id.Channel, b.id.Channel))
	})
	m.order = slices.Insert(m.order, i, p)
}

// chain returns the NICs in failover order for a channel whose primary NIC is primary: by distance
// from the primary's NUMA/PCIe distance, then by index distance, then by index.
func (m *Repair) chain(primary NICID) []NICID {
	ids := make([]NICID, len(m.nics))
	for i := range ids {
		ids[i] = NICID(i)
	}
	d0 := m.nics[primary].Distance
	abs := func(x int) int { return max(x, -x) }
	slices.SortStableFunc(ids, func(a, b NICID) int {
		return cmp.Or(cmp.Compare(abs(m.nics[a].Distance-d0), abs(m.nics[b].Distance-d0)),
			cmp.Compare(abs(int(a)-int(primary)), abs(int(b)-int(primary))))
	})
	return ids
}

// usable reports whether the rail-aligned pair (n at src, n at dst) is believed healthy.
func (m *Repair) usable(p *path, n NICID) bool {
	a, b := NICRef{p.id.Src, n}, NICRef{p.id.Dst, n}
	return m.health[a] == Healthy && m.health[b] == Healthy && !m.links[linkKey(a, b)] && !p.tried[n]
}

func linkKey(a, b NICRef) [2]NICRef {
	if b.Node < a.Node || (b.Node == a.Node && b.NIC < a.NIC) {
		a, b = b, a
	}
	return [2]NICRef{a, b}
}

func (m *Repair) open(in Open) {
	p := m.paths[in.Path]
	if p == nil {
		p = &path{id: in.Path, primary: in.Primary, local: in.Primary, remote: in.Primary, avoid: NoNIC}
		m.addPath(p)
	}
	retired := map[NICID]bool{}
	if p.op == in.Op && p.retired != nil {
		retired = p.retired // a failover request of this operation came before it opened here
	}
	*p = path{id: p.id, primary: in.Primary, local: p.local, remote: p.remote, epoch: p.epoch, chunks: in.Chunks,
		op: in.Op, avoid: p.avoid, open: true, postedAt: map[uint64]time.Time{}, tried: map[NICID]bool{}, retired: retired}
	if p.id.Src != m.self {
		p.stallBy = m.now.Add(m.cfg.StallTimeout)
		return
	}
	// The sender starts on the first healthy pair of the chain: the primary when it is healthy (a healed
	// NIC is taken back here), else the backup the path ended on.
	for _, n := range m.chain(p.primary) {
		if m.usable(p, n) {
			if n != p.local {
				p.epoch++
				p.local, p.remote = n, n
				p.awaiting, p.reqTries, p.reqBy = true, 1, m.now.Add(m.cfg.HandshakeTimeout)
				m.emit(Pause{p.id})
				m.emit(SendMsg{To: p.id.Dst, Avoid: NoNIC, Msg: Message{Kind: MsgFailReq, Path: p.id, Epoch: p.epoch,
					ID: p.op, Local: n, Remote: n, Seq: 0}})
				return
			}
			m.emit(Resume{Path: p.id, Local: p.local, Remote: p.remote, Epoch: p.epoch, From: 0})
			return
		}
	}
	m.fail(p)
}

func (m *Repair) rto(peer NodeID) time.Duration {
	e := m.srtt[peer]
	if e == nil {
		return m.cfg.MinAckTimeout
	}
	return min(max(e.srtt+4*e.rttvar, m.cfg.MinAckTimeout), m.cfg.MaxAckTimeout)
}

func (m *Repair) sample(peer NodeID, rtt time.Duration) {
	e := m.srtt[peer]
	if e == nil {
		m.srtt[peer] = &rttEstimate{srtt: rtt, rttvar: rtt / 2}
		return
	}
	d := e.srtt - rtt
	e.rttvar = (3*e.rttvar + max(d, -d)) / 4
	e.srtt = (7*e.srtt + rtt) / 8
}

func (m *Repair) posted(in Posted) {
	p := m.paths[in.Path]
	if p == nil || !p.open || in.Local != p.local {
		return
	}
	p.postedAt[in.Seq] = m.now
	p.posted = max(p.posted, in.Seq+1)
	if p.ackBy.IsZero() {
		p.ackBy = m.now.Add(m.rto(p.id.Dst))
	}
}

func (m *Repair) acked(in Acked) {
	p := m.paths[in.Path]
	if p == nil || !p.open || in.Local != p.local || in.Remote != p.remote || in.Seq < p.acked {
		return
	}
	if t, ok := p.postedAt[in.Seq]; ok {
		m.sample(p.id.Dst, m.now.Sub(t))
	}
	for s := p.acked; s <= in.Seq; s++ {
		delete(p.postedAt, s)
	}
	p.acked = in.Seq + 1
	p.ackBy = time.Time{}
	if p.acked < p.posted {
		p.ackBy = m.now.Add(m.rto(p.id.Dst))
	}
	if p.probing != 0 {
		delete(m.probes, p.probing)
		p.probing = 0
	}
}

func (m *Repair) received(in Received) {
	p := m.paths[in.Path]
	if p == nil || !p.open || p.retired[in.Local] || in.Seq != p.expect {
		m.emit(Reject{in.Path, in.Seq})
		return
	}
	p.expect++
	p.stallBy = time.Time{}
	if p.expect < p.chunks {
		p.stallBy = m.now.Add(m.cfg.StallTimeout)
	}
	if p.stallProbe != 0 {
		delete(m.probes, p.stallProbe)
		p.stallProbe = 0
	}
	m.emit(Accept{in.Path, in.Seq})
}

// active reports whether a path still has chunks to move.
func (p *path) active(self NodeID) bool {
	if !p.open {
		return false
	}
	if p.id.Src == self {
		return p.acked < p.chunks
	}
	return p.expect < p.chunks
}

func (m *Repair) linkFailed(in LinkFailed) {
	for _, p := range m.sortedPaths() {
		if !p.active(m.self) {
			continue
		}
		if p.id.Src == m.self && p.id.Dst == in.Peer && p.local == in.Local && p.remote == in.Remote {
			m.note("detect", p.id, "connection error on pair %d-%d: %v", in.Local, in.Remote, in.Err)
			m.failover(p, true)
		} else if p.id.Dst == m.self && p.id.Src == in.Peer && p.remote == in.Local && p.local == in.Remote {
			m.note("detect", p.id, "connection error on pair %d-%d: %v", in.Remote, in.Local, in.Err)
			m.notice(p)
		}
	}
}

// notice tells a path's sender that the receiver saw it fail.
func (m *Repair) notice(p *path) {
	m.emit(SendMsg{To: p.id.Src, Avoid: p.remote, Msg: Message{Kind: MsgNotice, Path: p.id, Epoch: p.epoch,
		ID: p.op, Local: p.local, Remote: p.remote}})
}

// failover moves a path the local node sends on to the next pair of its chain. localize says whether to
// start localizing the failed pair.
func (m *Repair) failover(p *path, localize bool) {
	old := p.local
	p.tried[old] = true
	p.avoid = old
	p.ackBy, p.stallBy = time.Time{}, time.Time{}
	if p.probing != 0 {
		delete(m.probes, p.probing)
		p.probing = 0
	}
	if localize {
		m.localize(p, NICRef{m.self, p.local}, NICRef{p.id.Dst, p.remote})
	}
	for _, n := range m.chain(p.primary) {
		if !m.usable(p, n) {
			continue
		}
		p.epoch++
		p.local, p.remote = n, n
		p.awaiting, p.reqTries, p.reqBy = true, 1, m.now.Add(m.cfg.HandshakeTimeout)
		m.emit(Pause{p.id})
		m.note("repair", p.id, "epoch %d: pair %d-%d -> %d-%d, first unacked %d", p.epoch, old, old, n, n, p.acked)
		m.emit(SendMsg{To: p.id.Dst, Avoid: old, Msg: Message{Kind: MsgFailReq, Path: p.id, Epoch: p.epoch,
			ID: p.op, Local: n, Remote: n, Seq: p.acked}})
		// Resume at once from the first unacknowledged chunk rather than a round trip later: the
		// receiver takes chunks in sequence from any pair it has not retired, so the data need not
		// wait for the FailAck, which rewinds further only if the receiver dropped a chunk that had
		// been completed.
		p.ahead, p.resumed, p.posted = true, p.acked, p.acked
		m.emit(Resume{Path: p.id, Local: n, Remote: n, Epoch: p.epoch, From: p.acked})
		return
	}
	m.fail(p)
}

func (m *Repair) fail(p *path) {
	p.open = false
	p.ackBy, p.reqBy, p.stallBy, p.awaiting = time.Time{}, time.Time{}, time.Time{}, false
	m.emit(PathFailed{Path: p.id, Err: fmt.Errorf("path %v: %w", p.id, ErrNoPath)})
}

func (m *Repair) portState(in PortState) {
	ref := NICRef{m.self, in.NIC}
	if in.Health != Down {
		for _, w := range m.watches {
			if w.fault == FaultNIC && w.a == ref {
				w.portUp = true
				w.next = m.now
			}
		}
		return
	}
	m.applyVerdict(Message{Kind: MsgVerdict, Origin: m.self, ID: m.newID(), Fault: FaultNIC, A: ref, Health: Down}, true)
}

func (m *Repair) newID() uint64 {
	m.nextID++
	return m.nextID
}

// neighbours returns the nodes at ring distance 1 and 2 (the control and probe mesh), in a fixed order.
func (m *Repair) neighbours() []NodeID {
	i := slices.Index(m.ring, m.self)
	n := len(m.ring)
	var out []NodeID
	for _, d := range []int{1, -1, 2, -2} {
		v := m.ring[((i+d)%n+n)%n]
		if v != m.self && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// applyVerdict records a verdict, passes it on around the ring (so every node gets it) and moves the
// local paths off the failed element. origin says whether this node concluded it.
func (m *Repair) applyVerdict(v Message, origin bool) {
	key := [2]uint64{uint64(v.Origin), v.ID}
	if m.seen[key] {
		return
	}
	m.seen[key] = true
	for _, n := range m.neighbours() {
		if n != v.Origin {
			m.emit(SendMsg{To: n, Avoid: NoNIC, Msg: v})
		}
	}
	switch {
	case v.Fault == FaultNIC && v.Health == Down:
		if m.health[v.A] == Down {
			return
		}
		m.health[v.A] = Down
		m.note("verdict", PathID{}, "nic %v down (by %d)", v.A, v.Origin)
		if origin {
			m.watchElem(FaultNIC, v.A, NICRef{})
		}
	case v.Fault == FaultLink && v.Health == Down:
		if m.links[linkKey(v.A, v.B)] {
			return
		}
		m.links[linkKey(v.A, v.B)] = true
		m.note("verdict", PathID{}, "link %v-%v down (by %d)", v.A, v.B, v.Origin)
		if origin {
			m.watchElem(FaultLink, v.A, v.B)
		}
	case v.Health == Healthy:
		if v.Fault == FaultNIC {
			if m.health[v.A] == Healthy {
				return
			}
			delete(m.health, v.A)
			m.note("healed", PathID{}, "nic %v back (by %d)", v.A, v.Origin)
		} else {
			if !m.links[linkKey(v.A, v.B)] {
				return
			}
			delete(m.links, linkKey(v.A, v.B))
			m.note("healed", PathID{}, "link %v-%v back (by %d)", v.A, v.B, v.Origin)
		}
		m.reconnect(v)
		return
	default:
		return
	}
	// Move every active path of this node off the failed element.
	for _, p := range m.sortedPaths() {
		if !p.active(m.self) {
			continue
		}
		a, b := NICRef{p.id.Src, p.local}, NICRef{p.id.Dst, p.remote}
		hit := (v.Fault == FaultNIC && (v.A == a || v.A == b)) || (v.Fault == FaultLink && linkKey(a, b) == linkKey(v.A, v.B))
		if !hit {
			continue
		}
		if p.id.Src == m.self {
			m.note("detect", p.id, "verdict on pair %d-%d", p.local, p.remote)
			m.failover(p, false)
		} else {
			m.note("detect", p.id, "verdict on pair %d-%d", p.local, p.remote)
			m.notice(p)
		}
	}
}

// reconnect asks for fresh connections where a healed element joins this node and a neighbour: both
// ends derive the same pairs and connection index from the verdict, so their Connect calls match.
func (m *Repair) reconnect(v Message) {
	index := uint32(v.ID) + uint32(v.Origin)<<20
	for _, n := range m.neighbours() {
		switch {
		case v.Fault == FaultNIC && (v.A.Node == m.self || v.A.Node == n):
			m.emit(Reconnect{Peer: n, Local: v.A.NIC, Remote: v.A.NIC, Index: index})
		case v.Fault == FaultLink && v.A.Node == m.self && v.B.Node == n:
			m.emit(Reconnect{Peer: n, Local: v.A.NIC, Remote: v.B.NIC, Index: index})
		case v.Fault == FaultLink && v.B.Node == m.self && v.A.Node == n:
			m.emit(Reconnect{Peer: n, Local: v.B.NIC, Remote: v.A.NIC, Index: index})
		}
	}
}

func (m *Repair) watchElem(f FaultClass, a, b NICRef) {
	for _, w := range m.watches {
		if w.fault == f && w.a == a && w.b == b {
			return
		}
	}
	m.watches = append(m.watches, &watch{fault: f, a: a, b: b, interval: m.cfg.ReprobeMin,
		next: m.now.Add(m.cfg.ReprobeMin), portUp: f != FaultNIC || a.Node != m.self})
}

// probePeer returns the neighbour a watch of a local NIC probes next: the neighbours whose NIC on the
// same rail is not known to be down, in turn (all of them in turn when every one is), so that a
// neighbour whose own NIC on that rail failed meanwhile cannot keep a healed NIC down.
func (m *Repair) probePeer(w *watch) NodeID {
	all := m.neighbours()
	var up []NodeID
	for _, n := range all {
		r := NICRef{n, w.a.NIC}
		if m.health[r] != Down && !m.links[linkKey(w.a, r)] {
			up = append(up, n)
		}
	}
	if len(up) == 0 {
		up = all
	}
	w.turn++
	return up[(w.turn-1)%len(up)]
}

// localize starts three-point probing of the pair a (local) - b.
func (m *Repair) localize(p *path, a, b NICRef) {
	for _, l := range m.locs {
		if l.a == a && l.b == b {
			return
		}
	}
	if m.health[a] == Down || m.health[b] == Down || m.links[linkKey(a, b)] {
		return // already known
	}
	l := &localization{id: m.newID(), a: a, b: b, by: m.now.Add(3 * m.cfg.ProbeTimeout), path: p.id}
	m.locs[l.id] = l
	pid := m.newID()
	m.probes[pid] = probeWait{kind: "pair", ref: l.id, by: m.now.Add(m.cfg.ProbeTimeout)}
	m.emit(ProbeNIC{ID: pid, Peer: b.Node, Local: a.NIC, Remote: b.NIC})
	for _, n := range m.neighbours() {
		if n != b.Node {
			l.third, l.hasThird = n, true
			m.emit(SendMsg{To: n, Avoid: a.NIC, Msg: Message{Kind: MsgProbeAsk, ID: l.id, A: a, B: b}})
			break
		}
	}
	if !l.hasThird {
		l.thirdDone = true
	}
}

func (m *Repair) concludeIfReady(l *localization, force bool) {
	if !force && (!l.pairDone || !l.thirdDone) {
		return
	}
	delete(m.locs, l.id)
	if l.pairDone && l.pairOK {
		m.note("verdict", l.path, "pair %v-%v answers probes: transient", l.a, l.b)
		return
	}
	v := Message{Kind: MsgVerdict, Origin: m.self, ID: m.newID(), Health: Down, A: l.a, B: l.b, Fault: FaultLink}
	switch {
	case !l.thirdDone:
		// No third view: blame the link, which keeps both NICs in use for other peers.
	case l.okA && !l.okB:
		v.Fault, v.A, v.B = FaultNIC, l.b, NICRef{}
	case !l.okA && l.okB:
		v.Fault, v.B = FaultNIC, NICRef{}
	}
	m.applyVerdict(v, true)
}

func (m *Repair) probeResult(in ProbeResult) {
	w, ok := m.probes[in.ID]
	if !ok {
		return // late or unknown
	}
	delete(m.probes, in.ID)
	m.probeDone(in.ID, w, in.OK, in.RTT)
}

func (m *Repair) probeDone(id uint64, w probeWait, ok bool, rtt time.Duration) {
	switch w.kind {
	case "pair":
		if l := m.locs[w.ref]; l != nil {
			l.pairDone, l.pairOK = true, ok
			m.concludeIfReady(l, false)
		}
	case "third-a", "third-b":
		t := m.asks[w.ref]
		if t == nil {
			return
		}
		if w.kind == "third-a" {
			t.doneA, t.okA = true, ok
		} else {
			t.doneB, t.okB = true, ok
		}
		if t.doneA && t.doneB {
			delete(m.asks, w.ref)
			m.emit(SendMsg{To: t.asker, Avoid: t.avoid, Msg: Message{Kind: MsgProbeReport, ID: t.locID, OKA: t.okA, OKB: t.okB}})
		}
	case "stall":
		p := m.paths[w.path]
		if p == nil || !p.active(m.self) {
			return
		}
		if p.id.Src == m.self {
			p.probing = 0
			if ok {
				if rtt > 0 {
					m.sample(p.id.Dst, rtt)
				}
				p.ackBy = m.now.Add(2 * m.rto(p.id.Dst)) // the peer answers: keep waiting
				return
			}
			m.note("detect", p.id, "ack deadline passed and probe failed on pair %d-%d", p.local, p.remote)
			m.failover(p, true)
			return
		}
		p.stallProbe = 0
		if ok {
			p.stallBy = m.now.Add(m.cfg.StallTimeout) // the sender is alive, only slow upstream
			return
		}
		m.note("detect", p.id, "stalled and probe failed on pair %d-%d", p.local, p.remote)
		m.notice(p)
		p.stallBy = m.now.Add(m.cfg.StallTimeout)
	case "watch":
		for _, wt := range m.watches {
			if wt.probe != id {
				continue
			}
			wt.probe = 0
			if ok {
				m.watches = slices.DeleteFunc(m.watches, func(x *watch) bool { return x == wt })
				m.applyVerdict(Message{Kind: MsgVerdict, Origin: m.self, ID: m.newID(), Fault: wt.fault, A: wt.a, B: wt.b,
					Health: Healthy}, true)
				return
			}
			wt.interval = min(2*wt.interval, m.cfg.ReprobeMax)
			wt.next = m.now.Add(wt.interval)
		}
	}
}

func (m *Repair) control(from NodeID, msg Message) {
	switch msg.Kind {
	case MsgNotice:
		p := m.paths[msg.Path]
		if p == nil || p.id.Src != m.self || !p.active(m.self) || msg.ID != p.op || msg.Epoch != p.epoch ||
			msg.Local != p.local || msg.Remote != p.remote {
			return // stale: an older operation or failover, or a pair already left
		}
		m.note("detect", p.id, "notice from %d on pair %d-%d", from, msg.Local, msg.Remote)
		m.failover(p, true)
	case MsgFailReq:
		p := m.paths[msg.Path]
		if p == nil {
			p = &path{id: msg.Path, local: msg.Local, remote: msg.Remote, op: msg.ID, avoid: NoNIC}
			m.addPath(p)
		}
		if p.id.Dst != m.self || (msg.ID == p.op && msg.Epoch < p.epoch) {
			return
		}
		if msg.ID < p.op {
			// The sender lost the last acknowledgements of an operation this node has finished (it
			// opens an operation only after the previous one): everything arrived. Adopt the new pair
			// so that both ends keep numbering failovers alike.
			if msg.Epoch > p.epoch {
				if p.remote != msg.Remote && p.retired != nil {
					p.retired[p.remote] = true
					p.avoid = p.remote
				}
				p.epoch, p.local, p.remote = msg.Epoch, msg.Local, msg.Remote
			}
			m.emit(SendMsg{To: from, Avoid: p.avoid, Msg: Message{Kind: MsgFailAck, Path: p.id, Epoch: msg.Epoch, ID: msg.ID,
				Seq: math.MaxUint64}})
			return
		}
		if msg.ID > p.op {
			// The request is for an operation not opened here yet: nothing of it has arrived.
			p.op, p.open, p.expect, p.retired = msg.ID, false, 0, map[NICID]bool{}
		}
		if msg.Epoch > p.epoch {
			if p.retired == nil {
				p.retired = map[NICID]bool{}
			}
			if p.remote != msg.Remote {
				p.retired[p.remote] = true
				p.avoid = p.remote
			}
			delete(p.retired, msg.Remote)
			p.epoch, p.local, p.remote = msg.Epoch, msg.Local, msg.Remote
			if p.active(m.self) {
				p.stallBy = m.now.Add(m.cfg.StallTimeout)
			}
		}
		m.emit(SendMsg{To: from, Avoid: p.avoid, Msg: Message{Kind: MsgFailAck, Path: p.id, Epoch: p.epoch, ID: p.op,
			Seq: p.expect}})
	case MsgFailAck:
		p := m.paths[msg.Path]
		if p == nil || p.id.Src != m.self || !p.awaiting || msg.ID != p.op || msg.Epoch != p.epoch {
			return
		}
		p.awaiting, p.reqBy = false, time.Time{}
		// The receiver is the authority on what it consumed. Its next chunk is usually at or past the
		// first unacknowledged one, but a completion says only that the chunk reached the receiver's
		// memory: one that arrived on a pair the receiver had just retired was completed and then
		// dropped, and goes again.
		next := min(msg.Seq, p.chunks)
		ahead := p.ahead
		p.ahead = false
		if ahead && next >= p.resumed {
			// The sender resumed at the failover from a chunk the receiver had not consumed yet:
			// nothing to redo.
			for s := p.acked; s < next; s++ {
				delete(p.postedAt, s)
			}
			if next > p.acked {
				p.acked, p.posted = next, max(p.posted, next)
			}
			return
		}
		for s := p.acked; s < next; s++ {
			delete(p.postedAt, s)
		}
		p.acked = next
		p.posted = p.acked
		if p.open {
			m.emit(Resume{Path: p.id, Local: p.local, Remote: p.remote, Epoch: p.epoch, From: p.acked})
		}
	case MsgProbeAsk:
		t := &thirdProbe{asker: from, locID: msg.ID, avoid: msg.A.NIC}
		id := m.newID()
		m.asks[id] = t
		ia, ib := m.newID(), m.newID()
		m.probes[ia] = probeWait{kind: "third-a", ref: id, by: m.now.Add(m.cfg.ProbeTimeout)}
		m.probes[ib] = probeWait{kind: "third-b", ref: id, by: m.now.Add(m.cfg.ProbeTimeout)}
		m.emit(ProbeNIC{ID: ia, Peer: msg.A.Node, Local: msg.A.NIC, Remote: msg.A.NIC})
		m.emit(ProbeNIC{ID: ib, Peer: msg.B.Node, Local: msg.B.NIC, Remote: msg.B.NIC})
	case MsgProbeReport:
		if l := m.locs[msg.ID]; l != nil && l.third == from {
			l.thirdDone, l.okA, l.okB = true, msg.OKA, msg.OKB
			m.concludeIfReady(l, false)
		}
	case MsgVerdict:
		m.applyVerdict(msg, false)
	}
}

// timers fires every deadline that has passed.
func (m *Repair) timers() {
	for _, p := range m.sortedPaths() {
		if !p.reqBy.IsZero() && !m.now.Before(p.reqBy) {
			if p.reqTries >= m.cfg.HandshakeTries {
				// The receiver cannot be told on this pair's control routes: try the next pair.
				p.awaiting, p.reqBy = false, time.Time{}
				m.note("detect", p.id, "no answer to failover request at epoch %d", p.epoch)
				m.failover(p, false)
				continue
			}
			p.reqTries++
			p.reqBy = m.now.Add(m.cfg.HandshakeTimeout)
			m.emit(SendMsg{To: p.id.Dst, Avoid: p.avoid, Msg: Message{Kind: MsgFailReq, Path: p.id, Epoch: p.epoch,
				ID: p.op, Local: p.local, Remote: p.remote, Seq: p.acked}})
		}
		if !p.ackBy.IsZero() && !m.now.Before(p.ackBy) && p.probing == 0 {
			p.ackBy = time.Time{}
			id := m.newID()
			p.probing = id
			m.probes[id] = probeWait{kind: "stall", path: p.id, by: m.now.Add(m.cfg.ProbeTimeout)}
			m.emit(ProbeNIC{ID: id, Peer: p.id.Dst, Local: p.local, Remote: p.remote})
		}
		if !p.stallBy.IsZero() && !m.now.Before(p.stallBy) && p.stallProbe == 0 {
			p.stallBy = time.Time{}
			id := m.newID()
			p.stallProbe = id
			m.probes[id] = probeWait{kind: "stall", path: p.id, by: m.now.Add(m.cfg.ProbeTimeout)}
			m.emit(ProbeNIC{ID: id, Peer: p.id.Src, Local: p.remote, Remote: p.local})
		}
	}
	for _, id := range due(m.probes, m.now, func(w probeWait) time.Time { return w.by }) {
		w, ok := m.probes[id]
		if !ok {
			continue
		}
		delete(m.probes, id)
		m.probeDone(id, w, false, 0)
	}
	for _, id := range due(m.locs, m.now, func(l *localization) time.Time { return l.by }) {
		if l := m.locs[id]; l != nil {
			m.concludeIfReady(l, true)
		}
	}
	for _, w := range m.watches {
		if w.probe != 0 || !w.portUp || m.now.Before(w.next) {
			continue
		}
		id := m.newID()
		w.probe = id
		m.probes[id] = probeWait{kind: "watch", by: m.now.Add(m.cfg.ProbeTimeout)}
		switch {
		case w.fault == FaultLink:
			m.emit(ProbeNIC{ID: id, Peer: w.b.Node, Local: w.a.NIC, Remote: w.b.NIC})
		case w.a.Node == m.self:
			m.emit(ProbeNIC{ID: id, Peer: m.probePeer(w), Local: w.a.NIC, Remote: w.a.NIC})
		default:
			m.emit(ProbeNIC{ID: id, Peer: w.a.Node, Local: w.a.NIC, Remote: w.a.NIC})
		}
	}
}

// due returns, in order, the ids in m whose deadline (by) is not after now: the expired entries, in
// an order that does not depend on map iteration.
func due[V any](m map[uint64]V, now time.Time, by func(V) time.Time) []uint64 {
	var ids []uint64
	for id, v := range m {
		if !now.Before(by(v)) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}
