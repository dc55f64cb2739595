package main

import (
	"bytes"
	"context"
	"maps"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/bench/internal/hostbed"
	"github.com/concord-ccl/concord/internal/cluster"
)

func TestMain(m *testing.M) {
	cluster.Main(testRoles())
	goleak.VerifyTestMain(m)
}

// roleCLI runs the command itself, with the child's arguments.
const roleCLI = "cli"

// testRoles are the program's roles and roleCLI.
func testRoles() map[string]func() int {
	r := maps.Clone(roles)
	r[roleCLI] = run
	return r
}

// TestHostsNeedRoot runs the command with --hosts as an unprivileged user: it must exit with status 2
// and say why, before it starts anything.
func TestHostsNeedRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("runs the command as another user, which needs root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, stderr, procs, err := hostbed.RunAsNobody(ctx, roleCLI, "--hosts", "--timeout", "30s")
	if err != nil {
		t.Fatalf("run the command as user 65534: %v", err)
	}
	if code != 2 || !strings.Contains(stderr, "--hosts runs every process in a network namespace of its own") {
		t.Fatalf("exit status %d, stderr %q; want 2 and why", code, stderr)
	}
	if procs != 1 {
		t.Fatalf("%d processes started, want only the command", procs)
	}
}

// lockedBuffer collects the children's stderr for a failure report.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRecoverySmall kills one peer and stops another on a small buffer, then restarts the master: the
// survivors must abort with their buffers restored, resume with correct results, the stopped peer
// must be dealt with, and every peer must carry on over the master's restart.
func TestRecoverySmall(t *testing.T) {
	if testing.Short() {
		t.Skip("stall round waits for the heartbeat timeout")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var logs lockedBuffer
	c := cluster.New(cluster.Config{Stderr: &logs, Env: []string{cluster.EnvLog + "=info"}})
	defer c.Close()
	b := newBench(c, 3, 32<<20, 7, 3*time.Minute)
	if err := b.run(ctx, 2, 1, 1, 0); err != nil {
		c.Close()
		t.Fatalf("%v\nchildren's stderr:\n%s", err, logs.String())
	}
	r := b.summary()
	if r.Samples != 2 || r.StallSamples != 1 || r.RestartSamples != 1 {
		t.Fatalf("samples %d kill, %d stall, %d restart; want 2, 1 and 1", r.Samples, r.StallSamples, r.RestartSamples)
	}
	if r.RevisionsLost > 1 {
		t.Fatalf("a master restart cost %d calls, want at most 1", r.RevisionsLost)
	}
	if !r.BuffersRestored || !r.ResultsCorrect {
		t.Fatalf("buffers restored %v, results correct %v", r.BuffersRestored, r.ResultsCorrect)
	}
	// Every survivor of every sampled round checked its failed call's buffer: two of three peers in a
	// kill or stall round, all three in a restart round.
	if want := 2*r.Samples + 2*r.StallSamples + 3*r.RestartSamples; r.RestoreChecks < want {
		t.Fatalf("%d buffers checked after failed calls, want at least %d", r.RestoreChecks, want)
	}
	if got := len(r.AbortAfterGoneMs) + r.GoneUnobserved; got != r.Samples {
		t.Fatalf("%d abort_after_gone samples and %d rounds unobserved for %d kill samples", len(r.AbortAfterGoneMs), r.GoneUnobserved, r.Samples)
	}
	outcomes := 0
	for _, n := range r.StalledPeerExit {
		outcomes += n
	}
	// A stall that landed after a call had finished is repeated, and its peer's outcome counts too.
	if outcomes < r.StallSamples {
		t.Fatalf("stalled peer outcomes %v for %d stall samples", r.StalledPeerExit, r.StallSamples)
	}
	if r.StalledPeerExit["stuck (killed)"] != 0 {
		t.Fatalf("the stopped peer neither left nor rejoined after SIGCONT: %v", r.StalledPeerExit)
	}
}

// TestGracefulLeaveSmall makes a peer leave on SIGTERM twice: each leaver must leave at its
// membership step and exit 0 (the bench fails otherwise), no survivor's call may fail, every result
// must be right, and each round must give a stall figure against a steady period of the same run.
func TestGracefulLeaveSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var logs lockedBuffer
	c := cluster.New(cluster.Config{Stderr: &logs, Env: []string{cluster.EnvLog + "=info"}})
	defer c.Close()
	b := newBench(c, 3, 16<<20, 11, 3*time.Minute)
	if err := b.run(ctx, 0, 0, 0, 2); err != nil {
		c.Close()
		t.Fatalf("%v\nchildren's stderr:\n%s", err, logs.String())
	}
	r := b.summary()
	if r.LeaveSamples != 2 || len(r.LeaveMs) != 2 || len(r.LeavePeriodMs) != 2 {
		t.Fatalf("%d leave samples (%v, %v), want 2", r.LeaveSamples, r.LeaveMs, r.LeavePeriodMs)
	}
	for _, ms := range r.LeaveMs {
		if !(ms > 0) {
			t.Fatalf("graceful_leave_ms %v: the re-wiring took no time", r.LeaveMs)
		}
	}
	if r.LeaveAborts != 0 || len(r.AbortErrors) != 0 || r.RestoreChecks != 0 {
		t.Fatalf("around a graceful leave %d calls failed (%v), %d buffers checked; want none", r.LeaveAborts, r.AbortErrors, r.RestoreChecks)
	}
	if !r.ResultsCorrect || !(r.LeaveBaselineMs > 0) || r.LeaveLimit != targetLeaveP50 {
		t.Fatalf("results correct %v, baseline %v ms, limit %v", r.ResultsCorrect, r.LeaveBaselineMs, r.LeaveLimit)
	}
	// Every survivor gave the steady periods after the leave: two survivors, leaveCalls-1 each.
	if want := 2 * 2 * (leaveCalls - 1); len(b.leavePeriods) != want {
		t.Fatalf("%d steady periods after the leaves, want %d", len(b.leavePeriods), want)
	}
	left := 0
	for _, s := range b.peers {
		if s.left.Event != "" {
			left++
			if s.proc.ExitCode() != 0 {
				t.Errorf("%s left with exit status %d", s.proc.Name(), s.proc.ExitCode())
			}
		}
	}
	if left != 2 || b.spawned != 5 {
		t.Fatalf("%d peers left, %d spawned; want 2 and 5 (a replacement per leave)", left, b.spawned)
	}
}

// TestRecoveryHosts runs a kill, a graceful leave and a master restart with every process on a host
// of its own: each peer must run in a network namespace of its own, the master on an address of its
// host, and the rounds must come out as on loopback.
func TestRecoveryHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a test bed of network namespaces")
	}
	if err := hostbed.Available(); err != nil {
		t.Skipf("runs on network namespaces, which need root: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bed, err := hostbed.New(3 + 2)
	if err != nil {
		t.Fatal(err)
	}
	defer bed.Close()
	var logs lockedBuffer
	c := cluster.New(cluster.Config{Stderr: &logs, Env: []string{cluster.EnvLog + "=info"}})
	defer c.Close()
	b := newBench(c, 3, 16<<20, 5, 3*time.Minute)
	b.bed = bed
	if err := b.run(ctx, 1, 0, 1, 1); err != nil {
		c.Close()
		t.Fatalf("%v\nchildren's stderr:\n%s", err, logs.String())
	}
	r := b.summary()
	if r.Samples != 1 || r.RestartSamples != 1 || r.LeaveSamples != 1 || r.LeaveAborts != 0 {
		t.Fatalf("samples %d kill, %d restart, %d leave, %d calls failed around the leave; want 1, 1, 1, 0",
			r.Samples, r.RestartSamples, r.LeaveSamples, r.LeaveAborts)
	}
	if !r.BuffersRestored || !r.ResultsCorrect {
		t.Fatalf("buffers restored %v, results correct %v", r.BuffersRestored, r.ResultsCorrect)
	}
	host, _, _ := net.SplitHostPort(b.addr)
	if ip := net.ParseIP(host); ip == nil || ip.IsLoopback() {
		t.Fatalf("the master listened on %q, not on an address of its host", b.addr)
	}
	own, err := hostbed.Netns()
	if err != nil {
		t.Fatal(err)
	}
	// Peers that ran at the same time ran on different hosts; a replacement may take the host of
	// one that exited.
	for _, s := range b.live() {
		if ns := s.connected.Netns; ns == "" || ns == own {
			t.Errorf("%s ran in network namespace %q, the test's own is %q", s.proc.Name(), ns, own)
		}
		for _, o := range b.live() {
			if o != s && o.connected.Netns == s.connected.Netns {
				t.Errorf("%s and %s ran on one host (%s)", s.proc.Name(), o.proc.Name(), s.connected.Netns)
			}
		}
	}
	if len(b.live()) != 3 {
		t.Fatalf("%d live peers at the end, want 3", len(b.live()))
	}
}

// TestMissedFault checks which rounds count as samples: only one whose fault hit the call every
// survivor had in flight.
func TestMissedFault(t *testing.T) {
	const tk = 1000 // the fault
	for _, tc := range []struct {
		name string
		s    peerState
		want bool
	}{
		{"the call in flight failed", peerState{
			start: peerEvent{Seq: 5, T: 400}, done: peerEvent{Seq: 4, T: 300}, abort: peerEvent{Seq: 5, T: 1040}, abortedStart: 400}, false},
		{"a call completed after the fault, then the next failed", peerState{
			start: peerEvent{Seq: 6, T: 1100}, done: peerEvent{Seq: 5, T: 1050}, abort: peerEvent{Seq: 6, T: 1120}, abortedStart: 1100}, true},
		{"the call in flight had completed before the fault; the next one failed", peerState{
			start: peerEvent{Seq: 6, T: 1220}, done: peerEvent{Seq: 5, T: 930}, abort: peerEvent{Seq: 6, T: 1225}, abortedStart: 1220}, true},
	} {
		if got := tc.s.missed(tk); got != tc.want {
			t.Errorf("%s: missed %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestPassedBy checks when a fault fell between two calls of a survivor: it completed a call it
// began after the fault.
func TestPassedBy(t *testing.T) {
	const tk = 1000 // the fault
	for _, tc := range []struct {
		name string
		s    peerState
		want bool
	}{
		{"the call in flight at the fault is still running", peerState{
			start: peerEvent{Seq: 5, T: 400}, done: peerEvent{Seq: 4, T: 300}}, false},
		{"the call in flight at the fault completed", peerState{
			start: peerEvent{Seq: 5, T: 400}, done: peerEvent{Seq: 5, T: 1100}}, false},
		{"a call begun after the fault is running", peerState{
			start: peerEvent{Seq: 6, T: 1200}, done: peerEvent{Seq: 5, T: 1100}}, false},
		{"a call begun after the fault completed", peerState{
			start: peerEvent{Seq: 6, T: 1200}, done: peerEvent{Seq: 6, T: 1700}}, true},
	} {
		if got := tc.s.passedBy(tk); got != tc.want {
			t.Errorf("%s: passedBy %v, want %v", tc.name, got, tc.want)
		}
	}
}

// feeder returns a bench with one peer, that peer's state, and a function that hands the bench one
// line of the peer's output.
func feeder(t *testing.T) (*bench, *peerState, func(raw string)) {
	p := &cluster.Proc{}
	s := &peerState{proc: p}
	b := &bench{peers: map[*cluster.Proc]*peerState{p: s}, res: result{BuffersRestored: true}}
	return b, s, func(raw string) {
		t.Helper()
		if err := b.handle(cluster.Line{Proc: p, Raw: []byte(raw)}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAbortedStartIsTheFailedCallsStart feeds a peer's lines to the bench and checks that an abort
// remembers when the call it ended had started, and forgets it for an abort without that start.
func TestAbortedStartIsTheFailedCallsStart(t *testing.T) {
	_, s, feed := feeder(t)
	feed(`{"event":"op_started","t":400,"seq":5}`)
	feed(`{"event":"aborted","t":1040,"seq":5}`)
	if s.abortedStart != 400 || s.missed(1000) {
		t.Errorf("abort of call 5: abortedStart %d, missed %v; want 400, false", s.abortedStart, s.missed(1000))
	}
	feed(`{"event":"op_started","t":1220,"seq":6}`)
	feed(`{"event":"aborted","t":1225,"seq":6}`)
	if s.abortedStart != 1220 || !s.missed(1000) {
		t.Errorf("abort of call 6: abortedStart %d, missed %v; want 1220, true", s.abortedStart, s.missed(1000))
	}
	feed(`{"event":"aborted","t":1300,"seq":9}`)
	if s.abortedStart != 0 {
		t.Errorf("abort of call 9, never started: abortedStart %d, want 0", s.abortedStart)
	}
}

// TestChecksFollowAborts feeds a peer's lines to the bench and checks that every failed call counts
// as an abort awaiting its buffer's check, and that a check finding the buffer changed clears
// buffers_restored.
func TestChecksFollowAborts(t *testing.T) {
	b, s, feed := feeder(t)
	feed(`{"event":"op_started","t":400,"seq":5}`)
	feed(`{"event":"aborted","t":1040,"seq":5}`)
	if s.aborts != 1 || s.checks != 0 {
		t.Fatalf("after an abort: %d aborts, %d checks; want 1, 0", s.aborts, s.checks)
	}
	feed(`{"event":"op_started","t":1100,"seq":6}`)
	feed(`{"event":"op_done","t":1300,"seq":6,"ok":true}`)
	feed(`{"event":"checked","t":1400,"seq":5,"restored":true}`)
	if s.checks != 1 || b.res.RestoreChecks != 1 || !b.res.BuffersRestored {
		t.Fatalf("after a good check: %d checks, restore_checks %d, buffers_restored %v; want 1, 1, true",
			s.checks, b.res.RestoreChecks, b.res.BuffersRestored)
	}
	feed(`{"event":"aborted","t":1500,"seq":7}`)
	feed(`{"event":"checked","t":1700,"seq":7}`)
	if s.aborts != 2 || s.checks != 2 || b.res.BuffersRestored {
		t.Fatalf("after a bad check: %d aborts, %d checks, buffers_restored %v; want 2, 2, false",
			s.aborts, s.checks, b.res.BuffersRestored)
	}
}

// TestLeaveRecords feeds a survivor's lines across a graceful leave to the bench: the first call
// without the leaver carries its membership step's "pending" answer and end, and only calls that
// follow the one before with nothing in between count as steady.
func TestLeaveRecords(t *testing.T) {
	b, s, feed := feeder(t)
	b.res.ResultsCorrect = true
	feed(`{"event":"op_started","t":100,"seq":4,"world":4,"ready_t":90}`)
	feed(`{"event":"op_done","t":500,"seq":4,"world":4,"ok":true}`)
	// The leave (SIGTERM at 300): pending at 610, re-wired and ready at 640, a call at world 3.
	feed(`{"event":"op_started","t":700,"seq":6,"world":3,"pending_t":610,"ready_t":640}`)
	feed(`{"event":"op_done","t":1000,"seq":6,"world":3,"ok":true}`)
	feed(`{"event":"op_started","t":1150,"seq":7,"world":3,"ready_t":1110}`)
	feed(`{"event":"op_done","t":1400,"seq":7,"world":3,"ok":true}`)
	feed(`{"event":"checked","t":1450,"seq":2,"restored":true}`)
	feed(`{"event":"op_started","t":1550,"seq":8,"world":3,"ready_t":1500}`)
	feed(`{"event":"op_done","t":1800,"seq":8,"world":3,"ok":true}`)
	if !b.res.ResultsCorrect {
		t.Fatal("a correct call counted as wrong")
	}
	after := s.callsSince(300, 3)
	if len(after) != 3 || after[0].Seq != 6 {
		t.Fatalf("calls since the leave at world 3: %+v, want seq 6, 7, 8", after)
	}
	if f := after[0]; f.Pending != 610 || f.Ready != 640 || f.Started != 700 || f.Done != 1000 {
		t.Fatalf("first call without the leaver %+v: want pending 610, ready 640, started 700, done 1000", f)
	}
	if after[0].steadyAfter(s.calls[0]) {
		t.Error("the call after a membership change (seq 4 to 6, world 4 to 3) counted as steady")
	}
	if !after[1].steadyAfter(after[0]) {
		t.Error("seq 7 right after seq 6 at the same world not steady")
	}
	if after[2].steadyAfter(after[1]) {
		t.Error("a call after a buffer check counted as steady")
	}
	if got := s.callsSince(2000, 3); got != nil {
		t.Errorf("calls since 2000: %+v, want none", got)
	}
	feed(`{"event":"left","t":1900,"seq":9}`)
	if s.left.Seq != 9 {
		t.Errorf("left line not recorded: %+v", s.left)
	}
}
