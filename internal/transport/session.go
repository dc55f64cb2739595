package transport

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Session is a connection between two endpoints that carries any number of independent byte streams in
// both directions and, where the implementation supports it, unreliable datagrams. It is what a QUIC
// connection is; over TCP each stream is a TCP connection of its own (see doc.go).
//
// All methods are safe for concurrent use by any number of goroutines.
type Session interface {
	// OpenStream opens a new stream to the peer, which receives it from AcceptStream. The caller owns
	// the stream and must close it; closing the session closes it too. It fails with an error wrapping
	// net.ErrClosed after Close, ErrSessionClosed once the peer has closed the session, ErrReset once the
	// session was torn down, or ctx.Err() when ctx ends first. A stream that the peer cannot take (its
	// queue of unaccepted streams is full) fails on first use with io.EOF or ErrReset. Over tcp and mem,
	// when ctx ends while the accepting end of a session waits for a stream it opens, the peer may still
	// accept that stream, which then reads io.EOF.
	OpenStream(ctx context.Context) (net.Conn, error)
	// AcceptStream waits for the next stream the peer opened. Streams that arrived before the peer
	// closed the session are still returned; after them it fails like OpenStream.
	AcceptStream(ctx context.Context) (net.Conn, error)
	// SendDatagram sends b as one unreliable datagram: it may be lost, and datagrams may arrive out of
	// order, but one never arrives in pieces. b may be reused when SendDatagram returns. It fails with an
	// error wrapping ErrNoDatagrams where the implementation has no datagrams, ErrDatagramTooLarge when
	// len(b) exceeds MaxDatagramSize, and like OpenStream once the session has ended.
	SendDatagram(b []byte) error
	// ReceiveDatagram waits for the next datagram and returns it; the caller owns the slice. It fails
	// like SendDatagram, or with ctx.Err() when ctx ends first.
	ReceiveDatagram(ctx context.Context) ([]byte, error)
	// LocalAddr returns the local address of the session.
	LocalAddr() net.Addr
	// RemoteAddr returns the peer's address.
	RemoteAddr() net.Addr
	// Close closes the session and every stream of it, and waits for the goroutines the session
	// started. Data already written on a stream is still delivered (QUIC keeps its connection open for
	// a bounded time to do so, see QUICConfig.Linger), but a caller that needs to know it arrived waits
	// for a reply first. Blocked calls
	// return net.ErrClosed; the peer's return ErrSessionClosed once the close reaches it. Close is
	// idempotent and returns nil.
	Close() error
}

// SessionListener accepts sessions dialled with DialSession. It is safe for concurrent use.
type SessionListener interface {
	// Accept waits for the next session. It fails with an error wrapping net.ErrClosed after Close, or
	// with ctx.Err() when ctx ends first. The caller owns the session and must close it.
	Accept(ctx context.Context) (Session, error)
	// Addr returns the "host:port" address the listener is bound to.
	Addr() net.Addr
	// Close stops accepting sessions, frees the address and closes every session accepted through the
	// listener (their new streams arrive through it), waiting for the goroutines it started. Close is
	// idempotent and returns nil.
	Close() error
}

// MaxDatagramSize is the largest datagram payload SendDatagram takes, in bytes: what a QUIC datagram
// carries on any path that honours the minimum IPv6 MTU, so code tested on one implementation works on
// the others.
const MaxDatagramSize = 1200

// Session errors that callers may test for with errors.Is.
var (
	// ErrNoDatagrams means the session's transport has no datagram path (TCP sessions).
	ErrNoDatagrams = errors.New("transport: session has no datagrams")
	// ErrDatagramTooLarge means a datagram exceeds MaxDatagramSize.
	ErrDatagramTooLarge = errors.New("transport: datagram too large")
	// ErrSessionClosed means the peer closed the session (or its process exited, which TCP reports as
	// a close).
	ErrSessionClosed = errors.New("transport: session closed by peer")
)

// Limits of the session machinery. They bound what a misbehaving or slow peer can make a listener hold.
const (
	// handshakeTimeout bounds the time a new connection may take to send its preamble, and the time
	// DialSession waits for the listener's answer.
	handshakeTimeout = 10 * time.Second
	// maxHandshakes bounds the connections whose preamble a listener is reading at once; further
	// connections wait in the transport's backlog.
	maxHandshakes = 64
	// maxQueuedSessions bounds the sessions a listener holds for Accept; more are refused.
	maxQueuedSessions = 128
	// maxQueuedStreams bounds the streams a session holds for AcceptStream; more are refused.
	maxQueuedStreams = 256
)

// sessionNet is what a Transport plugs into the session machinery.
type sessionNet struct {
	// name is the transport's name, for error messages: "tcp" or "mem".
	name string
	// dial opens a byte-stream connection to addr.
	dial func(ctx context.Context, addr string) (net.Conn, error)
	// datagrams returns the datagram port of the session end with id whose control connection is
	// ctrl. nil means the transport has no datagrams.
	datagrams func(id sessionID, ctrl net.Conn) datagramPort
}

// datagramPort is one session end's datagram path. Safe for concurrent use.
type datagramPort interface {
	// send sends a copy of b to the peer's port, best effort.
	send(b []byte)
	// take removes and returns the first datagram due at now. With none, it returns when the next one
	// is due (zero if none is on its way) and a channel closed when that may have changed.
	take(now time.Time) (b []byte, due time.Time, changed <-chan struct{})
	// close stops the port: later datagrams to it are dropped.
	close()
}

// session is a Session over a byte-stream transport: one connection per stream, plus the control
// connection ctrl. The control goroutine (run) owns reading ctrl; writes to ctrl are serialised by
// writeToken. On the dialling side, one short-lived goroutine per stream the peer asked for dials it.
// Close waits for all of them through wg.
type session struct {
	id     sessionID
	sn     sessionNet
	dialer bool   // this end dialled the session, and dials every stream
	addr   string // on the dialling end: the address streams are dialled to
	ctrl   net.Conn
	ln     *sessionListener // on the accepting end: the listener to leave on close
	dg     datagramPort     // nil when the transport has no datagrams

	writeToken chan struct{} // holds a token while a control frame is written
	ctx        context.Context
	cancel     context.CancelFunc // cancels ctx on Close, ending dials in flight
	wg         sync.WaitGroup
	closeOnce  sync.Once

	mu        sync.Mutex
	incoming  []net.Conn               // guarded by mu; streams the peer opened, not yet accepted
	streams   map[*stream]struct{}     // guarded by mu; streams handed out and not closed yet
	pending   map[uint32]chan net.Conn // guarded by mu; streams asked of the dialling end, by index
	nextIndex uint32                   // guarded by mu; index of the next stream this end opens
	closed    bool                     // guarded by mu; Close was called
	err       error                    // guarded by mu; why the session ended from the far side
	changed   chan struct{}            // guarded by mu; closed and replaced on every change of the above
}

func newSession(id sessionID, sn sessionNet, ctrl net.Conn, dialer bool, addr string) *session {
	s := &session{
		id: id, sn: sn, dialer: dialer, addr: addr, ctrl: ctrl,
		writeToken: make(chan struct{}, 1),
		streams:    make(map[*stream]struct{}),
		pending:    make(map[uint32]chan net.Conn),
		nextIndex:  1,
		changed:    make(chan struct{}),
	}
	if dialer {
		s.nextIndex = 2
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// start runs the control goroutine.
func (s *session) start() {
	s.wg.Add(1)
	go s.run()
}

func newSessionID() sessionID {
	var id sessionID
	rand.Read(id[:])
	return id
}

// dialSession opens a session to addr: a control connection, the preamble, and the listener's answer.
func dialSession(ctx context.Context, sn sessionNet, addr string) (Session, error) {
	c, err := sn.dial(ctx, addr)
	if err != nil {
		return nil, err // already names the transport and address
	}
	id := newSessionID()
	var dg datagramPort
	if sn.datagrams != nil {
		// The port exists before the listener can answer, so the peer's first datagram finds it.
		dg = sn.datagrams(id, c)
	}
	fail := func(err error) (Session, error) {
		c.Close()
		if dg != nil {
			dg.close()
		}
		return nil, fmt.Errorf("%s dial session %s: %w", sn.name, addr, err)
	}
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	stop := deadlineFromContext(ctx, c)
	defer stop()
	if _, err := writeFraming(c, appendPreamble(nil, preamble{id: id})); err != nil {
		return fail(handshakeError(ctx, err))
	}
	f, err := readFrame(c)
	if err != nil {
		return fail(handshakeError(ctx, err))
	}
	switch f.typ {
	case frameAccept:
	case frameRefuse:
		return fail(fmt.Errorf("session refused: %w", ErrRefused))
	default:
		return fail(fmt.Errorf("%w: type %d before the session was accepted", errBadFrame, f.typ))
	}
	if !stop() {
		return fail(ctx.Err())
	}
	c.SetDeadline(time.Time{})
	s := newSession(id, sn, c, true, addr)
	s.dg = dg
	s.start()
	return s, nil
}

// handshakeError turns an error met while dialling a session into the one to report: the context's when
// it ended, ErrRefused when the listener hung up without answering (it is not a session listener, or it
// refused a bad preamble), else err.
func handshakeError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrReset) {
		return fmt.Errorf("listener hung up during the handshake: %w", ErrRefused)
	}
	return err
}

// deadlineFromContext makes c's blocked calls fail when ctx ends. The returned stop reports false when
// it came too late to prevent that.
func deadlineFromContext(ctx context.Context, c net.Conn) (stop func() bool) {
	if ctx.Done() == nil {
		return func() bool { return true }
	}
	return context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
}

// framingWriter is implemented by connections that can write the session machinery's own bytes
// without counting them as the application's (the in-memory network's fault hooks see only the latter).
type framingWriter interface {
	writeFraming(b []byte) (int, error)
}

func writeFraming(c net.Conn, b []byte) (int, error) {
	if fw, ok := c.(framingWriter); ok {
		return fw.writeFraming(b)
	}
	return c.Write(b)
}

// readFrame reads one control frame from r.
func readFrame(r io.Reader) (frame, error) {
	var buf [maxFrameSize]byte
	if _, err := io.ReadFull(r, buf[:2]); err != nil {
		return frame{}, err
	}
	n, err := frameLen([2]byte{buf[0], buf[1]})
	if err != nil {
		return frame{}, err
	}
	if _, err := io.ReadFull(r, buf[2:2+n]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return frame{}, err
	}
	f, _, err := parseFrame(buf[:2+n])
	return f, err
}

// writeFrame writes f to the control connection. Concurrent callers take turns.
func (s *session) writeFrame(f frame) error {
	select {
	case s.writeToken <- struct{}{}:
	case <-s.ctx.Done():
		return net.ErrClosed
	}
	defer func() { <-s.writeToken }()
	_, err := writeFraming(s.ctrl, appendFrame(nil, f))
	return err
}

// run is the control goroutine: it reads control frames until the control connection ends, then
// records why.
func (s *session) run() {
	defer s.wg.Done()
	for {
		f, err := readFrame(s.ctrl)
		if err != nil {
			s.end(err)
			return
		}
		switch {
		case f.typ == frameOpen && s.dialer && f.index%2 == 1:
			s.wg.Add(1)
			go s.openFor(f.index)
		case f.typ == frameOpenFailed && !s.dialer && f.index%2 == 1:
			s.deliver(nil, f.index)
		default:
			s.ctrl.Close()
			s.end(fmt.Errorf("%w: type %d on an open session", errBadFrame, f.typ))
			return
		}
	}
}

// end records that the control connection ended with err, unless the session was closed locally.
func (s *session) end(err error) {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		err = ErrSessionClosed
	case errors.Is(err, ErrReset):
		err = ErrReset
	}
	s.mu.Lock()
	if s.err == nil && !s.closed {
		s.err = err
	}
	pending := s.pending
	s.pending = make(map[uint32]chan net.Conn)
	s.signalLocked()
	s.mu.Unlock()
	for _, ch := range pending {
		ch <- nil
	}
	if s.ln != nil {
		s.ln.forget(s)
	}
}

func (s *session) signalLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// openFor dials the stream with index that the accepting end asked for, and queues it for AcceptStream
// on this end: the peer opened it, this end only dialled it.
func (s *session) openFor(index uint32) {
	defer s.wg.Done()
	c, err := s.dialStream(s.ctx, index)
	if err != nil {
		s.writeFrame(frame{typ: frameOpenFailed, index: index})
		return
	}
	s.deliver(c, index)
}

// dialStream dials a new connection of the session and writes its preamble.
func (s *session) dialStream(ctx context.Context, index uint32) (net.Conn, error) {
	c, err := s.sn.dial(ctx, s.addr)
	if err != nil {
		return nil, err
	}
	stop := deadlineFromContext(ctx, c)
	_, err = writeFraming(c, appendPreamble(nil, preamble{id: s.id, index: index}))
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// deliver hands a stream connection that arrived for this session to whoever waits for it: an odd
// index on the accepting end is a stream this end asked for (c is nil when the dialling end could not
// open it), any other one is queued for AcceptStream. It closes c when nobody can take it.
func (s *session) deliver(c net.Conn, index uint32) {
	s.mu.Lock()
	if !s.dialer && index%2 == 1 {
		ch, ok := s.pending[index]
		delete(s.pending, index)
		s.mu.Unlock()
		if ok {
			ch <- c // buffered, and only ever sent to once
		} else if c != nil {
			c.Close()
		}
		return
	}
	if s.closed || s.err != nil || len(s.incoming) >= maxQueuedStreams {
		s.mu.Unlock()
		c.Close()
		return
	}
	s.incoming = append(s.incoming, c)
	s.signalLocked()
	s.mu.Unlock()
}

// stateLocked returns the error that every operation fails with once the session has ended, or nil.
func (s *session) stateLocked() error {
	if s.closed {
		return net.ErrClosed
	}
	return s.err
}

func (s *session) opError(op string, err error) error {
	return fmt.Errorf("%s session %s: %s: %w", s.sn.name, s.ctrl.RemoteAddr(), op, err)
}

// track wraps a stream connection so that closing it leaves the session's records, and records it.
// It returns nil and closes c when the session has ended meanwhile.
func (s *session) track(c net.Conn) (net.Conn, error) {
	st := &stream{Conn: c, s: s}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stateLocked(); err != nil {
		c.Close()
		return nil, err
	}
	s.streams[st] = struct{}{}
	return st, nil
}

// OpenStream opens a new stream. On the dialling end it dials one; on the accepting end it asks the
// dialling end to dial one and waits for it.
func (s *session) OpenStream(ctx context.Context) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, s.opError("open stream", err)
	}
	s.mu.Lock()
	if err := s.stateLocked(); err != nil {
		s.mu.Unlock()
		return nil, s.opError("open stream", err)
	}
	index := s.nextIndex
	s.nextIndex += 2
	var ch chan net.Conn
	if !s.dialer {
		ch = make(chan net.Conn, 1)
		s.pending[index] = ch
	}
	s.mu.Unlock()

	if s.dialer {
		c, err := s.dialStream(ctx, index)
		if err != nil {
			return nil, s.opError("open stream", err)
		}
		st, err := s.track(c)
		if err != nil {
			return nil, s.opError("open stream", err)
		}
		return st, nil
	}
	if err := s.writeFrame(frame{typ: frameOpen, index: index}); err != nil {
		s.abandon(index)
		return nil, s.opError("open stream", err)
	}
	select {
	case c := <-ch:
		if c == nil {
			s.mu.Lock()
			err := s.stateLocked()
			s.mu.Unlock()
			if err == nil {
				err = fmt.Errorf("peer could not open the stream: %w", ErrRefused)
			}
			return nil, s.opError("open stream", err)
		}
		st, err := s.track(c)
		if err != nil {
			return nil, s.opError("open stream", err)
		}
		return st, nil
	case <-ctx.Done():
		s.abandon(index)
		return nil, s.opError("open stream", ctx.Err())
	}
}

// abandon gives up waiting for the stream with index; a connection that still arrives for it, or one
// already delivered, is closed.
func (s *session) abandon(index uint32) {
	s.mu.Lock()
	ch, ok := s.pending[index]
	delete(s.pending, index)
	s.mu.Unlock()
	if !ok {
		// deliver or end already took the entry and sends on ch, which is buffered.
		return
	}
	select {
	case c := <-ch:
		if c != nil {
			c.Close()
		}
	default:
	}
}

// AcceptStream returns the next stream the peer opened.
func (s *session) AcceptStream(ctx context.Context) (net.Conn, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, s.opError("accept stream", net.ErrClosed)
		}
		if len(s.incoming) > 0 {
			c := s.incoming[0]
			s.incoming[0] = nil
			s.incoming = s.incoming[1:]
			s.mu.Unlock()
			st, err := s.track(c)
			if err != nil {
				return nil, s.opError("accept stream", err)
			}
			return st, nil
		}
		if s.err != nil {
			err := s.err
			s.mu.Unlock()
			return nil, s.opError("accept stream", err)
		}
		wait := s.changed
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, s.opError("accept stream", ctx.Err())
		}
	}
}

// SendDatagram sends b on the datagram path, if there is one.
func (s *session) SendDatagram(b []byte) error {
	if s.dg == nil {
		return s.opError("send datagram", ErrNoDatagrams)
	}
	if len(b) > MaxDatagramSize {
		return s.opError("send datagram", fmt.Errorf("%d bytes, at most %d: %w", len(b), MaxDatagramSize, ErrDatagramTooLarge))
	}
	s.mu.Lock()
	err := s.stateLocked()
	s.mu.Unlock()
	if err != nil {
		return s.opError("send datagram", err)
	}
	s.dg.send(b)
	return nil
}

// ReceiveDatagram returns the next datagram, if there is a datagram path. Datagrams that arrived before
// the peer closed the session are still returned.
func (s *session) ReceiveDatagram(ctx context.Context) ([]byte, error) {
	if s.dg == nil {
		return nil, s.opError("receive datagram", ErrNoDatagrams)
	}
	for {
		s.mu.Lock()
		closed, ended, wait := s.closed, s.err, s.changed
		s.mu.Unlock()
		if closed {
			return nil, s.opError("receive datagram", net.ErrClosed)
		}
		b, due, changed := s.dg.take(time.Now())
		if b != nil {
			return b, nil
		}
		if ended != nil {
			return nil, s.opError("receive datagram", ended)
		}
		fire, stop := timerAt(due)
		select {
		case <-changed:
		case <-fire:
		case <-wait:
		case <-ctx.Done():
		}
		stop()
		if err := ctx.Err(); err != nil {
			return nil, s.opError("receive datagram", err)
		}
	}
}

// LocalAddr returns the local address of the control connection.
func (s *session) LocalAddr() net.Addr { return s.ctrl.LocalAddr() }

// RemoteAddr returns the remote address of the control connection.
func (s *session) RemoteAddr() net.Addr { return s.ctrl.RemoteAddr() }

// Close closes the session, its streams and its control connection, and waits for its goroutines.
func (s *session) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		incoming, streams, pending := s.incoming, s.streams, s.pending
		s.incoming, s.streams, s.pending = nil, make(map[*stream]struct{}), make(map[uint32]chan net.Conn)
		s.signalLocked()
		s.mu.Unlock()
		for _, ch := range pending {
			ch <- nil
		}
		s.cancel()
		s.ctrl.Close()
		for _, c := range incoming {
			c.Close()
		}
		for st := range streams {
			st.Conn.Close()
		}
		if s.dg != nil {
			s.dg.close()
		}
		if s.ln != nil {
			s.ln.forget(s)
		}
		s.wg.Wait()
		// A stream dialled for the peer while Close ran was refused by deliver; nothing is left.
	})
	return nil
}

// stream is a stream handed to the application: its connection, and the session to leave on Close.
type stream struct {
	net.Conn
	s *session
}

// Close closes the stream's connection and removes it from its session.
func (st *stream) Close() error {
	err := st.Conn.Close()
	st.s.mu.Lock()
	delete(st.s.streams, st)
	st.s.mu.Unlock()
	return err
}

// CloseWrite shuts down the sending direction only, where the connection supports it.
func (st *stream) CloseWrite() error {
	if cw, ok := st.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
