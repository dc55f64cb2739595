// Package crashhost gives the WAN benches a TCP transport whose sockets are made inside a site's
// network namespace (internal/wanemu) and which can die as a host does, for their churn rounds.
package crashhost

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/internal/wanemu"
	"github.com/concord-ccl/concord/pccl"
)

// ErrCrashed is what a crashed transport's Listen and Dial return.
var ErrCrashed = fmt.Errorf("host crashed: %w", syscall.ENETUNREACH)

// Transport is a TCP transport whose sockets are made inside a network namespace, and which can die
// as a host does: Crash resets every connection it made or accepted, closes its listeners, and
// fails every later Listen and Dial. It has no sessions (the communicator does not use them).
type Transport struct {
	ns    *wanemu.Netns
	inner pccl.Transport

	mu      sync.Mutex
	crashed bool
	conns   []net.Conn
	lns     []net.Listener
}

// New returns a transport that makes TCP sockets inside ns.
func New(ns *wanemu.Netns) *Transport {
	return &Transport{ns: ns, inner: pccl.NewTCP(pccl.TCPConfig{})}
}

// Name names the transport as the peers' configuration does.
func (t *Transport) Name() string { return "tcp" }

// Listen listens on addr inside the namespace; the connections it accepts are reset by Crash.
func (t *Transport) Listen(addr string) (net.Listener, error) {
	var ln net.Listener
	if err := t.ns.Do(func() (err error) { ln, err = t.inner.Listen(addr); return err }); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.crashed {
		ln.Close()
		return nil, ErrCrashed
	}
	t.lns = append(t.lns, ln)
	return &listener{Listener: ln, t: t}, nil
}

// Dial connects to addr from inside the namespace; Crash resets the connection.
func (t *Transport) Dial(ctx context.Context, addr string) (net.Conn, error) {
	var c net.Conn
	if err := t.ns.Do(func() (err error) { c, err = t.inner.Dial(ctx, addr); return err }); err != nil {
		return nil, err
	}
	return t.track(c)
}

// ListenSession fails: the benches' communicators use no sessions.
func (t *Transport) ListenSession(string) (transport.SessionListener, error) {
	return nil, errors.New("crashhost: the transport has no sessions")
}

// DialSession fails: the benches' communicators use no sessions.
func (t *Transport) DialSession(context.Context, string) (transport.Session, error) {
	return nil, errors.New("crashhost: the transport has no sessions")
}

// track records c so that a crash resets it; after a crash it resets c at once.
func (t *Transport) track(c net.Conn) (net.Conn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.crashed {
		reset(c)
		return nil, ErrCrashed
	}
	t.conns = append(t.conns, c)
	return c, nil
}

// Crash resets every connection (an RST, as from a dead host's kernel), closes the listeners and
// makes every later Listen and Dial fail.
func (t *Transport) Crash() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.crashed = true
	for _, ln := range t.lns {
		ln.Close()
	}
	for _, c := range t.conns {
		reset(c)
	}
	t.lns, t.conns = nil, nil
}

// reset closes c with an RST, as the kernel of a host whose process died with unread data does. A
// connection inside the site (the TCP transport's unix socket) just closes, as on a process's death.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

type listener struct {
	net.Listener
	t *Transport
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.t.track(c)
}
