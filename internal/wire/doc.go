// Package wire defines Concord's wire format: the connection handshake, the length-prefixed control
// frames exchanged between peers and the master, and the fixed header of data frames exchanged between
// ring neighbours.
//
// Every connection starts with an 8-byte handshake in each direction:
//
//	"CNCD" | version u16 | kind u8 | reserved u8
//
// The acceptor answers with its own handshake; a magic or version mismatch closes the connection.
//
// A control frame is
//
//	length u32 | type u8 | payload
//
// where length counts the type byte and the payload and may not exceed the reader's limit. Integers are
// big-endian; strings and byte strings are a u32 length followed by the bytes; lists are a u32 count
// followed by the items. Every message type has a pure Append method and, beside it, a pure decode
// method; Decode rejects trailing bytes, oversized lengths and unknown types with an error wrapping
// ErrMalformed. The files follow who talks to whom: control.go (a peer and the master: membership and
// wiring), collective.go and sync.go (a peer and the master: collectives, shared-state syncs and
// bandwidth tests), session.go (the control session that outlives its connection), link.go and
// data.go (ring neighbours), state.go (a peer and a donor or a bandwidth-test partner). PeerInfo has one
// codec wherever it travels (message.go).
//
// A data frame (one part of one collective) is a fixed 40-byte header followed by the payload:
//
//	type u8 (=TypeData) | 0 u8 | 0 u16 | length u32 | epoch u64 | tag u64 | seq u64 | step u32 | part u32
//
// (epoch, tag, seq) name the operation, so a frame of an aborted attempt is recognised and dropped,
// never mixed into a later one; (step, part) name the frame within the operation's schedule.
//
// Message flow between a peer and the master:
//
//	peer                              master
//	Hello ------------------------->
//	      <------------------------- SessionStart (id), Welcome (peer id, heartbeat timing)   or Kick
//	      <------------------------- Connect (epoch, ring)   when a ring is being wired
//	LinksReady (epoch, ok) -------->
//	      <------------------------- Topology (epoch, ring)  the ring is in force; newcomers accepted
//	VoteTopology (rewire, no admit) ->                     (UpdateTopology, Rewire)
//	VotePending ------------------->
//	      <------------------------- Pending (answer)
//	Initiate (tag, descriptor) ---->
//	      <------------------------- Commence (tag, seq, epoch)   or Outcome (mismatch, ...)
//	Done (tag, seq, code, link timings) ->
//	      <------------------------- Outcome (tag, seq, ok | abort code)  exactly one per op
//	Heartbeat --------------------->
//	      <------------------------- HeartbeatAck
//	      <------------------------- Notice (a warning for the operator)
//	Bye --------------------------->
//
// After the Hello, both sides number their frames and acknowledge each other's (SessionAck), so that a
// peer whose connection breaks resumes the session on a new one (SessionResume) without a loss; see
// session.go.
package wire
