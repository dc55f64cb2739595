package wire

import (
	"fmt"
	"math"
)

// Type identifies a control message.
type Type uint8

// Control message types. Peer-to-master messages are below 64, master-to-peer messages from 64, link
// messages (between neighbours) from 128. TypeData marks a data frame header.
const (
	TypeHello         Type = 1
	TypeVoteTopology  Type = 2
	TypeLinksReady    Type = 3
	TypeVotePending   Type = 4
	TypeInitiate      Type = 5
	TypeDone          Type = 6
	TypeHeartbeat     Type = 7
	TypeBye           Type = 8
	TypeVoteSync      Type = 9
	TypeStepReport    Type = 10
	TypeSyncDone      Type = 11
	TypeVoteOptimize  Type = 12
	TypeMeasureReport Type = 13

	TypeWelcome      Type = 64
	TypeConnect      Type = 65
	TypeTopology     Type = 66
	TypePending      Type = 67
	TypeCommence     Type = 68
	TypeOutcome      Type = 69
	TypeKick         Type = 70
	TypeHeartbeatAck Type = 71
	TypeSyncPlan     Type = 72
	TypeSyncComplete Type = 73
	TypeMeasureRound Type = 74

	TypeLinkHello     Type = 128
	TypeLinkAck       Type = 129
	TypeStateRequest  Type = 130
	TypeStateResponse Type = 131
	TypeBenchHello    Type = 132
	TypeBenchResult   Type = 133

	TypeData Type = 200
)

// Message is one control message. Append encodes the payload (without the frame header).
type Message interface {
	Type() Type
	Append(b []byte) []byte
}

// Decode decodes the payload of a control frame of type t.
func Decode(t Type, p []byte) (Message, error) {
	d := &decoder{b: p}
	var m Message
	switch t {
	case TypeHello:
		h := &Hello{Token: d.str("token"), Addr: d.str("addr"), Site: d.str("site"), Caps: d.u64("caps"),
			Peer: d.u64("peer"), Group: d.u32("group")}
		n := d.count(4, "nics")
		for i := 0; i < n; i++ {
			h.NICs = append(h.NICs, d.str("nic"))
		}
		if d.boolean("resume") {
			h.Resume = decodeResume(d)
		}
		m = h
	case TypeVoteTopology:
		f := d.u8("topology flags")
		if f&^(topoRewire|topoNoAdmit) != 0 {
			d.fail("topology flags")
		}
		m = &VoteTopology{Rewire: f&topoRewire != 0, NoAdmit: f&topoNoAdmit != 0}
	case TypeLinksReady:
		v := &LinksReady{Epoch: d.u64("epoch"), OK: d.boolean("ok")}
		n := d.count(8, "failed")
		for i := 0; i < n; i++ {
			v.Failed = append(v.Failed, d.u64("failed"))
		}
		v.Detail = d.str("detail")
		m = v
	case TypeVotePending:
		m = &VotePending{}
	case TypeInitiate:
		v := &Initiate{Tag: d.u64("tag"), Desc: Desc{Count: d.u64("count"), DType: d.u8("dtype"), Op: d.u8("op"), Quant: d.u8("quant"), Part: d.u32("part")}}
		if d.boolean("stats") {
			v.Stats = &Contribution{Finite: d.boolean("finite"), Norm: d.f64("norm")}
		}
		m = v
	case TypeDone:
		v := &Done{Tag: d.u64("tag"), Seq: d.u64("seq"), Code: d.code(), Detail: d.str("detail"),
			LinkBytes: d.u64("link bytes"), LinkNanos: d.u64("link nanos")}
		v.Links = d.linkTimings()
		v.Silent = LinkRef{Peer: d.u64("silent peer"), Dir: LinkDir(d.u8("silent dir"))}
		if v.Silent.Dir > LinkIn || (v.Silent.Peer == 0 && v.Silent.Dir != 0) {
			d.fail("silent link")
		}
		m = v
	case TypeHeartbeat:
		m = &Heartbeat{Seq: d.u64("seq")}
	case TypeBye:
		m = &Bye{}
	case TypeWelcome:
		m = &Welcome{Peer: d.u64("peer"), HeartbeatInterval: d.u64("interval"), HeartbeatTimeout: d.u64("timeout"),
			Incarnation: d.u64("incarnation")}
	case TypeConnect:
		v := &Connect{Epoch: d.u64("epoch")}
		n := d.count(16, "ring")
		for i := 0; i < n; i++ {
			p := PeerInfo{ID: d.u64("peer id"), Addr: d.str("peer addr"), Site: d.str("peer site")}
			k := d.count(4, "peer nics")
			for j := 0; j < k; j++ {
				p.NICs = append(p.NICs, d.str("peer nic"))
			}
			v.Ring = append(v.Ring, p)
		}
		m = v
	case TypeTopology:
		v := &Topology{Epoch: d.u64("epoch"), Changed: d.boolean("changed")}
		n := d.count(8, "ring")
		for i := 0; i < n; i++ {
			v.Ring = append(v.Ring, d.u64("ring"))
		}
		v.Run = RunSize{Peers: d.u32("run peers"), Groups: d.u32("run groups"), Largest: d.u32("largest group")}
		m = v
	case TypePending:
		m = &Pending{Answer: d.boolean("answer")}
	case TypeCommence:
		m = &Commence{Tag: d.u64("tag"), Seq: d.u64("seq"), Epoch: d.u64("epoch"), Alone: d.boolean("alone")}
	case TypeOutcome:
		m = &Outcome{Tag: d.u64("tag"), Seq: d.u64("seq"), Code: d.code(), Detail: d.str("detail")}
	case TypeKick:
		m = &Kick{Reason: d.str("reason")}
	case TypeHeartbeatAck:
		m = &HeartbeatAck{Seq: d.u64("seq")}
	case TypeLinkHello:
		m = &LinkHello{Token: d.str("token"), From: d.u64("from"), To: d.u64("to"), Index: d.u16("index")}
	case TypeLinkAck:
		m = &LinkAck{OK: d.boolean("ok"), Reason: d.str("reason")}
	case TypeVoteSync:
		m = &VoteSync{Strategy: d.u8("strategy"), Digest: d.bytes("digest")}
	case TypeStepReport:
		m = &StepReport{Step: d.u64("step"), InOptimizer: d.boolean("in optimizer")}
	case TypeSyncDone:
		m = &SyncDone{OK: d.boolean("ok"), Detail: d.str("detail")}
	case TypeSyncPlan:
		v := &SyncPlan{Revision: d.u64("revision"), Code: d.code(), Detail: d.str("detail")}
		n := d.count(24, "fetch")
		for i := 0; i < n; i++ {
			f := FetchItem{Name: d.str("fetch name"), Hash: d.u64("fetch hash"), Bytes: d.u64("fetch bytes")}
			k := d.count(16, "donors")
			for j := 0; j < k; j++ {
				f.Donors = append(f.Donors, PeerInfo{ID: d.u64("donor id"), Addr: d.str("donor addr"), Site: d.str("donor site")})
			}
			v.Fetch = append(v.Fetch, f)
		}
		m = v
	case TypeSyncComplete:
		m = &SyncComplete{Revision: d.u64("revision"), Code: d.code(), Detail: d.str("detail"), ResumeStep: d.u64("resume step")}
	case TypeStateRequest:
		m = &StateRequest{Token: d.str("token"), Name: d.str("name"), Hash: d.u64("hash"), Off: d.u64("off"),
			Len: d.u64("len"), Compress: d.boolean("compress"), Leaves: d.boolean("leaves")}
	case TypeStateResponse:
		m = &StateResponse{OK: d.boolean("ok"), Detail: d.str("detail"), Len: d.u64("len"), Compressed: d.boolean("compressed")}
	case TypeVoteOptimize:
		m = &VoteOptimize{}
	case TypeMeasureReport:
		m = &MeasureReport{Round: d.u32("round"), To: d.u64("to"), BytesPerSec: d.f64("rate"), LatencyNanos: d.u64("latency")}
	case TypeMeasureRound:
		m = &MeasureRound{Round: d.u32("round"), Target: PeerInfo{ID: d.u64("target id"), Addr: d.str("target addr"),
			Site: d.str("target site")}, Nanos: d.u64("nanos"), Streams: d.u16("streams")}
	case TypeBenchHello:
		m = &BenchHello{Token: d.str("token"), Nanos: d.u64("nanos")}
	case TypeBenchResult:
		m = &BenchResult{Bytes: d.u64("bytes"), Nanos: d.u64("nanos"), Start: d.u64("start")}
	default:
		return nil, fmt.Errorf("%w: unknown message type %d", ErrMalformed, t)
	}
	if err := d.finish(); err != nil {
		return nil, fmt.Errorf("decode type %d: %w", t, err)
	}
	return m, nil
}

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
	// Resume, when set, says that the peer was accepted by a master before this connection (one that
	// restarted, or the same one after the connection broke) and what it holds, so that a restarted
	// master can rebuild its view from the peers that come back.
	Resume *Resume
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

func decodeResume(d *decoder) *Resume {
	r := &Resume{Incarnation: d.u64("resume incarnation"), Epoch: d.u64("resume epoch")}
	n := d.count(8, "resume ring")
	if n > MaxResumeRing {
		d.fail("resume ring")
		return r
	}
	for range n {
		r.Ring = append(r.Ring, d.u64("resume ring"))
	}
	r.Revision = d.u64("resume revision")
	r.Digest = d.bytes("resume digest")
	r.Step = d.u64("resume step")
	r.HasStep = d.boolean("resume has step")
	r.InOptimizer = d.boolean("resume in optimizer")
	return r
}

func appendResume(b []byte, r *Resume) []byte {
	b = appendU64(b, r.Incarnation)
	b = appendU64(b, r.Epoch)
	b = appendU32(b, uint32(len(r.Ring)))
	for _, id := range r.Ring {
		b = appendU64(b, id)
	}
	b = appendU64(b, r.Revision)
	b = appendU32(b, uint32(len(r.Digest)))
	b = append(b, r.Digest...)
	b = appendU64(b, r.Step)
	b = appendBool(b, r.HasStep)
	return appendBool(b, r.InOptimizer)
}

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

// LinksReady reports the result of wiring the ring of Epoch: OK, or the neighbours that could not be
// reached.
type LinksReady struct {
	Epoch  uint64
	OK     bool
	Failed []uint64
	Detail string
}

// VotePending is a peer's vote in ArePeersPending.
type VotePending struct{}

// Desc describes a collective: element count, dtype, op and quantization. All participants must send
// the same Desc for one operation.
type Desc struct {
	Count uint64
	DType uint8
	Op    uint8
	Quant uint8
	// Part is the pipelining granularity in bytes the peer cuts the operation's frames by: peers
	// that cut differently could not match each other's frames, so it must agree like the rest.
	Part uint32
}

// Initiate is a peer's vote to start the collective on Tag.
type Initiate struct {
	Tag  uint64
	Desc Desc
	// Stats, when the peer computes them, describe its contribution, for the master's contribution
	// guard.
	Stats *Contribution
}

// Contribution describes a peer's input to a collective: whether every element is finite, and its
// Euclidean norm (meaningful only when Finite).
type Contribution struct {
	Finite bool
	Norm   float64
}

// Done reports that the peer finished its part of the operation (Tag, Seq) (Code is CodeOK) or failed
// it: CodePeerLeft for an I/O failure on a link, CodeAborted when the caller cancelled. Seq 0 withdraws
// a vote for an operation whose Commence the peer has not seen; the master then counts the withdrawal
// as the peer's Done of that operation, and the peer ignores a Commence that crosses it.
//
// LinkBytes and LinkNanos time the peer's link to its successor during the operation: the bytes it
// sent and the nanoseconds its sends were blocked. The master keeps its bandwidth estimates fresh
// from them.
//
// Links is the operation's timing summary per link, for the master's diagnosis of slow links and
// slow peers: at most MaxLinkTimings entries, one per link and direction the operation used (in a
// ring: the link to the successor and the link from the predecessor). It is a bounded summary of
// the whole operation, never one entry per chunk. A peer that does not time its links sends none.
//
// Silent names the link whose progress deadline failed the operation (Silent.Peer 0: none). Both ends
// still reached the master, so the master avoids that edge in the next ring rather than evict
// either (a route black-holed between them).
//
// Encoding: tag u64 | seq u64 | code u8 | detail string | link bytes u64 | link nanos u64 | link
// count u32 (at most MaxLinkTimings) | per link: peer u64 | dir u8 | bytes u64 | start u64 | end u64
// | wait u64 (41 bytes each) | silent peer u64 | silent dir u8.
type Done struct {
	Tag       uint64
	Seq       uint64
	Code      Code
	Detail    string
	LinkBytes uint64
	LinkNanos uint64
	Links     []LinkTiming
	Silent    LinkRef
}

// LinkRef names one direction of the link between the reporting peer and Peer.
type LinkRef struct {
	Peer uint64
	Dir  LinkDir
}

// MaxLinkTimings bounds Done.Links; the decoder refuses more.
const MaxLinkTimings = 8

// LinkDir says which way a LinkTiming's bytes went.
type LinkDir uint8

// Link directions.
const (
	LinkOut LinkDir = iota // from the reporting peer to LinkTiming.Peer
	LinkIn                 // from LinkTiming.Peer to the reporting peer
)

// LinkTiming is what one link did during one operation, seen from the reporting peer. Start, End and
// Wait are nanoseconds; Start and End are offsets from the moment the peer began the operation (it
// received Commence), so no clocks need to agree.
//
// Wait is the time the peer spent stalled on this link and on nothing else: for LinkOut, the time a
// step of the operation could not go on because the send to Peer had not completed while the
// step's other work had; for LinkIn, the time it could not go on because the bytes from Peer had
// not arrived. A peer's stalls therefore never overlap, and its span minus its waits is the time it
// was busy on its own (computing, copying, or late to start).
type LinkTiming struct {
	Peer  uint64  // the peer at the other end of the link
	Dir   LinkDir // LinkOut or LinkIn
	Bytes uint64  // payload bytes carried
	Start uint64  // offset of the first byte sent or received
	End   uint64  // offset of the last byte sent or received
	Wait  uint64  // stalled on this link
}

// Heartbeat tells the master the peer is alive.
type Heartbeat struct{ Seq uint64 }

// Bye announces a graceful leave.
type Bye struct{}

// Welcome registers the peer: its id and the heartbeat timing it must keep (nanoseconds).
//
// Incarnation names this start of the master; it changes when the master restarts. Every epoch the
// master hands out carries its incarnation in its high 32 bits, so a restarted master never reuses an
// epoch that a peer of the previous incarnation may still hold.
type Welcome struct {
	Peer              uint64
	HeartbeatInterval uint64
	HeartbeatTimeout  uint64
	Incarnation       uint64
}

// PeerInfo names a ring member and where to reach it.
type PeerInfo struct {
	ID   uint64
	Addr string
	Site string
	// NICs are the peer's announced NICs (Hello.NICs); carried in Connect only.
	NICs []string
}

// Connect asks the peer to wire the ring of Epoch: open links to its successor and accept its
// predecessor's, then answer LinksReady.
type Connect struct {
	Epoch uint64
	Ring  []PeerInfo
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

// Pending answers ArePeersPending; every voter receives the same answer.
type Pending struct{ Answer bool }

// Commence starts the collective (Tag, Seq) on the ring of Epoch.
type Commence struct {
	Tag   uint64
	Seq   uint64
	Epoch uint64
	// Alone says that no other collective of the group was running when this one commenced, nor will
	// one commence before every member has reported this one done: the collective may use resources
	// that one collective at a time can hold (the intra-site fabric of a hierarchical AllReduce).
	Alone bool
}

// Code is the outcome of an operation.
type Code uint8

// Outcome codes.
const (
	CodeOK           Code = iota // every participant completed; commit the result
	CodePeerLeft                 // a participant left or failed; retry after UpdateTopology
	CodeAborted                  // a participant aborted (cancelled) the operation
	CodeMismatch                 // participants passed different descriptors
	CodeTooFewPeers              // fewer accepted peers than MinPeers
	CodeRejected                 // the master refused the request (see Detail)
	CodeLocalFailure             // a participant failed locally, e.g. a non-finite quantized result; a retry cannot fix it
	codeMax          = CodeLocalFailure
)

var codeNames = [...]string{"ok", "peer-left", "aborted", "mismatch", "too-few-peers", "rejected", "local-failure"}

func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("code(%d)", uint8(c))
}

// Outcome ends the operation (Tag, Seq) for this peer; each participant gets exactly one. Seq is 0 when
// the operation never commenced.
type Outcome struct {
	Tag    uint64
	Seq    uint64
	Code   Code
	Detail string
}

// Kick tells the peer it has been removed, and why. The master closes the connection after it.
type Kick struct{ Reason string }

// HeartbeatAck answers a Heartbeat.
type HeartbeatAck struct{ Seq uint64 }

// LinkHello opens a data link from peer From to peer To; Index is the connection's slot in the pool.
type LinkHello struct {
	Token string
	From  uint64
	To    uint64
	Index uint16
}

// LinkAck accepts or refuses a LinkHello.
type LinkAck struct {
	OK     bool
	Reason string
}

func (*Hello) Type() Type         { return TypeHello }
func (*VoteSync) Type() Type      { return TypeVoteSync }
func (*StepReport) Type() Type    { return TypeStepReport }
func (*SyncDone) Type() Type      { return TypeSyncDone }
func (*SyncPlan) Type() Type      { return TypeSyncPlan }
func (*SyncComplete) Type() Type  { return TypeSyncComplete }
func (*StateRequest) Type() Type  { return TypeStateRequest }
func (*StateResponse) Type() Type { return TypeStateResponse }
func (*VoteOptimize) Type() Type  { return TypeVoteOptimize }
func (*MeasureReport) Type() Type { return TypeMeasureReport }
func (*MeasureRound) Type() Type  { return TypeMeasureRound }
func (*BenchHello) Type() Type    { return TypeBenchHello }
func (*BenchResult) Type() Type   { return TypeBenchResult }
func (*VoteTopology) Type() Type  { return TypeVoteTopology }
func (*LinksReady) Type() Type    { return TypeLinksReady }
func (*VotePending) Type() Type   { return TypeVotePending }
func (*Initiate) Type() Type      { return TypeInitiate }
func (*Done) Type() Type          { return TypeDone }
func (*Heartbeat) Type() Type     { return TypeHeartbeat }
func (*Bye) Type() Type           { return TypeBye }
func (*Welcome) Type() Type       { return TypeWelcome }
func (*Connect) Type() Type       { return TypeConnect }
func (*Topology) Type() Type      { return TypeTopology }
func (*Pending) Type() Type       { return TypePending }
func (*Commence) Type() Type      { return TypeCommence }
func (*Outcome) Type() Type       { return TypeOutcome }
func (*Kick) Type() Type          { return TypeKick }
func (*HeartbeatAck) Type() Type  { return TypeHeartbeatAck }
func (*LinkHello) Type() Type     { return TypeLinkHello }
func (*LinkAck) Type() Type       { return TypeLinkAck }

// Append methods encode the payload.

func (m *Hello) Append(b []byte) []byte {
	b = appendString(b, m.Token)
	b = appendString(b, m.Addr)
	b = appendString(b, m.Site)
	b = appendU64(b, m.Caps)
	b = appendU64(b, m.Peer)
	b = appendU32(b, m.Group)
	b = appendU32(b, uint32(len(m.NICs)))
	for _, nic := range m.NICs {
		b = appendString(b, nic)
	}
	b = appendBool(b, m.Resume != nil)
	if m.Resume != nil {
		b = appendResume(b, m.Resume)
	}
	return b
}

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

func (m *LinksReady) Append(b []byte) []byte {
	b = appendU64(b, m.Epoch)
	b = appendBool(b, m.OK)
	b = appendU32(b, uint32(len(m.Failed)))
	for _, id := range m.Failed {
		b = appendU64(b, id)
	}
	return appendString(b, m.Detail)
}

func (m *VotePending) Append(b []byte) []byte { return b }

func (m *Initiate) Append(b []byte) []byte {
	b = appendU64(b, m.Tag)
	b = appendU64(b, m.Desc.Count)
	b = append(b, m.Desc.DType, m.Desc.Op, m.Desc.Quant)
	b = appendU32(b, m.Desc.Part)
	b = appendBool(b, m.Stats != nil)
	if m.Stats != nil {
		b = appendBool(b, m.Stats.Finite)
		b = appendU64(b, math.Float64bits(m.Stats.Norm))
	}
	return b
}

func (m *Done) Append(b []byte) []byte {
	b = appendU64(b, m.Tag)
	b = appendU64(b, m.Seq)
	b = append(b, byte(m.Code))
	b = appendString(b, m.Detail)
	b = appendU64(b, m.LinkBytes)
	b = appendU64(b, m.LinkNanos)
	b = appendLinkTimings(b, m.Links)
	b = appendU64(b, m.Silent.Peer)
	return append(b, byte(m.Silent.Dir))
}

// appendLinkTimings appends a list of link timings: count u32, then per entry peer u64 | dir u8 |
// bytes u64 | start u64 | end u64 | wait u64 (41 bytes).
func appendLinkTimings(b []byte, ls []LinkTiming) []byte {
	b = appendU32(b, uint32(len(ls)))
	for _, l := range ls {
		b = appendU64(b, l.Peer)
		b = append(b, byte(l.Dir))
		b = appendU64(b, l.Bytes)
		b = appendU64(b, l.Start)
		b = appendU64(b, l.End)
		b = appendU64(b, l.Wait)
	}
	return b
}

// linkTimingSize is the encoded size of one LinkTiming.
const linkTimingSize = 41

// linkTimings reads what appendLinkTimings wrote. It refuses more than MaxLinkTimings entries, an
// unknown direction, and an entry that ends before it starts.
func (d *decoder) linkTimings() []LinkTiming {
	n := d.count(linkTimingSize, "link timings")
	if n > MaxLinkTimings {
		d.fail("link timings")
		return nil
	}
	var ls []LinkTiming
	for range n {
		l := LinkTiming{Peer: d.u64("link peer"), Dir: LinkDir(d.u8("link dir")), Bytes: d.u64("link bytes"),
			Start: d.u64("link start"), End: d.u64("link end"), Wait: d.u64("link wait")}
		if l.Dir > LinkIn || l.End < l.Start {
			d.fail("link timing")
			return nil
		}
		ls = append(ls, l)
	}
	return ls
}

func (m *Heartbeat) Append(b []byte) []byte { return appendU64(b, m.Seq) }
func (m *Bye) Append(b []byte) []byte       { return b }

func (m *Welcome) Append(b []byte) []byte {
	b = appendU64(b, m.Peer)
	b = appendU64(b, m.HeartbeatInterval)
	b = appendU64(b, m.HeartbeatTimeout)
	return appendU64(b, m.Incarnation)
}

func (m *Connect) Append(b []byte) []byte {
	b = appendU64(b, m.Epoch)
	b = appendU32(b, uint32(len(m.Ring)))
	for _, p := range m.Ring {
		b = appendU64(b, p.ID)
		b = appendString(b, p.Addr)
		b = appendString(b, p.Site)
		b = appendU32(b, uint32(len(p.NICs)))
		for _, nic := range p.NICs {
			b = appendString(b, nic)
		}
	}
	return b
}

func (m *Topology) Append(b []byte) []byte {
	b = appendU64(b, m.Epoch)
	b = appendBool(b, m.Changed)
	b = appendU32(b, uint32(len(m.Ring)))
	for _, id := range m.Ring {
		b = appendU64(b, id)
	}
	b = appendU32(b, m.Run.Peers)
	b = appendU32(b, m.Run.Groups)
	return appendU32(b, m.Run.Largest)
}

func (m *Pending) Append(b []byte) []byte { return appendBool(b, m.Answer) }

func (m *Commence) Append(b []byte) []byte {
	b = appendU64(b, m.Tag)
	b = appendU64(b, m.Seq)
	b = appendU64(b, m.Epoch)
	return appendBool(b, m.Alone)
}

func (m *Outcome) Append(b []byte) []byte {
	b = appendU64(b, m.Tag)
	b = appendU64(b, m.Seq)
	b = append(b, byte(m.Code))
	return appendString(b, m.Detail)
}

func (m *Kick) Append(b []byte) []byte         { return appendString(b, m.Reason) }
func (m *HeartbeatAck) Append(b []byte) []byte { return appendU64(b, m.Seq) }

func (m *LinkHello) Append(b []byte) []byte {
	b = appendString(b, m.Token)
	b = appendU64(b, m.From)
	b = appendU64(b, m.To)
	return appendU16(b, m.Index)
}

func (m *LinkAck) Append(b []byte) []byte {
	b = appendBool(b, m.OK)
	return appendString(b, m.Reason)
}

// VoteSync is a peer's vote in SyncSharedState: its strategy (sharedstate.Strategy) and the digest of
// its state (sharedstate's encoding).
type VoteSync struct {
	Strategy uint8
	Digest   []byte
}

// StepReport tells the master the peer's training step and whether it is inside the optimizer step,
// so that a recovery resumes every peer at one consistent step.
type StepReport struct {
	Step        uint64
	InOptimizer bool
}

// SyncDone reports that the peer fetched (and verified) everything its SyncPlan listed, or failed to.
type SyncDone struct {
	OK     bool
	Detail string
}

// FetchItem is one entry an outlier must fetch: its elected hash, size, and the peers that hold it,
// preferred first.
type FetchItem struct {
	Name   string
	Hash   uint64
	Bytes  uint64
	Donors []PeerInfo
}

// SyncPlan is the master's answer to a VoteSync: the elected revision and what this peer must fetch.
// A Code other than CodeOK means the sync failed for this peer (Detail says why).
type SyncPlan struct {
	Revision uint64
	Code     Code
	Detail   string
	Fetch    []FetchItem
}

// SyncComplete ends a sync: every peer holds Revision (CodeOK), or the sync failed. ResumeStep is the
// consistent training step to resume from, from the peers' step reports.
type SyncComplete struct {
	Revision   uint64
	Code       Code
	Detail     string
	ResumeStep uint64
}

// StateRequest asks a donor for Len bytes at Off of entry Name, whose content must hash to Hash. With
// Leaves, it asks instead for the leaf hashes of the entry's hash tree (Off and Len are ignored): the
// response carries them as little-endian u64s, so that the receiver can verify every block before it
// writes it.
type StateRequest struct {
	Token    string
	Name     string
	Hash     uint64
	Off      uint64
	Len      uint64
	Compress bool
	Leaves   bool
}

// StateResponse answers a StateRequest; if OK, Len bytes follow (zstd-compressed if Compressed).
type StateResponse struct {
	OK         bool
	Detail     string
	Len        uint64
	Compressed bool
}

func (m *VoteSync) Append(b []byte) []byte {
	b = append(b, m.Strategy)
	return appendBytes(b, m.Digest)
}

func (m *StepReport) Append(b []byte) []byte {
	b = appendU64(b, m.Step)
	return appendBool(b, m.InOptimizer)
}

func (m *SyncDone) Append(b []byte) []byte {
	b = appendBool(b, m.OK)
	return appendString(b, m.Detail)
}

func (m *SyncPlan) Append(b []byte) []byte {
	b = appendU64(b, m.Revision)
	b = append(b, byte(m.Code))
	b = appendString(b, m.Detail)
	b = appendU32(b, uint32(len(m.Fetch)))
	for _, f := range m.Fetch {
		b = appendString(b, f.Name)
		b = appendU64(b, f.Hash)
		b = appendU64(b, f.Bytes)
		b = appendU32(b, uint32(len(f.Donors)))
		for _, p := range f.Donors {
			b = appendU64(b, p.ID)
			b = appendString(b, p.Addr)
			b = appendString(b, p.Site)
		}
	}
	return b
}

func (m *SyncComplete) Append(b []byte) []byte {
	b = appendU64(b, m.Revision)
	b = append(b, byte(m.Code))
	b = appendString(b, m.Detail)
	return appendU64(b, m.ResumeStep)
}

func (m *StateRequest) Append(b []byte) []byte {
	b = appendString(b, m.Token)
	b = appendString(b, m.Name)
	b = appendU64(b, m.Hash)
	b = appendU64(b, m.Off)
	b = appendU64(b, m.Len)
	b = appendBool(b, m.Compress)
	return appendBool(b, m.Leaves)
}

func (m *StateResponse) Append(b []byte) []byte {
	b = appendBool(b, m.OK)
	b = appendString(b, m.Detail)
	b = appendU64(b, m.Len)
	return appendBool(b, m.Compressed)
}

// VoteOptimize is a peer's vote in OptimizeTopology.
type VoteOptimize struct{}

// MeasureRound asks the peer to measure its link to Target for Nanos nanoseconds over Streams
// connections, and answer MeasureReport. Target.ID 0 means the peer sends nothing this round (it may
// still be measured by another peer). Rounds of OptimizeTopology count from 1; Round 0 is a test the
// master's diagnosis asks for on its own, beside the collectives, which the peer runs whether or not
// it optimizes.
type MeasureRound struct {
	Round   uint32
	Target  PeerInfo
	Nanos   uint64
	Streams uint16
}

// MeasureReport is the measured bandwidth of the directed link to To, in bytes per second (0: failed),
// and its one-way latency (half the round trip) in nanoseconds.
type MeasureReport struct {
	Round        uint32
	To           uint64
	BytesPerSec  float64
	LatencyNanos uint64
}

// BenchHello opens a bandwidth-test connection: the receiver answers an empty BenchResult at once (the
// sender times that round trip), then counts what arrives during Nanos nanoseconds from the first byte
// and answers a second BenchResult with the count.
type BenchHello struct {
	Token string
	Nanos uint64
}

// BenchResult is what a bandwidth-test receiver counted: Bytes during Nanos from Start (unix
// nanoseconds on the receiver's clock, so that the windows of parallel streams can be combined).
type BenchResult struct {
	Bytes uint64
	Nanos uint64
	Start uint64
}

func (m *VoteOptimize) Append(b []byte) []byte { return b }

func (m *MeasureReport) Append(b []byte) []byte {
	b = appendU32(b, m.Round)
	b = appendU64(b, m.To)
	b = appendF64(b, m.BytesPerSec)
	return appendU64(b, m.LatencyNanos)
}

func (m *MeasureRound) Append(b []byte) []byte {
	b = appendU32(b, m.Round)
	b = appendU64(b, m.Target.ID)
	b = appendString(b, m.Target.Addr)
	b = appendString(b, m.Target.Site)
	b = appendU64(b, m.Nanos)
	return appendU16(b, m.Streams)
}

func (m *BenchHello) Append(b []byte) []byte {
	b = appendString(b, m.Token)
	return appendU64(b, m.Nanos)
}

func (m *BenchResult) Append(b []byte) []byte {
	b = appendU64(b, m.Bytes)
	b = appendU64(b, m.Nanos)
	return appendU64(b, m.Start)
}
