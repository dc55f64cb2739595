// Command master runs a Concord master: the coordinator peers register with, which runs the
// micro-consensus of membership, topology, shared-state syncs and collectives, detects failed peers
// and serves a status page with Prometheus metrics.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/concord-ccl/concord/cmd/internal/runflag"
	"github.com/concord-ccl/concord/internal/logx"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/pccl/master/status"
)

func main() {
	if err := app().Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "master:", err)
		var ec cli.ExitCoder
		if errors.As(err, &ec) {
			os.Exit(ec.ExitCode())
		}
		os.Exit(1)
	}
}

func app() *cli.App {
	a := &cli.App{
		Name:  "master",
		Usage: "coordinate a Concord run: membership, ring topology, shared-state sync and failure detection",
		Description: "Peers connect to the master's --listen address. It accepts newcomers when the running\n" +
			"peers call UpdateTopology, aborts every collective of a peer that dies or hangs (heartbeat\n" +
			"timeout), elects the shared state and orders the ring from measured bandwidth. Peers that name\n" +
			"a group in their Hello form rings, epochs and collectives of their own. Each start draws a new\n" +
			"incarnation number, so epochs never repeat across restarts. From the link timings peers send\n" +
			"after every collective it keeps a delay matrix per group and diagnoses slow links, senders,\n" +
			"receivers and peers slow outside communication; slow links cost more in the next ring solve,\n" +
			"the ring is re-ordered around a clearly slow link on its own (--reorder), and chronic\n" +
			"stragglers can be evicted (--evict-stragglers-after). --gossip adds a gossip\n" +
			"failure detector that peers join (--gossip-join), and --guard-* check the contributions peers\n" +
			"report (--contribution-stats) before an AllReduce commences. A status page,\n" +
			"/status.json and Prometheus /metrics are served on --http. Stop it with SIGINT or SIGTERM.\n" +
			"Every flag can also be set through the environment variable shown next to it.",
		Flags: append(append(runflag.Transport(),
			&cli.StringFlag{Name: "listen", Value: "0.0.0.0:48148", EnvVars: []string{"CONCORD_LISTEN"},
				Usage: "address peers connect to (host:port)"},
			&cli.StringFlag{Name: "http", Value: "127.0.0.1:48180", EnvVars: []string{"CONCORD_HTTP"},
				Usage: "address of the status page and /metrics; empty disables it"},
			&cli.StringFlag{Name: "preset", Value: "lan", EnvVars: []string{"CONCORD_PRESET"},
				Usage: "timing preset: lan (heartbeat 250ms, gone after 1.5s) or wan (1s, gone after 6s)"},
			&cli.StringFlag{Name: "token", EnvVars: []string{"CONCORD_TOKEN"},
				Usage: "run token; peers with another token are refused"},
			&cli.IntFlag{Name: "min-peers", Value: 1, EnvVars: []string{"CONCORD_MIN_PEERS"},
				Usage: "collectives fail with ErrTooFewPeers while fewer peers are accepted"},
			&cli.DurationFlag{Name: "heartbeat-interval", EnvVars: []string{"CONCORD_HEARTBEAT_INTERVAL"},
				Usage: "how often peers send heartbeats", DefaultText: "from --preset"},
			&cli.DurationFlag{Name: "heartbeat-timeout", EnvVars: []string{"CONCORD_HEARTBEAT_TIMEOUT"},
				Usage: "silence after which a peer is declared gone and its collectives aborted", DefaultText: "from --preset"},
			&cli.DurationFlag{Name: "measure-duration", EnvVars: []string{"CONCORD_MEASURE_DURATION"},
				Usage: "time budget of one bandwidth test in OptimizeTopology", DefaultText: "500ms"},
			&cli.DurationFlag{Name: "solve-budget", EnvVars: []string{"CONCORD_SOLVE_BUDGET"},
				Usage: "time budget of the quick ring solve; a background search goes on", DefaultText: "200ms"},
			&cli.Float64Flag{Name: "slow-link-penalty", EnvVars: []string{"CONCORD_SLOW_LINK_PENALTY"},
				Usage: "factor by which a link diagnosed slow costs more in the ring solve, so the next OptimizeTopology avoids it", DefaultText: "10"},
			&cli.DurationFlag{Name: "slow-link-hold", EnvVars: []string{"CONCORD_SLOW_LINK_HOLD"},
				Usage: "how long a slow link keeps its penalty after it was last diagnosed", DefaultText: "10m"},
			&cli.IntFlag{Name: "evict-stragglers-after", EnvVars: []string{"CONCORD_EVICT_STRAGGLERS_AFTER"},
				Usage:       "kick a peer diagnosed as a slow sender, receiver or computer for this many collectives of its group; 0 never evicts",
				DefaultText: "0 (off)"},
			&cli.StringFlag{Name: "log-format", Value: "text", EnvVars: []string{"CONCORD_LOG_FORMAT"},
				Usage: "log format: text or json"},
			&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"CONCORD_LOG_LEVEL"},
				Usage: "log level: debug, info, warn or error"},
		), reorderFlags()...),
		Action: run,
	}
	a.Flags = append(a.Flags, switchFlags()...)
	return a
}

// switchFlags are the master's optional detectors and checks: gossip and the contribution guard.
func switchFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "gossip", EnvVars: []string{"CONCORD_GOSSIP"},
			Usage: "run a gossip failure detector (SWIM, over UDP and TCP) on this address (host:port; port 0 picks one, logged) " +
				"that peers join with --gossip-join: a peer the gossip group declares dead is kicked at once, even while its " +
				"connection to the master stays open; its timing follows --preset. Off by default: under the default lan preset " +
				"the heartbeat rule removes a hung peer as fast (1.5 s), and gossip nearly doubles an idle peer's CPU and bytes (docs/results/gossip.md)",
			DefaultText: "off"},
		&cli.BoolFlag{Name: "guard-non-finite", EnvVars: []string{"CONCORD_GUARD_NON_FINITE"},
			Usage: "contribution guard: refuse an AllReduce in which a peer's contribution holds NaN or infinity " +
				"(peers report their contributions with --contribution-stats)"},
		&cli.Float64Flag{Name: "guard-norm-factor", EnvVars: []string{"CONCORD_GUARD_NORM_FACTOR"},
			Usage:       "contribution guard: refuse an AllReduce in which a peer's contribution has a norm above this many times the median norm of the others' (above 1; 0: off)",
			DefaultText: "0 (off)"},
		&cli.BoolFlag{Name: "guard-exclude", EnvVars: []string{"CONCORD_GUARD_EXCLUDE"},
			Usage: "contribution guard: kick the peer whose contribution was refused, and the others retry without it; " +
				"without this flag the AllReduce fails for everyone with a local failure naming the offender"},
	}
}

// switches applies the flags of switchFlags to cfg, and returns the gossip configuration (nil: off).
func switches(cc *cli.Context, cfg *master.Config) *master.GossipConfig {
	cfg.Guard = master.GuardPolicy{RejectNonFinite: cc.Bool("guard-non-finite"), NormFactor: cc.Float64("guard-norm-factor"),
		Exclude: cc.Bool("guard-exclude")}
	addr := cc.String("gossip")
	if addr == "" {
		return nil
	}
	g := master.GossipLAN()
	if cc.String("preset") == "wan" {
		g = master.GossipWAN()
	}
	g.BindAddr = addr
	return &g
}

func run(cc *cli.Context) error {
	log, err := logx.New(os.Stderr, cc.String("log-format"), cc.String("log-level"))
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	var cfg master.Config
	switch cc.String("preset") {
	case "lan":
		cfg = master.LAN()
	case "wan":
		cfg = master.WAN()
	default:
		return cli.Exit(fmt.Sprintf("--preset %q: want lan or wan", cc.String("preset")), 2)
	}
	cfg.Token = cc.String("token")
	cfg.MinPeers = cc.Int("min-peers")
	if d := cc.Duration("heartbeat-interval"); d != 0 {
		cfg.HeartbeatInterval = d
	}
	if d := cc.Duration("heartbeat-timeout"); d != 0 {
		cfg.HeartbeatTimeout = d
	}
	cfg.MeasureDuration = cc.Duration("measure-duration")
	cfg.SolveBudget = cc.Duration("solve-budget")
	cfg.Diagnosis.Penalty = cc.Float64("slow-link-penalty")
	cfg.Diagnosis.PenaltyHold = cc.Duration("slow-link-hold")
	cfg.Diagnosis.EvictAfter = cc.Int("evict-stragglers-after")
	applyReorder(cc, &cfg)
	gossip := switches(cc, &cfg)
	if err := cfg.Validate(); err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if gossip != nil {
		if err := gossip.Validate(); err != nil {
			return cli.Exit("--gossip: "+err.Error(), 2)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tr, err := runflag.Select(cc, cc.String("listen"), log)
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	ln, err := tr.Listen(cc.String("listen"))
	if err != nil {
		return cli.Exit(fmt.Sprintf("listen: %v", err), 1)
	}
	srv := master.NewServer(master.ServerConfig{Config: cfg, Logger: log, Gossip: gossip})
	if gossip != nil {
		go func() {
			if addr, err := srv.GossipAddr(ctx); err == nil && addr != "" {
				log.Info("gossip listening: peers join with --gossip-join", "gossip", addr)
			}
		}()
	}
	if addr := cc.String("http"); addr != "" {
		hln, err := net.Listen("tcp", addr)
		if err != nil {
			ln.Close()
			return cli.Exit(fmt.Sprintf("listen --http: %v", err), 1)
		}
		hs := &http.Server{Handler: status.Handler(srv.Snapshot, nil), ReadHeaderTimeout: 5 * time.Second}
		go hs.Serve(hln)
		defer hs.Close()
		log.Info("status page", "url", "http://"+hln.Addr().String()+"/")
	}
	log.Info("master listening", "addr", ln.Addr().String(), "transport", tr.Name(), "preset", cc.String("preset"),
		"heartbeat_timeout", cfg.HeartbeatTimeout, "min_peers", cfg.MinPeers)
	if err := srv.Serve(ctx, ln); err != nil {
		return cli.Exit(err.Error(), 1)
	}
	log.Info("master stopped")
	return nil
}
