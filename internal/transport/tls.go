package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/concord-ccl/concord/internal/auth"
)

// Errors of the authenticated transports (tls and quic) that callers may test for with errors.Is.
var (
	// ErrAuth means the other end could not prove that it holds the run secret, or refused this end's
	// proof: a wrong secret, none at all, a proof replayed or relayed from another session, or a
	// certificate that the run's CA did not issue.
	ErrAuth = auth.ErrAuth
	// ErrPlaintext means the other end does not speak TLS: a plaintext client on a TLS port, or a TLS
	// client dialling a plaintext port.
	ErrPlaintext = auth.ErrPlaintext
	// ErrWeakSecret means the run secret is missing or shorter than auth.MinSecretLen bytes.
	ErrWeakSecret = auth.ErrWeakSecret
)

// AuthConfig says how the tls and quic transports authenticate: the run secret, and optionally the
// run's CA. See package auth for the protocol and the secret's required strength.
type AuthConfig = auth.Config

// defaultHandshakeTimeout bounds a TLS or QUIC handshake and the exchange of proofs that follows it.
const defaultHandshakeTimeout = 10 * time.Second

// TLSConfig configures the TLS transport. Auth.Secret is required; every other zero field takes the
// default given in its comment.
type TLSConfig struct {
	// TCP configures the sockets beneath TLS. Default: TCP's defaults.
	TCP TCPConfig
	// Auth holds the run secret (required) and the optional run CA.
	Auth AuthConfig
	// HandshakeTimeout bounds the TLS handshake plus the exchange of proofs, on both ends. Default 10 s.
	HandshakeTimeout time.Duration
	// Logger receives a warning for every incoming connection refused by authentication, unless
	// OnRefused is set. Default: slog.Default().
	Logger *slog.Logger
	// OnRefused, when set, is called instead of logging for every incoming connection that is refused:
	// err wraps ErrAuth, ErrPlaintext or the handshake's own error. It is called from the listener's
	// handshake goroutines, concurrently, and must not block. The listener goes on serving others.
	OnRefused func(remote net.Addr, err error)
}

// Validate reports the first field of c that holds an impossible value.
func (c TLSConfig) Validate() error {
	if err := c.TCP.Validate(); err != nil {
		return fmt.Errorf("tls config: %w", err)
	}
	if err := c.Auth.Validate(); err != nil {
		return fmt.Errorf("tls config: %w", err)
	}
	if c.HandshakeTimeout < 0 {
		return fmt.Errorf("tls config: HandshakeTimeout %v: must not be negative", c.HandshakeTimeout)
	}
	return nil
}

// tlsProto is the application protocol (ALPN) of Concord over TLS.
const tlsProto = "concord/1"

// tlsTransport is TLS 1.3 over TCP, with every connection authenticated by the run secret. It holds
// only immutable configuration, so it is safe for concurrent use.
type tlsTransport struct {
	cfg            TLSConfig
	tcp            *tcpTransport
	server, client *tls.Config
	err            error // the configuration error every operation fails with, or nil
}

// NewTLS returns a Transport of TLS 1.3 connections over TCP: each connection, once its handshake is
// done, proves in both directions that its ends hold cfg.Auth.Secret, bound to that TLS session (see
// package auth). An invalid cfg makes every Listen and Dial fail with the error of cfg.Validate.
// Sessions are built as TCP's, each stream a TLS connection of its own, authenticated on its own.
func NewTLS(cfg TLSConfig) Transport {
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = defaultHandshakeTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	t := &tlsTransport{cfg: cfg, tcp: &tcpTransport{cfg: cfg.TCP}}
	if t.err = cfg.Validate(); t.err == nil {
		t.server, t.client, t.err = cfg.Auth.TLS(tlsProto)
	}
	return t
}

// Name returns "tls".
func (t *tlsTransport) Name() string { return "tls" }

// Listen opens a TCP listener on addr whose Accept returns only connections that completed the TLS
// handshake and proved the run secret. Every other connection is refused and reported (see
// TLSConfig.OnRefused) without disturbing the others.
func (t *tlsTransport) Listen(addr string) (net.Listener, error) {
	if t.err != nil {
		return nil, fmt.Errorf("tls listen %s: %w", addr, t.err)
	}
	l, err := t.tcp.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("tls listen %s: %w", addr, errors.Unwrap(err))
	}
	tl := &tlsListener{
		ln: l, t: t,
		slots: make(chan struct{}, maxHandshakes),
		ready: make(chan net.Conn, maxQueuedSessions),
	}
	tl.ctx, tl.cancel = context.WithCancel(context.Background())
	tl.quit = tl.ctx.Done()
	tl.wg.Add(1)
	go tl.run()
	return tl, nil
}

// Dial connects to addr over TCP, runs the TLS handshake and the exchange of proofs, and returns the
// connection once both ends are authenticated.
func (t *tlsTransport) Dial(ctx context.Context, addr string) (net.Conn, error) {
	if t.err != nil {
		return nil, fmt.Errorf("tls dial %s: %w", addr, t.err)
	}
	c, err := t.tcp.Dial(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("tls dial %s: %w", addr, errors.Unwrap(err))
	}
	under := &batchConn{Conn: c}
	tc := tls.Client(under, t.client)
	c.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout))
	stop := deadlineFromContext(ctx, c)
	err = tc.HandshakeContext(ctx)
	if err != nil {
		err = tlsHandshakeError(wroteToClosed(err, c), "listener")
	} else {
		err = auth.Dial(tc, tc.ConnectionState(), t.cfg.Auth.Secret)
	}
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err != nil {
		c.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("tls dial %s: %w", addr, err)
	}
	c.SetDeadline(time.Time{})
	return &batchedTLS{Conn: tc, under: under}, nil
}

// ListenSession starts accepting sessions on addr; each stream is a TLS connection of its own.
func (t *tlsTransport) ListenSession(addr string) (SessionListener, error) {
	l, err := t.Listen(addr)
	if err != nil {
		return nil, err
	}
	return listenSession(l, t.sessionNet()), nil
}

// DialSession opens a session to addr: one authenticated TLS connection for control now, one more per
// stream later.
func (t *tlsTransport) DialSession(ctx context.Context, addr string) (Session, error) {
	return dialSession(ctx, t.sessionNet(), addr)
}

func (t *tlsTransport) sessionNet() sessionNet {
	return sessionNet{name: "tls", dial: t.Dial}
}

// wroteToClosed turns a handshake that failed on writing into the listener's answer, when the listener
// had answered and closed before our first record went out. Over TCP the write succeeds and the
// handshake reads the answer; over the local path (a unix socket) the write fails with a broken pipe
// while the answer still waits to be read. So the first bytes left behind are read, and if they do not
// start a TLS record they are reported as TCP would have reported them.
func wroteToClosed(err error, c net.Conn) error {
	if !errors.Is(err, ErrBrokenPipe) && !errors.Is(err, ErrReset) {
		return err
	}
	var hdr [5]byte
	c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	n, _ := io.ReadFull(c, hdr[:])
	if n == 0 || (hdr[0] >= recordChangeCipherSpec && hdr[0] <= recordApplicationData) {
		return err
	}
	return tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake", RecordHeader: hdr}
}

// The content types of TLS records (RFC 8446, section 5.1).
const (
	recordChangeCipherSpec = 20
	recordApplicationData  = 23
)

// tlsHandshakeError names the cause of a failed TLS handshake with other (the "listener" or the
// "dialler").
func tlsHandshakeError(err error, other string) error {
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) {
		return fmt.Errorf("%w: the %s sent %q where a TLS record belongs", ErrPlaintext, other, rh.RecordHeader[:])
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrReset) {
		return fmt.Errorf("the %s hung up during the TLS handshake (is it plaintext, or does it not know us?): %w", other, ErrRefused)
	}
	if errors.Is(err, ErrAuth) {
		return err // our own check of the other end's certificate
	}
	// crypto/tls reports an alert from the other end as a *net.OpError "remote error" around an
	// unexported type; the certificate alerts say that the other end refused our certificate.
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" && strings.Contains(op.Err.Error(), "certificate") {
		return fmt.Errorf("%w: the %s refused our certificate: %v", ErrAuth, other, op.Err)
	}
	// Records that do not decrypt under this handshake's keys: the other end does not hold them, as
	// when a handshake recorded elsewhere is replayed.
	if errors.As(err, &op) && op.Op == "local error" &&
		(strings.Contains(op.Err.Error(), "bad record MAC") || strings.Contains(op.Err.Error(), "decrypt")) {
		return fmt.Errorf("%w: the %s's handshake does not match its keys (replayed or tampered): %v", ErrAuth, other, op.Err)
	}
	return fmt.Errorf("tls handshake: %w", err)
}

// tlsListener hands out TLS connections that completed the handshake and the exchange of proofs. Its
// accept goroutine (run) owns ln's Accept and starts one handshake goroutine per connection, at most
// maxHandshakes at once; a handshake goroutine owns its connection until it is queued on ready or
// closed. Close waits for all of them through wg.
type tlsListener struct {
	ln     net.Listener
	t      *tlsTransport
	slots  chan struct{}   // a token per handshake goroutine
	ctx    context.Context // ends when Close is called
	cancel context.CancelFunc
	quit   <-chan struct{} // ctx.Done()
	ready  chan net.Conn   // authenticated connections, for Accept
	wg     sync.WaitGroup

	closeOnce sync.Once
}

// run is the accept goroutine: it hands each new connection to a handshake goroutine (see
// acceptHandshakes).
func (l *tlsListener) run() {
	defer l.wg.Done()
	acceptHandshakes(l.ln, l.slots, l.quit, &l.wg, nil, l.handshake)
}

// handshake authenticates c and queues it, or refuses it and reports why.
func (l *tlsListener) handshake(c net.Conn) {
	c.SetDeadline(time.Now().Add(l.t.cfg.HandshakeTimeout))
	stop := context.AfterFunc(l.ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	under := &batchConn{Conn: c}
	tc := tls.Server(under, l.t.server)
	err := tc.Handshake()
	if err != nil {
		err = tlsHandshakeError(err, "dialler")
	} else if err = auth.Accept(tc, tc.ConnectionState(), l.t.cfg.Auth.Secret); err != nil && !errors.Is(err, ErrAuth) {
		err = fmt.Errorf("%w: no proof of the run secret: %v", ErrAuth, err)
	}
	// Detach the listener's cancellation before the connection is handed over: once it belongs to
	// its acceptor, closing the listener must not poison its deadline. A cancellation that already
	// fired means the listener is closing, and the connection goes with it.
	if !stop() && err == nil {
		c.Close()
		return
	}
	if err != nil {
		c.Close()
		select {
		case <-l.quit:
		default:
			reportRefused(l.t.cfg.Logger, l.t.cfg.OnRefused, "tls", c.RemoteAddr(), err)
		}
		return
	}
	c.SetDeadline(time.Time{})
	select {
	case l.ready <- &batchedTLS{Conn: tc, under: under}:
	case <-l.quit:
		c.Close()
	default:
		c.Close() // nobody accepts: refuse rather than hold it
	}
}

// Accept returns the next authenticated connection.
func (l *tlsListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.quit:
		return nil, fmt.Errorf("tls accept %s: %w", l.ln.Addr(), net.ErrClosed)
	}
}

// Addr returns the listener's address.
func (l *tlsListener) Addr() net.Addr { return l.ln.Addr() }

// Close stops the listener, ends the handshakes in progress, closes the connections nobody accepted
// and waits for its goroutines. It is idempotent and returns nil.
func (l *tlsListener) Close() error {
	l.closeOnce.Do(func() {
		l.cancel()
		l.ln.Close()
		l.wg.Wait()
		for {
			select {
			case c := <-l.ready:
				c.Close()
			default:
				return
			}
		}
	})
	return nil
}

// reportRefused tells onRefused, or else log, why an incoming connection was refused.
func reportRefused(log *slog.Logger, onRefused func(net.Addr, error), name string, remote net.Addr, err error) {
	if onRefused != nil {
		onRefused(remote, err)
		return
	}
	log.Warn(name+": refused an incoming connection", "remote", remote.String(), "err", err)
}

// Names of the transports that Select knows.
var Names = []string{"tcp", "tls", "quic"}

// Select returns the transport called name ("tcp", "tls" or "quic") with its defaults and, for tls
// and quic, the authentication a. tcp ignores a: it neither encrypts nor authenticates.
func Select(name string, a AuthConfig) (Transport, error) {
	return SelectTCP(name, a, TCPConfig{})
}

// SelectTCP is Select with the TCP settings of tcp and tls (ignored by quic).
func SelectTCP(name string, a AuthConfig, tcp TCPConfig) (Transport, error) {
	switch name {
	case "tcp":
		return NewTCP(tcp), nil
	case "tls", "quic":
		if err := a.Validate(); err != nil {
			return nil, fmt.Errorf("transport %s: %w", name, err)
		}
		if name == "tls" {
			return NewTLS(TLSConfig{Auth: a, TCP: tcp}), nil
		}
		return NewQUIC(QUICConfig{Auth: a}), nil
	}
	return nil, fmt.Errorf("transport %q: want tcp, tls or quic", name)
}
