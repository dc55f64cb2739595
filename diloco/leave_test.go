package diloco_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/concord-ccl/concord/diloco"
	"github.com/concord-ccl/concord/pccl"
)

// TestTrainerLeave runs three peers of each algorithm; once the group completed step 3, one of them
// asks to leave (TrainerConfig.Leave, as a preemption notice would). It must leave at its next
// membership step with ErrLeft, and the others must finish every step without a failed collective,
// with bit-identical parameters and one shared state per step.
func TestTrainerLeave(t *testing.T) {
	for _, cfg := range []diloco.TrainerConfig{
		{Kind: diloco.KindDDP, BatchSize: 8, Steps: 8, Seed: 21},
		{Kind: diloco.KindDiLoCo, H: 3, BatchSize: 8, Steps: 8, Seed: 22},
		{Kind: diloco.KindAsyncDiLoCo, H: 3, BatchSize: 8, Steps: 8, Seed: 23},
		{Kind: diloco.KindStreamingDiLoCo, H: 4, Fragments: 2, SyncDelay: 1, BatchSize: 8, Steps: 8, Seed: 24},
	} {
		t.Run(cfg.Kind.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
			defer cancel()
			g := newGroup(t)
			var leave atomic.Bool
			leaverCfg := cfg
			leaverCfg.Leave = leave.Load
			hook := func(p *peer, pr diloco.Progress) {
				if pr.Step >= 3 {
					leave.Store(true)
				}
			}
			leaver := g.launch(ctx, leaverCfg, hook)
			var others []*peer
			for range 2 {
				others = append(others, g.launch(ctx, cfg, nil))
			}
			for _, p := range append([]*peer{leaver}, others...) {
				<-p.done
			}
			if !errors.Is(leaver.err, diloco.ErrLeft) {
				t.Fatalf("the leaver ended with %v, want ErrLeft", leaver.err)
			}
			if leaver.sum.LocalSteps < 3 || leaver.sum.Steps >= uint64(cfg.Steps) {
				t.Fatalf("the leaver took part in %d steps and ended at step %d", leaver.sum.LocalSteps, leaver.sum.Steps)
			}
			for _, p := range others {
				if p.err != nil {
					t.Fatalf("%s: %v", p.host, p.err)
				}
				if p.sum.Steps != uint64(cfg.Steps) || p.sum.Aborts != 0 {
					t.Fatalf("%s ended at step %d with %d failed collectives, want %d and none", p.host, p.sum.Steps, p.sum.Aborts, cfg.Steps)
				}
			}
			if !slices.Equal(others[0].sum.Params, others[1].sum.Params) || !sameDigest(others[0].sum.Digest, others[1].sum.Digest) {
				t.Fatal("the survivors end with different parameters")
			}
			requireOneStatePerStep(t, g, uint64(cfg.Steps))
			if c := g.srv.Snapshot().Counters; c.OpsAborted != 0 || c.Kicked != 0 {
				t.Fatalf("the master aborted %d collectives and kicked %d peers, want none", c.OpsAborted, c.Kicked)
			}
		})
	}
}

// requireOneStatePerStep checks that every peer that reported a step holds the same shared state
// after it.
func requireOneStatePerStep(t *testing.T, g *group, steps uint64) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	for step := uint64(1); step <= steps; step++ {
		rs := g.reports[step]
		if len(rs) == 0 {
			t.Fatalf("nobody completed step %d", step)
		}
		for _, r := range rs[1:] {
			if !sameDigest(r.p.Digest, rs[0].p.Digest) {
				t.Fatalf("step %d: %s and %s hold different shared state", step, r.peer.host, rs[0].peer.host)
			}
		}
	}
}

// TestTrainerRejoinsAfterKick cuts one of three DiLoCo peers off from the master and the others until
// the master removes it, then heals the network: the peer, running diloco.Run under pccl.Rejoin as
// `peer train` does, joins again as a newcomer by itself, fetches the group's state and finishes with
// the others' parameters.
func TestTrainerRejoinsAfterKick(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	g := newGroup(t)
	cfg := diloco.TrainerConfig{Kind: diloco.KindDiLoCo, H: 2, BatchSize: 8, Steps: 14, Seed: 25, RetryWait: 10 * time.Millisecond}
	var cut atomic.Bool
	hosts := []string{"peer1", "peer2", "peer3"}
	const victim = "peer3"
	hook := func(p *peer, pr diloco.Progress) {
		if pr.Step != 4 || p.host == victim || !cut.CompareAndSwap(false, true) {
			return
		}
		for _, h := range append([]string{"master"}, hosts[:2]...) {
			g.net.Partition(victim, h)
		}
		// Hold the group here until the master has removed the victim, then heal.
		for deadline := time.Now().Add(20 * time.Second); g.srv.Snapshot().Counters.Left < 1 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		for _, h := range append([]string{"master"}, hosts[:2]...) {
			g.net.Heal(victim, h)
		}
		// And until it registered again, so that the group is not over before it is back.
		g.awaitJoined(4)
	}
	var others []*peer
	for _, h := range hosts[:2] {
		others = append(others, g.launchAs(ctx, h, cfg, hook, false))
	}
	back := g.launchAs(ctx, victim, cfg, hook, true)
	for _, p := range append(others, back) {
		<-p.done
	}
	for _, p := range append(others, back) {
		if p.err != nil {
			t.Fatalf("%s: %v", p.host, p.err)
		}
		if p.sum.Steps != uint64(cfg.Steps) {
			t.Fatalf("%s ended at step %d, want %d", p.host, p.sum.Steps, cfg.Steps)
		}
	}
	if back.rejoins < 1 {
		t.Fatal("the cut peer never rejoined")
	}
	if back.sum.BytesFetched == 0 {
		t.Fatal("the rejoined peer fetched nothing")
	}
	for _, p := range []*peer{others[1], back} {
		if !slices.Equal(p.sum.Params, others[0].sum.Params) || !sameDigest(p.sum.Digest, others[0].sum.Digest) {
			t.Fatalf("%s ends with other parameters than %s", p.host, others[0].host)
		}
	}
	requireOneStatePerStep(t, g, uint64(cfg.Steps))
}

// launchAs runs the trainer on a peer at host, under pccl.Rejoin when rejoin is set, in the
// background.
func (g *group) launchAs(ctx context.Context, host string, cfg diloco.TrainerConfig, hook func(*peer, diloco.Progress), rejoin bool) *peer {
	p := &peer{host: host, done: make(chan struct{})}
	g.mu.Lock()
	g.peers = append(g.peers, p)
	g.mu.Unlock()
	cfg.Progress = func(pr diloco.Progress) {
		if hook != nil {
			hook(p, pr)
		}
		g.mu.Lock()
		g.reports[pr.Step] = append(g.reports[pr.Step], report{p, pr})
		g.mu.Unlock()
	}
	pcfg := pccl.Config{Master: g.addr, ListenAddr: host + ":9000", Transport: g.net.Host(host), PartBytes: 64 << 10,
		MasterTimeout: 5 * time.Second}
	body := func(ctx context.Context, comm *pccl.Communicator, rejoins int) error {
		p.rejoins = rejoins
		sum, err := diloco.Run(ctx, comm, cfg, g.train, nil)
		p.sum = sum
		return err
	}
	go func() {
		defer close(p.done)
		if !rejoin {
			comm, err := pccl.Connect(ctx, pcfg)
			if err != nil {
				p.err = err
				return
			}
			defer comm.Close()
			p.err = body(ctx, comm, 0)
			return
		}
		p.err = pccl.Rejoin(ctx, pcfg, pccl.RejoinConfig{MinBackoff: 10 * time.Millisecond}, body)
		if p.err != nil {
			p.err = fmt.Errorf("after %d rejoins: %w", p.rejoins, p.err)
		}
	}()
	return p
}
