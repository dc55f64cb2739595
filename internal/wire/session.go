package wire

// The control session between a peer and the master. The connection that carries it may break (a
// route flaps, a NAT forgets its mapping, a cable is pulled for seconds) while both ends live on; the
// peer then dials again and resumes the session on the new connection, and neither side loses a
// message. Both sides number the control frames they send on the session (the first after
// SessionStart is 1) and keep those the other side has not acknowledged; SessionAck reports how many
// frames have arrived. A resumption exchanges those counts, and each side sends again what the other
// missed, in order.
//
//	peer                                 master
//	Hello ------------------------------->
//	      <------------------------------- SessionStart (id)     then Welcome, as frame 1
//	...                                                          (both sides acknowledge now and then)
//	SessionAck (received) --------------->
//	      <------------------------------- SessionAck (received)
//	                 the connection breaks; the peer dials again
//	SessionResume (token, peer, id, received) ->
//	      <------------------------------- SessionResumed (ok, received)   then the master's missed frames
//	(the peer's missed frames) ---------->
//
// An unknown session (the master restarted, or removed the peer) is answered SessionResumed with OK
// false; the peer then sends a Hello on the same connection, as for a master that restarted.

// SessionIDSize is the size of a session id in bytes.
const SessionIDSize = 16

// SessionID names a control session; it is random and known only to its two ends.
type SessionID [SessionIDSize]byte

// SessionStart opens the control session of a connection whose Hello the master took: the master
// sends it before the session's first frame.
type SessionStart struct{ ID SessionID }

func (m *SessionStart) Append(b []byte) []byte { return append(b, m.ID[:]...) }
func (m *SessionStart) decode(d *decoder)      { copy(m.ID[:], d.take(SessionIDSize, "session id")) }

// SessionResume is the first frame of a connection that resumes session ID of peer Peer: the run
// token, and how many of the master's session frames the peer has received.
type SessionResume struct {
	Token string
	Peer  uint64
	ID    SessionID
	Recv  uint64
}

func (m *SessionResume) Append(b []byte) []byte {
	b = appendString(b, m.Token)
	b = appendU64(b, m.Peer)
	b = append(b, m.ID[:]...)
	return appendU64(b, m.Recv)
}

func (m *SessionResume) decode(d *decoder) {
	m.Token, m.Peer = d.str("token"), d.u64("peer")
	copy(m.ID[:], d.take(SessionIDSize, "session id"))
	m.Recv = d.u64("received")
}

// SessionResumed answers SessionResume: OK with how many of the peer's session frames the master has
// received, and the number of the first of its own frames it sends again (those before it the peer
// has, or has acknowledged); or not OK (Detail says why) when the master has no such session.
type SessionResumed struct {
	OK     bool
	Recv   uint64
	Next   uint64
	Detail string
}

func (m *SessionResumed) Append(b []byte) []byte {
	b = appendBool(b, m.OK)
	b = appendU64(b, m.Recv)
	b = appendU64(b, m.Next)
	return appendString(b, m.Detail)
}

func (m *SessionResumed) decode(d *decoder) {
	*m = SessionResumed{OK: d.boolean("ok"), Recv: d.u64("received"), Next: d.u64("next"), Detail: d.str("detail")}
}

// SessionAck says how many session frames the sender has received from the other side; the other
// side forgets the frames up to there. It goes both ways and is not itself numbered.
type SessionAck struct{ Recv uint64 }

func (m *SessionAck) Append(b []byte) []byte { return appendU64(b, m.Recv) }
func (m *SessionAck) decode(d *decoder)      { m.Recv = d.u64("received") }

func (*SessionStart) Type() Type   { return TypeSessionStart }
func (*SessionResume) Type() Type  { return TypeSessionResume }
func (*SessionResumed) Type() Type { return TypeSessionResumed }
func (*SessionAck) Type() Type     { return TypeSessionAck }
