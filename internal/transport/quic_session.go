package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// quicSession is a Session over one QUIC connection. Its first stream, opened by the dialling end,
// is the control stream: it carries the proofs of the run secret, and then only the goodbye, which is
// its FIN.
//
// Closing a QUIC connection drops whatever the peer has received but not read yet, unlike closing a
// TCP socket. So Close ends the streams with a FIN, says goodbye, and keeps the connection open
// (lingers) until the peer has closed too (its goodbye arrives, or it closes the connection), or
// until QUICConfig.Linger has passed; then it closes the connection, and on the dialling end the
// UDP socket. An end that closes after the peer's goodbye closes the connection at once.
//
// Goroutines: one control goroutine (run) per session, which owns reading the control stream and
// tears the connection down when both ends have closed; quic-go's own (one per connection, and on the
// dialling end one per UDP socket). Close waits for them unless it lingers; a lingering session ends
// by itself within Linger.
type quicSession struct {
	t      *quicTransport
	conn   *quic.Conn
	ctrl   *quic.Stream
	dialer bool
	udp    *net.UDPConn    // dialling end: the session's own socket
	tr     *quic.Transport // dialling end: quic-go's endpoint on udp
	ln     *quicListener   // accepting end: the listener to leave on close

	end       context.Context // ends on Close or when the peer has ended the session
	endCancel context.CancelFunc
	done      chan struct{} // closed when the control goroutine returns
	tearOnce  sync.Once

	mu      sync.Mutex
	closed  bool                     // guarded by mu; Close was called
	err     error                    // guarded by mu; why the peer ended the session, nil while it has not
	torn    bool                     // guarded by mu; the connection was torn down
	streams map[*quicStream]struct{} // guarded by mu; streams handed out and not closed
	linger  *time.Timer              // guarded by mu; tears down a lingering session
}

func newQUICSession(t *quicTransport, conn *quic.Conn, ctrl *quic.Stream, dialer bool) *quicSession {
	s := &quicSession{
		t: t, conn: conn, ctrl: ctrl, dialer: dialer,
		done:    make(chan struct{}),
		streams: make(map[*quicStream]struct{}),
	}
	s.end, s.endCancel = context.WithCancel(context.Background())
	return s
}

// start runs the control goroutine.
func (s *quicSession) start() { go s.run() }

// run reads the control stream until the peer's goodbye or the connection's end, records why the
// session ended, and tears the connection down if this end has closed too.
func (s *quicSession) run() {
	defer close(s.done)
	var buf [64]byte
	var err error
	for err == nil {
		_, err = s.ctrl.Read(buf[:]) // nothing but the goodbye is expected; anything else is ignored
	}
	why := ErrSessionClosed
	if err != io.EOF {
		why = quicConnError(err)
	}
	s.mu.Lock()
	if s.err == nil && !s.closed {
		s.err = why
	}
	closed := s.closed
	s.mu.Unlock()
	s.endCancel()
	if closed || err != io.EOF {
		s.teardown()
	}
}

// teardown closes the connection and, on the dialling end, its socket. It runs once.
func (s *quicSession) teardown() {
	s.tearOnce.Do(func() {
		s.mu.Lock()
		s.torn = true
		if s.linger != nil {
			s.linger.Stop()
		}
		s.mu.Unlock()
		s.conn.CloseWithError(codeClosed, "session closed")
		if s.tr != nil {
			s.tr.Close()
			s.udp.Close()
		}
		if s.ln != nil {
			s.ln.forget(s)
		}
	})
}

// state returns the error every operation fails with once the session has ended, or nil.
func (s *quicSession) state() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return net.ErrClosed
	}
	return s.err
}

func (s *quicSession) opError(op string, err error) error {
	return fmt.Errorf("quic session %s: %s: %w", s.conn.RemoteAddr(), op, err)
}

// failure returns the error of an operation that failed with err while ctx was its context.
func (s *quicSession) failure(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if st := s.state(); st != nil {
		return st
	}
	return quicConnError(err)
}

// whileOpen returns a context that ends with ctx or when the session ends.
func (s *quicSession) whileOpen(ctx context.Context) (context.Context, func()) {
	c, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.end, cancel)
	return c, func() { stop(); cancel() }
}

// OpenStream opens a QUIC stream and sends its header, so that the peer can accept it at once.
func (s *quicSession) OpenStream(ctx context.Context) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, s.opError("open stream", err)
	}
	if err := s.state(); err != nil {
		return nil, s.opError("open stream", err)
	}
	c, done := s.whileOpen(ctx)
	st, err := s.conn.OpenStreamSync(c)
	done()
	if err != nil {
		return nil, s.opError("open stream", s.failure(ctx, err))
	}
	if _, err := st.Write([]byte{streamHeader}); err != nil {
		st.CancelRead(0)
		st.CancelWrite(0)
		return nil, s.opError("open stream", s.failure(ctx, err))
	}
	return s.track(st)
}

// AcceptStream returns the next stream the peer opened, once its header has arrived. Streams with a
// wrong header are reset and skipped.
func (s *quicSession) AcceptStream(ctx context.Context) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, s.opError("accept stream", err)
	}
	for {
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			return nil, s.opError("accept stream", net.ErrClosed)
		}
		c, done := s.whileOpen(ctx)
		st, err := s.conn.AcceptStream(c) // streams already queued come first, even once c has ended
		done()
		if err != nil {
			return nil, s.opError("accept stream", s.failure(ctx, err))
		}
		var hdr [1]byte
		st.SetReadDeadline(time.Now().Add(s.t.cfg.HandshakeTimeout))
		_, err = io.ReadFull(st, hdr[:])
		st.SetReadDeadline(time.Time{})
		if err != nil || hdr[0] != streamHeader {
			st.CancelRead(0)
			st.CancelWrite(0)
			continue
		}
		return s.track(st)
	}
}

// track wraps st and records it, so that Close can end it.
func (s *quicSession) track(st *quic.Stream) (net.Conn, error) {
	qs := &quicStream{st: st, s: s}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		st.CancelRead(0)
		st.CancelWrite(0)
		return nil, s.opError("stream", net.ErrClosed)
	}
	s.streams[qs] = struct{}{}
	return qs, nil
}

func (s *quicSession) forget(qs *quicStream) {
	s.mu.Lock()
	delete(s.streams, qs)
	s.mu.Unlock()
}

// SendDatagram sends b as a QUIC datagram.
func (s *quicSession) SendDatagram(b []byte) error {
	if len(b) > MaxDatagramSize {
		return s.opError("send datagram", fmt.Errorf("%d bytes, at most %d: %w", len(b), MaxDatagramSize, ErrDatagramTooLarge))
	}
	if err := s.state(); err != nil {
		return s.opError("send datagram", err)
	}
	if err := s.conn.SendDatagram(b); err != nil {
		var tl *quic.DatagramTooLargeError
		if errors.As(err, &tl) {
			return s.opError("send datagram", fmt.Errorf("%d bytes, the path carries %d: %w", len(b), tl.MaxDatagramPayloadSize, ErrDatagramTooLarge))
		}
		return s.opError("send datagram", s.failure(context.Background(), err))
	}
	return nil
}

// ReceiveDatagram returns the next QUIC datagram.
func (s *quicSession) ReceiveDatagram(ctx context.Context) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, s.opError("receive datagram", err)
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, s.opError("receive datagram", net.ErrClosed)
	}
	c, done := s.whileOpen(ctx)
	b, err := s.conn.ReceiveDatagram(c)
	done()
	if err != nil {
		return nil, s.opError("receive datagram", s.failure(ctx, err))
	}
	return b, nil
}

// LocalAddr returns the local UDP address of the connection.
func (s *quicSession) LocalAddr() net.Addr { return s.conn.LocalAddr() }

// RemoteAddr returns the peer's UDP address.
func (s *quicSession) RemoteAddr() net.Addr { return s.conn.RemoteAddr() }

// Close ends every stream with a FIN, says goodbye and lingers as the type's comment describes.
func (s *quicSession) Close() error {
	s.closeWith(true)
	return nil
}

// closeWith closes the session; with linger false it tears the connection down at once.
func (s *quicSession) closeWith(linger bool) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		if !linger {
			s.teardown()
			<-s.done
		}
		return
	}
	s.closed = true
	streams := s.streams
	s.streams = make(map[*quicStream]struct{})
	peerGone := s.err != nil
	s.mu.Unlock()
	s.endCancel()
	for qs := range streams {
		qs.shut()
	}
	s.ctrl.Close() // the goodbye
	if peerGone || !linger || s.t.cfg.Linger < 0 {
		s.teardown()
		<-s.done
		return
	}
	s.mu.Lock()
	if !s.torn {
		s.linger = time.AfterFunc(s.t.cfg.Linger, s.teardown)
	}
	s.mu.Unlock()
}

// quicStream is a stream handed to the application. Close ends the sending direction with a FIN
// (or a reset, when a Write is blocked in it) and stops reading; Read and Write then fail with
// net.ErrClosed.
type quicStream struct {
	st          *quic.Stream
	s           *quicSession
	ownsSession bool // a byte-stream connection: closing the stream closes the session

	writeMu   sync.Mutex // held by Write and CloseWrite, which quic-go forbids to run concurrently
	closed    atomic.Bool
	closeOnce sync.Once
}

var _ net.Conn = (*quicStream)(nil)

func (qs *quicStream) opError(op string, err error) error {
	return fmt.Errorf("quic stream %s: %s: %w", qs.s.conn.RemoteAddr(), op, err)
}

// streamError turns an error of a stream operation into the transport's standard ones.
func (qs *quicStream) streamError(op string, err error, reading bool) error {
	if qs.closed.Load() {
		return qs.opError(op, net.ErrClosed)
	}
	var se *quic.StreamError
	if errors.As(err, &se) {
		switch {
		case !se.Remote:
			return qs.opError(op, net.ErrClosed)
		case reading:
			return qs.opError(op, fmt.Errorf("peer reset the stream: %w", ErrReset))
		default:
			return qs.opError(op, fmt.Errorf("peer stopped reading: %w", ErrBrokenPipe))
		}
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return qs.opError(op, err)
	}
	return qs.opError(op, quicConnError(err))
}

// Read reads from the stream; it returns io.EOF once the peer has closed its direction and all data
// has been read.
func (qs *quicStream) Read(b []byte) (int, error) {
	if qs.closed.Load() {
		return 0, qs.opError("read", net.ErrClosed)
	}
	n, err := qs.st.Read(b)
	if err != nil && err != io.EOF {
		err = qs.streamError("read", err, true)
	}
	return n, err
}

// Write writes b to the stream.
func (qs *quicStream) Write(b []byte) (int, error) {
	if qs.closed.Load() {
		return 0, qs.opError("write", net.ErrClosed)
	}
	qs.writeMu.Lock()
	n, err := qs.st.Write(b)
	qs.writeMu.Unlock()
	if err != nil {
		err = qs.streamError("write", err, false)
	}
	return n, err
}

// CloseWrite ends the sending direction with a FIN once what was written is sent.
func (qs *quicStream) CloseWrite() error {
	if qs.closed.Load() {
		return qs.opError("close write", net.ErrClosed)
	}
	qs.writeMu.Lock()
	defer qs.writeMu.Unlock()
	return qs.st.Close()
}

// shut ends both directions of the stream: a FIN after the data written (a reset when a Write is
// blocked), and a request to the peer to stop sending.
func (qs *quicStream) shut() {
	qs.closed.Store(true)
	if qs.writeMu.TryLock() {
		qs.st.Close()
		qs.writeMu.Unlock()
	} else {
		qs.st.CancelWrite(0)
	}
	qs.st.CancelRead(0)
}

// Close closes the stream and, for a byte-stream connection, its session. It is idempotent and
// returns nil.
func (qs *quicStream) Close() error {
	qs.closeOnce.Do(func() {
		qs.s.forget(qs)
		qs.shut()
		if qs.ownsSession {
			qs.s.Close()
		}
	})
	return nil
}

// LocalAddr returns the local address of the stream's connection.
func (qs *quicStream) LocalAddr() net.Addr { return qs.s.conn.LocalAddr() }

// RemoteAddr returns the peer's address.
func (qs *quicStream) RemoteAddr() net.Addr { return qs.s.conn.RemoteAddr() }

// SetDeadline sets the read and write deadlines.
func (qs *quicStream) SetDeadline(t time.Time) error { return qs.st.SetDeadline(t) }

// SetReadDeadline sets the read deadline.
func (qs *quicStream) SetReadDeadline(t time.Time) error { return qs.st.SetReadDeadline(t) }

// SetWriteDeadline sets the write deadline.
func (qs *quicStream) SetWriteDeadline(t time.Time) error { return qs.st.SetWriteDeadline(t) }
