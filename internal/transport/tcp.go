package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// TCPConfig configures the TCP transport. Its zero value works and gives Nagle's algorithm off,
// the operating system's socket buffer sizes and Go's default keep-alive probing.
type TCPConfig struct {
	// DisableNoDelay turns Nagle's algorithm back on (TCP_NODELAY off). Default false: small frames
	// leave at once, which is what latency-bound control traffic wants.
	DisableNoDelay bool
	// ReadBuffer is the socket receive buffer size (SO_RCVBUF) in bytes. 0 keeps the OS default.
	// Long fat pipes need it at least as large as the bandwidth-delay product.
	ReadBuffer int
	// WriteBuffer is the socket send buffer size (SO_SNDBUF) in bytes. 0 keeps the OS default.
	WriteBuffer int
	// KeepAlive is the period between TCP keep-alive probes. 0 keeps Go's default (15 s); a negative
	// value disables keep-alive probes.
	KeepAlive time.Duration
	// DisableLocal keeps every connection on TCP. By default (on Linux), a listener also accepts on a
	// unix socket named after its address, and a dial to an address of this host's network namespace
	// goes over that socket: the same bytes with far less kernel work (see local.go). ReadBuffer and
	// WriteBuffer size its buffers as well; 0 gives 4 MiB there.
	DisableLocal bool
}

// Validate reports the first field of c that holds an impossible value.
func (c TCPConfig) Validate() error {
	if c.ReadBuffer < 0 {
		return fmt.Errorf("tcp config: ReadBuffer %d: must not be negative", c.ReadBuffer)
	}
	if c.WriteBuffer < 0 {
		return fmt.Errorf("tcp config: WriteBuffer %d: must not be negative", c.WriteBuffer)
	}
	return nil
}

// tcpTransport is the Transport over real TCP sockets. It holds only its configuration, so it is
// safe for concurrent use.
type tcpTransport struct {
	cfg TCPConfig
}

// NewTCP returns a Transport over real TCP sockets configured by cfg. An invalid cfg makes every
// Listen and Dial fail with the error of cfg.Validate.
func NewTCP(cfg TCPConfig) Transport {
	return &tcpTransport{cfg: cfg}
}

// Name returns "tcp".
func (t *tcpTransport) Name() string { return "tcp" }

// Listen opens a TCP listener on addr. Every connection it accepts gets the socket options of the
// transport's configuration.
func (t *tcpTransport) Listen(addr string) (net.Listener, error) {
	if err := t.cfg.Validate(); err != nil {
		return nil, fmt.Errorf("tcp listen %s: %w", addr, err)
	}
	lc := net.ListenConfig{KeepAlive: t.cfg.KeepAlive}
	l, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp listen %s: %w", addr, unwrapOp(err))
	}
	tl := &tcpListener{Listener: l, cfg: t.cfg}
	if ul := listenLocal(l, t.cfg); ul != nil {
		return newDualListener(tl, ul, t.cfg), nil
	}
	return tl, nil
}

// Dial connects to addr over TCP, honouring ctx's cancellation and deadline; over the local path
// when addr's listener is in this host's network namespace.
func (t *tcpTransport) Dial(ctx context.Context, addr string) (net.Conn, error) {
	if err := t.cfg.Validate(); err != nil {
		return nil, fmt.Errorf("tcp dial %s: %w", addr, err)
	}
	if c, err := dialLocal(ctx, addr, t.cfg); err != nil {
		return nil, fmt.Errorf("tcp dial %s: %w", addr, err)
	} else if c != nil {
		return c, nil
	}
	d := net.Dialer{KeepAlive: t.cfg.KeepAlive}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp dial %s: %w", addr, unwrapOp(err))
	}
	if err := configureTCP(c, t.cfg); err != nil {
		c.Close()
		return nil, fmt.Errorf("tcp dial %s: %w", addr, err)
	}
	return c, nil
}

// ListenSession starts accepting sessions on addr. Each stream of a session is a TCP connection of its
// own, accepted by this listener; TCP sessions have no datagrams.
func (t *tcpTransport) ListenSession(addr string) (SessionListener, error) {
	l, err := t.Listen(addr)
	if err != nil {
		return nil, err
	}
	return listenSession(l, t.sessionNet()), nil
}

// DialSession opens a session to addr: one TCP connection for control now, one more per stream later.
func (t *tcpTransport) DialSession(ctx context.Context, addr string) (Session, error) {
	return dialSession(ctx, t.sessionNet(), addr)
}

func (t *tcpTransport) sessionNet() sessionNet {
	return sessionNet{name: "tcp", dial: t.Dial}
}

// unwrapOp strips a *net.OpError so that the message does not repeat the operation and address that
// the caller's own wrapping already names. The cause keeps its identity for errors.Is.
func unwrapOp(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}

// configureTCP applies the socket options of cfg to c.
func configureTCP(c net.Conn, cfg TCPConfig) error {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	if err := tc.SetNoDelay(!cfg.DisableNoDelay); err != nil {
		return fmt.Errorf("set TCP_NODELAY: %w", err)
	}
	if cfg.ReadBuffer > 0 {
		if err := tc.SetReadBuffer(cfg.ReadBuffer); err != nil {
			return fmt.Errorf("set SO_RCVBUF %d: %w", cfg.ReadBuffer, err)
		}
	}
	if cfg.WriteBuffer > 0 {
		if err := tc.SetWriteBuffer(cfg.WriteBuffer); err != nil {
			return fmt.Errorf("set SO_SNDBUF %d: %w", cfg.WriteBuffer, err)
		}
	}
	return nil
}

// tcpListener configures every accepted connection and makes Close idempotent.
type tcpListener struct {
	net.Listener
	cfg TCPConfig

	closeOnce sync.Once
	closeErr  error
}

// Accept waits for the next connection and applies the configured socket options to it.
func (l *tcpListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if err := configureTCP(c, l.cfg); err != nil {
			// The connection is unusable as configured, but the listener is fine: drop it
			// and wait for the next one, as the kernel would for a failed handshake.
			c.Close()
			continue
		}
		return c, nil
	}
}

// Close stops the listener. Calling it again returns the result of the first call.
func (l *tcpListener) Close() error {
	l.closeOnce.Do(func() { l.closeErr = l.Listener.Close() })
	return l.closeErr
}
