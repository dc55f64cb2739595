// Command scale measures how Concord's master behaves as the number of peers grows.
//
//	go run ./bench/scale --simulated 10000
//
// Simulated mode drives the master with simulated peers, without peer processes:
//
//   - In process, through the state machine (master.Machine), at 100, 1,000 and 10,000 peers (the
//     sizes up to --simulated, and --simulated itself): every peer joins, is wired in, then the steady
//     state runs for --cycles rounds: a heartbeat interval (every peer's heartbeat, four ticks), an
//     ArePeersPending vote, a collective (Initiate and Done, with a link timing), an UpdateTopology
//     with nothing to do, a step report and a shared-state sync. Only the time spent inside Step is
//     measured (the simulated peers react between batches, off the clock), with the heap allocations
//     made meanwhile. Then the operations: a collective, a sync, a newcomer's admission, a peer's death
//     mid-collective through the re-wired ring, and the rendering of the status page.
//   - Over real sockets on loopback, through the server, with as many control connections as the
//     file-descriptor limit allows, up to --sockets (2,000): every connection joins and is wired in,
//     then collectives and heartbeats run over TCP. The result says how far it got and why it
//     stopped.
//
// The result's event_cost_ratio is the steady-state cost per event at the largest size over that at
// the smallest; a master whose per-event cost does not grow with the number of peers keeps it near 1.
// It is compared to the limit of 2. Every run also checks the protocol's outcomes (every peer
// accepted, every collective completed with every peer's Done, a death aborted and re-wired): a run
// whose outcomes are wrong fails.
//
// Progress goes to stderr; the JSON result is the last line on stdout. Timings taken on a loaded
// machine are noisy; the ratio is more robust than the absolute figures.
//
// The recovery mode runs real peer processes on loopback:
//
//	go run ./bench/scale --peers 4,8,16,32,64
//
// For each number of peers it starts a master (LAN preset) and the peers, which loop like a training
// job with small buffers (--size, 1 MiB, all-reduced; --state, 1 MiB of shared state synced before
// every AllReduce). Kill rounds (--kills per size, within --budget): SIGKILL one peer while the
// group's AllReduce calls are in flight; measure the time until every survivor's call failed
// (abort_ms), the part of it after a survivor first saw the victim's sockets close
// (abort_after_gone_ms), and the time until every survivor completed its next AllReduce
// (resume_ms), split into the protocol (from the error to the start of that AllReduce: topology
// update, wiring, votes) and the data transfer (the AllReduce itself). Then a replacement joins;
// its admission (the members' UpdateTopology) and its state sync (the newcomer's first
// SyncSharedState, which fetches the state) are measured the same way. The result's
// abort_p50_ratio and resume_p50_ratio are the p50 at the largest size over that at the smallest,
// compared to the limit of 1.2.
//
// The same recovery in virtual time (virtual.go):
//
//	go run ./bench/scale --virtual --peers 4,16,64,256,1024 --size 64KiB
//
// Every size runs in a testing/synctest bubble of its own (stress/sim's cluster): the master and all
// the peers, their real code, in this process on the in-memory network, across three sites 50, 100
// and 150 ms apart (round trip; 1 ms inside a site), 1 Gbit/s per link, the WAN presets, peers placed
// in the sites in turn (each names its site, so the ring groups them). Time is virtual: CPU work takes
// none, so 1,024 peers on two cores measure the protocol's round trips, not the machine. --kills
// rounds (5), each: every member starts an AllReduce of --size, 100 to 200 ms later a peer picked
// with --seed crashes (its host's connections are reset at once, as a SIGKILL's are); rewired_ms is
// from the crash until every survivor's retry started on the new ring (after the UpdateTopology that
// dropped it), resume_ms until every retry completed. Then a newcomer in the victim's site registers
// and the members admit it (admit_ms: from its Connect until the last member's UpdateTopology
// returned), and everyone syncs the shared state (--state), which the newcomer fetches (join_ms: its
// sync call). p50 and p99 per size (nearest rank: with fewer than 100 rounds p99 is the maximum),
// ratios of the p50s to the smallest size, and the master's real CPU per crash, admission and join,
// from the CPU profile's samples of its goroutines, net of its heartbeat load (priced by an idle
// window of 10 virtual seconds). Targets: rewired_ms p99 at 64 peers <= 1,000 ms, p50 ratios 64/4 <=
// 1.2 and 1024/4 <= 2. A run of the five sizes takes minutes of wall time, nearly all of it at 1,024
// peers, whose flat ring moves two million frames per AllReduce.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/concord-ccl/concord/bench/internal/measure"
	supervise "github.com/concord-ccl/concord/internal/cluster"
)

// targetEventCostRatio is the limit event_cost_ratio is compared to.
const targetEventCostRatio = 2.0

// simSizes are the sizes measured in process, up to --simulated.
var simSizes = []int{100, 1000, 10000}

// simulatedResult is the JSON result of the simulated mode.
type simulatedResult struct {
	Mode           string      `json:"mode"`
	Note           string      `json:"note"`
	Sizes          []simResult `json:"in_process"`
	EventCostRatio float64     `json:"event_cost_ratio"`
	RatioOf        string      `json:"event_cost_ratio_of"`
	RatioLimit     float64     `json:"event_cost_ratio_limit"`
	RatioOK        bool        `json:"event_cost_ratio_ok"`
	WallRatio      float64     `json:"wall_event_cost_ratio"` // the same in wall time, which counts the waits for a CPU
	AllocRatio     float64     `json:"alloc_per_event_ratio"`
	Loopback       *loopResult `json:"loopback,omitempty"`
}

func main() {
	supervise.Main(roles)
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

// options are the command line.
type options struct {
	peers      []int         // recovery mode: peer counts
	simulated  int           // simulated mode: the largest number of simulated peers
	cycles     int           // steady-state cycles per size; 0 picks about 300,000 events per size
	sockets    int           // loopback connections at most; 0 skips the loopback part
	timeout    time.Duration // bound on the whole run
	cpuprofile string        // CPU profile file, if any
	bytes      int           // recovery mode: AllReduce buffer per peer
	stateBytes int           // recovery mode: shared state per peer
	kills      int           // recovery mode: kill rounds per size
	budget     time.Duration // recovery mode: time for the kill rounds of one size
	virtual    bool          // recovery in virtual time (--peers sizes), see virtual.go
	seed       uint64        // virtual mode: picks the victims and the crash instants
}

func parse(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	peers := fs.String("peers", "", "recovery mode: comma-separated numbers of peer processes, at least 3 each")
	fs.IntVar(&o.simulated, "simulated", 0, "simulated mode: the largest number of simulated peers (measured at 100, 1,000, 10,000 up to it)")
	fs.IntVar(&o.cycles, "cycles", 0, "steady-state cycles per size (0: about 300,000 events per size)")
	fs.IntVar(&o.sockets, "sockets", 2000, "simulated mode: the most control connections over loopback (0: skip)")
	fs.DurationVar(&o.timeout, "timeout", 20*time.Minute, "bound on the whole run")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the run to this file")
	size := fs.String("size", "1MiB", "recovery mode: AllReduce buffer per peer")
	state := fs.String("state", "1MiB", "recovery mode: shared state per peer, fetched by every newcomer")
	fs.IntVar(&o.kills, "kills", 5, "recovery mode: kill rounds per number of peers")
	fs.BoolVar(&o.virtual, "virtual", false, "with --peers: measure recovery in virtual time, every peer in this process on a simulated WAN")
	fs.Uint64Var(&o.seed, "seed", 1, "virtual mode: the seed that picks the victims and the crash instants")
	fs.DurationVar(&o.budget, "budget", 3*time.Minute, "recovery mode: time for the kill rounds of one number of peers (one round at least)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if *peers != "" {
		for _, f := range strings.Split(*peers, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 3 {
				return o, fmt.Errorf("--peers %q: want numbers of at least 3 (two survivors) separated by commas", *peers)
			}
			o.peers = append(o.peers, n)
		}
	}
	for _, f := range []struct {
		s   string
		dst *int
	}{{*size, &o.bytes}, {*state, &o.stateBytes}} {
		v, err := measure.ParseSize(f.s)
		if err != nil || v <= 0 || v%4 != 0 {
			return o, fmt.Errorf("--size and --state: want a positive multiple of 4 bytes, got %q", f.s)
		}
		*f.dst = int(v)
	}
	if o.kills < 1 {
		return o, errors.New("--kills must be at least 1")
	}
	if o.simulated < 0 || o.cycles < 0 || o.sockets < 0 {
		return o, errors.New("--simulated, --cycles and --sockets must not be negative")
	}
	if o.simulated == 0 && len(o.peers) == 0 {
		return o, errors.New("nothing to do: give --simulated N or --peers LIST")
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	progress := func(format string, a ...any) { fmt.Fprintf(stderr, format+"\n", a...) }
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if len(o.peers) > 0 && o.virtual {
		res := runVirtualScale(o.peers, o, progress)
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(b))
		for _, s := range res.Sizes {
			if s.Failure != "" {
				return fmt.Errorf("%d peers: %s", s.Peers, s.Failure)
			}
		}
		return nil
	}
	if len(o.peers) > 0 {
		res := recovery(ctx, o.peers, peersOptions{bytes: o.bytes, stateBytes: o.stateBytes, kills: o.kills,
			budget: o.budget, timeout: o.timeout}, stderr)
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(b))
		for _, s := range res.Sizes {
			if s.Failure != "" {
				return fmt.Errorf("%d peers: %s", s.Peers, s.Failure)
			}
		}
		return nil
	}
	res, err := simulated(ctx, o, progress)
	if err != nil {
		return err
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, string(b))
	return nil
}

// sizesUpTo returns the sizes of simSizes up to n, and n itself.
func sizesUpTo(n int) []int {
	var sizes []int
	for _, s := range simSizes {
		if s <= n {
			sizes = append(sizes, s)
		}
	}
	if !slices.Contains(sizes, n) {
		sizes = append(sizes, n)
	}
	return sizes
}

// cyclesFor picks the steady-state cycles at n peers: about 300,000 events (a cycle is about ten
// events per peer), in whole heartbeat timeouts (window), at least one.
func cyclesFor(n, fixed int) int {
	if fixed > 0 {
		return fixed
	}
	return max(1, (30000/n+window/2)/window) * window
}

func simulated(ctx context.Context, o options, progress func(string, ...any)) (simulatedResult, error) {
	res := simulatedResult{Mode: "simulated", RatioLimit: targetEventCostRatio,
		Note: "timings under load: the machine was shared with other work; compare ratios, not absolute figures"}
	// Warm up (code paths, the heap, the CPU's caches) off the record, so that the smallest size is not
	// the one that pays for it.
	if _, err := runSimulated(min(100, o.simulated), 2, nil); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}
	for _, n := range sizesUpTo(o.simulated) {
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("simulated n=%d: %w", n, err)
		}
		r, err := runSimulated(n, cyclesFor(n, o.cycles), progress)
		if err != nil {
			return res, err
		}
		res.Sizes = append(res.Sizes, r)
	}
	first, last := res.Sizes[0], res.Sizes[len(res.Sizes)-1]
	res.RatioOf = fmt.Sprintf("ns_per_event (process CPU time in Step, the garbage collector included) at %d peers over at %d peers", last.Peers, first.Peers)
	if first.NsPer > 0 {
		res.EventCostRatio = last.NsPer / first.NsPer
	}
	if first.WallNsPer > 0 {
		res.WallRatio = last.WallNsPer / first.WallNsPer
	}
	if first.AllocsPer > 0 {
		res.AllocRatio = last.AllocsPer / first.AllocsPer
	}
	res.RatioOK = res.EventCostRatio <= targetEventCostRatio
	progress("event_cost_ratio %.2f (limit %.1f)", res.EventCostRatio, targetEventCostRatio)
	if o.sockets > 0 {
		l, err := runLoopback(ctx, o.sockets, progress)
		if err != nil {
			return res, fmt.Errorf("loopback: %w", err)
		}
		res.Loopback = &l
	}
	return res, nil
}
