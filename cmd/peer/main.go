// Command peer runs Concord peers.
//
//	peer demo                      a master and 4 peer processes on this machine train an MLP on
//	                               Fashion-MNIST with DiLoCo while peers are killed and replaced
//	peer run --master ADDR         one peer of a real run: a loop of AllReduces with retry
//	peer train --master ADDR       one peer of a real training run (ddp, diloco or async-diloco)
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/concord-ccl/concord/internal/auth"
	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/internal/transport"
)

func main() {
	cluster.Main(map[string]func() int{roleWorker: workerMain})
	if err := app().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		var ec cli.ExitCoder
		if errors.As(err, &ec) {
			os.Exit(ec.ExitCode())
		}
		os.Exit(1)
	}
}

func app() *cli.App {
	return &cli.App{
		Name:  "peer",
		Usage: "run Concord peers: a local demo with churn, or one peer of a real run",
		Description: "Concord keeps training going while peers die and join: collectives abort within a round\n" +
			"trip, survivors re-wire and retry, newcomers get the shared state from their peers.\n" +
			"Every flag can also be set through the environment variable shown next to it.",
		Commands: []*cli.Command{demoCommand(), runCommand(), trainCommand()},
	}
}

// commonFlags are the flags of a peer that joins a master.
func commonFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "master", Required: true, EnvVars: []string{"CONCORD_MASTER"},
			Usage: "master address host:port"},
		&cli.StringFlag{Name: "token", EnvVars: []string{"CONCORD_TOKEN"}, Usage: "run token"},
		&cli.StringFlag{Name: "transport", Value: "tcp", EnvVars: []string{"CONCORD_TRANSPORT"},
			Usage: "tcp (plaintext), tls (TLS 1.3 over TCP) or quic, as the master's; tls and quic need the run secret"},
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
		&cli.StringFlag{Name: "listen", Value: "0.0.0.0:0", EnvVars: []string{"CONCORD_PEER_LISTEN"},
			Usage: "address ring neighbours connect to (host:port; port 0 picks one)"},
		&cli.StringFlag{Name: "advertise", EnvVars: []string{"CONCORD_ADVERTISE"},
			Usage: "address neighbours should dial, if not the listen address (e.g. behind NAT)"},
		&cli.StringFlag{Name: "site", EnvVars: []string{"CONCORD_SITE"},
			Usage: "datacenter or region of this peer, used to order the ring"},
		&cli.StringSliceFlag{Name: "nics", EnvVars: []string{"CONCORD_NICS"},
			Usage: "network interfaces (names or IPv4 addresses) this peer uses inside its site, in rail order, comma-separated; with --site the collectives inside the site run on them (the intra-site tier, with hot repair)"},
		&cli.StringFlag{Name: "preset", Value: "lan", EnvVars: []string{"CONCORD_PRESET"},
			Usage: "connection preset: lan (1 connection per neighbour) or wan (4, more patience)"},
		&cli.StringFlag{Name: "log-format", Value: "text", EnvVars: []string{"CONCORD_LOG_FORMAT"},
			Usage: "log format: text or json"},
		&cli.StringFlag{Name: "log-level", Value: "warn", EnvVars: []string{"CONCORD_LOG_LEVEL"},
			Usage: "log level: debug, info, warn or error"},
	}
}

// transportFromFlags builds the transport named by --transport with the run secret and CA flags.
func transportFromFlags(cc *cli.Context) (transport.Transport, error) {
	secret, err := auth.LoadSecret(cc.String("secret"), cc.String("secret-file"))
	if err != nil {
		return nil, fmt.Errorf("--secret: %w", err)
	}
	return transport.SelectTCP(cc.String("transport"), transport.AuthConfig{
		Secret: secret, CAFile: cc.String("tls-ca"), CertFile: cc.String("tls-cert"), KeyFile: cc.String("tls-key"),
	}, transport.TCPConfig{DisableLocal: cc.Bool("no-local")})
}
