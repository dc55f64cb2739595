package pccl

import "github.com/concord-ccl/concord/internal/transport"

// Transport opens the connections to the master and between peers (Config.Transport): TCP by
// default; TLS or QUIC, both authenticated by a run secret, for peers across untrusted networks; or a
// host of an in-memory Network in tests. The master must listen on the same kind of transport, with
// the same secret. A Transport is safe for concurrent use; one value may serve every Communicator of
// a process.
type Transport = transport.Transport

// TCPConfig tunes the TCP transport; the zero value works.
type TCPConfig = transport.TCPConfig

// NewTCP returns the TCP transport: plaintext, unauthenticated (the run token only tells runs apart),
// over a unix socket to a peer on the same host where it can. An invalid cfg makes every Listen and
// Dial fail with the error of cfg.Validate.
func NewTCP(cfg TCPConfig) Transport { return transport.NewTCP(cfg) }

// AuthConfig says how the TLS and QUIC transports authenticate: Secret, the run secret every peer and
// the master share (at least 16 random bytes; required), and optionally the run's CA and this end's
// certificate (CAFile, CertFile, KeyFile), which both ends then check too.
type AuthConfig = transport.AuthConfig

// TLSConfig configures the TLS transport: AuthConfig in Auth (required), the TCP settings beneath,
// the handshake's deadline (default 10 s) and what happens to refused connections (default: a
// warning on slog.Default()).
type TLSConfig = transport.TLSConfig

// QUICConfig configures the QUIC transport: AuthConfig in Auth (required), the flow-control windows,
// UDP buffers, keep-alive, idle and handshake timeouts, and what happens to refused connections; every
// zero field takes the default its comment gives.
type QUICConfig = transport.QUICConfig

// Errors of the TLS and QUIC transports, wrapped by the errors of Connect and of the links when the
// other end is not of this run. They come with ErrMasterLost (Connect), or ErrPeerLeft (a link).
var (
	// ErrAuth: the other end could not prove that it holds the run secret, or refused this end's
	// proof (a wrong secret, or a certificate the run's CA did not issue).
	ErrAuth = transport.ErrAuth
	// ErrPlaintext: the other end does not speak TLS (a TCP master for a TLS peer, say).
	ErrPlaintext = transport.ErrPlaintext
	// ErrWeakSecret: the run secret is missing or shorter than 16 bytes.
	ErrWeakSecret = transport.ErrWeakSecret
)

// NewTLS returns the TLS transport: TLS 1.3 over TCP, each connection proving in both directions,
// bound to its TLS session, that its ends hold cfg.Auth.Secret. It starts nothing. An invalid cfg
// makes every Listen and Dial fail with the error of cfg.Validate (which wraps ErrWeakSecret for a
// short secret): call cfg.Validate first for a clear error at start-up.
func NewTLS(cfg TLSConfig) Transport { return transport.NewTLS(cfg) }

// NewQUIC returns the QUIC transport: every connection is a QUIC connection of its own (TLS 1.3),
// authenticated as NewTLS's, so that the frames striped over a pool (Config.PoolSize) travel on as
// many congestion windows and flows. Over QUIC a peer behind NAT can be reached by a punched path
// (the master tells the peers how). It starts nothing; an invalid cfg makes every Listen and Dial fail
// with the error of cfg.Validate.
func NewQUIC(cfg QUICConfig) Transport { return transport.NewQUIC(cfg) }

// SelectTransport returns the transport called name, "tcp", "tls" or "quic", with its defaults and,
// for tls and quic, the authentication auth (tcp ignores it). It fails on another name and, for tls
// and quic, when auth is invalid (a short secret wraps ErrWeakSecret).
func SelectTransport(name string, auth AuthConfig) (Transport, error) {
	return transport.Select(name, auth)
}

// Network is an in-memory network with per-link latency, bandwidth, loss, black holes and partitions,
// for deterministic tests of whole groups in one process.
type Network = transport.Network

// LinkConfig configures one directed link of a Network.
type LinkConfig = transport.LinkConfig

// NewNetwork returns an empty in-memory network.
func NewNetwork() *Network { return transport.NewNetwork() }
