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
