// Command allreduce measures Concord's AllReduce among real processes, on loopback or each on a host
// of its own (--hosts), and compares it with the physical limit of this machine, measured by the same
// command in the same run.
//
//	go run ./bench/allreduce --peers 4 --size 64MiB --iters 5
//
// It starts a master and --peers peer processes (this program, re-executed), and in each iteration
// every peer refills its buffer (untimed), passes a barrier (a one-element AllReduce on another tag),
// then times one in-place float32 SUM AllReduce of --size bytes. An iteration's time is the maximum
// over the peers; the figure is the median over --iters iterations after --warmup untimed ones. A
// second barrier follows the timed call, so that no peer checks its result while another is still
// in the call. Every element of every peer's result is checked against an independently computed
// sum, and the peers' xxh3 result hashes must be equal.
//
// The limit: --peers processes in a ring (measured before and after the all-reduce, --ring-reps
// timed repetitions each, median of all), each sending --size bytes from a real buffer to the next
// while receiving as much from the previous, over the same path as the peers' bytes (the TCP
// transport's local path, a unix socket, for tcp and tls; loopback TCP for quic or with --local=false;
// the key limit_network says which; over the local path the loopback TCP ring is measured as well,
// for efficiency_vs_tcp_ring), give the aggregate loopback throughput L; the ring's
// 2(N-1)·D bytes cannot cross loopback faster than limit_seconds = 2(N-1)·D/L. The float adds of the
// reduce-scatter, (N-1)·D bytes at the add rate Red of two goroutines, give limit_reduce_seconds =
// (N-1)·D·(2/L + 1/Red), the true ceiling when both share the same cores.
//
// --gomaxprocs sets GOMAXPROCS in every child (the peers, the master and the limit's ring alike). The
// default, auto, gives each peer its share of the cores (cores / peers, at least 1), as one would
// deploy N peers on one machine: with Go's default every process runs a scheduler thread per core,
// and N processes on C cores then fight over them. 0 leaves Go's default.
//
// --transport picks what the master and the peers talk over: tcp (the default), tls (TLS 1.3 over
// TCP) or quic, each of the last two authenticated with a run secret drawn for the run; a
// comma-separated list (--transport tcp,tls,quic) runs the whole benchmark once per transport, one
// after the other, for figures side by side.
//
// Progress goes to stderr. Stdout gets, per transport, the baseline harness's line
//
//	RESULT lib=concord n=N bytes=D median_s=... min_s=... max_s=... iters=K check=ok|FAIL
//
// (lib=concord-tls, lib=concord-quic for the others) and, last, one JSON object with the figures:
// for a single transport the figures themselves; for several, {"transports": {name: figures},
// "seconds_vs_tcp": {name: median over tcp's median}}.
//
// --hosts runs every process of the run on a host of its own, as one peer per machine: the master on
// one, each peer on another, each host a network namespace with its own address on one bridge (veth
// pairs to a Linux bridge, MTU 1500, no rate limit; internal/hosts), and process i of the limit's ring
// on peer i's host. Between hosts there is no unix socket: the peers' bytes cross the bridge over TCP
// (over QUIC's UDP for quic), the limit's ring over TCP between the same hosts, and limit_network
// says tcp; L is then the aggregate throughput across the bridge. The JSON says "hosts": true. It
// needs root (network namespaces); without it the command exits with status 2.
//
// --nat K (with --hosts) then runs the same all-reduce again on hosts where K of the peers sit behind
// NAT routers of their own (nftables masquerade, nothing forwarded: every connection to them goes by
// rendezvous through the master). The JSON gains nat_seconds_median, nat_efficiency (this run's
// median over the NAT run's: 1 when NAT costs nothing) and links_opened, links_reversed,
// links_punched, links_relayed and relay_bytes (the connections the NAT run's peers opened by
// rendezvous, and what the master's relay carried); correct covers both runs.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/concord-ccl/concord/bench/internal/hostbed"
	"github.com/concord-ccl/concord/bench/internal/measure"
	"github.com/concord-ccl/concord/bench/internal/workload"
	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/internal/hugemem"
	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/rings"
)

// Tags of the two collectives every iteration runs.
const (
	tagData    = 1
	tagBarrier = 2
)

// Environment of the peer role.
const (
	envMaster  = "CONCORD_BENCH_MASTER"
	envParams  = "CONCORD_BENCH_PARAMS"
	envSecret  = "CONCORD_BENCH_SECRET"
	envListen  = "CONCORD_BENCH_LISTEN" // the master's listen address; empty: 127.0.0.1:0
	rolePeer   = "peer"
	roleMaster = "transport-master"
	addThreads = 2 // goroutines of the add-rate measurement: one per core of the reference machine
)

// params is what every peer is told, as JSON in envParams.
type params struct {
	Peers      int    `json:"peers"`
	Bytes      int    `json:"bytes"`
	Iters      int    `json:"iters"`
	Warmup     int    `json:"warmup"`
	Pool       int    `json:"pool"`
	Part       int    `json:"part"`
	ProfileDir string `json:"profile_dir"`
	Transport  string `json:"transport"` // tcp, tls or quic; empty means tcp
	NoLocal    bool   `json:"no_local"`  // tcp and tls stay on loopback TCP (TCPConfig.DisableLocal)
}

// iterEvent is the line a peer prints after each iteration.
type iterEvent struct {
	Event   string  `json:"event"` // "iter"
	Rank    int     `json:"rank"`
	Iter    int     `json:"iter"`
	Warm    bool    `json:"warm"` // a warm-up iteration, not timed
	Seconds float64 `json:"seconds"`
	OK      bool    `json:"ok"`
	Hash    string  `json:"hash"`
	Detail  string  `json:"detail,omitempty"`
}

// linksEvent is the line a peer prints after its last iteration: the connections it opened by
// rendezvous.
type linksEvent struct {
	Event    string `json:"event"` // "links"
	Reversed uint64 `json:"reversed"`
	Punched  uint64 `json:"punched"`
	Relayed  uint64 `json:"relayed"`
}

// relayEvent is the line the master prints when it stops: what its relay carried.
type relayEvent struct {
	Event string `json:"event"` // "relay"
	Links uint64 `json:"links"`
	Bytes uint64 `json:"bytes"`
}

// result is the last line on stdout.
type result struct {
	Transport          string    `json:"transport"`
	Hosts              bool      `json:"hosts"`         // every process on a host of its own (--hosts)
	Local              bool      `json:"local"`         // tcp and tls: the peers talked over the local path
	LimitNetwork       string    `json:"limit_network"` // what the limit's ring ran over: unix or tcp
	Peers              int       `json:"peers"`
	Bytes              int       `json:"bytes"`
	Iters              int       `json:"iters"`
	Warmup             int       `json:"warmup"`
	Pool               int       `json:"pool"`
	PartBytes          int       `json:"part_bytes"`
	GOMAXPROCS         int       `json:"gomaxprocs"` // of every child; 0: Go's default
	Seconds            []float64 `json:"seconds"`
	SecondsMedian      float64   `json:"seconds_median"`
	SecondsMin         float64   `json:"seconds_min"`
	SecondsMax         float64   `json:"seconds_max"`
	AlgbwGBps          float64   `json:"algbw_gbps"`
	BusbwGBps          float64   `json:"busbw_gbps"`
	RingSeconds        []float64 `json:"ring_seconds"`
	RingAggregateGBps  float64   `json:"ring_aggregate_gbps"`
	RingPerRankGBps    float64   `json:"ring_per_rank_gbps"`
	AddRateGBps        float64   `json:"add_rate_gbps"`
	LimitSeconds       float64   `json:"limit_seconds"`
	Efficiency         float64   `json:"efficiency"`
	LimitReduceSeconds float64   `json:"limit_reduce_seconds"`
	EfficiencyReduce   float64   `json:"efficiency_reduce"`
	// Over the local path only: loopback TCP's ring, measured beside the local one, and the
	// efficiency against the limit it sets.
	TCPRingAggregateGBps float64 `json:"tcp_ring_aggregate_gbps,omitempty"`
	LimitTCPSeconds      float64 `json:"limit_tcp_seconds,omitempty"`
	EfficiencyVsTCPRing  float64 `json:"efficiency_vs_tcp_ring,omitempty"`
	// With --nat: the same run again with that many peers behind NATs of their own, its median
	// against this run's (nat_efficiency, 1 when NAT costs nothing), the connections the peers of
	// that run opened by rendezvous (to a peer behind NAT: called back by it, over a punched QUIC
	// path, through the master's relay), and what the master's relay carried: the connections it
	// joined (links_relayed) and their bytes. They cover the whole run, the rings formed while the
	// peers joined and the master's bandwidth probes included.
	NAT              int     `json:"nat,omitempty"`
	NATSecondsMedian float64 `json:"nat_seconds_median,omitempty"`
	NATEfficiency    float64 `json:"nat_efficiency,omitempty"`
	NATCorrect       bool    `json:"nat_correct,omitempty"`
	LinksReversed    uint64  `json:"links_reversed,omitempty"`
	LinksPunched     uint64  `json:"links_punched,omitempty"`
	LinksRelayed     *uint64 `json:"links_relayed,omitempty"`
	RelayBytes       *uint64 `json:"relay_bytes,omitempty"`

	Correct         bool   `json:"correct"`
	ElementsChecked int64  `json:"elements_checked"`
	HashesEqual     bool   `json:"hashes_equal"`
	Failure         string `json:"failure,omitempty"`
}

// roles are the roles this program runs as a child.
var roles = map[string]func() int{rolePeer: peerMain, roleMaster: masterMain, measure.RoleRing: measure.RingMain}

func main() {
	cluster.Main(roles)
	os.Exit(run())
}

// hiddenFlags are left out of the usage text.
var hiddenFlags = map[string]bool{"cpuprofile-dir": true}

func run() int {
	fs := flag.NewFlagSet("allreduce", flag.ContinueOnError)
	peers := fs.Int("peers", 4, "number of peer processes")
	sizeStr := fs.String("size", "64MiB", "buffer size per peer: bytes, or with a unit (KiB, MiB, GiB; K, M, G are binary)")
	iters := fs.Int("iters", 5, "timed iterations")
	warmup := fs.Int("warmup", 1, "untimed warm-up iterations")
	pool := fs.Int("pool", 0, "connections per neighbour (0: the library's default)")
	partStr := fs.String("part", "0", "pipelining granularity in bytes (0: the LAN preset's, pccl.LAN)")
	ringReps := fs.Int("ring-reps", 5, "timed repetitions of the loopback ring measurement")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up (and kill every child) after this long")
	profDir := fs.String("cpuprofile-dir", "", "write a CPU profile of every peer's timed iterations to this directory")
	transports := fs.String("transport", "tcp", "tcp, tls or quic, or a comma-separated list to run one after the other")
	procsFlag := fs.String("gomaxprocs", "auto", measure.ProcsUsage+"; the limit's ring included")
	local := fs.Bool("local", true, "tcp and tls: the peers talk over the TCP transport's local path (a unix socket), and the limit's ring too; false keeps both on loopback TCP (across --hosts there is no local path)")
	onHosts := fs.Bool("hosts", false, "run the master, every peer and the limit's ring each on a host of its own (network namespaces on one bridge; needs root), over TCP between them")
	nat := fs.Int("nat", 0, "with --hosts: run again with this many peers behind NATs of their own and report nat_efficiency and the links relayed")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: go run ./bench/allreduce [flags]\n")
		fs.VisitAll(func(f *flag.Flag) {
			if !hiddenFlags[f.Name] {
				fmt.Fprintf(fs.Output(), "  --%s\t%s (default %q)\n", f.Name, f.Usage, f.DefValue)
			}
		})
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	size, err := measure.ParseSize(*sizeStr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "allreduce: --size:", err)
		return 2
	}
	part, err := measure.ParseSize(*partStr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "allreduce: --part:", err)
		return 2
	}
	procs, err := measure.ParseProcs(*procsFlag, *peers)
	if err != nil {
		fmt.Fprintln(os.Stderr, "allreduce:", err)
		return 2
	}
	if *nat != 0 && (!*onHosts || *nat < 0 || *nat > *peers) {
		fmt.Fprintln(os.Stderr, "allreduce: --nat needs --hosts and at most --peers peers")
		return 2
	}
	if *peers < 2 || size <= 0 || size%4 != 0 || *iters < 1 || *warmup < 0 || *ringReps < 1 {
		fmt.Fprintln(os.Stderr, "allreduce: need --peers >= 2, --size a positive multiple of 4, --iters >= 1, --warmup >= 0")
		return 2
	}
	if *profDir != "" {
		if *profDir, err = filepath.Abs(*profDir); err == nil {
			err = os.MkdirAll(*profDir, 0o755)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "allreduce: --cpuprofile-dir:", err)
			return 2
		}
	}
	names := strings.Split(*transports, ",")
	for _, name := range names {
		if !slices.Contains(transport.Names, name) {
			fmt.Fprintf(os.Stderr, "allreduce: --transport %q: want a list of %s\n", name, strings.Join(transport.Names, ", "))
			return 2
		}
	}
	var bed *hostbed.Bed
	if *onHosts {
		if err := hostbed.Available(); err != nil {
			fmt.Fprintln(os.Stderr, "allreduce: --hosts runs every process in a network namespace of its own:", err)
			return 2
		}
		if bed, err = hostbed.New(*peers); err != nil {
			fmt.Fprintln(os.Stderr, "allreduce: --hosts:", err)
			return 1
		}
		defer bed.Close()
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, *timeout)
	defer cancelT()
	code := 0
	results := make(map[string]result)
	for _, name := range names {
		p := params{Peers: *peers, Bytes: int(size), Iters: *iters, Warmup: *warmup, Pool: *pool, Part: int(part), ProfileDir: *profDir, Transport: name,
			NoLocal: !*local}
		progress("transport %s", name)
		c := cluster.New(cluster.Config{Env: measure.ProcsEnv(procs)})
		res, err := bench(ctx, c, bed, p, *ringReps)
		if err == nil && *nat > 0 {
			err = natRun(ctx, c, &res, p, *nat)
		}
		res.GOMAXPROCS = procs
		if cerr := c.Close(); cerr != nil {
			fmt.Fprintln(os.Stderr, "allreduce:", cerr)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "allreduce: FAILED:", err)
			res.Failure = err.Error()
		}
		check := "ok"
		if !res.Correct {
			check = "FAIL"
		}
		lib := "concord"
		if name != "tcp" {
			lib += "-" + name
		}
		if res.SecondsMedian > 0 {
			fmt.Printf("RESULT lib=%s n=%d bytes=%d median_s=%.6f min_s=%.6f max_s=%.6f iters=%d check=%s\n",
				lib, p.Peers, p.Bytes, res.SecondsMedian, res.SecondsMin, res.SecondsMax, len(res.Seconds), check)
		}
		if err != nil || !res.Correct {
			code = 1
		}
		results[name] = res
	}
	var out any = results[names[0]]
	if len(names) > 1 {
		vs := make(map[string]float64)
		if tcp, ok := results["tcp"]; ok && tcp.SecondsMedian > 0 {
			for name, r := range results {
				vs[name] = r.SecondsMedian / tcp.SecondsMedian
			}
		}
		out = map[string]any{"transports": results, "seconds_vs_tcp": vs}
	}
	js, _ := json.Marshal(out)
	fmt.Println(string(js))
	return code
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "allreduce: "+format+"\n", args...)
}

// natRun runs p again on a bed of its own with nat peers behind NAT and adds what it measured to res.
func natRun(ctx context.Context, c *cluster.Cluster, res *result, p params, nat int) error {
	bed, err := hostbed.NewNAT(p.Peers, nat)
	if err != nil {
		return fmt.Errorf("--nat: %w", err)
	}
	defer bed.Close()
	progress("again with %d of %d peers behind NAT", nat, p.Peers)
	nr, err := bench(ctx, c, bed, p, 0)
	res.NAT, res.NATSecondsMedian, res.NATCorrect = nat, nr.SecondsMedian, nr.Correct
	res.LinksReversed, res.LinksPunched, res.LinksRelayed, res.RelayBytes = nr.LinksReversed, nr.LinksPunched, nr.LinksRelayed, nr.RelayBytes
	if err != nil {
		return fmt.Errorf("behind NAT: %w", err)
	}
	res.NATEfficiency = res.SecondsMedian / nr.SecondsMedian
	res.Correct = res.Correct && nr.Correct
	progress("behind NAT: median %.4f s, nat_efficiency %.3f; connections by rendezvous: %d called back, %d punched, %d relayed (%d bytes)",
		nr.SecondsMedian, res.NATEfficiency, nr.LinksReversed, nr.LinksPunched, *nr.LinksRelayed, *nr.RelayBytes)
	return nil
}

// bench measures the limits, then the all-reduce, on the hosts of bed (nil: on loopback). The result
// carries whatever was measured before a failure. ringReps 0 measures no limit: the limit's ring cannot
// reach hosts behind NAT.
func bench(ctx context.Context, c *cluster.Cluster, bed *hostbed.Bed, p params, ringReps int) (result, error) {
	n, d := p.Peers, float64(p.Bytes)
	if p.Transport == "" {
		p.Transport = "tcp"
	}
	res := result{Transport: p.Transport, Peers: n, Bytes: p.Bytes, Iters: p.Iters, Warmup: p.Warmup, Pool: p.Pool, PartBytes: cmp.Or(p.Part, pccl.LAN().PartBytes)}
	// The limit's ring runs over the path the peers' bytes take: the local path for tcp and tls (when
	// on), loopback TCP otherwise (for quic, whose UDP has no ring of its own here); across hosts, TCP
	// between the same hosts, whatever the transport (no local path reaches another host).
	res.Hosts = bed != nil
	res.Local = !p.NoLocal && p.Transport != "quic" && !res.Hosts
	res.LimitNetwork = map[bool]string{true: "unix", false: "tcp"}[res.Local]
	var place measure.Placement
	if bed != nil {
		place = bed.Peer
	}

	// rings measures the limit's ring and, over the local path, loopback TCP's ring too: the
	// yardstick the peers would have without it. It appends the times to ringTimes and tcpTimes.
	var ringTimes, tcpTimes []float64
	rings := func() error {
		r, err := measure.RingOn(ctx, c, n, p.Bytes, 1, ringReps, res.Local, place)
		if err != nil {
			return fmt.Errorf("ring limit: %w", err)
		}
		ringTimes = append(ringTimes, r.Times...)
		if res.Local {
			tr, err := measure.LoopbackRing(ctx, c, n, p.Bytes, 1, ringReps, false)
			if err != nil {
				return fmt.Errorf("tcp ring: %w", err)
			}
			tcpTimes = append(tcpTimes, tr.Times...)
		}
		return nil
	}
	where := "loopback"
	if res.Hosts {
		where = "hosts'"
	}
	if ringReps > 0 {
		progress("measuring the %s ring over %s: %d processes, %d bytes each, 1+%d repetitions", where, res.LimitNetwork, n, p.Bytes, ringReps)
		if err := rings(); err != nil {
			return res, err
		}
	}

	// A secret of 256 random bits for this run, handed to the children in their environment.
	var secret [32]byte
	rand.Read(secret[:])
	js, _ := json.Marshal(p)
	env := []string{envParams + "=" + string(js), envSecret + "=" + hex.EncodeToString(secret[:])}
	mspec := cluster.Spec{Role: roleMaster, Name: "master", Env: env}
	if bed != nil {
		mspec.Env = append(slices.Clip(env), envListen+"="+bed.MasterListen())
		mspec.Start = bed.MasterStart
	}
	mp, err := c.Spawn(mspec)
	if err != nil {
		return res, fmt.Errorf("master: %w", err)
	}
	l, err := mp.Await(ctx, "listening")
	if err != nil {
		return res, fmt.Errorf("master: %w", err)
	}
	var ev cluster.ListeningEvent
	if err := l.Decode(&ev); err != nil {
		return res, fmt.Errorf("master: %w", err)
	}
	addr := ev.Addr
	env = append(env, envMaster+"="+addr)
	procs := make([]*cluster.Proc, n)
	for i := range procs {
		spec := cluster.Spec{Role: rolePeer, Name: fmt.Sprintf("peer-%d", i), Env: env}
		if bed != nil {
			procs[i], _, err = bed.Spawn(c, spec)
		} else {
			procs[i], err = c.Spawn(spec)
		}
		if err != nil {
			return res, err
		}
	}
	progress("master on %s (%s), %d peers started", addr, p.Transport, n)

	total := p.Warmup + p.Iters
	times := make([]float64, total)
	hashes := make([]string, total)
	res.Correct, res.HashesEqual = true, true
	for _, pr := range procs {
		for it := range total {
			l, err := awaitEvent(ctx, pr, "iter")
			if err != nil {
				return res, err
			}
			var ev iterEvent
			if err := l.Decode(&ev); err != nil {
				return res, err
			}
			if ev.Iter != it {
				return res, fmt.Errorf("%s: iteration %d reported as %d", pr.Name(), it, ev.Iter)
			}
			times[it] = max(times[it], ev.Seconds)
			if !ev.OK {
				res.Correct = false
				progress("%s iteration %d: WRONG RESULT: %s", pr.Name(), it, ev.Detail)
			} else {
				res.ElementsChecked += int64(p.Bytes / 4)
			}
			if hashes[it] == "" {
				hashes[it] = ev.Hash
			} else if hashes[it] != ev.Hash {
				res.HashesEqual = false
				progress("%s iteration %d: hash %s differs from %s", pr.Name(), it, ev.Hash, hashes[it])
			}
		}
	}
	var relayed uint64
	for _, pr := range procs {
		l, err := awaitEvent(ctx, pr, "links")
		if err != nil {
			return res, err
		}
		var ev linksEvent
		if err := l.Decode(&ev); err != nil {
			return res, err
		}
		res.LinksReversed += ev.Reversed
		res.LinksPunched += ev.Punched
		relayed += ev.Relayed
	}
	for _, pr := range procs {
		if code, err := pr.Wait(ctx); err != nil {
			return res, err
		} else if code != 0 {
			return res, fmt.Errorf("%s exited with status %d", pr.Name(), code)
		}
	}
	// The master stops on SIGTERM and says what its relay carried; the peers' count of relayed
	// connections must agree with it.
	if err := mp.Signal(syscall.SIGTERM); err != nil {
		return res, fmt.Errorf("master: %w", err)
	}
	if l, err = awaitEvent(ctx, mp, "relay"); err != nil {
		return res, fmt.Errorf("master: %w", err)
	}
	var rev relayEvent
	if err := l.Decode(&rev); err != nil {
		return res, fmt.Errorf("master: %w", err)
	}
	if rev.Links != relayed {
		return res, fmt.Errorf("the peers opened %d connections through the master's relay, the master joined %d", relayed, rev.Links)
	}
	res.LinksRelayed, res.RelayBytes = &rev.Links, &rev.Bytes
	res.Correct = res.Correct && res.HashesEqual
	res.Seconds = times[p.Warmup:]
	res.SecondsMedian = measure.Median(res.Seconds)
	res.SecondsMin, res.SecondsMax = slices.Min(res.Seconds), slices.Max(res.Seconds)
	if ringReps == 0 {
		return res, nil
	}

	// The ring again, so that the limit brackets the all-reduce in time: on a shared machine the
	// neighbours' load drifts.
	progress("measuring the %s ring again: 1+%d repetitions", where, ringReps)
	if err := rings(); err != nil {
		return res, err
	}
	res.RingSeconds = ringTimes
	red := measure.AddRate(p.Bytes, addThreads, 5)
	res.AddRateGBps = red / 1e9
	progress("add rate (%d goroutines): %.3f GB/s", addThreads, res.AddRateGBps)
	ringSec := measure.Median(res.RingSeconds)
	agg := float64(n) * d / ringSec
	res.RingAggregateGBps, res.RingPerRankGBps = agg/1e9, d/ringSec/1e9
	progress("ring: L = %.3f GB/s aggregate, R = %.3f GB/s per rank", res.RingAggregateGBps, res.RingPerRankGBps)
	res.LimitSeconds = 2 * float64(n-1) * d / agg
	res.LimitReduceSeconds = float64(n-1) * d * (2/agg + 1/red)
	for it, t := range times {
		progress("iteration %d%s: %.4f s", it, map[bool]string{true: " (warm-up)"}[it < p.Warmup], t)
	}
	res.AlgbwGBps = d / res.SecondsMedian / 1e9
	res.BusbwGBps = res.AlgbwGBps * 2 * float64(n-1) / float64(n)
	res.Efficiency = res.LimitSeconds / res.SecondsMedian
	res.EfficiencyReduce = res.LimitReduceSeconds / res.SecondsMedian
	if len(tcpTimes) > 0 {
		aggTCP := float64(n) * d / measure.Median(tcpTimes)
		res.TCPRingAggregateGBps = aggTCP / 1e9
		res.LimitTCPSeconds = 2 * float64(n-1) * d / aggTCP
		res.EfficiencyVsTCPRing = res.LimitTCPSeconds / res.SecondsMedian
	}
	return res, nil
}

// awaitEvent reads pr's lines until event; a line with event "error" fails it.
func awaitEvent(ctx context.Context, pr *cluster.Proc, event string) (cluster.Line, error) {
	for {
		l, err := pr.Next(ctx)
		if err != nil {
			return l, fmt.Errorf("waiting for %q: %w", event, err)
		}
		switch l.Event {
		case event:
			return l, nil
		case "error":
			return l, fmt.Errorf("%s", l)
		}
	}
}

// childTransport builds the transport named in p with the run secret of the environment.
func childTransport(p params) (transport.Transport, error) {
	name := p.Transport
	if name == "" {
		name = "tcp"
	}
	a := transport.AuthConfig{Secret: []byte(os.Getenv(envSecret))}
	return transport.SelectTCP(name, a, transport.TCPConfig{DisableLocal: p.NoLocal})
}

// masterMain is the master role: a master server on 127.0.0.1:0 (or the address envListen gives) over
// the run's transport, until SIGTERM, SIGINT or the end of stdin.
func masterMain() int {
	var p params
	if err := json.Unmarshal([]byte(os.Getenv(envParams)), &p); err != nil {
		fmt.Fprintf(os.Stderr, "master: %s: %v\n", envParams, err)
		return 1
	}
	tr, err := childTransport(p)
	if err != nil {
		fmt.Fprintf(os.Stderr, "master: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	listen := os.Getenv(envListen)
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	ln, err := tr.Listen(listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "master: %v\n", err)
		return 1
	}
	srv := master.NewServer(master.ServerConfig{Config: master.LAN(), Logger: cluster.Logger()})
	if err := cluster.Emit(cluster.ListeningEvent{Event: "listening", Addr: ln.Addr().String()}); err != nil {
		fmt.Fprintf(os.Stderr, "master: %v\n", err)
		return 1
	}
	// The server stops after the snapshot of its relay is taken: once Serve returned, it has none.
	serveCtx, stopServe := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(serveCtx, ln) }()
	select {
	case err := <-served:
		stopServe()
		fmt.Fprintf(os.Stderr, "master: serve: %v\n", err)
		return 1
	case <-ctx.Done():
	}
	r := srv.Snapshot().Relay
	stopServe()
	<-served
	if err := cluster.Emit(relayEvent{Event: "relay", Links: r.Links, Bytes: r.Bytes}); err != nil {
		fmt.Fprintf(os.Stderr, "master: %v\n", err)
		return 1
	}
	return 0
}

// peerMain is the peer role.
func peerMain() int {
	if err := peer(); err != nil {
		cluster.Emit(map[string]string{"event": "error", "error": err.Error()})
		return 1
	}
	return 0
}

func peer() error {
	var p params
	if err := json.Unmarshal([]byte(os.Getenv(envParams)), &p); err != nil {
		return fmt.Errorf("%s: %w", envParams, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cfg := pccl.LAN()
	cfg.Master = os.Getenv(envMaster)
	cfg.Logger = cluster.Logger()
	if p.Pool > 0 {
		cfg.PoolSize = p.Pool
	}
	if p.Part > 0 {
		cfg.PartBytes = p.Part
	}
	tr, err := childTransport(p)
	if err != nil {
		return err
	}
	cfg.Transport = tr
	comm, err := pccl.Connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer comm.Close()
	jctx, jcancel := context.WithTimeout(ctx, 2*time.Minute)
	err = workload.Join(jctx, comm, p.Peers)
	jcancel()
	if err != nil {
		return err
	}
	rank, world := comm.Rank(), comm.WorldSize()
	netns, _ := hostbed.Netns() // which host this peer runs on, for the tests
	cluster.Emit(map[string]any{"event": "joined", "rank": rank, "world": world, "netns": netns})

	count := p.Bytes / 4
	b := hugemem.Make(4*count, 4*count) // in huge pages where the kernel has them, like the staging buffers
	buf := rings.View[float32](b)
	one := make([]float32, 1)
	data := pccl.Desc{Tag: tagData, Count: count, DType: pccl.F32, Op: pccl.Sum}
	barrier := pccl.Desc{Tag: tagBarrier, Count: 1, DType: pccl.F32, Op: pccl.Sum}
	for it := range p.Warmup + p.Iters {
		if it == p.Warmup && p.ProfileDir != "" {
			f, err := os.Create(filepath.Join(p.ProfileDir, "peer-"+strconv.Itoa(rank)+".pprof"))
			if err != nil {
				return err
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				return err
			}
			defer f.Close()
			defer pprof.StopCPUProfile()
		}
		workload.Fill(buf, rank)
		one[0] = 1
		if err := comm.AllReduce(ctx, pccl.Bytes(one), pccl.Bytes(one), barrier); err != nil {
			return fmt.Errorf("iteration %d: barrier: %w", it, err)
		}
		t0 := time.Now()
		err := comm.AllReduce(ctx, b, b, data)
		dt := time.Since(t0)
		if err != nil {
			return fmt.Errorf("iteration %d: %w", it, err)
		}
		// A second barrier before the checks: a peer that finished first must not hash and check
		// its 64 MiB on the cores the others still need for the timed call.
		one[0] = 1
		if err := comm.AllReduce(ctx, pccl.Bytes(one), pccl.Bytes(one), barrier); err != nil {
			return fmt.Errorf("iteration %d: barrier after the call: %w", it, err)
		}
		ev := iterEvent{Event: "iter", Rank: rank, Iter: it, Warm: it < p.Warmup, Seconds: dt.Seconds(), OK: true,
			Hash: fmt.Sprintf("%016x", workload.Hash(b))}
		if m := workload.Check(buf, world); m != nil {
			ev.OK, ev.Detail = false, m.Error()
		}
		if one[0] != float32(world) {
			ev.OK, ev.Detail = false, fmt.Sprintf("barrier sum %v, want %d; %s", one[0], world, ev.Detail)
		}
		if err := cluster.Emit(ev); err != nil {
			return err
		}
	}
	st := comm.Stats()
	return cluster.Emit(linksEvent{Event: "links", Reversed: st.LinksReversed, Punched: st.LinksPunched, Relayed: st.LinksRelayed})
}
