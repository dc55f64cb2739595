package transport

import (
	"context"
	"fmt"
	"net"
	"sync"

	"github.com/quic-go/quic-go"
)

// quicListener accepts QUIC connections on one UDP socket, authenticates them and queues them as
// sessions, or, for a byte-stream listener, queues the first stream of each. Its accept goroutine
// (run) owns the QUIC listener's Accept; each new connection is then owned by a handshake goroutine
// until it is queued or refused, at most maxHandshakes at once. Close waits for all of them.
type quicListener struct {
	t       *quicTransport
	streams bool // a byte-stream listener
	udp     *net.UDPConn
	tr      *quic.Transport
	ql      *quic.Listener

	ctx      context.Context // ends on Close
	cancel   context.CancelFunc
	slots    chan struct{}     // a token per handshake goroutine
	ready    chan quicAccepted // authenticated sessions, for Accept
	wg       sync.WaitGroup
	once     sync.Once
	freeOnce sync.Once

	mu       sync.Mutex
	sessions map[*quicSession]struct{} // guarded by mu; sessions whose connection is not torn down
	closed   bool                      // guarded by mu
}

// quicAccepted is one authenticated session and, for a byte-stream listener, its stream.
type quicAccepted struct {
	s  *quicSession
	st net.Conn
}

func newQUICListener(t *quicTransport, streams bool, udp *net.UDPConn, tr *quic.Transport, ql *quic.Listener) *quicListener {
	l := &quicListener{
		t: t, streams: streams, udp: udp, tr: tr, ql: ql,
		slots:    make(chan struct{}, maxHandshakes),
		ready:    make(chan quicAccepted, maxQueuedSessions),
		sessions: make(map[*quicSession]struct{}),
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.run()
	return l
}

// run accepts QUIC connections (whose TLS handshake quic-go has completed) and starts a handshake
// goroutine for each.
func (l *quicListener) run() {
	defer l.wg.Done()
	for {
		select {
		case l.slots <- struct{}{}:
		case <-l.ctx.Done():
			return
		}
		conn, err := l.ql.Accept(l.ctx)
		if err != nil {
			<-l.slots
			return // the listener was closed
		}
		l.wg.Add(1)
		go l.handshake(conn)
	}
}

// handshake checks the dialler's proof, and queues the session (and for a byte-stream listener its
// first stream), or refuses it and reports why.
func (l *quicListener) handshake(conn *quic.Conn) {
	defer l.wg.Done()
	defer func() { <-l.slots }()
	ctx, cancel := context.WithTimeout(l.ctx, l.t.cfg.HandshakeTimeout)
	defer cancel()
	s, err := l.t.authenticate(ctx, conn, false)
	if err != nil {
		if l.ctx.Err() == nil {
			reportRefused(l.t.cfg.Logger, l.t.cfg.OnRefused, "quic", conn.RemoteAddr(), err)
		}
		return
	}
	s.ln = l
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		conn.CloseWithError(codeRefused, "listener closed")
		return
	}
	l.sessions[s] = struct{}{}
	l.mu.Unlock()
	s.start()
	a := quicAccepted{s: s}
	if l.streams {
		st, err := s.AcceptStream(ctx)
		if err != nil {
			s.closeWith(false)
			return
		}
		qs := st.(*quicStream)
		qs.ownsSession = true
		a.st = qs
	}
	select {
	case l.ready <- a:
	default:
		// Nobody accepts: refuse rather than hold it.
		s.conn.CloseWithError(codeRefused, "accept queue full")
		s.closeWith(false)
	}
}

// forget drops a session whose connection was torn down, and frees the socket once the listener is
// closed and no session uses it any more.
func (l *quicListener) forget(s *quicSession) {
	l.mu.Lock()
	delete(l.sessions, s)
	free := l.closed && len(l.sessions) == 0
	l.mu.Unlock()
	if free {
		l.release()
	}
}

// release closes quic-go's endpoint and the UDP socket. It runs once.
func (l *quicListener) release() {
	l.freeOnce.Do(func() {
		l.tr.Close()
		l.udp.Close()
	})
}

// Accept returns the next authenticated session.
func (l *quicListener) Accept(ctx context.Context) (Session, error) {
	a, err := l.next(ctx)
	if err != nil {
		return nil, err
	}
	return a.s, nil
}

func (l *quicListener) next(ctx context.Context) (quicAccepted, error) {
	if err := ctx.Err(); err != nil {
		return quicAccepted{}, fmt.Errorf("quic accept %s: %w", l.Addr(), err)
	}
	select {
	case a := <-l.ready:
		return a, nil
	case <-l.ctx.Done():
		return quicAccepted{}, fmt.Errorf("quic accept %s: %w", l.Addr(), net.ErrClosed)
	case <-ctx.Done():
		return quicAccepted{}, fmt.Errorf("quic accept %s: %w", l.Addr(), ctx.Err())
	}
}

// Addr returns the UDP address the listener is bound to.
func (l *quicListener) Addr() net.Addr { return l.udp.LocalAddr() }

// Close stops accepting and waits for its goroutines. A session listener closes every session
// accepted through it at once (without lingering) and frees the address. A byte-stream listener, like
// a TCP one, leaves the connections it accepted open; they share its UDP socket, which is freed when
// the last of them closes.
func (l *quicListener) Close() error {
	l.once.Do(func() {
		l.cancel()
		l.ql.Close()
		l.wg.Wait()
		l.mu.Lock()
		l.closed = true
		var doomed []*quicSession
		if !l.streams {
			for s := range l.sessions {
				doomed = append(doomed, s)
			}
		}
		l.mu.Unlock()
		for {
			select {
			case a := <-l.ready:
				doomed = append(doomed, a.s)
				continue
			default:
			}
			break
		}
		for _, s := range doomed {
			s.closeWith(false)
		}
		l.mu.Lock()
		free := len(l.sessions) == 0
		l.mu.Unlock()
		if free {
			l.release()
		}
	})
	return nil
}

// streamListener is a byte-stream listener: a net.Listener over a quicListener.
type streamListener struct{ l *quicListener }

// Accept returns the stream of the next authenticated connection.
func (sl streamListener) Accept() (net.Conn, error) {
	a, err := sl.l.next(context.Background())
	if err != nil {
		return nil, err
	}
	return a.st, nil
}

// Addr returns the UDP address the listener is bound to.
func (sl streamListener) Addr() net.Addr { return sl.l.Addr() }

// Close closes the listener and every connection accepted through it.
func (sl streamListener) Close() error { return sl.l.Close() }
