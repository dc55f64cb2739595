package rdma

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// PathID names one direction of one channel between two nodes: the chunks that Src sends to Dst for
// channel Channel. Both ends name a path the same way.
type PathID struct {
	Src, Dst NodeID
	Channel  uint16
}

// String returns "SRC->DST/chC".
func (p PathID) String() string { return fmt.Sprintf("%d->%d/ch%d", p.Src, p.Dst, p.Channel) }

// NICRef names a NIC of any node of the group.
type NICRef struct {
	Node NodeID
	NIC  NICID
}

// String returns "node.nicN".
func (r NICRef) String() string { return fmt.Sprintf("%d.nic%d", r.Node, r.NIC) }

// MsgKind says what a control Message is.
type MsgKind uint8

const (
	// MsgNotice tells a path's sender that its receiver saw the path fail (bilateral awareness). Path,
	// Epoch and the failed pair (Local = sender's NIC, Remote = receiver's NIC) are set.
	MsgNotice MsgKind = iota + 1
	// MsgFailReq asks a path's receiver to move the path to a new NIC pair (Local, Remote) at Epoch;
	// Seq is the sender's first unacknowledged chunk.
	MsgFailReq
	// MsgFailAck answers a MsgFailReq of the same Epoch; Seq is the next chunk the receiver expects,
	// where the sender resumes.
	MsgFailAck
	// MsgProbeAsk asks a third node to probe NICs A and B and report. ID names the localization.
	MsgProbeAsk
	// MsgProbeReport answers MsgProbeAsk: OKA and OKB say whether each NIC answered.
	MsgProbeReport
	// MsgVerdict tells the group what localization concluded: Fault says what failed (A, or the link
	// between A and B), Health whether it is down or healed. ID is a per-origin sequence number, Origin
	// the node that concluded it.
	MsgVerdict
	// MsgProbeConn asks the receiver to open a fresh probe connection between its NIC B.NIC and the
	// sender's NIC A.NIC with connection index ID (the old one failed).
	MsgProbeConn
)

// FaultClass is what localization blames.
type FaultClass uint8

const (
	// FaultNone means the probes found the path working.
	FaultNone FaultClass = iota
	// FaultNIC blames NIC A.
	FaultNIC
	// FaultLink blames the link between NICs A and B.
	FaultLink
)

// String returns "none", "nic" or "link".
func (f FaultClass) String() string {
	switch f {
	case FaultNone:
		return "none"
	case FaultNIC:
		return "nic"
	case FaultLink:
		return "link"
	}
	return fmt.Sprintf("fault(%d)", uint8(f))
}

// Message is a control message of the hot-repair protocol, carried on ControlClass connections.
// Which fields matter depends on Kind (see the MsgKind constants).
type Message struct {
	Kind          MsgKind
	Path          PathID
	Epoch         uint32
	Local, Remote NICID
	Seq           uint64
	ID            uint64
	Origin        NodeID
	A, B          NICRef
	OKA, OKB      bool
	Fault         FaultClass
	Health        Health
}

// String formats the fields that matter for the message's kind.
func (m Message) String() string {
	switch m.Kind {
	case MsgNotice:
		return fmt.Sprintf("Notice{%v epoch=%d pair=%d-%d}", m.Path, m.Epoch, m.Local, m.Remote)
	case MsgFailReq:
		return fmt.Sprintf("FailReq{%v epoch=%d pair=%d-%d seq=%d}", m.Path, m.Epoch, m.Local, m.Remote, m.Seq)
	case MsgFailAck:
		return fmt.Sprintf("FailAck{%v epoch=%d seq=%d}", m.Path, m.Epoch, m.Seq)
	case MsgProbeAsk:
		return fmt.Sprintf("ProbeAsk{id=%d %v %v}", m.ID, m.A, m.B)
	case MsgProbeReport:
		return fmt.Sprintf("ProbeReport{id=%d a=%v b=%v}", m.ID, m.OKA, m.OKB)
	case MsgProbeConn:
		return fmt.Sprintf("ProbeConn{%v-%v index=%d}", m.A, m.B, m.ID)
	case MsgVerdict:
		if m.Fault == FaultLink {
			return fmt.Sprintf("Verdict{origin=%d id=%d link %v-%v %v}", m.Origin, m.ID, m.A, m.B, m.Health)
		}
		return fmt.Sprintf("Verdict{origin=%d id=%d %v %v %v}", m.Origin, m.ID, m.Fault, m.A, m.Health)
	}
	return fmt.Sprintf("Message{kind=%d}", m.Kind)
}

// messageVersion is the first byte of every encoded Message.
const messageVersion = 1

// MessageSize is the length of every encoded Message.
const MessageSize = 1 + 1 + 10 + 4 + 2 + 2 + 8 + 8 + 4 + 6 + 6 + 1 + 1 + 1

// ErrBadMessage reports a control message that does not decode.
var ErrBadMessage = errors.New("rdma: malformed control message")

// AppendMessage appends m's encoding to b: a fixed-size little-endian layout behind a version byte.
func AppendMessage(b []byte, m Message) []byte {
	le := binary.LittleEndian
	b = append(b, messageVersion, byte(m.Kind))
	b = le.AppendUint32(b, uint32(m.Path.Src))
	b = le.AppendUint32(b, uint32(m.Path.Dst))
	b = le.AppendUint16(b, m.Path.Channel)
	b = le.AppendUint32(b, m.Epoch)
	b = le.AppendUint16(b, uint16(m.Local))
	b = le.AppendUint16(b, uint16(m.Remote))
	b = le.AppendUint64(b, m.Seq)
	b = le.AppendUint64(b, m.ID)
	b = le.AppendUint32(b, uint32(m.Origin))
	b = le.AppendUint32(b, uint32(m.A.Node))
	b = le.AppendUint16(b, uint16(m.A.NIC))
	b = le.AppendUint32(b, uint32(m.B.Node))
	b = le.AppendUint16(b, uint16(m.B.NIC))
	var flags byte
	if m.OKA {
		flags |= 1
	}
	if m.OKB {
		flags |= 2
	}
	return append(b, flags, byte(m.Fault), byte(m.Health))
}

// DecodeMessage decodes one encoded Message, which must be exactly MessageSize bytes.
func DecodeMessage(b []byte) (Message, error) {
	if len(b) != MessageSize {
		return Message{}, fmt.Errorf("%w: %d bytes, want %d", ErrBadMessage, len(b), MessageSize)
	}
	if b[0] != messageVersion {
		return Message{}, fmt.Errorf("%w: version %d", ErrBadMessage, b[0])
	}
	le := binary.LittleEndian
	m := Message{Kind: MsgKind(b[1])}
	if m.Kind < MsgNotice || m.Kind > MsgProbeConn {
		return Message{}, fmt.Errorf("%w: kind %d", ErrBadMessage, b[1])
	}
	m.Path = PathID{Src: NodeID(le.Uint32(b[2:])), Dst: NodeID(le.Uint32(b[6:])), Channel: le.Uint16(b[10:])}
	m.Epoch = le.Uint32(b[12:])
	m.Local, m.Remote = NICID(le.Uint16(b[16:])), NICID(le.Uint16(b[18:]))
	m.Seq, m.ID = le.Uint64(b[20:]), le.Uint64(b[28:])
	m.Origin = NodeID(le.Uint32(b[36:]))
	m.A = NICRef{NodeID(le.Uint32(b[40:])), NICID(le.Uint16(b[44:]))}
	m.B = NICRef{NodeID(le.Uint32(b[46:])), NICID(le.Uint16(b[50:]))}
	flags := b[52]
	if flags&^3 != 0 {
		return Message{}, fmt.Errorf("%w: flags %#x", ErrBadMessage, flags)
	}
	m.OKA, m.OKB = flags&1 != 0, flags&2 != 0
	m.Fault, m.Health = FaultClass(b[53]), Health(b[54])
	if m.Fault > FaultLink || m.Health > Down {
		return Message{}, fmt.Errorf("%w: fault %d health %d", ErrBadMessage, b[53], b[54])
	}
	return m, nil
}
