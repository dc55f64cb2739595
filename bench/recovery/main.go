// Command recovery measures how fast Concord's survivors notice a dead or hung peer and carry on, and
// what they pay when a peer leaves gracefully.
//
//	go run ./bench/recovery --peers 4
//
// It starts a master (LAN preset: heartbeats every 250ms, a peer is gone after 1.5s of silence) and
// --peers peer processes (this program, re-executed) that loop like a training job: if peers are
// pending, UpdateTopology; AllReduce --size bytes (256 MiB); on ErrPeerLeft or ErrAborted,
// UpdateTopology and retry; on SIGTERM, leave at the membership step. A failed call must leave its buffer unchanged: every peer keeps a second
// buffer with the same contribution, retries on it, and hashes the failed call's buffer (xxh3, against
// the contribution's) once the retry has ended everywhere, so that the check's pass over 256 MiB does
// not compete for the cores with the recovery being timed; the next fault waits until every survivor
// has reported its check (restore_checks counts them). Every peer reports each event as a JSON line
// stamped with the machine's wall clock. --gomaxprocs (auto by default, as in bench/allreduce) gives
// every child its share of the cores.
//
// Kill rounds (--kills, 20): while an AllReduce is in flight on every peer, after a random delay
// within the expected duration of the call, SIGKILL one peer. abort_ms is the time from the kill
// until every survivor's call has returned its error; resume_ms until every survivor's next AllReduce
// has completed (its result is checked, element by element, after that); redials_per_kill is the
// median number of data connections the survivors opened between their abort and that completion
// (only the dead peer's neighbours need new links). Then a replacement is spawned and admitted, and
// the next round waits for the full group.
//
// Stall rounds (--stalls, 5): SIGSTOP one peer mid-call; stall_ms is the time until every survivor's
// call has returned an error (the master declares the silent peer gone after its heartbeat timeout).
// The peer is then continued with SIGCONT: it must leave cleanly (kicked) or rejoin; a replacement
// takes its place if it left.
//
// Master restart rounds (--restarts, 5): while an AllReduce is in flight on every peer, SIGKILL the
// master and start a new one on the same address. master_restart_resume_ms is the time from the new
// master listening until every peer has completed an AllReduce after its failed one (the peers
// reconnect, report, and the master rebuilds the ring); master_restart_total_ms counts from the kill.
// master_restart_revisions_lost is the most calls of the training loop one restart cost, over the
// rounds: 1 when the call in flight failed and was redone, 0 when it completed.
//
// Graceful leave rounds (--leaves, 5): while an AllReduce is in flight on every peer, after a random
// delay within the expected duration of the call, send one peer SIGTERM. The peer finishes its call
// and leaves at its next membership step, with Communicator.Leave in place of its ArePeersPending,
// as `peer run` does on SIGTERM or a preemption notice; it must report that it left and exit 0. The
// master answers the survivors' ArePeersPending "pending" and removes the leaver; the survivors
// re-wire at their UpdateTopology, vote again, and go on without it. The round waits until every
// survivor has completed three calls without the leaver; then a replacement is spawned and
// admitted, as after a kill.
//
// graceful_leave_ms is the survivors' stall: per round, the longest over the survivors of the time
// from the master's "pending" answer at their membership step (where a steady step goes on to its
// call) until the step ends, ready for the first call without the leaver, that is the
// UpdateTopology that re-wires the ring and the ArePeersPending vote after it. Everything else in
// the loop (checking the last result, the vote that waits for the slowest peer, refilling the
// buffer, the call itself) a steady step pays too. As a check on that, graceful_leave_period_ms
// measures the whole loop period across the leave: for each survivor, from the completion of its last
// call with the leaver (t0) to that of its first call without it (t1); per round the longest t1 − t0
// minus graceful_leave_baseline_ms, the median period between two consecutive completions of one
// survivor with nothing in between (no membership change, no failed call, no buffer check) at the
// same world size, from the second and third calls without the leaver of every leave round of the
// run. It takes in the first call on the re-wired ring as well, and with it the spread of the peers'
// work on 256 MiB (the checks, the fills and the calls vary by tens of ms on a busy machine), so it
// is printed beside, not held to the limit. graceful_leave_aborts counts the survivors' calls that
// failed between the SIGTERM and the end of the round; a clean leave has none.
//
// targets_met is true when abort_ms_p99 ≤ 100, stall_ms_p99 ≤ 2500, resume_ms_p50 ≤ 300,
// redials_per_kill ≤ 4 and master_restart_resume_ms_p99 ≤ 2000, with leave rounds
// graceful_leave_ms_p50 ≤ 50 (graceful_leave_ms_p50_limit) and graceful_leave_aborts = 0, every
// restored buffer matched and every result was correct. abort_after_gone_ms_p99_limit (50) is a
// budget for the part of an abort after the kernel has closed the victim's sockets, printed beside
// its figure to read the abort by; it is not part of targets_met, since its p99 over 20 kills is
// their maximum, one scheduling delay. graceful_leave_ms_p50, a median, is in targets_met like
// resume_ms_p50.
//
// --hosts runs the master on a host of its own and every peer on another, each host a network
// namespace with its own address on one bridge (veth pairs to a Linux bridge, internal/hosts), as one
// peer per machine: the peers' links cross the bridge over TCP, a killed peer's sockets are closed
// by its host's kernel and the survivors hear of it over the wire, and a restarted master comes back
// on its host's address. A replacement takes the host of a peer that exited. The JSON says
// "hosts": true. It needs root (network namespaces); without it the command exits with status 2.
//
// p50 and p99 are nearest-rank percentiles; with fewer than 100 samples p99 is the maximum (the key
// samples says how many). A round whose kill came after the call had already finished somewhere is
// not a sample; it is repeated (kills_missed counts them). Progress goes to stderr, the JSON result is
// the last line on stdout. Everything is bounded by --timeout: on a hang the command fails with a
// message saying what it waited for, and kills every child.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/concord-ccl/concord/bench/internal/hostbed"
	"github.com/concord-ccl/concord/bench/internal/measure"
	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/pccl/master"
)

// Targets the result is compared to.
const (
	targetAbortP99         = 100.0  // ms, on loopback
	targetStallP99         = 2500.0 // ms
	targetRestartResumeP99 = 2000.0 // ms, from the new master's start
	// targetAfterGoneP99 bounds abort_after_gone_ms_p99: what Concord adds after the kernel closed
	// the victim's sockets.
	targetAfterGoneP99 = 50.0 // ms
	// targetResumeP50 bounds resume_ms_p50 and targetRedials redials_per_kill.
	targetResumeP50 = 300.0 // ms
	targetRedials   = 4.0
	// targetLeaveP50 bounds graceful_leave_ms_p50: the survivors' stall when a peer leaves on SIGTERM.
	targetLeaveP50 = 50.0 // ms
)

// leaveCalls is how many calls every survivor completes without the leaver before a leave round
// ends: the first is the one measured, the others give the steady period it is compared to.
const leaveCalls = 3

// keepCalls is how many of its last completed calls the bench remembers of a peer.
const keepCalls = 16

// Bounds of the waits within one round.
const (
	waitAbort  = 30 * time.Second
	waitResume = 60 * time.Second
	waitJoin   = 90 * time.Second
	waitLeave  = 20 * time.Second
)

type result struct {
	Hosts           bool      `json:"hosts"`      // every process on a host of its own (--hosts)
	GOMAXPROCS      int       `json:"gomaxprocs"` // of every child; 0: Go's default
	Peers           int       `json:"peers"`
	Bytes           int       `json:"bytes"`
	Kills           int       `json:"kills"`
	Stalls          int       `json:"stalls"`
	Samples         int       `json:"samples"`
	StallSamples    int       `json:"stall_samples"`
	PercentileNote  string    `json:"percentile_note"`
	AbortMsP50      float64   `json:"abort_ms_p50"`
	AbortMsP99      float64   `json:"abort_ms_p99"`
	ResumeMsP50     float64   `json:"resume_ms_p50"`
	ResumeMsP99     float64   `json:"resume_ms_p99"`
	ResumeP50Limit  float64   `json:"resume_ms_p50_limit"`
	RedialsPerKill  float64   `json:"redials_per_kill"` // median over kills of the data connections survivors opened to recover
	RedialsLimit    float64   `json:"redials_per_kill_limit"`
	StallMsP50      float64   `json:"stall_ms_p50"`
	StallMsP99      float64   `json:"stall_ms_p99"`
	BuffersRestored bool      `json:"buffers_restored"`
	RestoreChecks   int       `json:"restore_checks"` // failed calls whose buffer was hashed afterwards
	ResultsCorrect  bool      `json:"results_correct"`
	AbortMs         []float64 `json:"abort_ms"`
	ResumeMs        []float64 `json:"resume_ms"`
	Redials         []float64 `json:"redials"`
	AbortFirstMs    []float64 `json:"abort_first_ms"`
	VictimExitMs    []float64 `json:"victim_exit_ms"`
	// AbortAfterExitMsP99 is the p99 over kill rounds of (last survivor's return − the moment the
	// parent saw the victim reaped): the part of abort_ms after the kernel has torn the victim down and
	// closed its sockets. It may be negative: sockets close before the process is reaped.
	AbortAfterExitMsP50 float64 `json:"abort_after_victim_exit_ms_p50"`
	AbortAfterExitMsP99 float64 `json:"abort_after_victim_exit_ms_p99"`
	// AbortAfterGoneMs is, per kill round, the last survivor's return minus the first far-end
	// close of a data connection any survivor observed after the kill (end of file or reset from the
	// victim's sockets): the part of abort_ms that Concord controls. Rounds in which no survivor saw
	// such a close count in gone_unobserved instead.
	AbortAfterGoneMsP50 float64        `json:"abort_after_gone_ms_p50"`
	AbortAfterGoneMsP99 float64        `json:"abort_after_gone_ms_p99"`
	AbortAfterGoneLimit float64        `json:"abort_after_gone_ms_p99_limit"`
	AbortAfterGoneMs    []float64      `json:"abort_after_gone_ms"`
	GoneUnobserved      int            `json:"gone_unobserved"`
	StallMs             []float64      `json:"stall_ms"`
	StallResumeMs       []float64      `json:"stall_resume_ms"`
	AbortErrors         map[string]int `json:"abort_errors"`
	StalledPeerExit     map[string]int `json:"stalled_peer_outcome"`
	KillsMissed         int            `json:"kills_missed"`
	OpSecondsMedian     float64        `json:"op_seconds_median"`
	Restarts            int            `json:"master_restarts"`
	RestartSamples      int            `json:"master_restart_samples"`
	RestartResumeMsP50  float64        `json:"master_restart_resume_ms_p50"`
	RestartResumeMsP99  float64        `json:"master_restart_resume_ms_p99"`
	RestartResumeMs     []float64      `json:"master_restart_resume_ms"`
	RestartTotalMs      []float64      `json:"master_restart_total_ms"`
	RevisionsLost       int            `json:"master_restart_revisions_lost"`
	// The graceful leave rounds (see the package doc).
	Leaves           int       `json:"leaves"`
	LeaveSamples     int       `json:"graceful_leave_samples"`
	LeaveMsP50       float64   `json:"graceful_leave_ms_p50"`
	LeaveMsP99       float64   `json:"graceful_leave_ms_p99"`
	LeaveLimit       float64   `json:"graceful_leave_ms_p50_limit"`
	LeaveMs          []float64 `json:"graceful_leave_ms"`
	LeavePeriodMsP50 float64   `json:"graceful_leave_period_ms_p50"`
	LeavePeriodMs    []float64 `json:"graceful_leave_period_ms"`
	LeaveBaselineMs  float64   `json:"graceful_leave_baseline_ms"`
	LeaveAborts      int       `json:"graceful_leave_aborts"`
	TargetsMet       bool      `json:"targets_met"`
	Failure          string    `json:"failure,omitempty"`
}

// roles are the roles this program runs as a child.
var roles = map[string]func() int{rolePeer: peerMain}

func main() {
	cluster.Main(roles)
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("recovery", flag.ContinueOnError)
	peers := fs.Int("peers", 4, "number of peer processes")
	sizeStr := fs.String("size", "256MiB", "AllReduce buffer size per peer")
	kills := fs.Int("kills", 20, "SIGKILL rounds")
	stalls := fs.Int("stalls", 5, "SIGSTOP rounds")
	restarts := fs.Int("restarts", 5, "master restart rounds")
	leaves := fs.Int("leaves", 5, "graceful leave rounds (SIGTERM)")
	onHosts := fs.Bool("hosts", false, "run the master and every peer each on a host of its own (network namespaces on one bridge; needs root)")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up (and kill every child) after this long")
	seed := fs.Uint64("seed", 1, "seed of the victims and kill delays")
	verbose := fs.Bool("v", false, "print every line of every peer to stderr")
	procsFlag := fs.String("gomaxprocs", "auto", measure.ProcsUsage)
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	size, err := measure.ParseSize(*sizeStr)
	if err != nil || size <= 0 || size%4 != 0 || *peers < 3 || *kills < 0 || *stalls < 0 || *restarts < 0 || *leaves < 0 {
		fmt.Fprintln(os.Stderr, "recovery: need --peers >= 3 (two survivors), --size a positive multiple of 4, --kills, --stalls, --restarts and --leaves >= 0")
		return 2
	}
	procs, err := measure.ParseProcs(*procsFlag, *peers)
	if err != nil {
		fmt.Fprintln(os.Stderr, "recovery:", err)
		return 2
	}
	var bed *hostbed.Bed
	if *onHosts {
		if err := hostbed.Available(); err != nil {
			fmt.Fprintln(os.Stderr, "recovery: --hosts runs every process in a network namespace of its own:", err)
			return 2
		}
		// A host per peer, and two for peers that are still on their way out when their
		// replacement starts.
		if bed, err = hostbed.New(*peers + 2); err != nil {
			fmt.Fprintln(os.Stderr, "recovery: --hosts:", err)
			return 1
		}
		defer bed.Close()
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, *timeout)
	defer cancelT()

	c := cluster.New(cluster.Config{Env: measure.ProcsEnv(procs)})
	b := newBench(c, *peers, int(size), *seed, *timeout+time.Minute)
	b.bed, b.res.Hosts = bed, bed != nil
	b.verbose = *verbose
	b.res.Kills, b.res.Stalls, b.res.Restarts, b.res.Leaves = *kills, *stalls, *restarts, *leaves
	b.res.GOMAXPROCS = procs
	err = b.run(ctx, *kills, *stalls, *restarts, *leaves)
	if cerr := c.Close(); cerr != nil {
		fmt.Fprintln(os.Stderr, "recovery:", cerr)
	}
	res := b.summary()
	if err != nil {
		fmt.Fprintln(os.Stderr, "recovery: FAILED:", err)
		res.Failure = err.Error()
		res.TargetsMet = false
	}
	js, _ := json.Marshal(res)
	fmt.Println(string(js))
	if err != nil {
		return 1
	}
	return 0
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "recovery: "+format+"\n", args...)
}

// peerState is what the parent knows of one peer from its lines.
type peerState struct {
	proc   *cluster.Proc
	victim bool // killed or stopped by us: no longer counted among the live peers
	start  peerEvent
	done   peerEvent
	abort  peerEvent
	exit   peerEvent
	// abortedStart is when the call that abort ended had started (its op_started line's T).
	abortedStart int64
	// aborts and checks count the peer's failed calls and the checks of their buffers.
	aborts, checks int
	// calls are the peer's last completed calls, oldest first (at most keepCalls); checkedSince says
	// that a buffer was checked since the last.
	calls        []callRecord
	checkedSince bool
	left         peerEvent // the peer left gracefully
	connected    peerEvent
}

// callRecord is one completed call of a peer.
type callRecord struct {
	Seq, World    int
	Started, Done int64 // wall clock, Unix ns; Started is 0 if its op_started line was not seen
	// Pending and Ready are when the membership step before the call was first answered "pending"
	// (0: it was not) and when it ended (0 if the op_started line was not seen).
	Pending, Ready  int64
	CheckedInBefore bool // the peer checked a failed call's buffer between its previous call and this one
}

// steadyAfter reports whether c followed p with nothing in between: the next step of the loop (no
// membership change, no failed call), at the same world size, and no buffer check.
func (c callRecord) steadyAfter(p callRecord) bool {
	return c.Seq == p.Seq+1 && c.World == p.World && !c.CheckedInBefore && c.Started > 0
}

// bench runs the rounds. It is used by one goroutine.
type bench struct {
	c        *cluster.Cluster
	bed      *hostbed.Bed // the hosts every process runs on; nil: all on this one, over loopback
	master   *cluster.Proc
	addr     string // the master's address
	n, bytes int
	rng      *rand.Rand
	lifetime time.Duration
	verbose  bool
	env      []string
	spawned  int
	peers    map[*cluster.Proc]*peerState
	opSecs   []float64
	// Per leave round, the survivors' longest stall (ms) and their longest period across the leave
	// (t1 − t0, ms); the steady periods of the calls after the leaves (ms).
	leaveStalls, leaveSpans []float64
	leavePeriods            []float64
	res                     result
}

// newBench returns a bench of n peers of the given buffer size in c; peers give up after lifetime.
func newBench(c *cluster.Cluster, n, bytes int, seed uint64, lifetime time.Duration) *bench {
	return &bench{
		c: c, n: n, bytes: bytes, rng: rand.New(rand.NewPCG(seed, 0x5eed)), lifetime: lifetime,
		peers: map[*cluster.Proc]*peerState{},
		res: result{Peers: n, Bytes: bytes, BuffersRestored: true, ResultsCorrect: true,
			AbortErrors: map[string]int{}, StalledPeerExit: map[string]int{},
			PercentileNote: "nearest rank; with fewer than 100 samples p99 is the maximum"},
	}
}

func (b *bench) spawn() error {
	spec := cluster.Spec{Role: rolePeer, Name: fmt.Sprintf("peer-%d", b.spawned), Env: b.env}
	var p *cluster.Proc
	var err error
	if b.bed != nil {
		p, _, err = b.bed.Spawn(b.c, spec)
	} else {
		p, err = b.c.Spawn(spec)
	}
	if err != nil {
		return err
	}
	b.spawned++
	b.peers[p] = &peerState{proc: p}
	return nil
}

// live returns the peers that are neither victims nor exited, in spawn order.
func (b *bench) live() []*peerState {
	var out []*peerState
	for _, p := range b.c.Procs() {
		if s := b.peers[p]; s != nil && !s.victim && s.exit.Event == "" {
			out = append(out, s)
		}
	}
	return out
}

// handle records one line.
func (b *bench) handle(l cluster.Line) error {
	if b.verbose {
		progress("%s", l)
	}
	s := b.peers[l.Proc]
	if s == nil {
		return nil // the master
	}
	var ev peerEvent
	if err := l.Decode(&ev); err != nil {
		return nil // not one of ours (a stray print)
	}
	switch ev.Event {
	case "connected":
		s.connected = ev
	case "op_started":
		s.start = ev
	case "op_done":
		s.done = ev
		rec := callRecord{Seq: ev.Seq, World: ev.World, Done: ev.T, CheckedInBefore: s.checkedSince}
		if s.start.Seq == ev.Seq {
			rec.Started, rec.Pending, rec.Ready = s.start.T, s.start.Pending, s.start.Ready
		}
		s.checkedSince = false
		s.calls = append(s.calls, rec)
		if len(s.calls) > keepCalls {
			s.calls = append(s.calls[:0], s.calls[len(s.calls)-keepCalls:]...)
		}
		if !ev.OK {
			b.res.ResultsCorrect = false
			progress("%s: WRONG RESULT (world %d): %s", l.Proc.Name(), ev.World, ev.Detail)
		}
		if ev.World == b.n {
			b.opSecs = append(b.opSecs, ev.Seconds)
		}
	case "aborted":
		s.abort = ev
		s.abortedStart = 0
		if s.start.Seq == ev.Seq {
			s.abortedStart = s.start.T
		}
		s.aborts++
	case "checked":
		s.checkedSince = true
		s.checks++
		b.res.RestoreChecks++
		if !ev.Restored {
			b.res.BuffersRestored = false
			progress("%s: buffer NOT restored after its call %d failed", l.Proc.Name(), ev.Seq)
		}
	case "left":
		s.left = ev
	case "exit":
		s.exit = ev
		if !s.victim {
			// A peer nobody hurt was kicked (e.g. heartbeats starved on an overloaded machine): the
			// group can no longer become whole, so say so now instead of timing out later.
			return fmt.Errorf("%s left unexpectedly: %s: %s", l.Proc.Name(), ev.Kind, ev.Detail)
		}
	case "error":
		if !s.victim {
			return fmt.Errorf("%s: %s", l.Proc.Name(), ev.Detail)
		}
	}
	return nil
}

// until processes lines until cond holds, for at most limit; what names the wait in errors.
func (b *bench) until(ctx context.Context, limit time.Duration, what string, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case l, ok := <-b.c.Lines():
			if !ok {
				return errors.New("cluster closed")
			}
			if err := b.handle(l); err != nil {
				return err
			}
		case <-tick.C:
			for _, s := range b.live() {
				select {
				case <-s.proc.Done():
					return fmt.Errorf("while waiting for %s: %s exited unexpectedly with status %d", what, s.proc.Name(), s.proc.ExitCode())
				default:
				}
			}
		case <-ctx.Done():
			return fmt.Errorf("hang: %s did not happen within %v (%w); %s", what, limit, ctx.Err(), b.describe())
		}
	}
	return nil
}

// describe names the last call each live peer started, completed and saw fail, for hang reports.
func (b *bench) describe() string {
	var parts []string
	for _, s := range b.live() {
		parts = append(parts, fmt.Sprintf("%s: started #%d (world %d), done #%d (world %d), aborted #%d (%s)",
			s.proc.Name(), s.start.Seq, s.start.World, s.done.Seq, s.done.World, s.abort.Seq, s.abort.Kind))
	}
	return "live peers: " + strings.Join(parts, "; ")
}

// allStartedSince waits until every live peer has started a call at full size after t.
func (b *bench) allStartedSince(ctx context.Context, t int64) error {
	return b.until(ctx, waitJoin, fmt.Sprintf("all %d peers in an AllReduce at full size", b.n), func() bool {
		live := b.live()
		if len(live) != b.n {
			return false
		}
		for _, s := range live {
			if s.start.T < t || s.start.World != b.n || s.start.Seq <= s.done.Seq || s.start.Seq <= s.abort.Seq {
				return false
			}
		}
		return true
	})
}

// masterHost returns where the master listens and how it is started: on loopback, or on its host.
func (b *bench) masterHost() (string, func(*exec.Cmd) error) {
	if b.bed == nil {
		return "", nil
	}
	return b.bed.MasterListen(), b.bed.MasterStart
}

func (b *bench) run(ctx context.Context, kills, stalls, restarts, leaves int) error {
	listen, start := b.masterHost()
	mp, addr, err := b.c.StartMasterWith(ctx, master.LAN(), listen, start)
	if err != nil {
		return fmt.Errorf("master: %w", err)
	}
	b.master, b.addr = mp, addr
	js, _ := json.Marshal(params{Bytes: b.bytes, Lifetime: b.lifetime})
	b.env = []string{envMaster + "=" + addr, envParams + "=" + string(js)}
	for range b.n {
		if err := b.spawn(); err != nil {
			return err
		}
	}
	progress("master on %s; %d peers, %d bytes per AllReduce", addr, b.n, b.bytes)
	// Two full-size calls complete before the first round, to learn how long one takes.
	if err := b.until(ctx, waitJoin, "two full-size AllReduce calls", func() bool { return len(b.opSecs) >= 2*b.n }); err != nil {
		return err
	}
	for done, tries := 0, 0; done < kills; tries++ {
		if tries >= 2*kills+5 {
			return fmt.Errorf("only %d of %d kill rounds hit a call in flight after %d tries", done, kills, tries)
		}
		ok, err := b.killRound(ctx, done)
		if err != nil {
			return fmt.Errorf("kill round %d: %w", done+1, err)
		}
		if ok {
			done++
		}
	}
	for done, tries := 0, 0; done < stalls; tries++ {
		if tries >= 2*stalls+5 {
			return fmt.Errorf("only %d of %d stall rounds hit a call in flight after %d tries", done, stalls, tries)
		}
		ok, err := b.stallRound(ctx, done)
		if err != nil {
			return fmt.Errorf("stall round %d: %w", done+1, err)
		}
		if ok {
			done++
		}
	}
	for done, tries := 0, 0; done < restarts; tries++ {
		if tries >= 2*restarts+5 {
			return fmt.Errorf("only %d of %d restart rounds hit a call in flight after %d tries", done, restarts, tries)
		}
		ok, err := b.restartRound(ctx, done)
		if err != nil {
			return fmt.Errorf("restart round %d: %w", done+1, err)
		}
		if ok {
			done++
		}
	}
	for i := range leaves {
		if err := b.leaveRound(ctx, i); err != nil {
			return fmt.Errorf("leave round %d: %w", i+1, err)
		}
	}
	return b.awaitChecks(ctx)
}

// restartRound kills the master while a call is in flight everywhere and starts a new one on its
// address; every peer must carry on.
func (b *bench) restartRound(ctx context.Context, i int) (bool, error) {
	v, err := b.strike(ctx)
	if err != nil || v == nil {
		return false, err
	}
	tk := time.Now().UnixNano()
	if err := b.master.Kill(); err != nil {
		return false, err
	}
	if _, err := b.master.Wait(ctx); err != nil {
		return false, fmt.Errorf("hang: the killed master was not reaped: %w", err)
	}
	_, start := b.masterHost()
	mp, _, err := b.c.StartMasterWith(ctx, master.LAN(), b.addr, start)
	if err != nil {
		return false, fmt.Errorf("restart the master on %s: %w", b.addr, err)
	}
	b.master = mp
	tb := time.Now().UnixNano()
	// Every peer's call in flight must fail. The kill can also fall between two calls on every
	// peer (a call that ended just before it, its line still on the way): then no call fails, and the
	// peers go on under the new master; a call completed after it started says so, and the round
	// is not a sample.
	late := false
	err = b.until(ctx, waitAbort, "every peer's AllReduce returning an error after SIGKILL of the master, or completing under the new master", func() bool {
		for _, s := range b.live() {
			if s.abort.T < tk && s.done.T < tb {
				return false
			}
		}
		return true
	})
	if err != nil {
		return false, err
	}
	for _, s := range b.live() {
		if s.abort.T < tk || (s.done.T >= tk && s.done.T < s.abort.T) {
			late = true
		} else {
			b.res.AbortErrors[s.abort.Kind]++
		}
	}
	resumed, err := b.survivorsResumed(ctx)
	if err != nil {
		return false, err
	}
	if late {
		b.res.KillsMissed++
		progress("restart %d: the master was killed after a call had finished; not a sample", i+1)
		return false, nil
	}
	resume, total := float64(resumed-tb)/1e6, float64(resumed-tk)/1e6
	b.res.RestartResumeMs = append(b.res.RestartResumeMs, resume)
	b.res.RestartTotalMs = append(b.res.RestartTotalMs, total)
	b.res.RevisionsLost = max(b.res.RevisionsLost, 1) // the call in flight failed and was redone
	progress("restart %d: every peer resumed %.1f ms after the new master started (%.1f ms after the kill)", i+1, resume, total)
	return true, nil
}

// strike waits for the checks of earlier failed calls and for a call in flight on every peer, sleeps
// a random part of its expected duration, and picks a victim. It returns nil (and no error) if a call
// finished during the sleep: the caller then repeats the round.
func (b *bench) strike(ctx context.Context) (*peerState, error) {
	if err := b.awaitChecks(ctx); err != nil {
		return nil, err
	}
	if err := b.allStartedSince(ctx, time.Now().UnixNano()); err != nil {
		return nil, err
	}
	est := measure.Median(b.opSecs[max(0, len(b.opSecs)-8*b.n):])
	delay := time.Duration((0.05 + 0.45*b.rng.Float64()) * est * float64(time.Second))
	time.Sleep(delay)
	live := b.live()
	// Take in what arrived during the sleep: a call that ended already makes this round void.
	for {
		select {
		case l := <-b.c.Lines():
			if err := b.handle(l); err != nil {
				return nil, err
			}
			continue
		default:
		}
		break
	}
	for _, s := range live {
		if s.done.Seq >= s.start.Seq || s.abort.Seq >= s.start.Seq {
			b.res.KillsMissed++
			return nil, nil
		}
	}
	return live[b.rng.IntN(len(live))], nil
}

// missed reports whether a fault at t missed the call of s that its last abort ended: s completed a
// call after t before that abort, or the failed call began after t.
func (s *peerState) missed(t int64) bool {
	return s.done.T >= t && s.done.T < s.abort.T || s.abortedStart >= t
}

// passedBy reports whether s completed a call it started after a fault at t: the fault came between
// two of its calls (the line of the one before still on its way when strike looked), and the group
// went on without the victim, or without noticing it yet.
func (s *peerState) passedBy(t int64) bool {
	return s.done.Seq == s.start.Seq && s.start.T >= t
}

// survivorsAborted waits until every survivor's call has returned an error after t, or completed a
// call begun after t (see passedBy), and returns the latest return time. It reports whether the fault
// missed some survivor's call (late, see missed and passedBy): the failed call may have begun after t
// because the one in flight at t had already finished, its line not yet read when strike looked.
// Such a round measures the time between calls, not an abort.
func (b *bench) survivorsAborted(ctx context.Context, t int64, what string) (first, last int64, late bool, err error) {
	err = b.until(ctx, waitAbort, what, func() bool {
		for _, s := range b.live() {
			if s.abort.T < t && !s.passedBy(t) {
				return false
			}
		}
		return true
	})
	if err != nil {
		return 0, 0, false, err
	}
	first = math.MaxInt64
	for _, s := range b.live() {
		if s.abort.T < t {
			late = true // no call of s failed: the fault fell between two of its calls
			continue
		}
		first, last = min(first, s.abort.T), max(last, s.abort.T)
		b.res.AbortErrors[s.abort.Kind]++
		late = late || s.missed(t)
	}
	return first, last, late, nil
}

// survivorsResumed waits until every survivor has completed a call after its abort and returns the
// latest completion time.
func (b *bench) survivorsResumed(ctx context.Context) (int64, error) {
	var last int64
	err := b.until(ctx, waitResume, "every survivor completing an AllReduce after the failure", func() bool {
		for _, s := range b.live() {
			if s.done.T < s.abort.T {
				return false
			}
		}
		return true
	})
	for _, s := range b.live() {
		last = max(last, s.done.T)
	}
	return last, err
}

func (b *bench) killRound(ctx context.Context, i int) (bool, error) {
	v, err := b.strike(ctx)
	if err != nil || v == nil {
		return false, err
	}
	exited := make(chan int64, 1)
	tk := time.Now().UnixNano()
	if err := v.proc.Kill(); err != nil {
		return false, err
	}
	go func() {
		<-v.proc.Done()
		exited <- time.Now().UnixNano()
	}()
	v.victim = true
	first, last, late, err := b.survivorsAborted(ctx, tk, "every survivor's AllReduce returning an error after SIGKILL of "+v.proc.Name())
	if err != nil {
		return false, err
	}
	resumed, err := b.survivorsResumed(ctx)
	if err != nil {
		return false, err
	}
	if late {
		b.res.KillsMissed++
		progress("kill %d: %s killed after a call had finished; not a sample", i+1, v.proc.Name())
	} else {
		abort, resume := float64(last-tk)/1e6, float64(resumed-tk)/1e6
		var gone float64
		select {
		case te := <-exited:
			gone = float64(te-tk) / 1e6
		case <-time.After(waitLeave):
			return false, fmt.Errorf("hang: %s not reaped %v after SIGKILL", v.proc.Name(), waitLeave)
		}
		b.res.AbortMs = append(b.res.AbortMs, abort)
		b.res.AbortFirstMs = append(b.res.AbortFirstMs, float64(first-tk)/1e6)
		b.res.VictimExitMs = append(b.res.VictimExitMs, gone)
		b.res.ResumeMs = append(b.res.ResumeMs, resume)
		var redials uint64
		for _, s := range b.live() {
			redials += s.done.Links - s.abort.Links
		}
		b.res.Redials = append(b.res.Redials, float64(redials))
		var seen int64 = math.MaxInt64
		for _, s := range b.live() {
			if s.abort.Gone >= tk {
				seen = min(seen, s.abort.Gone)
			}
		}
		if seen == math.MaxInt64 {
			b.res.GoneUnobserved++
		} else {
			b.res.AbortAfterGoneMs = append(b.res.AbortAfterGoneMs, float64(last-seen)/1e6)
		}
		progress("kill %d: %s; victim gone after %.1f ms; survivors aborted after %.1f ms (first %.1f ms), resumed after %.1f ms",
			i+1, v.proc.Name(), gone, abort, float64(first-tk)/1e6, resume)
	}
	return !late, b.replace(ctx)
}

func (b *bench) stallRound(ctx context.Context, i int) (bool, error) {
	v, err := b.strike(ctx)
	if err != nil || v == nil {
		return false, err
	}
	ts := time.Now().UnixNano()
	if err := v.proc.Stop(); err != nil {
		return false, err
	}
	v.victim = true
	_, last, late, err := b.survivorsAborted(ctx, ts, "every survivor's AllReduce returning an error after SIGSTOP of "+v.proc.Name())
	if err != nil {
		return false, err
	}
	if err := v.proc.Continue(); err != nil {
		return false, err
	}
	tc := time.Now().UnixNano()
	resumed, err := b.survivorsResumed(ctx)
	if err != nil {
		return false, err
	}
	// The continued peer must leave by itself (kicked) or come back into the group: complete a call
	// it started after SIGCONT. (A call that completes right after SIGCONT may be the one it was in
	// when stopped, whose line was still on its way; the master may still kick it afterwards.)
	rejoined := false
	err = b.until(ctx, waitLeave, v.proc.Name()+" leaving or rejoining after SIGCONT", func() bool {
		select {
		case <-v.proc.Done():
			return true
		default:
		}
		rejoined = v.start.T > tc && v.done.Seq == v.start.Seq && v.done.OK
		return rejoined
	})
	outcome := ""
	switch {
	case err != nil:
		outcome = "stuck (killed)"
		v.proc.Kill()
	case rejoined:
		outcome = "rejoined"
		v.victim = false
	default:
		outcome = fmt.Sprintf("exited %d after %s", v.proc.ExitCode(), v.exit.Kind)
	}
	b.res.StalledPeerExit[outcome]++
	if late {
		b.res.KillsMissed++
		progress("stall %d: %s stopped after a call had finished; not a sample", i+1, v.proc.Name())
	} else {
		stall, resume := float64(last-ts)/1e6, float64(resumed-ts)/1e6
		b.res.StallMs = append(b.res.StallMs, stall)
		b.res.StallResumeMs = append(b.res.StallResumeMs, resume)
		progress("stall %d: %s; survivors aborted after %.1f ms, resumed after %.1f ms; the stopped peer %s", i+1, v.proc.Name(), stall, resume, outcome)
	}
	if rejoined {
		return !late, nil
	}
	return !late, b.replace(ctx)
}

// leaveRound sends SIGTERM to one peer while a call is in flight everywhere: it must leave at its
// next membership step and exit 0, and the survivors go on without it, no call failing. The round ends
// once every survivor has completed leaveCalls calls without the leaver, and a replacement has been
// admitted.
func (b *bench) leaveRound(ctx context.Context, i int) error {
	if err := b.awaitChecks(ctx); err != nil {
		return err
	}
	if err := b.allStartedSince(ctx, time.Now().UnixNano()); err != nil {
		return err
	}
	est := measure.Median(b.opSecs[max(0, len(b.opSecs)-8*b.n):])
	time.Sleep(time.Duration((0.05 + 0.45*b.rng.Float64()) * est * float64(time.Second)))
	live := b.live()
	v := live[b.rng.IntN(len(live))]
	aborts := map[*peerState]int{}
	for _, s := range live {
		aborts[s] = s.aborts
	}
	tl := time.Now().UnixNano()
	if err := v.proc.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	v.victim = true
	// The leaver's last lines are on their way before it is reaped.
	err := b.until(ctx, waitLeave, v.proc.Name()+" exiting after SIGTERM", func() bool {
		select {
		case <-v.proc.Done():
			return v.left.Event != "" || v.exit.Event != ""
		default:
			return false
		}
	})
	if err != nil {
		return err
	}
	if v.left.Event == "" || v.proc.ExitCode() != 0 {
		return fmt.Errorf("%s did not leave gracefully on SIGTERM: exit status %d, %s %s", v.proc.Name(), v.proc.ExitCode(), v.exit.Kind, v.exit.Detail)
	}
	survivors := b.live()
	smaller := b.n - 1
	err = b.until(ctx, waitResume, fmt.Sprintf("every survivor completing %d calls without %s", leaveCalls, v.proc.Name()), func() bool {
		for _, s := range survivors {
			if len(s.callsSince(tl, smaller)) < leaveCalls {
				return false
			}
		}
		return true
	})
	if err != nil {
		return err
	}
	var stall, span float64
	failed := 0
	for _, s := range survivors {
		failed += s.aborts - aborts[s]
		after := s.callsSince(tl, smaller)
		j := len(s.calls) - len(after) // the first call without the leaver
		if j == 0 {
			return fmt.Errorf("%s: no call before the leave on record", s.proc.Name())
		}
		first, prev := s.calls[j], s.calls[j-1]
		if first.Ready == 0 {
			return fmt.Errorf("%s: the start of its first call without %s was not seen", s.proc.Name(), v.proc.Name())
		}
		// Without a "pending" answer the survivor did not see a clean departure (a failed call
		// took it through a retry instead): its whole gap counts.
		from := first.Pending
		if from == 0 {
			from = prev.Done
		}
		stall = max(stall, float64(first.Ready-from)/1e6)
		span = max(span, float64(first.Done-prev.Done)/1e6)
		for k := j + 1; k < min(len(s.calls), j+leaveCalls); k++ {
			if c, p := s.calls[k], s.calls[k-1]; c.steadyAfter(p) {
				b.leavePeriods = append(b.leavePeriods, float64(c.Done-p.Done)/1e6)
			}
		}
	}
	b.leaveStalls, b.leaveSpans = append(b.leaveStalls, stall), append(b.leaveSpans, span)
	b.res.LeaveAborts += failed
	progress("leave %d: %s left %.1f ms after SIGTERM; the survivors re-formed in %.1f ms (period across the leave %.1f ms); %d calls failed",
		i+1, v.proc.Name(), float64(v.left.T-tl)/1e6, stall, span, failed)
	return b.replace(ctx)
}

// callsSince returns the peer's calls completed after t at world size world, from the first of
// them on: the calls without a peer that left at t.
func (s *peerState) callsSince(t int64, world int) []callRecord {
	for j, c := range s.calls {
		if c.Done > t && c.World == world {
			return s.calls[j:]
		}
	}
	return nil
}

// awaitChecks waits until every live peer has checked the buffer of each of its failed calls, which
// it does once the retry has ended everywhere. Every round's strike begins with it, so that no check
// runs during a fault, and the run ends with it, so that the last round's checks count.
func (b *bench) awaitChecks(ctx context.Context) error {
	return b.until(ctx, waitLeave, "every survivor checking the buffer of its failed call", func() bool {
		for _, s := range b.live() {
			if s.checks < s.aborts {
				return false
			}
		}
		return true
	})
}

// replace spawns a peer for the one lost and waits until the group is whole again: every live peer
// has completed a full-size call.
func (b *bench) replace(ctx context.Context) error {
	if err := b.spawn(); err != nil {
		return err
	}
	t := time.Now().UnixNano()
	return b.until(ctx, waitJoin, "the replacement joining and a full-size AllReduce completing everywhere", func() bool {
		live := b.live()
		if len(live) != b.n {
			return false
		}
		for _, s := range live {
			if s.done.T < t || s.done.World != b.n {
				return false
			}
		}
		return true
	})
}

func (b *bench) summary() result {
	r := b.res
	r.Samples, r.StallSamples = len(r.AbortMs), len(r.StallMs)
	r.AbortMsP50, r.AbortMsP99 = percentile(r.AbortMs, 50), percentile(r.AbortMs, 99)
	r.ResumeMsP50, r.ResumeMsP99 = percentile(r.ResumeMs, 50), percentile(r.ResumeMs, 99)
	r.StallMsP50, r.StallMsP99 = percentile(r.StallMs, 50), percentile(r.StallMs, 99)
	r.RedialsPerKill = percentile(r.Redials, 50)
	r.OpSecondsMedian = percentile(b.opSecs, 50)
	r.RestartSamples = len(r.RestartResumeMs)
	r.RestartResumeMsP50, r.RestartResumeMsP99 = percentile(r.RestartResumeMs, 50), percentile(r.RestartResumeMs, 99)
	var after []float64
	for i := range r.AbortMs {
		after = append(after, r.AbortMs[i]-r.VictimExitMs[i])
	}
	r.AbortAfterExitMsP50, r.AbortAfterExitMsP99 = percentile(after, 50), percentile(after, 99)
	r.AbortAfterGoneMsP50, r.AbortAfterGoneMsP99 = percentile(r.AbortAfterGoneMs, 50), percentile(r.AbortAfterGoneMs, 99)
	r.AbortAfterGoneLimit = targetAfterGoneP99
	r.ResumeP50Limit, r.RedialsLimit = targetResumeP50, targetRedials
	r.LeaveSamples = len(b.leaveStalls)
	r.LeaveMs = b.leaveStalls
	r.LeaveMsP50, r.LeaveMsP99 = percentile(r.LeaveMs, 50), percentile(r.LeaveMs, 99)
	r.LeaveBaselineMs = percentile(b.leavePeriods, 50)
	r.LeavePeriodMs = nil
	for _, span := range b.leaveSpans {
		r.LeavePeriodMs = append(r.LeavePeriodMs, span-r.LeaveBaselineMs)
	}
	r.LeavePeriodMsP50 = percentile(r.LeavePeriodMs, 50)
	r.LeaveLimit = targetLeaveP50
	r.TargetsMet = r.Samples > 0 && r.AbortMsP99 <= targetAbortP99 && (r.StallSamples == 0 || r.StallMsP99 <= targetStallP99) &&
		r.ResumeMsP50 <= targetResumeP50 && r.RedialsPerKill <= targetRedials &&
		r.BuffersRestored && r.ResultsCorrect && (r.RestartSamples == 0 || r.RestartResumeMsP99 <= targetRestartResumeP99) &&
		(r.LeaveSamples == 0 || r.LeaveMsP50 <= targetLeaveP50) && r.LeaveAborts == 0
	return r
}

// percentile is measure.Percentile, with 0 instead of NaN for no samples (JSON has no NaN).
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return measure.Percentile(xs, p)
}
