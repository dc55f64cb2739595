package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/concord-ccl/concord/internal/auth"
)

// QUICConfig configures the QUIC transport. Auth.Secret is required; every other zero field takes the
// default given in its comment. The defaults suit a long fat pipe of 100 ms × 1 Gbit/s (a
// bandwidth-delay product of 12.5 MB).
type QUICConfig struct {
	// Auth holds the run secret (required) and the optional run CA. QUIC always encrypts.
	Auth AuthConfig
	// StreamWindow is the largest receive window of one stream, in bytes: one stream can have at most
	// this much unacknowledged data in flight towards this end. quic-go starts smaller and grows the
	// window while the application keeps up. Default 16 MiB (quic-go's own default, 6 MB, holds one
	// stream of a 100 ms path under 500 Mbit/s).
	StreamWindow uint64
	// ConnWindow is the largest receive window of one connection, over all its streams, in bytes.
	// Default 32 MiB (quic-go's own: 15 MB). It bounds the memory a peer can make this end buffer per
	// connection.
	ConnWindow uint64
	// UDPBuffer is the size asked of the kernel for each UDP socket's receive and send buffers
	// (SO_RCVBUF, SO_SNDBUF), in bytes, as the kernel reports it. Where the operating system limits
	// it, a warning naming the sysctl to raise (net.core.rmem_max, net.core.wmem_max) is logged once
	// per process. Default 8 MiB.
	UDPBuffer int
	// KeepAlive is the period of keep-alive packets, which keep NAT bindings and idle connections
	// open. Default 5 s; negative disables them (an idle connection then ends after IdleTimeout).
	KeepAlive time.Duration
	// IdleTimeout is how long a connection may go without receiving anything before it is declared
	// dead (ErrReset). Default 30 s.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds the QUIC handshake plus the exchange of proofs, on both ends.
	// Default 10 s.
	HandshakeTimeout time.Duration
	// Linger is how long a closed session (or byte-stream connection) keeps its QUIC connection open
	// to deliver what was written before Close, waiting for the peer to close too. Default 5 s;
	// negative closes at once and may drop data still in flight.
	Linger time.Duration
	// MaxStreams bounds the streams a peer may have open towards this end at once per session.
	// Default 1024.
	MaxStreams int64
	// Logger receives a warning for every incoming connection refused, unless OnRefused is set, and
	// the socket buffer warning. Default: slog.Default().
	Logger *slog.Logger
	// OnRefused, when set, is called instead of logging for every incoming connection refused: err
	// wraps ErrAuth, or the handshake's own error. It is called from the listener's handshake
	// goroutines, concurrently, and must not block. The listener goes on serving others.
	OnRefused func(remote net.Addr, err error)
}

// Defaults of QUICConfig.
const (
	defaultStreamWindow = 16 << 20
	defaultConnWindow   = 32 << 20
	defaultUDPBuffer    = 8 << 20
	defaultKeepAlive    = 5 * time.Second
	defaultIdleTimeout  = 30 * time.Second
	defaultLinger       = 5 * time.Second
	defaultMaxStreams   = 1024
)

// Validate reports the first field of c that holds an impossible value.
func (c QUICConfig) Validate() error {
	if err := c.Auth.Validate(); err != nil {
		return fmt.Errorf("quic config: %w", err)
	}
	switch {
	case c.UDPBuffer < 0:
		return fmt.Errorf("quic config: UDPBuffer %d: must not be negative", c.UDPBuffer)
	case c.IdleTimeout < 0:
		return fmt.Errorf("quic config: IdleTimeout %v: must not be negative", c.IdleTimeout)
	case c.HandshakeTimeout < 0:
		return fmt.Errorf("quic config: HandshakeTimeout %v: must not be negative", c.HandshakeTimeout)
	case c.MaxStreams < 0:
		return fmt.Errorf("quic config: MaxStreams %d: must not be negative", c.MaxStreams)
	case c.StreamWindow > 0 && c.ConnWindow > 0 && c.ConnWindow < c.StreamWindow:
		return fmt.Errorf("quic config: ConnWindow %d is below StreamWindow %d", c.ConnWindow, c.StreamWindow)
	}
	return nil
}

func (c QUICConfig) withDefaults() QUICConfig {
	if c.StreamWindow == 0 {
		c.StreamWindow = defaultStreamWindow
	}
	if c.ConnWindow == 0 {
		c.ConnWindow = max(defaultConnWindow, c.StreamWindow)
	}
	if c.UDPBuffer == 0 {
		c.UDPBuffer = defaultUDPBuffer
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = defaultKeepAlive
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = defaultIdleTimeout
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = defaultHandshakeTimeout
	}
	if c.Linger == 0 {
		c.Linger = defaultLinger
	}
	if c.MaxStreams == 0 {
		c.MaxStreams = defaultMaxStreams
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Application protocols (ALPN) of the two kinds of QUIC listener. A session dialled to a byte-stream
// listener, or the reverse, fails its handshake and is refused (ErrRefused).
const (
	quicSessionProto = "concord-session/1"
	quicStreamProto  = "concord-stream/1"
)

// Application error codes of Concord's QUIC connections.
const (
	codeClosed  quic.ApplicationErrorCode = 0 // the session was closed
	codeAuth    quic.ApplicationErrorCode = 1 // the dialler failed authentication
	codeRefused quic.ApplicationErrorCode = 2 // the listener is full or closing
)

// streamHeader is the byte that opens every data stream: QUIC makes a stream known to the peer only
// when data arrives on it, and Session.OpenStream promises that the peer can accept it at once.
const streamHeader = 'D'

// quicTransport is the Transport over QUIC (quic-go). It holds only immutable configuration, so it is
// safe for concurrent use.
//
// Every dialled connection, byte stream or session, is a QUIC connection of its own on a UDP socket of
// its own. quic-go runs one congestion controller (NewReno, window capped near 14 MB) per connection,
// and routers share bandwidth per 5-tuple, so striping one transfer over K connections needs K QUIC
// connections on K sockets; K streams of one connection would share one window and one flow. It also
// isolates failures the way TCP connections are isolated. The price is one handshake (plus one round
// trip for the proofs) per connection, as with TCP and TLS.
type quicTransport struct {
	cfg     QUICConfig
	session tlsPair // TLS configurations of session connections
	stream  tlsPair // TLS configurations of byte-stream connections
	qconf   *quic.Config
	err     error // the configuration error every operation fails with, or nil
}

// tlsPair holds the server and client TLS configurations of one kind of connection.
type tlsPair struct{ server, client *tls.Config }

// NewQUIC returns a Transport over QUIC. Every connection is TLS 1.3 and proves in both directions
// that its ends hold cfg.Auth.Secret, bound to its TLS session (see package auth). Sessions map to
// QUIC connections natively, streams to QUIC streams, datagrams to QUIC datagrams (RFC 9221); a
// byte-stream connection from Dial is a QUIC connection with one stream. An invalid cfg makes every
// Listen and Dial fail with the error of cfg.Validate.
func NewQUIC(cfg QUICConfig) Transport {
	t := &quicTransport{cfg: cfg.withDefaults()}
	if t.err = cfg.Validate(); t.err != nil {
		return t
	}
	srv, cli, err := t.cfg.Auth.TLS(quicSessionProto)
	if err != nil {
		t.err = err
		return t
	}
	t.session = tlsPair{srv, cli}
	t.stream = tlsPair{srv.Clone(), cli.Clone()}
	t.stream.server.NextProtos = []string{quicStreamProto}
	t.stream.client.NextProtos = []string{quicStreamProto}
	c := t.cfg
	keepAlive := c.KeepAlive
	if keepAlive < 0 {
		keepAlive = 0
	}
	t.qconf = &quic.Config{
		HandshakeIdleTimeout:           c.HandshakeTimeout,
		MaxIdleTimeout:                 c.IdleTimeout,
		KeepAlivePeriod:                keepAlive,
		InitialStreamReceiveWindow:     min(c.StreamWindow, 2<<20),
		MaxStreamReceiveWindow:         c.StreamWindow,
		InitialConnectionReceiveWindow: min(c.ConnWindow, 4<<20),
		MaxConnectionReceiveWindow:     c.ConnWindow,
		MaxIncomingStreams:             c.MaxStreams + 1, // and the control stream
		MaxIncomingUniStreams:          -1,
		EnableDatagrams:                true,
	}
	return t
}

// Name returns "quic".
func (t *quicTransport) Name() string { return "quic" }

// Listen opens a UDP socket on addr whose Accept returns one stream per authenticated QUIC connection.
// Closing an accepted connection closes its QUIC connection.
func (t *quicTransport) Listen(addr string) (net.Listener, error) {
	l, err := t.listen(addr, true)
	if err != nil {
		return nil, err
	}
	return streamListener{l}, nil
}

// Dial opens a QUIC connection of its own to addr, authenticates it and returns its one stream.
// Closing the stream closes the connection, after delivering what was written (see QUICConfig.Linger).
func (t *quicTransport) Dial(ctx context.Context, addr string) (net.Conn, error) {
	s, err := t.dial(ctx, addr, true)
	if err != nil {
		return nil, err
	}
	c, err := s.OpenStream(ctx)
	if err != nil {
		s.closeWith(false)
		return nil, fmt.Errorf("quic dial %s: %w", addr, errors.Unwrap(err))
	}
	st := c.(*quicStream)
	st.ownsSession = true
	return st, nil
}

// ListenSession opens a UDP socket on addr and accepts QUIC connections on it as sessions.
func (t *quicTransport) ListenSession(addr string) (SessionListener, error) {
	return t.listen(addr, false)
}

// DialSession opens a QUIC connection of its own to addr and authenticates it.
func (t *quicTransport) DialSession(ctx context.Context, addr string) (Session, error) {
	return t.dial(ctx, addr, false)
}

// listen opens the UDP socket and the QUIC listener of a session or byte-stream listener.
func (t *quicTransport) listen(addr string, streams bool) (*quicListener, error) {
	if t.err != nil {
		return nil, fmt.Errorf("quic listen %s: %w", addr, t.err)
	}
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("quic listen %s: %w", addr, err)
	}
	udp, err := net.ListenUDP(udpNetwork(ua.IP), ua)
	if err != nil {
		return nil, fmt.Errorf("quic listen %s: %w", addr, unwrapOp(err))
	}
	setUDPBuffers(udp, t.cfg.UDPBuffer, t.cfg.Logger)
	tr := &quic.Transport{Conn: udp}
	pair := t.session
	if streams {
		pair = t.stream
	}
	ql, err := tr.Listen(pair.server, t.qconf)
	if err != nil {
		tr.Close()
		udp.Close()
		return nil, fmt.Errorf("quic listen %s: %w", addr, err)
	}
	return newQUICListener(t, streams, udp, tr, ql), nil
}

// dial opens a QUIC connection to addr on a socket of its own, runs the exchange of proofs on its
// control stream, and returns the session.
func (t *quicTransport) dial(ctx context.Context, addr string, streams bool) (*quicSession, error) {
	if t.err != nil {
		return nil, fmt.Errorf("quic dial %s: %w", addr, t.err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("quic dial %s: %w", addr, err)
	}
	fail := func(err error) (*quicSession, error) {
		return nil, fmt.Errorf("quic dial %s: %w", addr, err)
	}
	ra, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return fail(err)
	}
	udp, err := localUDP(ra)
	if err != nil {
		return fail(unwrapOp(err))
	}
	setUDPBuffers(udp, t.cfg.UDPBuffer, t.cfg.Logger)
	// While the handshake runs, an ICMP port unreachable ends it at once with ECONNREFUSED, as a TCP
	// RST would. Afterwards ICMP errors are ignored, as TCP ignores them on established connections:
	// they can be forged, and a path MTU probe may draw one.
	setRecvErr(udp, ra.IP, true)
	tr := &quic.Transport{Conn: udp}
	pair := t.session
	if streams {
		pair = t.stream
	}
	hctx, cancel := context.WithTimeout(ctx, t.cfg.HandshakeTimeout)
	defer cancel()
	conn, err := tr.Dial(hctx, ra, pair.client, t.qconf)
	if err != nil {
		tr.Close()
		udp.Close()
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		return fail(quicConnError(err))
	}
	setRecvErr(udp, ra.IP, false)
	s, err := t.authenticate(hctx, conn, true)
	if err != nil {
		tr.Close()
		udp.Close()
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		return fail(err)
	}
	s.udp, s.tr = udp, tr
	s.start()
	return s, nil
}

// authenticate runs the exchange of proofs on the control stream of conn, the first stream, opened
// by the dialling end. It closes conn on failure.
func (t *quicTransport) authenticate(ctx context.Context, conn *quic.Conn, dialer bool) (*quicSession, error) {
	var ctrl *quic.Stream
	var err error
	if dialer {
		ctrl, err = conn.OpenStreamSync(ctx)
	} else {
		ctrl, err = conn.AcceptStream(ctx)
	}
	if err == nil {
		if d, ok := ctx.Deadline(); ok {
			ctrl.SetDeadline(d)
		}
		stop := context.AfterFunc(ctx, func() { ctrl.SetDeadline(time.Unix(1, 0)) })
		if dialer {
			err = auth.Dial(ctrl, conn.ConnectionState().TLS, t.cfg.Auth.Secret)
		} else {
			err = auth.Accept(ctrl, conn.ConnectionState().TLS, t.cfg.Auth.Secret)
		}
		stop()
		ctrl.SetDeadline(time.Time{})
	}
	if err != nil {
		switch {
		case errors.Is(err, ErrAuth):
		case dialer:
			err = quicConnError(err)
		default:
			err = fmt.Errorf("%w: no proof of the run secret: %v", ErrAuth, quicConnError(err))
		}
		code, msg := codeClosed, "session closed"
		if errors.Is(err, ErrAuth) {
			code, msg = codeAuth, "authentication failed"
		}
		conn.CloseWithError(code, msg)
		return nil, err
	}
	return newQUICSession(t, conn, ctrl, dialer), nil
}

// localUDP opens a UDP socket for a connection to ra, bound to the local address the kernel would
// route from (so that the session's LocalAddr is the one the peer sees), on a free port.
func localUDP(ra *net.UDPAddr) (*net.UDPConn, error) {
	probe, err := net.DialUDP(udpNetwork(ra.IP), nil, ra) // sends nothing
	if err != nil {
		return nil, err
	}
	ip := probe.LocalAddr().(*net.UDPAddr).IP
	probe.Close()
	return net.ListenUDP(udpNetwork(ra.IP), &net.UDPAddr{IP: ip})
}

// udpNetwork returns "udp4" for an IPv4 address, "udp6" for an IPv6 one and "udp" for none.
func udpNetwork(ip net.IP) string {
	switch {
	case ip == nil:
		return "udp"
	case ip.To4() != nil:
		return "udp4"
	default:
		return "udp6"
	}
}

// quicConnError turns an error of a QUIC connection into the transport's standard ones, keeping
// quic-go's description.
func quicConnError(err error) error {
	if err == nil {
		return nil
	}
	var ae *quic.ApplicationError
	if errors.As(err, &ae) {
		if !ae.Remote {
			return net.ErrClosed
		}
		switch ae.ErrorCode {
		case codeClosed:
			return ErrSessionClosed
		case codeAuth:
			return fmt.Errorf("%w: the listener refused our proof: the run secrets differ", ErrAuth)
		case codeRefused:
			return fmt.Errorf("the listener refused the connection (%s): %w", ae.ErrorMessage, ErrRefused)
		}
		return fmt.Errorf("peer closed the connection with error %d (%s): %w", ae.ErrorCode, ae.ErrorMessage, ErrReset)
	}
	var te *quic.TransportError
	if errors.As(err, &te) {
		if te.ErrorCode.IsCryptoError() {
			switch alert := uint8(te.ErrorCode - 0x100); alert {
			case 120: // no_application_protocol
				return fmt.Errorf("the listener serves another kind of connection (session or byte stream): %w", ErrRefused)
			case 42, 43, 44, 45, 46, 48, 116: // certificate alerts
				return fmt.Errorf("%w: %v", ErrAuth, err)
			}
		}
		return fmt.Errorf("%w: %v", ErrReset, err)
	}
	var idle *quic.IdleTimeoutError
	if errors.As(err, &idle) {
		return fmt.Errorf("no packet within the idle timeout: %w", ErrReset)
	}
	var sr *quic.StatelessResetError
	if errors.As(err, &sr) {
		return fmt.Errorf("stateless reset: %w", ErrReset)
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return ErrRefused
	}
	if errors.Is(err, quic.ErrTransportClosed) || errors.Is(err, quic.ErrServerClosed) {
		return net.ErrClosed
	}
	return err
}
