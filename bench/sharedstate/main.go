// Command sharedstate measures Concord's shared-state synchronization on loopback.
//
//	go run ./bench/sharedstate --peers 4 --state 1GiB [--compress] [--profile DIR]
//	go run ./bench/sharedstate --peers 4 --state 1GiB --virtual
//
// It starts a master and --peers peer processes (this program, re-executed), each holding --state
// bytes of f32 weights in --entries entries (64) with the same deterministic content, and measures,
// all in the same run:
//
//   - hash_gbps and memcpy_gbps: the content hash (sharedstate.HashParallel) and a parallel copy of
//     a buffer of the state's size, both on 2 goroutines, best of 3 after a warm-up. Target:
//     hash_gbps >= 0.5 x memcpy_gbps.
//   - raw_transfer_seconds: the state's size moved over one loopback TCP connection between two
//     processes, 1 MiB per write and per read, from a real buffer into a real buffer (median of
//     --raw-reps before the join and --raw-reps after it, so that both sides of the ratio are taken
//     under the same load).
//   - sync_noop_rehash_ms: a sync in which every peer already agrees while the entries carry Version 0,
//     so every peer re-hashes its whole state each time (median of --rehash-rounds).
//   - sync_noop_ms: the same with a non-zero Version, which the application promises to change with the
//     data, so the hashes of the previous sync are reused: the documented fast path (median of
//     --noop-rounds, after one sync that fills the hash caches). Target: <= 50 ms.
//   - join_seconds: a newcomer process whose state is zeros (at the same revision as the group)
//     registers, the group admits it with ArePeersPending and UpdateTopology, then every peer syncs and
//     the newcomer fetches the whole state from the others. join_seconds is the newcomer's sync call,
//     join_total_seconds adds the admitting UpdateTopology round. Target: join_seconds <= 1.3 x
//     raw_transfer_seconds. --compress makes the newcomer ask for zstd-compressed transfers;
//     zstd_ratio says how far the donors' compression level shrinks this content (one entry).
//   - join_again_seconds: the join again, --joins-again times (median), in the same processes: the
//     newcomer zeroes its state in place and the next sync fetches all of it again.
//     join_again_ratio is join_again_seconds over raw_transfer_seconds.
//   - raw_transfer_first_seconds_all: the first transfer of each raw set, and join_vs_first_raw,
//     join_seconds over their median. The join is the first time the kernel copies into the
//     newcomer's buffers and out of the donors'; on some virtual machines (shadow-paged guests) that
//     first copy of each page costs many times a later one (docs/results/sharedstate.md), and the
//     raw median, taken past the first transfer, would not pay it. So every process passes its
//     buffers through the kernel once before anything is timed (--kernel-warm, on by default;
//     kernel_warm in the JSON); with --kernel-warm=false these two figures show what the first
//     copy costs.
//   - bit_identical: after the joins, every peer re-hashes its whole state; true when all agree.
//   - join_vs_donor_bound: join_seconds over the state's size divided by the sum of the donors'
//     upload bandwidths (donor_bound_seconds), each donor's taken as the raw transfer's rate. On one
//     machine the donors share the cores and the memory bus, so this only says how far loopback is
//     from the bound; --virtual measures it where the donors' links are their own.
//
// With --virtual the join runs in virtual time instead (see virtual.go): a master, --peers donors and
// the newcomer, their real code, on the simulated network of stress/sim in a testing/synctest
// bubble, across three sites 50 to 150 ms apart with 1 Gbit/s per link. Every CPU cost takes no
// virtual time, so join_seconds is what the protocol and the links make of the join, and
// join_vs_donor_bound compares it with the donors' summed uploads; the target is 1.2. It also
// reports each donor's share, when the first and last range arrived, and one stream's transfer over
// a donor's link (raw_transfer_seconds, one connection: what a single TCP-like stream gets). A 1 GiB
// run takes about a minute of wall time and 2 GiB of memory (the donors share their buffers).
//
// A sync round starts on every peer at one wall-clock instant (the processes share the machine's
// clock), and its time ends when the last peer's call has returned. --profile DIR writes the CPU
// profiles of the join sync of the newcomer and of the first founding peer (a donor) to
// DIR/newcomer.cpu.pprof and DIR/donor.cpu.pprof. Progress goes to stderr, the JSON
// result is the last line on stdout. Everything is bounded by --timeout.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/concord-ccl/concord/bench/internal/measure"
	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/sharedstate"
)

// Targets the result is compared to.
const (
	targetHashRatio  = 0.5  // hash_gbps / memcpy_gbps, at least
	targetNoopMs     = 50.0 // sync_noop_ms, at most
	targetJoinRatio  = 1.3  // join_seconds / raw_transfer_seconds, at most
	measureWorkers   = 2
	measureRounds    = 3
	roundStartDelay  = 100 * time.Millisecond // how far ahead a round's common start is scheduled
	admitRetryPeriod = 20 * time.Millisecond
)

type result struct {
	Peers      int  `json:"peers"`
	StateBytes int  `json:"state_bytes"`
	Entries    int  `json:"entries"`
	Compress   bool `json:"compress"`

	HashGBps        float64 `json:"hash_gbps"`
	MemcpyGBps      float64 `json:"memcpy_gbps"`
	HashRatio       float64 `json:"hash_ratio"`
	HashRatioTarget float64 `json:"hash_ratio_target"`

	SyncNoopMs          float64   `json:"sync_noop_ms"`
	SyncNoopMsAll       []float64 `json:"sync_noop_ms_all"`
	SyncNoopTargetMs    float64   `json:"sync_noop_target_ms"`
	SyncNoopRehashMs    float64   `json:"sync_noop_rehash_ms"`
	SyncNoopRehashMsAll []float64 `json:"sync_noop_rehash_ms_all"`
	SyncNoopNote        string    `json:"sync_noop_note"`

	JoinSeconds               float64   `json:"join_seconds"`
	JoinTotalSeconds          float64   `json:"join_total_seconds"`
	JoinUpdateTopologySeconds float64   `json:"join_update_topology_seconds"`
	JoinFirstRangeSeconds     float64   `json:"join_first_range_seconds"` // from the sync call until the first fetched range was in
	JoinLastRangeSeconds      float64   `json:"join_last_range_seconds"`  // ... until the last one was in
	JoinFetchedBytes          int64     `json:"join_fetched_bytes"`
	JoinNewcomerUsage         usage     `json:"join_newcomer_usage"` // CPU and page faults of the newcomer during its sync
	JoinDonorUsage            []usage   `json:"join_donor_usage"`    // the same for each founding peer
	RawTransferSeconds        float64   `json:"raw_transfer_seconds"`
	RawTransferSecondsAll     []float64 `json:"raw_transfer_seconds_all"`
	RawTransferGBps           float64   `json:"raw_transfer_gbps"`
	JoinRatio                 float64   `json:"join_ratio"`
	// The join repeated in the same processes, and the first raw transfer of each set (see the doc).
	JoinAgainSeconds           float64   `json:"join_again_seconds"`
	JoinAgainSecondsAll        []float64 `json:"join_again_seconds_all"`
	JoinAgainRatio             float64   `json:"join_again_ratio"`
	RawTransferFirstSecondsAll []float64 `json:"raw_transfer_first_seconds_all"`
	JoinVsFirstRaw             float64   `json:"join_vs_first_raw"`
	KernelWarm                 bool      `json:"kernel_warm"`
	// DonorBoundSeconds is the state's size over the sum of the donors' upload bandwidths, each
	// taken as the raw transfer's rate: raw_transfer_seconds / peers. On one machine the donors
	// share its cores and memory, so their rates do not add up; in virtual time (--virtual) they do.
	DonorBoundSeconds float64 `json:"donor_bound_seconds"`
	JoinVsDonorBound  float64 `json:"join_vs_donor_bound"`
	// The CPU time the join's sync used on every peer (newcomer and donors) over the CPU time of a
	// raw transfer (sender and receiver): on a machine shared with other work, the wall-clock ratio
	// follows how much CPU each side needs and gets; this says how much it needs.
	RawCPUSeconds    float64   `json:"raw_cpu_seconds"`
	RawCPUSecondsAll []float64 `json:"raw_cpu_seconds_all"`
	JoinCPUSeconds   float64   `json:"join_cpu_seconds"`
	JoinCPURatio     float64   `json:"join_cpu_ratio"`
	JoinRatioTarget  float64   `json:"join_ratio_target"`
	// ZstdRatio is the compressed size over the original size of the first entry's content at the
	// donors' compression level: what --compress can save on this data.
	ZstdRatio float64 `json:"zstd_ratio"`

	BitIdentical bool   `json:"bit_identical"`
	TargetsMet   bool   `json:"targets_met"`
	Failure      string `json:"failure,omitempty"`
}

func main() {
	cluster.Main(map[string]func() int{rolePeer: peerMain, roleSink: sinkMain, roleSource: sourceMain})
	os.Exit(run())
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "sharedstate: "+format+"\n", args...)
}

func run() int {
	fs := flag.NewFlagSet("sharedstate", flag.ContinueOnError)
	peers := fs.Int("peers", 4, "number of peer processes holding the state")
	stateStr := fs.String("state", "1GiB", "state size per peer")
	entries := fs.Int("entries", 64, "number of f32 entries the state is cut into")
	noopRounds := fs.Int("noop-rounds", 7, "no-op syncs timed with hash caching")
	rehashRounds := fs.Int("rehash-rounds", 3, "no-op syncs timed with a full re-hash")
	rawReps := fs.Int("raw-reps", 3, "raw loopback transfers timed")
	againJoins := fs.Int("joins-again", 3, "joins timed again after the first, the newcomer's state zeroed in place each time (0: none)")
	warm := fs.Bool("kernel-warm", true, "every process passes its buffers through the kernel once before anything is timed (see the doc)")
	compress := fs.Bool("compress", false, "the newcomer asks for zstd-compressed transfers")
	profile := fs.String("profile", "", "directory for the CPU profile of the newcomer's join sync")
	virt := fs.Bool("virtual", false, "measure the join in virtual time: the master and peers in one process on a simulated WAN (see the doc)")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up (and kill every child) after this long")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	size, err := measure.ParseSize(*stateStr)
	if err != nil || *peers < 1 || *entries < 1 || size < int64(*entries)*4 || size%4 != 0 || size > 1<<40 ||
		*noopRounds < 1 || *rehashRounds < 1 || *rawReps < 1 || *againJoins < 0 {
		fmt.Fprintln(os.Stderr, "sharedstate: need --peers >= 1, --state a multiple of 4 of at least 4 bytes per entry, --entries >= 1 and every round count >= 1 (--joins-again >= 0)")
		return 2
	}
	if *virt {
		progress("virtual time: %d donors, %d bytes in %d entries, newcomer joining", *peers, size, *entries)
		res := runVirtual(*peers, int(size), *entries)
		progress("virtual join %.3f s against the donors' bound %.3f s (%.2fx), %.1f s of wall time", res.JoinSeconds,
			res.DonorBoundSeconds, res.JoinVsDonorBound, res.WallSeconds)
		js, _ := json.Marshal(res)
		fmt.Println(string(js))
		if res.Failure != "" {
			return 1
		}
		return 0
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, *timeout)
	defer cancelT()

	res := result{Peers: *peers, StateBytes: int(size), Entries: *entries, Compress: *compress,
		HashRatioTarget: targetHashRatio, SyncNoopTargetMs: targetNoopMs, JoinRatioTarget: targetJoinRatio, KernelWarm: *warm,
		SyncNoopNote: "sync_noop_ms: entries carry a non-zero Version, hashes reused; sync_noop_rehash_ms: Version 0, every peer re-hashes its whole state"}
	c := cluster.New(cluster.Config{})
	b := &bench{c: c, n: *peers, p: params{Bytes: int(size), Entries: *entries, Lifetime: *timeout + time.Minute, Warm: *warm},
		againJoins: *againJoins}
	err = b.run(ctx, &res, *noopRounds, *rehashRounds, *rawReps, *compress, *profile)
	if cerr := c.Close(); cerr != nil {
		progress("%v", cerr)
	}
	if err != nil {
		progress("FAILED: %v", err)
		res.Failure = err.Error()
	}
	res.TargetsMet = err == nil && res.HashRatio >= targetHashRatio && res.SyncNoopMs <= targetNoopMs &&
		res.JoinRatio <= targetJoinRatio && res.BitIdentical
	js, _ := json.Marshal(res)
	fmt.Println(string(js))
	if err != nil {
		return 1
	}
	return 0
}

// bench drives the children. It is used by one goroutine.
type bench struct {
	c          *cluster.Cluster
	n          int
	p          params
	env        []string // the peers' environment
	revision   uint64   // the revision of the last sync
	againJoins int      // joins after the first
}

func (b *bench) run(ctx context.Context, res *result, noopRounds, rehashRounds, rawReps int, compress bool, profile string) (err error) {
	size := b.p.Bytes
	progress("hash and memcpy throughput on %d bytes, %d goroutines", size, measureWorkers)
	res.HashGBps = sharedstate.MeasureHashGBps(size, measureWorkers, measureRounds)
	res.MemcpyGBps = sharedstate.MeasureMemcpyGBps(size, measureWorkers, measureRounds)
	res.HashRatio = res.HashGBps / res.MemcpyGBps
	debug.FreeOSMemory()
	progress("hash %.2f GB/s, memcpy %.2f GB/s", res.HashGBps, res.MemcpyGBps)

	if res.ZstdRatio, err = zstdRatio(size / b.p.Entries / 4 * 4); err != nil {
		return err
	}

	raw, cpus, err := b.rawTransfer(ctx, size, rawReps)
	if err != nil {
		return fmt.Errorf("raw transfer: %w", err)
	}
	res.RawTransferSecondsAll, res.RawCPUSecondsAll = raw, cpus
	res.RawTransferFirstSecondsAll = append(res.RawTransferFirstSecondsAll, raw[0])
	res.RawTransferSeconds = measure.Median(raw)
	res.RawTransferGBps = float64(size) / res.RawTransferSeconds / 1e9
	progress("raw loopback transfer %.3f s (%.2f GB/s)", res.RawTransferSeconds, res.RawTransferGBps)

	_, addr, err := b.c.StartMaster(ctx, master.Config{})
	if err != nil {
		return fmt.Errorf("master: %w", err)
	}
	b.env = []string{envMaster + "=" + addr}
	founders, err := b.startGroup(ctx)
	if err != nil {
		return err
	}

	// No-op syncs with a full re-hash (the first also is the group's first sync), then with hashes
	// cached through Version (the first fills the caches and is not timed).
	for i := range rehashRounds {
		ms, err := b.noop(ctx, founders, 0)
		if err != nil {
			return fmt.Errorf("re-hash sync %d: %w", i, err)
		}
		res.SyncNoopRehashMsAll = append(res.SyncNoopRehashMsAll, ms)
	}
	res.SyncNoopRehashMs = measure.Median(res.SyncNoopRehashMsAll)
	progress("no-op sync with re-hash: %.1f ms (median of %v)", res.SyncNoopRehashMs, res.SyncNoopRehashMsAll)
	if _, err := b.noop(ctx, founders, 1); err != nil {
		return fmt.Errorf("cache-filling sync: %w", err)
	}
	for i := range noopRounds {
		ms, err := b.noop(ctx, founders, 1)
		if err != nil {
			return fmt.Errorf("no-op sync %d: %w", i, err)
		}
		res.SyncNoopMsAll = append(res.SyncNoopMsAll, ms)
	}
	res.SyncNoopMs = measure.Median(res.SyncNoopMsAll)
	progress("no-op sync with cached hashes: %.2f ms (median of %v)", res.SyncNoopMs, res.SyncNoopMsAll)

	if err := b.join(ctx, res, founders, compress, profile); err != nil {
		return fmt.Errorf("join: %w", err)
	}
	// The reference is taken again after the join, so that on a machine shared with other work both
	// sides of the ratio see the same load: raw_transfer_seconds is the median of both sets.
	after, cpus, err := b.rawTransfer(ctx, size, rawReps)
	if err != nil {
		return fmt.Errorf("raw transfer after the join: %w", err)
	}
	res.RawTransferSecondsAll = append(res.RawTransferSecondsAll, after...)
	res.RawTransferFirstSecondsAll = append(res.RawTransferFirstSecondsAll, after[0])
	res.RawCPUSecondsAll = append(res.RawCPUSecondsAll, cpus...)
	res.RawCPUSeconds = measure.Median(res.RawCPUSecondsAll)
	res.JoinCPUSeconds = res.JoinNewcomerUsage.cpu()
	for _, u := range res.JoinDonorUsage {
		res.JoinCPUSeconds += u.cpu()
	}
	if res.RawCPUSeconds > 0 {
		res.JoinCPURatio = res.JoinCPUSeconds / res.RawCPUSeconds
	}
	res.RawTransferSeconds = measure.Median(res.RawTransferSecondsAll)
	res.RawTransferGBps = float64(size) / res.RawTransferSeconds / 1e9
	res.JoinRatio = res.JoinSeconds / res.RawTransferSeconds
	res.DonorBoundSeconds = res.RawTransferSeconds / float64(b.n)
	res.JoinVsDonorBound = res.JoinSeconds / res.DonorBoundSeconds
	res.JoinVsFirstRaw = res.JoinSeconds / measure.Median(res.RawTransferFirstSecondsAll)
	if len(res.JoinAgainSecondsAll) > 0 {
		res.JoinAgainSeconds = measure.Median(res.JoinAgainSecondsAll)
		res.JoinAgainRatio = res.JoinAgainSeconds / res.RawTransferSeconds
	}
	progress("join: sync %.3f s (ratio %.2f to raw %.3f s, median of %v), with UpdateTopology %.3f s, fetched %d bytes",
		res.JoinSeconds, res.JoinRatio, res.RawTransferSeconds, res.RawTransferSecondsAll, res.JoinTotalSeconds, res.JoinFetchedBytes)
	progress("join %.2fx the first raw transfers %v; joins again %v (median %.2fx raw)", res.JoinVsFirstRaw,
		res.RawTransferFirstSecondsAll, res.JoinAgainSecondsAll, res.JoinAgainRatio)
	return nil
}

// joinSync runs one sync of the founders and the newcomer nc from a common start instant, every
// entry at Version 1 (the founders' hashes cached) unless edit changes a peer's command, and returns
// every peer's event, the newcomer's last.
func (b *bench) joinSync(ctx context.Context, founders []*cluster.Proc, nc *cluster.Proc, edit func(*cluster.Proc, *command) error) ([]peerEvent, error) {
	all := append(slices.Clone(founders), nc)
	b.revision++
	start := time.Now().Add(roundStartDelay)
	for _, p := range all {
		cmd := command{Cmd: "sync", StartNs: start.UnixNano(), Revision: b.revision, Version: 1}
		if err := edit(p, &cmd); err != nil {
			return nil, err
		}
		if err := p.Send(cmd); err != nil {
			return nil, err
		}
	}
	evs := make([]peerEvent, len(all))
	for i, p := range all {
		var err error
		if evs[i], err = await(ctx, p, "synced"); err != nil {
			return nil, err
		}
	}
	return evs, nil
}

// joinAgain zeroes the newcomer's state in place and syncs everyone once more, so that the newcomer
// fetches the whole state again, and returns the seconds of its sync call. The donors keep their
// cached hashes, as in the first join; the newcomer's entries carry a new version, so it re-hashes
// its zeros, as it did then.
func (b *bench) joinAgain(ctx context.Context, founders []*cluster.Proc, nc *cluster.Proc, version uint64, compress bool) (float64, error) {
	if _, _, err := b.round(ctx, []*cluster.Proc{nc}, command{Cmd: "zero"}, "zeroed"); err != nil {
		return 0, err
	}
	evs, err := b.joinSync(ctx, founders, nc, func(p *cluster.Proc, cmd *command) error {
		if p == nc {
			cmd.Version, cmd.Compress = version, compress
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for i, e := range evs[:len(founders)] {
		if e.Fetched != 0 {
			return 0, fmt.Errorf("%s fetched %d bytes", founders[i].Name(), e.Fetched)
		}
	}
	ev := evs[len(evs)-1]
	if ev.Fetched != int64(b.p.Bytes) {
		return 0, fmt.Errorf("newcomer fetched %d bytes, want %d", ev.Fetched, b.p.Bytes)
	}
	secs := time.Duration(ev.EndNs - ev.StartNs).Seconds()
	progress("join again: sync %.3f s", secs)
	return secs, nil
}

// zstdRatio compresses n bytes of the first entry's content as donors do (fastest level) and returns
// the compressed size over n.
func zstdRatio(n int) (float64, error) {
	data := make([]byte, n)
	fillEntry(data, 0)
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return 0, err
	}
	defer enc.Close()
	return float64(len(enc.EncodeAll(data, nil))) / float64(n), nil
}

// rawTransfer runs the raw loopback transfer reps times and returns the seconds of each and the CPU
// seconds of each (the sender's and the receiver's together).
func (b *bench) rawTransfer(ctx context.Context, size, reps int) ([]float64, []float64, error) {
	env := []string{rawEnv(size, reps, b.p.Warm)}
	sink, err := b.c.Spawn(cluster.Spec{Role: roleSink, Name: "raw-sink", Env: env})
	if err != nil {
		return nil, nil, err
	}
	defer sink.Kill()
	source, err := b.c.Spawn(cluster.Spec{Role: roleSource, Name: "raw-source", Env: env})
	if err != nil {
		return nil, nil, err
	}
	defer source.Kill()
	var ev rawEvent
	if err := awaitRaw(ctx, sink, "listening", &ev); err != nil {
		return nil, nil, err
	}
	if err := source.Send(ev.Addr); err != nil {
		return nil, nil, err
	}
	var secs, cpus []float64
	for range reps {
		if err := awaitRaw(ctx, source, "rep", &ev); err != nil {
			return nil, nil, err
		}
		secs, cpus = append(secs, ev.Seconds), append(cpus, ev.CPUSeconds)
	}
	for i := range reps {
		if err := awaitRaw(ctx, sink, "rep", &ev); err != nil {
			return nil, nil, err
		}
		cpus[i] += ev.CPUSeconds
	}
	for _, p := range []*cluster.Proc{sink, source} {
		if _, err := p.Wait(ctx); err != nil {
			return nil, nil, err
		}
	}
	debug.FreeOSMemory()
	return secs, cpus, nil
}

// awaitRaw reads p's lines until event (decoded into v), failing on an error line or when p ends.
func awaitRaw(ctx context.Context, p *cluster.Proc, event string, v *rawEvent) error {
	for {
		l, err := p.Next(ctx)
		if err != nil {
			return err
		}
		if l.Event == "error" || l.Event == event {
			if err := l.Decode(v); err != nil {
				return err
			}
			if l.Event == "error" {
				return fmt.Errorf("%s: %s", p.Name(), v.Detail)
			}
			return nil
		}
	}
}

// await reads p's lines until event and returns it, failing on an error line or when p ends.
func await(ctx context.Context, p *cluster.Proc, event string) (peerEvent, error) {
	for {
		l, err := p.Next(ctx)
		if err != nil {
			return peerEvent{}, err
		}
		if l.Event != "error" && l.Event != event {
			continue
		}
		var ev peerEvent
		if err := l.Decode(&ev); err != nil {
			return ev, err
		}
		if l.Event == "error" {
			return ev, fmt.Errorf("%s: %s", p.Name(), ev.Detail)
		}
		return ev, nil
	}
}

// spawnPeer starts one peer process and waits until its state is built.
func (b *bench) spawnPeer(ctx context.Context, name string, zero bool) (*cluster.Proc, error) {
	p := b.p
	p.Zero = zero
	js, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	proc, err := b.c.Spawn(cluster.Spec{Role: rolePeer, Name: name, Env: append(slices.Clone(b.env), envParams+"="+string(js))})
	if err != nil {
		return nil, err
	}
	if _, err := await(ctx, proc, "ready"); err != nil {
		return nil, err
	}
	return proc, nil
}

// startGroup starts the founding peers and admits them all.
func (b *bench) startGroup(ctx context.Context) ([]*cluster.Proc, error) {
	progress("starting %d peers with %d bytes of state each", b.n, b.p.Bytes)
	procs := make([]*cluster.Proc, b.n)
	for i := range procs {
		p, err := b.spawnPeer(ctx, fmt.Sprintf("peer-%d", i), false)
		if err != nil {
			return nil, err
		}
		procs[i] = p
	}
	if _, err := await(ctx, procs[0], "connected"); err != nil {
		return nil, err
	}
	if _, err := b.admit(ctx, procs[:1], b.n); err != nil {
		return nil, err
	}
	for _, p := range procs[1:] {
		if _, err := await(ctx, p, "connected"); err != nil {
			return nil, err
		}
	}
	return procs, nil
}

// admit runs admission rounds on the accepted peers until the ring holds world peers, and returns
// the duration of the round that got there: from the common start until the last peer's
// ArePeersPending and UpdateTopology returned.
func (b *bench) admit(ctx context.Context, accepted []*cluster.Proc, world int) (time.Duration, error) {
	for {
		evs, start, err := b.round(ctx, accepted, command{Cmd: "admit"}, "admitted")
		if err != nil {
			return 0, err
		}
		if evs[0].World == world {
			return lastEnd(evs).Sub(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("admitting peers: ring of %d, want %d: %w", evs[0].World, world, ctx.Err())
		case <-time.After(admitRetryPeriod):
		}
	}
}

// round sends cmd to every proc with a common start instant shortly ahead, and collects the event
// each answers with.
func (b *bench) round(ctx context.Context, procs []*cluster.Proc, cmd command, event string) ([]peerEvent, time.Time, error) {
	start := time.Now().Add(roundStartDelay)
	cmd.StartNs = start.UnixNano()
	for _, p := range procs {
		if err := p.Send(cmd); err != nil {
			return nil, start, err
		}
	}
	evs := make([]peerEvent, len(procs))
	for i, p := range procs {
		ev, err := await(ctx, p, event)
		if err != nil {
			return nil, start, err
		}
		evs[i] = ev
	}
	return evs, start, nil
}

func lastEnd(evs []peerEvent) time.Time {
	var ns int64
	for _, ev := range evs {
		ns = max(ns, ev.EndNs)
	}
	return time.Unix(0, ns)
}

// noop runs one sync of the founders, who already agree, with every entry's Version set to version,
// and returns its time in milliseconds.
func (b *bench) noop(ctx context.Context, founders []*cluster.Proc, version uint64) (float64, error) {
	b.revision++
	evs, start, err := b.round(ctx, founders, command{Cmd: "sync", Revision: b.revision, Version: version}, "synced")
	if err != nil {
		return 0, err
	}
	for i, ev := range evs {
		if ev.Fetched != 0 {
			return 0, fmt.Errorf("%s fetched %d bytes in a no-op sync", founders[i].Name(), ev.Fetched)
		}
	}
	return float64(lastEnd(evs).Sub(start).Microseconds()) / 1e3, nil
}

// join starts a newcomer with zeroed state, admits it, syncs everyone and checks the digests.
func (b *bench) join(ctx context.Context, res *result, founders []*cluster.Proc, compress bool, profile string) error {
	progress("newcomer: building zeroed state")
	nc, err := b.spawnPeer(ctx, "newcomer", true)
	if err != nil {
		return err
	}
	admitted, err := b.admit(ctx, founders, b.n+1)
	if err != nil {
		return err
	}
	if _, err := await(ctx, nc, "connected"); err != nil {
		return err
	}
	res.JoinUpdateTopologySeconds = admitted.Seconds()
	all := append(slices.Clone(founders), nc)
	progress("newcomer admitted in %.3f s; syncing", res.JoinUpdateTopologySeconds)
	evs, err := b.joinSync(ctx, founders, nc, func(p *cluster.Proc, cmd *command) error {
		if p == nc {
			cmd.Compress = compress
		}
		if profile == "" || (p != nc && p != founders[0]) {
			return nil
		}
		file := "newcomer.cpu.pprof"
		if p != nc {
			file = "donor.cpu.pprof"
		}
		if err := os.MkdirAll(profile, 0o755); err != nil {
			return err
		}
		abs, err := filepath.Abs(filepath.Join(profile, file))
		cmd.Profile = abs
		return err
	})
	if err != nil {
		return err
	}
	ev := evs[len(evs)-1]
	res.JoinSeconds = time.Duration(ev.EndNs - ev.StartNs).Seconds()
	res.JoinTotalSeconds = res.JoinUpdateTopologySeconds + res.JoinSeconds
	res.JoinFetchedBytes = ev.Fetched
	for i, e := range evs {
		var u usage
		if e.Usage != nil {
			u = *e.Usage
		}
		if i == len(evs)-1 {
			res.JoinNewcomerUsage = u
		} else {
			res.JoinDonorUsage = append(res.JoinDonorUsage, u)
		}
	}
	if ev.FirstRangeNs != 0 {
		res.JoinFirstRangeSeconds = time.Duration(ev.FirstRangeNs - ev.StartNs).Seconds()
		res.JoinLastRangeSeconds = time.Duration(ev.LastRangeNs - ev.StartNs).Seconds()
	}
	res.JoinRatio = res.JoinSeconds / res.RawTransferSeconds
	res.DonorBoundSeconds = res.RawTransferSeconds / float64(b.n)
	res.JoinVsDonorBound = res.JoinSeconds / res.DonorBoundSeconds
	if ev.Fetched != int64(b.p.Bytes) {
		return fmt.Errorf("newcomer fetched %d bytes, want %d", ev.Fetched, b.p.Bytes)
	}
	for i := range b.againJoins {
		secs, err := b.joinAgain(ctx, founders, nc, uint64(i+2), compress)
		if err != nil {
			return fmt.Errorf("join %d again: %w", i+1, err)
		}
		res.JoinAgainSecondsAll = append(res.JoinAgainSecondsAll, secs)
	}

	progress("re-hashing every peer's state")
	digests, _, err := b.round(ctx, all, command{Cmd: "digest"}, "digest")
	if err != nil {
		return err
	}
	res.BitIdentical = true
	for i, d := range digests {
		if d.Digest != digests[0].Digest || d.Revision != digests[0].Revision {
			res.BitIdentical = false
			progress("%s holds digest %s at revision %d, %s holds %s at %d", all[i].Name(), d.Digest, d.Revision,
				all[0].Name(), digests[0].Digest, digests[0].Revision)
		}
	}
	for _, p := range all {
		if err := p.Send(command{Cmd: "exit"}); err != nil {
			return err
		}
	}
	for _, p := range all {
		if code, err := p.Wait(ctx); err != nil || code != 0 {
			return errors.Join(err, fmt.Errorf("%s exited with status %d", p.Name(), code))
		}
	}
	return nil
}
