package wire

import "fmt"

// Type identifies a control message.
type Type uint8

// Control message types. Peer-to-master messages are below 64, master-to-peer messages from 64, link
// messages (between neighbours), state transfer and bandwidth tests from 128. The session layer's
// acknowledgement (SessionAck) goes both ways. TypeData marks a data frame header.
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
	TypeSessionResume Type = 14
	TypeSessionAck    Type = 15
	TypeRendezvous    Type = 16

	TypeWelcome        Type = 64
	TypeConnect        Type = 65
	TypeTopology       Type = 66
	TypePending        Type = 67
	TypeCommence       Type = 68
	TypeOutcome        Type = 69
	TypeKick           Type = 70
	TypeHeartbeatAck   Type = 71
	TypeSyncPlan       Type = 72
	TypeSyncComplete   Type = 73
	TypeMeasureRound   Type = 74
	TypeNotice         Type = 75
	TypeSessionStart   Type = 76
	TypeSessionResumed Type = 77
	TypeRendezvousCall Type = 78

	TypeLinkHello     Type = 128
	TypeLinkAck       Type = 129
	TypeStateRequest  Type = 130
	TypeStateResponse Type = 131
	TypeBenchHello    Type = 132
	TypeBenchResult   Type = 133
	TypeCallHello     Type = 134

	TypeData Type = 200
)

// Message is one control message. Append encodes the payload (without the frame header); decode, its
// counterpart, fills the message from a payload. Only this package's types are Messages.
type Message interface {
	Type() Type
	Append(b []byte) []byte
	decode(d *decoder)
}

// newMessage returns a zero message of type t, or nil for an unknown type.
func newMessage(t Type) Message {
	switch t {
	case TypeHello:
		return &Hello{}
	case TypeVoteTopology:
		return &VoteTopology{}
	case TypeLinksReady:
		return &LinksReady{}
	case TypeVotePending:
		return &VotePending{}
	case TypeInitiate:
		return &Initiate{}
	case TypeDone:
		return &Done{}
	case TypeHeartbeat:
		return &Heartbeat{}
	case TypeBye:
		return &Bye{}
	case TypeVoteSync:
		return &VoteSync{}
	case TypeStepReport:
		return &StepReport{}
	case TypeSyncDone:
		return &SyncDone{}
	case TypeVoteOptimize:
		return &VoteOptimize{}
	case TypeMeasureReport:
		return &MeasureReport{}
	case TypeSessionResume:
		return &SessionResume{}
	case TypeSessionAck:
		return &SessionAck{}
	case TypeRendezvous:
		return &Rendezvous{}
	case TypeWelcome:
		return &Welcome{}
	case TypeConnect:
		return &Connect{}
	case TypeTopology:
		return &Topology{}
	case TypePending:
		return &Pending{}
	case TypeCommence:
		return &Commence{}
	case TypeOutcome:
		return &Outcome{}
	case TypeKick:
		return &Kick{}
	case TypeHeartbeatAck:
		return &HeartbeatAck{}
	case TypeSyncPlan:
		return &SyncPlan{}
	case TypeSyncComplete:
		return &SyncComplete{}
	case TypeMeasureRound:
		return &MeasureRound{}
	case TypeNotice:
		return &Notice{}
	case TypeSessionStart:
		return &SessionStart{}
	case TypeSessionResumed:
		return &SessionResumed{}
	case TypeRendezvousCall:
		return &RendezvousCall{}
	case TypeLinkHello:
		return &LinkHello{}
	case TypeLinkAck:
		return &LinkAck{}
	case TypeStateRequest:
		return &StateRequest{}
	case TypeStateResponse:
		return &StateResponse{}
	case TypeBenchHello:
		return &BenchHello{}
	case TypeBenchResult:
		return &BenchResult{}
	case TypeCallHello:
		return &CallHello{}
	}
	return nil
}

// Decode decodes the payload of a control frame of type t.
func Decode(t Type, p []byte) (Message, error) {
	m := newMessage(t)
	if m == nil {
		return nil, fmt.Errorf("%w: unknown message type %d", ErrMalformed, t)
	}
	d := &decoder{b: p}
	m.decode(d)
	if err := d.finish(); err != nil {
		return nil, fmt.Errorf("decode type %d: %w", t, err)
	}
	return m, nil
}

// PeerInfo names a peer and where to reach it. It travels in Connect (the ring to wire), SyncPlan
// (the donors of an entry) and MeasureRound (the target of a bandwidth test), encoded the same way
// everywhere:
//
//	id u64 | addr string | site string | nic count u32 | nics string... | public string | inbound bool
type PeerInfo struct {
	ID   uint64
	Addr string
	Site string
	// NICs are the peer's announced NICs (Hello.NICs), for the intra-site tier.
	NICs []string
	// Public is where the master sees the peer's connection come from (its NAT's address and, over
	// QUIC, the mapping of its listening socket); empty where the master cannot tell.
	Public string
	// Inbound says that others can dial Addr. A peer behind NAT without a forwarded port cannot be
	// dialled: it is reached by a rendezvous (see Rendezvous).
	Inbound bool
}

// MaxNICs bounds the NICs a Hello or PeerInfo may list.
const MaxNICs = 256

func appendPeerInfo(b []byte, p PeerInfo) []byte {
	b = appendU64(b, p.ID)
	b = appendString(b, p.Addr)
	b = appendString(b, p.Site)
	b = appendStrings(b, p.NICs)
	b = appendString(b, p.Public)
	return appendBool(b, p.Inbound)
}

func (d *decoder) peerInfo() PeerInfo {
	return PeerInfo{ID: d.u64("peer id"), Addr: d.str("peer addr"), Site: d.str("peer site"),
		NICs: d.strs(MaxNICs, "peer nics"), Public: d.str("peer public"), Inbound: d.boolean("peer inbound")}
}

// peerInfoMin is the least encoded size of a PeerInfo, for list counts.
const peerInfoMin = 8 + 4 + 4 + 4 + 4 + 1

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
