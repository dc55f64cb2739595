package transport

import (
	"context"
	"io"
	"net"
	"sync"
	"time"
)

// sessionListener accepts sessions over a byte-stream listener. Its accept goroutine (run) owns ln's
// Accept; each new connection is then owned by a handshake goroutine until its preamble is read and the
// connection is handed to a session, or refused. At most maxHandshakes handshake goroutines run at
// once. Close waits for all of them through wg.
type sessionListener struct {
	ln    net.Listener
	sn    sessionNet
	slots chan struct{} // holds a token per handshake goroutine
	quit  chan struct{} // closed by Close
	wg    sync.WaitGroup

	closeOnce sync.Once

	mu          sync.Mutex
	sessions    map[sessionID]*session // guarded by mu; live sessions, by id
	queue       []*session             // guarded by mu; accepted by the handshake, not yet by Accept
	admitting   int                    // guarded by mu; sessions being answered, bound for queue
	handshaking map[net.Conn]struct{}  // guarded by mu; connections whose preamble is being read
	closed      bool                   // guarded by mu; Close was called or ln failed
	changed     chan struct{}          // guarded by mu; closed and replaced when queue or closed change
}

// listenSession starts a session listener over ln, which it owns from then on.
func listenSession(ln net.Listener, sn sessionNet) *sessionListener {
	l := &sessionListener{
		ln:          ln,
		sn:          sn,
		slots:       make(chan struct{}, maxHandshakes),
		quit:        make(chan struct{}),
		sessions:    make(map[sessionID]*session),
		handshaking: make(map[net.Conn]struct{}),
		changed:     make(chan struct{}),
	}
	l.wg.Add(1)
	go l.run()
	return l
}

// run is the accept goroutine: it hands each new connection to a handshake goroutine (see
// acceptHandshakes) and marks the listener closed when it ends.
func (l *sessionListener) run() {
	defer l.wg.Done()
	defer l.shut()
	acceptHandshakes(l.ln, l.slots, l.quit, &l.wg, l.track, l.handshake)
}

// track records c as in its handshake, so that Close can end it, unless the listener is closed.
func (l *sessionListener) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.handshaking[c] = struct{}{}
	return true
}

// shut marks the listener closed, so that Accept fails.
func (l *sessionListener) shut() {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.changed)
		l.changed = make(chan struct{})
	}
	l.mu.Unlock()
}

// handshake reads the preamble of c within handshakeTimeout and hands c on. A connection with a bad or
// late preamble is closed; nothing else is disturbed.
func (l *sessionListener) handshake(c net.Conn) {
	var buf [preambleSize]byte
	c.SetReadDeadline(time.Now().Add(handshakeTimeout))
	_, err := io.ReadFull(c, buf[:])
	var p preamble
	if err == nil {
		p, err = parsePreamble(buf[:])
	}
	if err == nil {
		err = c.SetReadDeadline(time.Time{})
	}
	l.mu.Lock()
	delete(l.handshaking, c)
	closed := l.closed
	l.mu.Unlock()
	if err != nil || closed {
		c.Close()
		return
	}
	if p.index == 0 {
		l.admit(c, p.id)
		return
	}
	l.mu.Lock()
	s := l.sessions[p.id]
	l.mu.Unlock()
	if s == nil {
		c.Close() // a stream of a session that ended, or of none
		return
	}
	s.deliver(c, p.index)
}

// admit answers a new session's control connection c: it queues the session for Accept, or refuses it
// when the queue is full or the id is taken.
func (l *sessionListener) admit(c net.Conn, id sessionID) {
	l.mu.Lock()
	_, taken := l.sessions[id]
	full := len(l.queue)+l.admitting >= maxQueuedSessions
	if l.closed || taken || full {
		l.mu.Unlock()
		if full && !taken {
			c.SetWriteDeadline(time.Now().Add(handshakeTimeout))
			writeFraming(c, appendFrame(nil, frame{typ: frameRefuse}))
		}
		c.Close()
		return
	}
	s := newSession(id, l.sn, c, false, "")
	s.ln = l
	// Registered before the answer, so that streams dialled right after it find the session.
	l.sessions[id] = s
	l.admitting++
	l.mu.Unlock()
	if l.sn.datagrams != nil {
		s.dg = l.sn.datagrams(id, c)
	}
	c.SetWriteDeadline(time.Now().Add(handshakeTimeout))
	_, err := writeFraming(c, appendFrame(nil, frame{typ: frameAccept}))
	if err == nil {
		err = c.SetWriteDeadline(time.Time{})
	}
	if err != nil {
		l.mu.Lock()
		l.admitting--
		l.mu.Unlock()
		s.Close()
		return
	}
	s.start()
	l.mu.Lock()
	l.admitting--
	if l.closed {
		l.mu.Unlock()
		s.Close()
		return
	}
	l.queue = append(l.queue, s)
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

// forget removes s from the live sessions, so that later connections for it are refused.
func (l *sessionListener) forget(s *session) {
	l.mu.Lock()
	if l.sessions[s.id] == s {
		delete(l.sessions, s.id)
	}
	l.mu.Unlock()
}

// Accept returns the next session.
func (l *sessionListener) Accept(ctx context.Context) (Session, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, &net.OpError{Op: "accept session", Net: l.sn.name, Addr: l.ln.Addr(), Err: net.ErrClosed}
		}
		if len(l.queue) > 0 {
			s := l.queue[0]
			l.queue[0] = nil
			l.queue = l.queue[1:]
			l.mu.Unlock()
			return s, nil
		}
		wait := l.changed
		l.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, &net.OpError{Op: "accept session", Net: l.sn.name, Addr: l.ln.Addr(), Err: ctx.Err()}
		}
	}
}

// Addr returns the address of the underlying listener.
func (l *sessionListener) Addr() net.Addr { return l.ln.Addr() }

// Close closes the listener, the connections in their handshake and every live session.
func (l *sessionListener) Close() error {
	l.closeOnce.Do(func() {
		l.shut()
		close(l.quit)
		l.ln.Close()
		l.mu.Lock()
		handshaking := make([]net.Conn, 0, len(l.handshaking))
		for c := range l.handshaking {
			handshaking = append(handshaking, c)
		}
		l.mu.Unlock()
		for _, c := range handshaking {
			c.Close()
		}
		l.wg.Wait()
		l.mu.Lock()
		sessions := make([]*session, 0, len(l.sessions))
		for _, s := range l.sessions {
			sessions = append(sessions, s)
		}
		l.queue = nil
		l.mu.Unlock()
		for _, s := range sessions {
			s.Close()
		}
	})
	return nil
}
