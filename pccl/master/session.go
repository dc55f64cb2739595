package master

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// Control sessions.
//
// Every peer's control traffic runs in a session (wire/session.go) that outlives its connection: when
// the connection goes silent or breaks while the peer lives on, the peer dials again and resumes the
// session, and each side sends again what the other missed. The Machine never sees it: its ConnID is
// the session's, and a resumption changes nothing for it. So a cut of the master's link, a route that
// flaps or a NAT that forgets a mapping costs nothing but time while the Machine keeps the peer (see
// heartbeat.go for when it does not).
//
// A connection the peer closes (EOF, reset) ends its session at once: the peer's process is gone, and
// the Machine learns of it within a round trip, as before. A connection that fails by silence (a
// timeout of the transport: QUIC's idle timeout, TCP's retransmission or keep-alive giving up) only
// detaches the session, which waits for a resumption until the Machine removes the peer.
//
// Goroutines: the reader of each connection (handle), one writer per session (write). mu guards the
// session's connection, counts and unacknowledged frames; out and attach are the writer's inputs.

// session is one peer's control session.
type session struct {
	id     ConnID
	key    wire.SessionID
	out    chan wire.Message // the Machine's messages; a nil message: close after what is queued
	attach chan attachment   // connections that resumed the session, for the writer
	once   sync.Once

	mu      sync.Mutex
	started bool     // SessionStart was sent: frames are numbered and acknowledged
	conn    net.Conn // the connection in use; nil while detached
	recv    uint64   // numbered frames received from the peer
	sent    uint64   // numbered frames sent to the peer
	acked   uint64   // the received count last acknowledged to the peer
	unacked [][]byte // frames sent+1-len(unacked) .. sent
	bytes   int
	ended   bool
}

// attachment is a connection that resumed a session: the peer had received peerRecv of its frames,
// and the session had received recv of the peer's when it moved.
type attachment struct {
	conn     net.Conn
	recv     uint64
	peerRecv uint64
}

// maxUnackedBytes bounds the frames a session keeps for a peer that does not acknowledge them; past
// it the session ends as if the peer had closed it.
const maxUnackedBytes = 64 << 20

// newSession registers a session on conn, with a fresh random key.
func (s *Server) newSession(conn net.Conn) *session {
	sess := &session{out: make(chan wire.Message, s.cfg.SendQueue), attach: make(chan attachment, 1), conn: conn}
	if _, err := rand.Read(sess.key[:]); err != nil {
		panic(fmt.Sprintf("master: no randomness for a session key: %v", err))
	}
	s.mu.Lock()
	s.next++
	sess.id = s.next
	s.conns[sess.id] = sess
	s.sessions[sess.key] = sess
	s.mu.Unlock()
	return sess
}

// forget removes a session from the tables.
func (s *Server) forget(sess *session) {
	s.mu.Lock()
	if s.conns[sess.id] == sess {
		delete(s.conns, sess.id)
	}
	if s.sessions[sess.key] == sess {
		delete(s.sessions, sess.key)
	}
	s.mu.Unlock()
}

// resumed looks up the session a SessionResume names; nil if there is none.
func (s *Server) resumed(r *wire.SessionResume) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sessions[r.ID]
	if sess == nil || r.Token != s.cfg.Config.Token {
		return nil
	}
	return sess
}

// moveTo makes conn the session's connection: the reader of the one before stops, and the writer
// answers SessionResumed and sends again what the peer has not received.
func (sess *session) moveTo(conn net.Conn, peerRecv uint64) bool {
	sess.mu.Lock()
	if sess.ended {
		sess.mu.Unlock()
		return false
	}
	old := sess.conn
	sess.conn = conn
	a := attachment{conn: conn, recv: sess.recv, peerRecv: peerRecv}
	sess.mu.Unlock()
	if old != nil {
		old.Close()
	}
	for {
		select {
		case sess.attach <- a:
			return true
		default:
			select {
			case <-sess.attach: // an older resumption the writer has not taken: this one replaces it
			default:
			}
		}
	}
}

// received counts a frame read on conn; false if conn is no longer the session's connection, whose
// reader must stop.
func (sess *session) received(conn net.Conn) bool {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.conn != conn {
		return false
	}
	if sess.started {
		sess.recv++
	}
	return true
}

// ack forgets the frames the peer has received.
func (sess *session) ack(n uint64) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	first := sess.sent + 1 - uint64(len(sess.unacked))
	for len(sess.unacked) > 0 && first <= n {
		sess.bytes -= len(sess.unacked[0])
		sess.unacked[0] = nil
		sess.unacked = sess.unacked[1:]
		first++
	}
}

// failed handles the error that ended the reader of conn: it reports whether the session ends (the
// peer closed the connection, or its data was bad) rather than waits for a resumption (the connection
// went silent, or another took its place).
func (sess *session) failed(conn net.Conn, err error) (ends bool) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.conn != conn || sess.ended {
		return false
	}
	if silence(err) {
		sess.conn = nil
		return false
	}
	return true
}

// silence reports whether err says that a connection went quiet (a timeout of the transport) rather
// than that its other end closed it.
func silence(err error) bool {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, wire.ErrMalformed) || errors.Is(err, wire.ErrTooLarge) || errors.Is(err, net.ErrClosed) {
		return false
	}
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// frame encodes msg as the session's next numbered frame, preceded by an acknowledgement when more of
// the peer's frames arrived since the last one, and keeps it until the peer acknowledges it. It
// returns the bytes to write, or false when the session keeps more than maxUnackedBytes.
func (sess *session) frame(b []byte, msg wire.Message) ([]byte, bool) {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if !sess.started {
		return wire.AppendFrame(b, msg), true
	}
	if sess.recv != sess.acked {
		b = wire.AppendFrame(b, &wire.SessionAck{Recv: sess.recv})
		sess.acked = sess.recv
	}
	start := len(b)
	b = wire.AppendFrame(b, msg)
	if sess.bytes+len(b)-start > maxUnackedBytes {
		return b, false
	}
	sess.sent++
	sess.unacked = append(sess.unacked, append([]byte(nil), b[start:]...))
	sess.bytes += len(b) - start
	return b, true
}

// replay returns the frames the peer has not received after peerRecv, with the SessionResumed answer
// in front, for a connection that resumed the session. Frames the peer acknowledged since it counted
// peerRecv are not sent again: Next tells the peer where the frames start.
func (sess *session) replay(a attachment) net.Buffers {
	sess.ack(a.peerRecv)
	sess.mu.Lock()
	defer sess.mu.Unlock()
	next := sess.sent + 1 - uint64(len(sess.unacked))
	bufs := net.Buffers{wire.AppendFrame(nil, &wire.SessionResumed{OK: true, Recv: a.recv, Next: next})}
	sess.acked = a.recv
	return append(bufs, sess.unacked...)
}

// end marks the session over; it reports whether it was still running.
func (sess *session) end() bool {
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.ended {
		return false
	}
	sess.ended = true
	if sess.conn != nil {
		sess.conn.Close()
	}
	return true
}

// closeAfterQueue asks the writer to close the session once what is queued is written.
func (sess *session) closeAfterQueue() {
	sess.once.Do(func() {
		select {
		case sess.out <- nil:
		default:
			sess.end()
		}
	})
}

// write is the session's writer: it sends the Machine's messages on the connection in use, keeps them
// until the peer acknowledges them, and sends them again on a connection that resumes the session.
// A frame that cannot be written is kept: the peer resumes, or the Machine removes it. The writer
// changes connection only through attach, so that a resumed connection starts with SessionResumed
// and the frames the peer missed, in order.
func (s *Server) write(ctx context.Context, sess *session) {
	defer s.wg.Done()
	defer sess.end()
	var buf []byte
	sess.mu.Lock()
	conn := sess.conn
	sess.mu.Unlock()
	send := func(b []byte) {
		if conn == nil {
			return
		}
		conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write(b); err != nil {
			conn = nil // the reader finds out what became of it; frames wait for a resumption
		}
	}
	for {
		select {
		case a := <-sess.attach:
			conn = a.conn
			bufs := sess.replay(a)
			conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := bufs.WriteTo(conn); err != nil {
				conn = nil
			}
		case msg := <-sess.out:
			if msg == nil {
				return
			}
			b, ok := sess.frame(buf[:0], msg)
			buf = b
			if !ok {
				s.log.Warn("peer does not acknowledge its control frames; closing its session", "conn", sess.id)
				s.ended(ctx, sess, "control frames unacknowledged")
				return
			}
			send(b)
		case <-ctx.Done():
			return
		}
	}
}

// ended ends a session for reason and tells the Machine, unless it has ended already.
func (s *Server) ended(ctx context.Context, sess *session, reason string) {
	if !sess.end() {
		return
	}
	s.forget(sess)
	select {
	case s.in <- Closed{Conn: sess.id, Err: reason}:
	case <-ctx.Done():
	}
}
