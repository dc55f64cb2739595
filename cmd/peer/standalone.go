package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/concord-ccl/concord/cmd/internal/runflag"
	"github.com/concord-ccl/concord/diloco"
	"github.com/concord-ccl/concord/internal/logx"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/rings"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:  "run",
		Usage: "join a master and run a loop of checked AllReduces with retry (one peer of a real run)",
		Description: "Every step syncs a step counter as shared state and AllReduces --size bytes; the result is\n" +
			"checked element by element. On a peer failure the step is re-wired and retried. Runs for\n" +
			"--steps steps or until SIGINT.",
		Flags: append(commonFlags(),
			&cli.IntFlag{Name: "size", Value: 16 << 20, EnvVars: []string{"CONCORD_SIZE"}, Usage: "bytes per AllReduce"},
			&cli.Uint64Flag{Name: "steps", Value: 1000, EnvVars: []string{"CONCORD_STEPS"}, Usage: "steps to run"},
			&cli.StringFlag{Name: "quant", Value: "none", EnvVars: []string{"CONCORD_QUANT"},
				Usage: "encoding of the AllReduce on the wire, the same on every peer: none, minmax-u8 or minmax-u16 (the all-gather), " +
					"minmax-u8-both or minmax-u16-both (every hop of both phases); results are then checked within the encoding's error bound"},
		),
		Action: func(cc *cli.Context) error {
			q, err := rings.ParseQuant(cc.String("quant"))
			if err != nil {
				return cli.Exit(fmt.Sprintf("--quant: %v", err), 2)
			}
			return standalone(cc, func(ctx context.Context, comm *pccl.Communicator, leaving func() bool, emit func(event)) error {
				steps := cc.Uint64("steps")
				lc := loopConfig{size: cc.Int("size"), quant: q, stopAt: func() uint64 { return steps }, leaving: leaving}
				return allreduceLoop(ctx, comm, lc, emit, comm.Logger())
			})
		},
	}
}

func trainCommand() *cli.Command {
	return &cli.Command{
		Name:  "train",
		Usage: "join a master and train the Fashion-MNIST MLP (one peer of a real multi-machine run)",
		Description: "Every peer of the run uses the same --trainer, --h, --seed and --steps. Newcomers get the\n" +
			"model from their peers. --data-dir reads the full Fashion-MNIST IDX files; otherwise the\n" +
			"embedded subset is used.",
		Flags: append(commonFlags(),
			&cli.StringFlag{Name: "trainer", Value: "diloco", EnvVars: []string{"CONCORD_TRAINER"},
				Usage: "ddp, diloco, async-diloco or streaming-diloco"},
			&cli.IntFlag{Name: "inner-steps", Value: 50, EnvVars: []string{"CONCORD_H"}, Usage: "H: DiLoCo inner steps per outer step"},
			&cli.IntFlag{Name: "batch", Value: 64, EnvVars: []string{"CONCORD_BATCH"}, Usage: "minibatch size"},
			&cli.IntFlag{Name: "steps", Value: 100, EnvVars: []string{"CONCORD_STEPS"}, Usage: "outer steps of the run"},
			&cli.Uint64Flag{Name: "seed", EnvVars: []string{"CONCORD_SEED"}, Usage: "model seed (same on every peer)"},
			&cli.StringFlag{Name: "data-dir", EnvVars: []string{"CONCORD_DATA_DIR"},
				Usage: "directory of the Fashion-MNIST IDX files (e.g. /usr/share/datasets/fashion-mnist)"},
			&cli.IntFlag{Name: "fragments", Value: 4, EnvVars: []string{"CONCORD_FRAGMENTS"},
				Usage: "streaming-diloco: fragments the parameters sync in, one every --inner-steps/--fragments steps (must divide --inner-steps)"},
			&cli.IntFlag{Name: "sync-delay", Value: 0, EnvVars: []string{"CONCORD_SYNC_DELAY"},
				Usage: "streaming-diloco: inner steps a fragment's sync overlaps before it is mixed in (0 to --inner-steps/--fragments)"},
			&cli.Float64Flag{Name: "mix", Value: 0, EnvVars: []string{"CONCORD_MIX"},
				Usage: "streaming-diloco: weight of the local parameters when a synced fragment is mixed in, in [0, 1)"},
			&cli.StringFlag{Name: "compress", Value: "f32", EnvVars: []string{"CONCORD_COMPRESS"},
				Usage: "streaming-diloco: outer-gradient values sent as f32, int8 or int4 (with error feedback)"},
			&cli.Float64Flag{Name: "topk", Value: 0, EnvVars: []string{"CONCORD_TOPK"},
				Usage: "streaming-diloco: fraction of the outer gradient's elements sent, largest first (0: all)"},
		),
		Action: func(cc *cli.Context) error {
			kind, err := diloco.ParseKind(cc.String("trainer"))
			if err != nil {
				return cli.Exit(err.Error(), 2)
			}
			values, err := diloco.ParseValueBits(cc.String("compress"))
			if err != nil {
				return cli.Exit(err.Error(), 2)
			}
			shape := diloco.TrainerConfig{Kind: kind, H: cc.Int("inner-steps"), Fragments: cc.Int("fragments"),
				SyncDelay: cc.Int("sync-delay"), Mix: float32(cc.Float64("mix")),
				Compression: diloco.Compression{Values: values, TopK: cc.Float64("topk")}}
			if err := shape.Validate(); err != nil {
				return cli.Exit(err.Error(), 2)
			}
			train, test, err := diloco.LoadEmbedded()
			if dir := cc.String("data-dir"); dir != "" {
				train, test, err = diloco.LoadDir(dir)
			}
			if err != nil {
				return cli.Exit(fmt.Sprintf("data: %v", err), 1)
			}
			return standalone(cc, func(ctx context.Context, comm *pccl.Communicator, leaving func() bool, emit func(event)) error {
				tc := diloco.TrainerConfig{Kind: kind, H: cc.Int("inner-steps"), BatchSize: cc.Int("batch"), Seed: cc.Uint64("seed"),
					Steps: cc.Int("steps"), Logger: comm.Logger(), Leave: leaving,
					Fragments: shape.Fragments, SyncDelay: shape.SyncDelay, Mix: shape.Mix, Compression: shape.Compression,
					Progress: func(p diloco.Progress) {
						emit(event{Event: "step", Step: p.Step, Loss: p.Loss, Rank: p.Rank, World: p.World, Rev: p.Revision,
							Aborts: p.Aborts, Joins: p.Joins, State: stateHash(p.Digest)})
					}}
				sum, err := diloco.Run(ctx, comm, tc, train, test)
				if errors.Is(err, diloco.ErrLeft) {
					emit(event{Event: "left", Step: sum.Steps, Rev: sum.Digest.Revision, Aborts: sum.Aborts, Joins: sum.Joins})
					return errLeft
				}
				if err != nil {
					return err
				}
				fmt.Printf("\ntrained %d outer steps: test accuracy %.4f, state %s\n", sum.Steps, sum.TestAccuracy, stateHash(sum.Digest))
				return nil
			})
		},
	}
}

// standalone connects to the master named by the flags and runs body, printing a progress line. A peer
// that the master removes (a partition, a long silence) connects again as a newcomer by itself, with
// backoff, and body runs again, fetching the group's state at its first sync; it gives up only on what
// a retry cannot fix, such as a wrong token, each named in one line.
//
// The first SIGTERM or SIGINT, or a preemption notice (--preempt-notice), makes body leave the group
// at its next membership step (leaving reports true), so that the others go on without an abort; a
// second signal, or --leave-timeout without a safe point, stops it at once: body's context ends, and
// a call still waiting for the master stopGrace later (an unreachable master) is failed by closing
// the communicator.
func standalone(cc *cli.Context, body func(ctx context.Context, comm *pccl.Communicator, leaving func() bool, emit func(event)) error) error {
	log, err := logx.New(os.Stderr, cc.String("log-format"), cc.String("log-level"))
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	var cfg pccl.Config
	switch cc.String("preset") {
	case "lan":
		cfg = pccl.LAN()
	case "wan":
		cfg = pccl.WAN()
	default:
		return cli.Exit(fmt.Sprintf("--preset %q: want lan or wan", cc.String("preset")), 2)
	}
	cfg.Master, cfg.Token, cfg.Site, cfg.Logger = cc.String("master"), cc.String("token"), cc.String("site"), log
	cfg.ListenAddr, cfg.AdvertiseAddr = cc.String("listen"), cc.String("advertise")
	if cfg.Transport, err = runflag.Select(cc, cfg.Master, log); err != nil {
		return cli.Exit(err.Error(), 2)
	}
	cfg.NICs = cc.StringSlice("nics")
	if err := peerSwitches(cc, &cfg); err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if err := cfg.Validate(); err != nil {
		return cli.Exit(err.Error(), 2)
	}
	notice, err := newPreemptWatch(cc.String("preempt-notice"), cc.Duration("preempt-poll"))
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	ctx, cancel := context.WithCancel(cc.Context)
	defer cancel()
	leave := newLeaver(ctx, cancel, notice, cc.Duration("leave-timeout"))
	defer leave.stop()
	fmt.Fprintf(os.Stderr, "connecting to %s (waiting to be accepted by the running peers)...\n", cfg.Master)
	start := time.Now()
	rc := pccl.RejoinConfig{
		OnRejoin: func(err error, n int) {
			fmt.Fprintf(os.Stderr, "\nremoved from the run (%v); joining again as a newcomer (rejoin %d)\n", err, n)
		},
		OnConnectError: func(err error, n int) {
			fmt.Fprintf(os.Stderr, "connecting failed (%v); trying again (%d)\n", err, n)
		},
	}
	jsonOut := json.NewEncoder(os.Stdout)
	err = pccl.Rejoin(ctx, cfg, rc, func(ctx context.Context, comm *pccl.Communicator, rejoins int) error {
		defer comm.CloseAfter(ctx, stopGrace)()
		fmt.Fprintf(os.Stderr, "accepted as peer %d: rank %d of %d\n", comm.ID(), comm.Rank(), comm.WorldSize())
		return body(ctx, comm, leave.requested, func(e event) {
			if cc.Bool("json") {
				e.Time, e.Rejoins = time.Now().UnixNano(), rejoins
				jsonOut.Encode(e)
			}
			switch e.Event {
			case "sync":
			case "left":
				fmt.Fprintf(os.Stderr, "\nleft the group at step %d (%s)\n", e.Step, leave.why())
			case "done":
				fmt.Fprintf(os.Stderr, "\ndone: step %d, world %d, revision %d, aborts %d, joins %d, rejoins %d, state %s\n",
					e.Step, e.World, e.Rev, e.Aborts, e.Joins, rejoins, e.State)
			default:
				fmt.Fprintf(os.Stderr, "\r[%5s] step %5d  world %d  rank %d  revision %5d  loss %.3f  aborts %d  joins %d   ",
					time.Since(start).Truncate(time.Second), e.Step, e.World, e.Rank, e.Rev, e.Loss, e.Aborts, e.Joins)
			}
		})
	})
	fmt.Fprintln(os.Stderr)
	switch {
	case err == nil, errors.Is(err, errLeft):
		return nil
	case errors.Is(err, pccl.ErrRefused):
		return cli.Exit(fmt.Sprintf("refused by the master, not retrying: %v", err), 1)
	case ctx.Err() != nil:
		return cli.Exit("stopped: "+leave.why(), 1)
	}
	return cli.Exit(err.Error(), 1)
}

// stopGrace is how long a peer that stops at once lets its calls end by their context before it
// closes its communicator.
const stopGrace = 2 * time.Second

// peerSwitches applies the flags that switch optional parts on: the peer group, gossip and the
// contribution statistics.
func peerSwitches(cc *cli.Context, cfg *pccl.Config) error {
	g := cc.Uint64("group")
	if g > math.MaxUint32 {
		return fmt.Errorf("--group %d: a peer group is a 32-bit id", g)
	}
	cfg.Group = uint32(g)
	cfg.ContributionStats = cc.Bool("contribution-stats")
	cfg.GossipJoin = cc.String("gossip-join")
	if cfg.GossipJoin == "" {
		if cc.String("gossip-listen") != "" {
			return errors.New("--gossip-listen needs --gossip-join")
		}
		return nil
	}
	cfg.Gossip = pccl.GossipLAN()
	if cc.String("preset") == "wan" {
		cfg.Gossip = pccl.GossipWAN()
	}
	cfg.Gossip.BindAddr = cc.String("gossip-listen")
	if cfg.Gossip.BindAddr == "" {
		cfg.Gossip.BindAddr = net.JoinHostPort(localHost(cfg.ListenAddr, cfg.Master), "0")
	}
	return nil
}

// localHost returns the host this peer's gossip member binds by default: the host of listen when it
// names one address, else the local address of the route to master (loopback for a master on this
// host).
func localHost(listen, master string) string {
	if h, _, err := net.SplitHostPort(listen); err == nil && h != "" {
		if ip, err := netip.ParseAddr(h); err != nil || !ip.IsUnspecified() {
			return h
		}
	}
	host, port, err := net.SplitHostPort(master)
	if err != nil {
		return "127.0.0.1"
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
		return host
	}
	u, err := net.Dial("udp", net.JoinHostPort(host, port))
	if err != nil {
		return "127.0.0.1"
	}
	defer u.Close()
	return u.LocalAddr().(*net.UDPAddr).IP.String()
}
