package diloco_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/diloco"
	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/sharedstate"
)

// group is a master and peers on one in-memory network, each peer running
// diloco.Run in a goroutine of its own.
type group struct {
	t     *testing.T
	net   *pccl.Network
	addr  string
	srv   *master.Server
	train *diloco.Dataset

	mu      sync.Mutex
	reports map[uint64][]report // by step
	peers   []*peer
}

// report is one Progress of one peer.
type report struct {
	peer *peer
	p    diloco.Progress
}

// peer is one participant: its host on the network and how its Run ended.
type peer struct {
	host string
	id   uint64 // set once connected
	sum  diloco.Summary
	err  error
	done chan struct{}
	stop context.CancelFunc // ends the peer's process: with a crash, so it cannot resume its session

	rejoins int // under pccl.Rejoin: the rejoins before the last Run
}

// embeddedTrain is the embedded training set, decoded once for all tests.
var embeddedTrain = sync.OnceValues(func() (*diloco.Dataset, error) {
	train, _, err := diloco.LoadEmbedded()
	return train, err
})

func newGroup(t *testing.T) *group {
	t.Helper()
	t.Cleanup(func() { goleak.VerifyNone(t) })
	train, err := embeddedTrain()
	if err != nil {
		t.Fatal(err)
	}
	g := &group{t: t, net: pccl.NewNetwork(), addr: "master:7000", train: train, reports: map[uint64][]report{}}
	ln, err := g.net.Host("master").Listen(g.addr)
	if err != nil {
		t.Fatal(err)
	}
	g.srv = master.NewServer(master.ServerConfig{Config: master.Config{HeartbeatInterval: 50 * time.Millisecond, HeartbeatTimeout: 500 * time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("master: %v", err)
		}
	})
	return g
}

// launch connects a new peer and runs the trainer on it in the background.
// hook, if set, is called with every report of this peer before it is
// recorded.
func (g *group) launch(ctx context.Context, cfg diloco.TrainerConfig, hook func(*peer, diloco.Progress)) *peer {
	g.mu.Lock()
	p := &peer{host: fmt.Sprintf("peer%d", len(g.peers)+1), done: make(chan struct{})}
	g.peers = append(g.peers, p)
	g.mu.Unlock()
	ctx, p.stop = context.WithCancel(ctx)
	cfg.Progress = func(pr diloco.Progress) {
		if hook != nil {
			hook(p, pr)
		}
		g.mu.Lock()
		g.reports[pr.Step] = append(g.reports[pr.Step], report{p, pr})
		g.mu.Unlock()
	}
	go func() {
		defer close(p.done)
		comm, err := pccl.Connect(ctx, pccl.Config{
			Master:     g.addr,
			ListenAddr: p.host + ":9000",
			Transport:  g.net.Host(p.host),
			PartBytes:  64 << 10,
		})
		if err != nil {
			p.err = err
			return
		}
		defer comm.Close()
		g.mu.Lock()
		p.id = comm.ID()
		g.mu.Unlock()
		p.sum, p.err = diloco.Run(ctx, comm, cfg, g.train, nil)
	}()
	return p
}

// crashMidCollective arms every link from v to another peer of g: the next write on any of them (the
// collectives are the only traffic between the peers here) is reset halfway, and v's host crashes.
func crashMidCollective(g *group, v *peer) {
	var fired atomic.Bool
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, q := range g.peers {
		if q.host == v.host {
			continue
		}
		g.net.OnWrite(v.host, q.host, func(w transport.Write) transport.Fault {
			if !fired.CompareAndSwap(false, true) {
				return transport.Fault{}
			}
			go g.net.Crash(v.host)
			return transport.Fault{Kind: transport.FaultReset, Keep: w.Size / 2}
		})
	}
}

// awaitJoined waits until the master has seen n peers register.
func (g *group) awaitJoined(n uint64) {
	for deadline := time.Now().Add(20 * time.Second); g.srv.Snapshot().Counters.Joined < n; {
		if time.Now().After(deadline) {
			g.t.Error("peer did not register")
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// sameDigest reports whether a and b have the same revision and the same
// voted entries.
func sameDigest(a, b sharedstate.Digest) bool {
	if a.Revision != b.Revision || len(a.Entries) != len(b.Entries) {
		return false
	}
	for i, e := range a.Entries {
		if e != b.Entries[i] {
			return false
		}
	}
	return true
}

// runChurn trains n peers with cfg. When the group completes step crashAt,
// one peer's host crashes; when it completes step joinAt (>= crashAt), a
// newcomer connects, and the reporting peer waits until it registered, so
// that the others meet it at their next membership vote. It checks that every
// peer that completed a step holds the same shared state after it, that the
// survivors and the newcomer finish with identical parameters, and that the
// newcomer's pseudo-gradients were averaged by the first reduce that could
// include them. It returns the survivors, the newcomer last.
func runChurn(t *testing.T, cfg diloco.TrainerConfig, n int, crashAt, joinAt uint64) []*peer {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	g := newGroup(t)
	var crashOnce, joinOnce sync.Once
	var victim, newcomer *peer
	hook := func(p *peer, pr diloco.Progress) {
		if pr.Step == crashAt {
			crashOnce.Do(func() {
				g.mu.Lock()
				for _, q := range g.peers {
					if q != p && victim == nil {
						victim = q
					}
				}
				g.mu.Unlock()
				// Crash the victim in the middle of the next collective, so that the survivors
				// see it as a failed all-reduce rather than as a departure between two: its next
				// write to a peer is cut halfway by a reset, and the crash of the whole host
				// follows. The write hook runs in the victim's write, so a loaded machine cannot
				// let the collective end first.
				crashMidCollective(g, victim)
			})
		}
		if pr.Step == joinAt {
			joinOnce.Do(func() {
				newcomer = g.launch(ctx, cfg, nil)
				g.awaitJoined(uint64(n) + 1)
			})
		}
	}
	if n == 2 {
		// The survivor is alone after the crash and reports nothing until
		// a newcomer arrives: start it once the master saw the crash.
		hook = func(p *peer, pr diloco.Progress) {
			if pr.Step != crashAt {
				return
			}
			crashOnce.Do(func() {
				g.mu.Lock()
				for _, q := range g.peers {
					if q != p && victim == nil {
						victim = q
					}
				}
				g.mu.Unlock()
				// A crashed process never comes back: ending the victim's
				// run keeps its communicator from resuming its session on a
				// new connection while its listener is gone.
				g.net.Crash(victim.host)
				victim.stop()
				for deadline := time.Now().Add(20 * time.Second); g.srv.Snapshot().Counters.Left < 1 && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
				newcomer = g.launch(ctx, cfg, nil)
			})
		}
	}
	var first []*peer
	for range n {
		first = append(first, g.launch(ctx, cfg, hook))
	}
	for _, p := range first {
		<-p.done
	}
	if newcomer == nil {
		t.Fatal("the group never reached the crash step")
	}
	<-newcomer.done
	var finals []*peer
	for _, p := range first {
		if p != victim {
			finals = append(finals, p)
		}
	}
	finals = append(finals, newcomer)
	for _, p := range finals {
		if p.err != nil {
			t.Fatalf("%s: %v", p.host, p.err)
		}
		if p.sum.Steps != uint64(cfg.Steps) {
			t.Fatalf("%s ended at step %d, want %d", p.host, p.sum.Steps, cfg.Steps)
		}
	}
	// Bit-identical shared state on every peer after every outer step.
	for step := uint64(1); step <= uint64(cfg.Steps); step++ {
		rs := g.reports[step]
		// The victim may crash before it reports the crash step.
		if len(rs) < 2 && !(step == crashAt && len(rs) == 1) {
			t.Fatalf("step %d completed by %d peers", step, len(rs))
		}
		for _, r := range rs[1:] {
			if !sameDigest(r.p.Digest, rs[0].p.Digest) {
				t.Fatalf("step %d: %s and %s hold different shared state:\n%+v\n%+v", step, r.peer.host, rs[0].peer.host, r.p.Digest, rs[0].p.Digest)
			}
		}
	}
	for _, p := range finals[1:] {
		if !slices.Equal(p.sum.Params, finals[0].sum.Params) || !sameDigest(p.sum.Digest, finals[0].sum.Digest) {
			t.Fatalf("%s and %s end with different parameters", p.host, finals[0].host)
		}
	}
	if newcomer.sum.LocalSteps == 0 || newcomer.sum.BytesFetched == 0 {
		t.Fatalf("newcomer took part in %d steps, fetched %d bytes", newcomer.sum.LocalSteps, newcomer.sum.BytesFetched)
	}
	// The newcomer's pseudo-gradient is in the first reduce after it joined:
	// that of its first step (DDP, DiLoCo) or of the next step (async).
	firstStep := uint64(0)
	for step := uint64(1); step <= uint64(cfg.Steps) && firstStep == 0; step++ {
		for _, r := range g.reports[step] {
			if r.peer == newcomer {
				firstStep = step
			}
		}
	}
	for _, p := range append(slices.Clone(finals), victim) {
		if p == nil {
			continue
		}
		t.Logf("%s (id %d): %d local steps, aborts %d, joins %d, dropped %d, reduced %d B, fetched %d B, err %v",
			p.host, p.id, p.sum.LocalSteps, p.sum.Aborts, p.sum.Joins, p.sum.Dropped, p.sum.BytesReduced, p.sum.BytesFetched, p.err)
	}
	t.Logf("newcomer's first step: %d", firstStep)
	want := firstStep
	if cfg.Kind == diloco.KindAsyncDiLoCo {
		want++
	}
	if want <= uint64(cfg.Steps) {
		for _, r := range g.reports[want] {
			if !slices.Contains(r.p.Reduced, newcomer.id) {
				t.Fatalf("step %d on %s averaged %v, without the newcomer %d", want, r.peer.host, r.p.Reduced, newcomer.id)
			}
		}
	}
	return finals
}

// requireAborts checks that every survivor saw the crash as a failed
// all-reduce (the newcomer, last, joined after it).
func requireAborts(t *testing.T, survivors []*peer) {
	t.Helper()
	for _, p := range survivors[:len(survivors)-1] {
		if p.sum.Aborts == 0 {
			t.Fatalf("%s saw no failed all-reduce", p.host)
		}
	}
}

func TestTrainerChurnDDP(t *testing.T) {
	cfg := diloco.TrainerConfig{Kind: diloco.KindDDP, BatchSize: 8, Steps: 12, Seed: 3}
	requireAborts(t, runChurn(t, cfg, 3, 3, 6))
}

func TestTrainerChurnDiLoCo(t *testing.T) {
	cfg := diloco.TrainerConfig{Kind: diloco.KindDiLoCo, H: 3, BatchSize: 8, Steps: 10, Seed: 4}
	requireAborts(t, runChurn(t, cfg, 3, 3, 5))
}

// TestTrainerChurnDiLoCoAlone leaves one survivor, which must wait (its
// step is dropped) until a newcomer arrives.
func TestTrainerChurnDiLoCoAlone(t *testing.T) {
	cfg := diloco.TrainerConfig{Kind: diloco.KindDiLoCo, H: 2, BatchSize: 8, Steps: 8, Seed: 6}
	runChurn(t, cfg, 2, 3, 3)
}

func TestTrainerChurnAsyncDiLoCo(t *testing.T) {
	cfg := diloco.TrainerConfig{Kind: diloco.KindAsyncDiLoCo, H: 3, BatchSize: 8, Steps: 10, Seed: 5}
	requireAborts(t, runChurn(t, cfg, 3, 3, 5))
}

// TestTrainerJoinAsyncDiLoCo adds a newcomer while nobody fails: it enters
// with two syncs (the second receive-only) and its pseudo-gradient is in the
// next reduce.
func TestTrainerJoinAsyncDiLoCo(t *testing.T) {
	cfg := diloco.TrainerConfig{Kind: diloco.KindAsyncDiLoCo, H: 2, BatchSize: 8, Steps: 8, Seed: 7}
	runChurn(t, cfg, 3, 100, 3)
}

// TestTrainerMatchesSerial runs DiLoCo on two peers without churn and checks
// the result against the same algorithm computed serially from the package's
// pieces: the shards, AdamW, the average and the Nesterov step.
func TestTrainerMatchesSerial(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := newGroup(t)
	cfg := diloco.TrainerConfig{H: 2, BatchSize: 4, Steps: 3, Seed: 9}
	ps := []*peer{g.launch(ctx, cfg, nil), g.launch(ctx, cfg, nil)}
	for _, p := range ps {
		<-p.done
		if p.err != nil {
			t.Fatalf("%s: %v", p.host, p.err)
		}
	}
	// Ranks follow the ring, which lists the first accepted peer first.
	global := diloco.NewMLP(cfg.Seed).Params
	outer := diloco.NewNesterov(cfg.Outer, diloco.NumParams)
	inner := []*diloco.AdamW{diloco.NewAdamW(cfg.Inner, diloco.NumParams), diloco.NewAdamW(cfg.Inner, diloco.NumParams)}
	grads := make([]float32, diloco.NumParams)
	x := make([]float32, cfg.BatchSize*diloco.InputSize)
	y := make([]uint8, cfg.BatchSize)
	var pos uint64
	for range cfg.Steps {
		avg := make([]float32, diloco.NumParams)
		deltas := make([][]float32, 2)
		for rank := range 2 {
			s := diloco.NewSampler(g.train, rank, 2)
			s.Pos = int(pos / 2)
			m := &diloco.MLP{Params: slices.Clone(global)}
			for range cfg.H {
				bx, by := g.train.Batch(s.Next(cfg.BatchSize), x, y)
				m.LossGrad(bx, by, grads)
				inner[rank].Step(m.Params, grads)
			}
			deltas[rank] = make([]float32, diloco.NumParams)
			diloco.PseudoGradient(deltas[rank], global, m.Params)
		}
		for i := range avg {
			avg[i] = (deltas[0][i] + deltas[1][i]) / 2
		}
		outer.Step(global, avg)
		pos += uint64(2 * cfg.H * cfg.BatchSize)
	}
	for _, p := range ps {
		if !slices.Equal(p.sum.Params, global) {
			t.Fatalf("%s: parameters differ from the serial computation", p.host)
		}
		if want := int64(cfg.Steps * 4 * diloco.NumParams); p.sum.BytesReduced != want {
			t.Fatalf("%s reduced %d bytes, want %d", p.host, p.sum.BytesReduced, want)
		}
	}
}

func TestParseKind(t *testing.T) {
	for _, k := range []diloco.Kind{diloco.KindDiLoCo, diloco.KindDDP, diloco.KindAsyncDiLoCo} {
		got, err := diloco.ParseKind(k.String())
		if err != nil || got != k {
			t.Fatalf("ParseKind(%q) = %v, %v", k.String(), got, err)
		}
	}
	if _, err := diloco.ParseKind("sgd"); !errors.Is(err, diloco.ErrBadConfig) {
		t.Fatalf("ParseKind(sgd): %v, want ErrBadConfig", err)
	}
	if err := (diloco.TrainerConfig{H: -1}).Validate(); !errors.Is(err, diloco.ErrBadConfig) {
		t.Fatalf("H -1: %v, want ErrBadConfig", err)
	}
}
