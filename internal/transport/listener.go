package transport

import (
	"net"
	"sync"
)

// listener is a net.Listener on a Network host. Dial hands it the server end of each new connection;
// Accept takes them in order. Safe for concurrent use.
type listener struct {
	n    *Network
	addr memAddr

	mu      sync.Mutex
	queue   []*conn       // guarded by mu; dialled but not yet accepted
	closed  bool          // guarded by mu
	changed chan struct{} // guarded by mu; closed and replaced when queue or closed changes
}

func newListener(n *Network, addr memAddr) *listener {
	return &listener{n: n, addr: addr, changed: make(chan struct{})}
}

// enqueue hands a dialled connection to the listener. It reports false when the listener is closed.
func (l *listener) enqueue(c *conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.queue = append(l.queue, c)
	close(l.changed)
	l.changed = make(chan struct{})
	return true
}

// Accept waits for the next connection. After Close it returns an error wrapping net.ErrClosed.
func (l *listener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, &net.OpError{Op: "accept", Net: "mem", Addr: l.addr, Err: net.ErrClosed}
		}
		if len(l.queue) > 0 {
			c := l.queue[0]
			l.queue[0] = nil
			l.queue = l.queue[1:]
			l.mu.Unlock()
			return c, nil
		}
		wait := l.changed
		l.mu.Unlock()
		<-wait
	}
}

// Close stops the listener and frees its port. Connections dialled but not yet accepted are reset, as
// the kernel resets those left in a closed socket's backlog. Close is idempotent and returns nil.
func (l *listener) Close() error {
	l.n.unlisten(l)
	for _, c := range l.shut() {
		l.n.forget(c)
	}
	return nil
}

// shut marks l closed, wakes Accept, resets the queued connections and returns them so that the
// caller can forget them.
func (l *listener) shut() []*conn {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	queued := l.queue
	l.queue = nil
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
	for _, c := range queued {
		c.reset()
	}
	return queued
}

// Addr returns the listener's "host:port" address.
func (l *listener) Addr() net.Addr { return l.addr }
