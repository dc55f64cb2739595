package main

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/cluster"
)

func TestMain(m *testing.M) {
	cluster.Main(roles)
	goleak.VerifyTestMain(m)
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
	if err := b.run(ctx, 2, 1, 1); err != nil {
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
