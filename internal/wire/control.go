package wire

// Membership messages between a peer and the master: joining, heartbeats, leaving and the wiring of
// the ring.

// Hello is a peer's first message to the master.
//
// Peer is the identity the peer chooses, so that it keeps its id when it reconnects to a restarted
// master; 0 lets the master assign one. The master refuses a Hello that chooses the id of a peer it
// still counts as live. Group is the peer group the peer joins (for example one per pipeline stage):
// rings, epochs, collectives and shared-state syncs span one group; 0 is the default group.
type Hello struct {
	Token string   // the run token; the master refuses peers with another token
	Addr  string   // the address ring neighbours dial, host:port
	Site  string   // the site (datacenter, region) the peer runs in; may be empty
	Caps  uint64   // capability bits, reserved
	Peer  uint64   // the chosen peer id, or 0 for one assigned by the master
	Group uint32   // the peer group, 0 by default
	NICs  []string // the peer's NICs inside its site: the listen address (ip:port) of each, in rail order, when it runs the intra-site tier, else as configured; may be empty
	// Published says that Addr was set by the operator (a public address, a forwarded port): others
	// can dial it even when this connection comes from another address.
	Published bool
	// Resume, when set, says that the peer was accepted by a master before this connection (one that
	// restarted, or the same one after the connection broke) and what it holds, so that a restarted
	// master can rebuild its view from the peers that come back.
	Resume *Resume
}

func (m *Hello) Append(b []byte) []byte {
	b = appendString(b, m.Token)
	b = appendString(b, m.Addr)
	b = appendString(b, m.Site)
	b = appendU64(b, m.Caps)
	b = appendU64(b, m.Peer)
	b = appendU32(b, m.Group)
	b = appendStrings(b, m.NICs)
	b = appendBool(b, m.Published)
	b = appendBool(b, m.Resume != nil)
	if m.Resume != nil {
		b = m.Resume.append(b)
	}
	return b
}

func (m *Hello) decode(d *decoder) {
	*m = Hello{Token: d.str("token"), Addr: d.str("addr"), Site: d.str("site"), Caps: d.u64("caps"),
		Peer: d.u64("peer"), Group: d.u32("group"), NICs: d.strs(MaxNICs, "nics"), Published: d.boolean("published")}
	if d.boolean("resume") {
		m.Resume = &Resume{}
		m.Resume.decode(d)
	}
}

// MaxResumeRing bounds the ring a Resume may carry.
const MaxResumeRing = 1 << 16

// Resume is what a reconnecting peer held when it lost the master: the master incarnation that
// accepted it, the epoch and ring in force, its shared-state revision and the encoded digest of that
// state (sharedstate.EncodeDigest; empty before its first sync), and its last reported training step.
type Resume struct {
	Incarnation uint64
	Epoch       uint64
	Ring        []uint64 // at most MaxResumeRing ids
	Revision    uint64
	Digest      []byte
	Step        uint64
	HasStep     bool
	InOptimizer bool
}

func (r *Resume) append(b []byte) []byte {
	b = appendU64(b, r.Incarnation)
	b = appendU64(b, r.Epoch)
	b = appendU64s(b, r.Ring)
	b = appendU64(b, r.Revision)
	b = appendBytes(b, r.Digest)
	b = appendU64(b, r.Step)
	b = appendBool(b, r.HasStep)
	return appendBool(b, r.InOptimizer)
}

func (r *Resume) decode(d *decoder) {
	*r = Resume{Incarnation: d.u64("resume incarnation"), Epoch: d.u64("resume epoch"),
		Ring: d.u64s(MaxResumeRing, "resume ring"), Revision: d.u64("resume revision"), Digest: d.bytes("resume digest"),
		Step: d.u64("resume step"), HasStep: d.boolean("resume has step"), InOptimizer: d.boolean("resume in optimizer")}
}

// Welcome registers the peer: its id and the heartbeat timing it must keep (nanoseconds).
//
// Incarnation names this start of the master; it changes when the master restarts. Every epoch the
// master hands out carries its incarnation in its high 32 bits, so a restarted master never reuses an
// epoch that a peer of the previous incarnation may still hold.
//
// Public and Inbound are the master's view of the peer, as PeerInfo carries it to the others: where
// its connection comes from, and whether others can dial its advertised address.
type Welcome struct {
	Peer              uint64
	HeartbeatInterval uint64
	HeartbeatTimeout  uint64
	Incarnation       uint64
	Public            string
	Inbound           bool
}

func (m *Welcome) Append(b []byte) []byte {
	b = appendU64(b, m.Peer)
	b = appendU64(b, m.HeartbeatInterval)
	b = appendU64(b, m.HeartbeatTimeout)
	b = appendU64(b, m.Incarnation)
	b = appendString(b, m.Public)
	return appendBool(b, m.Inbound)
}

func (m *Welcome) decode(d *decoder) {
	*m = Welcome{Peer: d.u64("peer"), HeartbeatInterval: d.u64("interval"), HeartbeatTimeout: d.u64("timeout"),
		Incarnation: d.u64("incarnation"), Public: d.str("public"), Inbound: d.boolean("inbound")}
}

// Kick tells the peer it has been removed, and why. The master closes the connection after it. Final
// says that joining again cannot help until the cause is fixed (a wrong run token, say); otherwise the
// peer may join again as a newcomer (it was silent, unreachable, or removed by a partition).
type Kick struct {
	Reason string
	Final  bool
}

func (m *Kick) Append(b []byte) []byte {
	b = appendString(b, m.Reason)
	return appendBool(b, m.Final)
}

func (m *Kick) decode(d *decoder) { *m = Kick{Reason: d.str("reason"), Final: d.boolean("final")} }

// Notice is a warning the master has for the peer's operator, one line: its advertised address seems
// unreachable, or it connects through NAT. The peer logs it; nothing else changes.
type Notice struct{ Text string }

func (m *Notice) Append(b []byte) []byte { return appendString(b, m.Text) }
func (m *Notice) decode(d *decoder)      { m.Text = d.str("text") }

// Heartbeat tells the master the peer is alive.
type Heartbeat struct{ Seq uint64 }

func (m *Heartbeat) Append(b []byte) []byte { return appendU64(b, m.Seq) }
func (m *Heartbeat) decode(d *decoder)      { m.Seq = d.u64("seq") }

// HeartbeatAck answers a Heartbeat.
type HeartbeatAck struct{ Seq uint64 }

func (m *HeartbeatAck) Append(b []byte) []byte { return appendU64(b, m.Seq) }
func (m *HeartbeatAck) decode(d *decoder)      { m.Seq = d.u64("seq") }

// Bye announces a graceful leave.
type Bye struct{}

func (m *Bye) Append(b []byte) []byte { return b }
func (m *Bye) decode(*decoder)        {}

// VoteTopology is an accepted peer's vote in UpdateTopology. Rewire asks for the ring's links to be
// re-established even if membership did not change (after an aborted collective left them unusable).
// NoAdmit asks the master to keep registered peers waiting: the round re-wires the accepted peers
// only (the repair after a failed collective). Both travel in one flags byte (bit 0 Rewire, bit 1
// NoAdmit), so a vote without NoAdmit encodes as it did when the byte was a bool.
type VoteTopology struct{ Rewire, NoAdmit bool }

// Flags of VoteTopology.
const (
	topoRewire  = 1
	topoNoAdmit = 2
)

func (m *VoteTopology) Append(b []byte) []byte {
	var f byte
	if m.Rewire {
		f |= topoRewire
	}
	if m.NoAdmit {
		f |= topoNoAdmit
	}
	return append(b, f)
}

func (m *VoteTopology) decode(d *decoder) {
	f := d.u8("topology flags")
	if f&^(topoRewire|topoNoAdmit) != 0 {
		d.fail("topology flags")
	}
	*m = VoteTopology{Rewire: f&topoRewire != 0, NoAdmit: f&topoNoAdmit != 0}
}

// Connect asks the peer to wire the ring of Epoch: open links to its successor and accept its
// predecessor's, then answer LinksReady.
type Connect struct {
	Epoch uint64
	Ring  []PeerInfo
}

func (m *Connect) Append(b []byte) []byte {
	b = appendU64(b, m.Epoch)
	b = appendU32(b, uint32(len(m.Ring)))
	for _, p := range m.Ring {
		b = appendPeerInfo(b, p)
	}
	return b
}

func (m *Connect) decode(d *decoder) {
	m.Epoch = d.u64("epoch")
	n := d.count(peerInfoMin, "ring")
	for range n {
		m.Ring = append(m.Ring, d.peerInfo())
	}
}

// LinksReady reports the result of wiring the ring of Epoch: OK, or the neighbours that could not be
// reached, with the error (Detail).
type LinksReady struct {
	Epoch  uint64
	OK     bool
	Failed []uint64
	Detail string
}

func (m *LinksReady) Append(b []byte) []byte {
	b = appendU64(b, m.Epoch)
	b = appendBool(b, m.OK)
	b = appendU64s(b, m.Failed)
	return appendString(b, m.Detail)
}

func (m *LinksReady) decode(d *decoder) {
	*m = LinksReady{Epoch: d.u64("epoch"), OK: d.boolean("ok"), Failed: d.u64s(-1, "failed"), Detail: d.str("detail")}
}

// Topology puts the ring of Epoch in force. Changed is false when nothing changed since the last one.
// Run describes the whole run, all peer groups together, as the master sees it when it sends the
// message.
type Topology struct {
	Epoch   uint64
	Changed bool
	Ring    []uint64
	Run     RunSize
}

// RunSize counts the accepted peers of a run over all its peer groups: Peers in all, Groups that have
// at least one accepted peer, and the accepted peers of the Largest group.
type RunSize struct {
	Peers, Groups, Largest uint32
}

func (m *Topology) Append(b []byte) []byte {
	b = appendU64(b, m.Epoch)
	b = appendBool(b, m.Changed)
	b = appendU64s(b, m.Ring)
	b = appendU32(b, m.Run.Peers)
	b = appendU32(b, m.Run.Groups)
	return appendU32(b, m.Run.Largest)
}

func (m *Topology) decode(d *decoder) {
	*m = Topology{Epoch: d.u64("epoch"), Changed: d.boolean("changed"), Ring: d.u64s(-1, "ring"),
		Run: RunSize{Peers: d.u32("run peers"), Groups: d.u32("run groups"), Largest: d.u32("largest group")}}
}

// VotePending is a peer's vote in ArePeersPending. Leave makes it the peer's last: it leaves the group
// at this safe point, and every other voter is answered true, so that the group re-wires without it
// at its next UpdateTopology and no collective is aborted.
type VotePending struct{ Leave bool }

func (m *VotePending) Append(b []byte) []byte {
	if m.Leave {
		return append(b, 1)
	}
	return b // a plain vote is empty, as it was before Leave
}

func (m *VotePending) decode(d *decoder) {
	if len(d.b) > 0 {
		m.Leave = true
		if !d.boolean("leave") {
			d.fail("leave") // a plain vote has no byte at all
		}
	}
}

// Pending answers ArePeersPending; every voter receives the same answer.
type Pending struct{ Answer bool }

func (m *Pending) Append(b []byte) []byte { return appendBool(b, m.Answer) }
func (m *Pending) decode(d *decoder)      { m.Answer = d.boolean("answer") }

func (*Hello) Type() Type        { return TypeHello }
func (*Welcome) Type() Type      { return TypeWelcome }
func (*Kick) Type() Type         { return TypeKick }
func (*Notice) Type() Type       { return TypeNotice }
func (*Heartbeat) Type() Type    { return TypeHeartbeat }
func (*HeartbeatAck) Type() Type { return TypeHeartbeatAck }
func (*Bye) Type() Type          { return TypeBye }
func (*VoteTopology) Type() Type { return TypeVoteTopology }
func (*Connect) Type() Type      { return TypeConnect }
func (*LinksReady) Type() Type   { return TypeLinksReady }
func (*Topology) Type() Type     { return TypeTopology }
func (*VotePending) Type() Type  { return TypeVotePending }
func (*Pending) Type() Type      { return TypePending }
