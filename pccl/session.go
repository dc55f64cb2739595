package pccl

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/concord-ccl/concord/internal/wire"
)

// ctlSession is this peer's side of the control session with the master (wire/session.go): it numbers
// the frames sent to the master and keeps those the master has not acknowledged, so that they can be
// sent again on a new connection, and counts the master's frames received.
//
// Ownership: the run goroutine sends frames, counts received ones and moves the session to a new
// connection; a redial goroutine reads the id and the received count for its SessionResume. mu guards
// the id and the unacknowledged frames; recv is atomic.
type ctlSession struct {
	mu      sync.Mutex
	id      wire.SessionID
	started bool     // the master opened a session (SessionStart)
	sent    uint64   // numbered frames sent
	unacked [][]byte // frames sent+1-len(unacked) .. sent, encoded
	bytes   int      // their total size
	acked   uint64   // the received count last acknowledged to the master

	recv atomic.Uint64 // numbered frames received from the master
	skip uint64        // frames of a resumed connection already received on the old one (run only)
}

// maxUnacked bounds the bytes of frames the master has not acknowledged; past it the session cannot
// be resumed, and the peer gives the connection up as lost.
const maxUnacked = 64 << 20

// start opens the session the master named in SessionStart, on a new connection whose Welcome (the
// master's first frame of the session) was read: nothing else sent or received on it yet.
func (s *ctlSession) start(id wire.SessionID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.id, s.started, s.sent, s.unacked, s.bytes, s.acked, s.skip = id, true, 0, nil, 0, 0, 0
	s.recv.Store(1) // the Welcome
}

// ident returns the session's id and whether there is one.
func (s *ctlSession) ident() (wire.SessionID, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id, s.started
}

// frame appends to b the frame of msg, numbered in the session, preceded by an acknowledgement of
// the master's frames when more arrived since the last one; it returns the bytes to write. It fails
// when too much is unacknowledged.
func (s *ctlSession) frame(b []byte, msg wire.Message) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.recv.Load(); s.started && r != s.acked {
		b = wire.AppendFrame(b, &wire.SessionAck{Recv: r})
		s.acked = r
	}
	start := len(b)
	b = wire.AppendFrame(b, msg)
	if !s.started {
		return b, nil
	}
	if s.bytes+len(b)-start > maxUnacked {
		return b, fmt.Errorf("pccl: %d bytes of control frames unacknowledged by the master", s.bytes)
	}
	s.sent++
	s.unacked = append(s.unacked, append([]byte(nil), b[start:]...))
	s.bytes += len(b) - start
	return b, nil
}

// ack forgets the frames the master has received (its SessionAck).
func (s *ctlSession) ack(n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trim(n)
}

// trim drops the unacknowledged frames numbered up to n (mu held).
func (s *ctlSession) trim(n uint64) {
	first := s.sent + 1 - uint64(len(s.unacked))
	for len(s.unacked) > 0 && first <= n {
		s.bytes -= len(s.unacked[0])
		s.unacked[0] = nil
		s.unacked = s.unacked[1:]
		first++
	}
}

// resume moves the session to conn: the master had received masterRecv of our frames, so the rest is
// written again, in order; the master sends its frames again from number next, and those of them that
// arrived on the old connection meanwhile are skipped.
func (s *ctlSession) resume(conn net.Conn, masterRecv, next uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trim(masterRecv)
	if first := s.sent + 1 - uint64(len(s.unacked)); first != masterRecv+1 && len(s.unacked) > 0 {
		return fmt.Errorf("pccl: the master resumed at frame %d, but frames from %d on are kept", masterRecv+1, first)
	}
	r := s.recv.Load()
	if r+1 < next {
		return fmt.Errorf("pccl: the master resends its frames from %d, but only %d arrived", next, r)
	}
	s.skip = r + 1 - next
	s.acked = 0
	bufs := net.Buffers(append([][]byte(nil), s.unacked...))
	if len(bufs) == 0 {
		return nil
	}
	_, err := bufs.WriteTo(conn)
	return err
}

// received counts a frame of the master's that arrived on the connection in use; it reports false
// for one to skip (it came on the old connection already).
func (s *ctlSession) received() bool {
	if s.skip > 0 {
		s.skip--
		return false
	}
	s.recv.Add(1)
	return true
}
