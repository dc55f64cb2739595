// Package runflag holds what both commands, master and peer, read the same way: the transport and
// its authentication, and the logger.
package runflag

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/urfave/cli/v2"

	"github.com/concord-ccl/concord/internal/auth"
	"github.com/concord-ccl/concord/internal/transport"
)

// Transport returns the flags that choose the transport and authenticate the run.
func Transport() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "transport", EnvVars: []string{"CONCORD_TRANSPORT"},
			Usage:       "tcp (plaintext), tls (TLS 1.3 over TCP) or quic, the same on the master and every peer; tls and quic need the run secret (or a CA)",
			DefaultText: "tls with a run secret or CA, else tcp"},
		&cli.StringFlag{Name: "secret", EnvVars: []string{"CONCORD_SECRET"},
			Usage: "run secret for tls and quic: at least 16 random bytes (e.g. `openssl rand -hex 32`); prefer --secret-file"},
		&cli.StringFlag{Name: "secret-file", EnvVars: []string{"CONCORD_SECRET_FILE"},
			Usage: "file holding the run secret (a trailing newline is ignored)"},
		&cli.StringFlag{Name: "tls-ca", EnvVars: []string{"CONCORD_TLS_CA"},
			Usage: "PEM file of the run's CA: every end must then present a certificate it issued"},
		&cli.StringFlag{Name: "tls-cert", EnvVars: []string{"CONCORD_TLS_CERT"}, Usage: "PEM certificate issued by --tls-ca"},
		&cli.StringFlag{Name: "tls-key", EnvVars: []string{"CONCORD_TLS_KEY"}, Usage: "PEM private key of --tls-cert"},
		&cli.BoolFlag{Name: "no-local", EnvVars: []string{"CONCORD_NO_LOCAL"},
			Usage: "keep tcp and tls on TCP between processes of one host, instead of the unix socket each TCP listener also opens"},
	}
}

// Select builds the transport the flags of Transport name. With no --transport it is tls when a run
// secret or CA is given, else tcp. Plaintext tcp towards an address that is not loopback (the master's
// for a peer, the listen address for the master) is logged as a warning that names the flag.
func Select(cc *cli.Context, addr string, log *slog.Logger) (transport.Transport, error) {
	secret, err := auth.LoadSecret(cc.String("secret"), cc.String("secret-file"))
	if err != nil {
		return nil, fmt.Errorf("--secret: %w", err)
	}
	a := transport.AuthConfig{Secret: secret, CAFile: cc.String("tls-ca"), CertFile: cc.String("tls-cert"), KeyFile: cc.String("tls-key")}
	name := cc.String("transport")
	if name == "" {
		name = "tcp"
		if len(secret) > 0 || a.CAFile != "" {
			name = "tls"
		}
	}
	tr, err := transport.SelectTCP(name, a, transport.TCPConfig{DisableLocal: cc.Bool("no-local")})
	if err != nil {
		return nil, err
	}
	if name == "tcp" && !loopback(addr) {
		log.Warn("plaintext TCP beyond this host: the run token and every byte travel in clear; give every machine the run secret (--secret-file, CONCORD_SECRET_FILE) for TLS, or --transport quic",
			"addr", addr)
	}
	return tr, nil
}

// loopback reports whether addr (host:port) names this host's loopback.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
