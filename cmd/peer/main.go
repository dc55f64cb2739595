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
	"time"

	"github.com/urfave/cli/v2"

	"github.com/concord-ccl/concord/cmd/internal/runflag"
	"github.com/concord-ccl/concord/internal/cluster"
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
	return append(runflag.Transport(),
		&cli.StringFlag{Name: "master", Required: true, EnvVars: []string{"CONCORD_MASTER"},
			Usage: "master address host:port"},
		&cli.StringFlag{Name: "token", EnvVars: []string{"CONCORD_TOKEN"}, Usage: "run token"},
		&cli.StringFlag{Name: "listen", EnvVars: []string{"CONCORD_PEER_LISTEN"},
			Usage:       "address ring neighbours connect to (host:port; port 0 picks one; 0.0.0.0 or [::] for every interface)",
			DefaultText: "the address of this host's route to the master, any port"},
		&cli.StringFlag{Name: "advertise", EnvVars: []string{"CONCORD_ADVERTISE"},
			Usage:       "address ring neighbours dial (host or host:port; a host alone takes the listen port), e.g. a public address behind NAT with the port forwarded",
			DefaultText: "the listen address; for a wildcard, the address of the route to the master"},
		&cli.StringFlag{Name: "site", EnvVars: []string{"CONCORD_SITE"},
			Usage: "datacenter or region of this peer, used to order the ring"},
		&cli.StringSliceFlag{Name: "nics", EnvVars: []string{"CONCORD_NICS"},
			Usage: "network interfaces (names or IPv4 addresses) this peer uses inside its site, in rail order, comma-separated; with --site the collectives inside the site run on them (the intra-site tier, with hot repair)"},
		&cli.StringFlag{Name: "preset", Value: "lan", EnvVars: []string{"CONCORD_PRESET"},
			Usage: "connection preset: lan (1 connection per neighbour) or wan (4, more patience)"},
		&cli.StringFlag{Name: "preempt-notice", EnvVars: []string{"CONCORD_PREEMPT_NOTICE"},
			Usage: "a file, or an http(s) URL polled every --preempt-poll (a cloud's metadata endpoint), that announces this machine's preemption: once the file exists and is not empty, or the URL answers 200 with a body other than \"false\", the peer leaves the group at its next membership step, as on SIGTERM"},
		&cli.DurationFlag{Name: "preempt-poll", Value: time.Second, EnvVars: []string{"CONCORD_PREEMPT_POLL"},
			Usage: "how often --preempt-notice is polled"},
		&cli.DurationFlag{Name: "leave-timeout", Value: 30 * time.Second, EnvVars: []string{"CONCORD_LEAVE_TIMEOUT"},
			Usage: "after SIGTERM or a preemption notice, how long to wait for a membership step to leave at before stopping at once"},
		&cli.Uint64Flag{Name: "group", EnvVars: []string{"CONCORD_GROUP"},
			Usage: "peer group to join (a 32-bit id): shared state and collectives span one group, each with its own ring, under the one master"},
		&cli.StringFlag{Name: "gossip-join", EnvVars: []string{"CONCORD_GOSSIP_JOIN"},
			Usage:       "the master's gossip address (its --gossip, as it logs it): this peer joins the gossip failure detector, so that the master kicks it at once if it hangs",
			DefaultText: "no gossip"},
		&cli.StringFlag{Name: "gossip-listen", EnvVars: []string{"CONCORD_GOSSIP_LISTEN"},
			Usage:       "address this peer's gossip member binds (UDP and TCP, host:port; port 0 picks one) with --gossip-join",
			DefaultText: "the host of --listen, or of the route to the master, any port"},
		&cli.BoolFlag{Name: "contribution-stats", EnvVars: []string{"CONCORD_CONTRIBUTION_STATS"},
			Usage: "report the norm and finiteness of this peer's contribution to every f32 or f64 AllReduce, for a master that runs a contribution guard (--guard-*); one pass over the buffer"},
		&cli.BoolFlag{Name: "json", EnvVars: []string{"CONCORD_JSON"},
			Usage: "print every step as one JSON object per line on stdout (step, world, rank, revision, state hash, aborts, joins, rejoins)"},
		&cli.StringFlag{Name: "log-format", Value: "text", EnvVars: []string{"CONCORD_LOG_FORMAT"},
			Usage: "log format: text or json"},
		&cli.StringFlag{Name: "log-level", Value: "warn", EnvVars: []string{"CONCORD_LOG_LEVEL"},
			Usage: "log level: debug, info, warn or error"},
	)
}
