package pccl_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/netlab"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// The intra-site fabric tests run every peer's NICs in a network namespace of a netlab test bed (one
// bridge per rail), while the master, the WAN rings and the site rings' TCP links stay on the
// in-memory network. They need root.

// siteLab builds a lab of nodes namespaces with nics NICs each at mbit (0: unlimited), torn down when
// the test ends, or skips the test when this process cannot create namespaces.
func siteLab(t *testing.T, nodes, nics, mbit int) *netlab.Lab {
	t.Helper()
	if err := netlab.Available(); err != nil {
		t.Skipf("skipping: the intra-site fabric tests build network namespaces: %v", err)
	}
	lab, err := netlab.New(netlab.Config{Nodes: nodes, NICs: nics, NICMbit: mbit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("tear the lab down: %v", err)
		}
	})
	return lab
}

// onLab gives peer i the NICs of lab node i.
func onLab(lab *netlab.Lab, nics int) func(i int, cfg *pccl.Config) {
	return func(i int, cfg *pccl.Config) {
		for r := range nics {
			cfg.NICs = append(cfg.NICs, netlab.NICName(r))
		}
		cfg.NICNetNS = lab.Node(i).Path()
	}
}

// requireFabric checks that every peer has an open intra-site fabric of one generation, and returns it.
func requireFabric(t *testing.T, comms []*pccl.Communicator) (epoch, gen uint64) {
	t.Helper()
	for i, c := range comms {
		open, e, g, received, _ := pccl.SiteFabricForTest(c)
		if !open || received == 0 {
			t.Fatalf("peer %d: intra-site fabric open %v, %d bytes received", i, open, received)
		}
		if i == 0 {
			epoch, gen = e, g
		} else if e != epoch || g != gen {
			t.Fatalf("peer %d: fabric generation (%d, %d), peer 0 has (%d, %d)", i, e, g, epoch, gen)
		}
	}
	return epoch, gen
}

// sumOnEvery runs one f32 Sum AllReduce of count elements (seeded inputs) on every peer and checks
// every element and that all results are bit-identical.
func sumOnEvery(ctx context.Context, t *testing.T, comms []*pccl.Communicator, tag uint64, count, seed int) {
	t.Helper()
	bufs, want := inputs(len(comms), count, seed)
	errs := each(comms, func(i int, c *pccl.Communicator) error {
		b := pccl.Bytes(bufs[i])
		return c.AllReduce(ctx, b, b, pccl.Desc{Tag: tag, Count: count, DType: pccl.F32, Op: pccl.Sum})
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("count %d: peer %d: %v", count, i, err)
		}
		checkSum(t, fmt.Sprintf("count %d: peer %d", count, i), bufs[i], want)
	}
}

func TestSiteFabricAllReduce(t *testing.T) {
	const sites, per, nics = 2, 3, 2
	ctx, _, g, comms, _ := onFabric(t, sites, per, nics, 0)
	requireHierarchical(t, comms, sites, per)

	// The master lists each peer's NICs as the listen address of each, on the lab's addresses.
	byID := map[uint64]master.PeerInfo{}
	for _, p := range g.srv.Snapshot().Peers {
		byID[uint64(p.ID)] = p
	}
	for i, c := range comms {
		p := byID[c.ID()]
		if len(p.NICs) != nics {
			t.Fatalf("peer %d: master lists NICs %q", i, p.NICs)
		}
		for r, s := range p.NICs {
			ap, err := netip.ParseAddrPort(s)
			if err != nil || ap.Addr() != netlab.Addr(i, r) || ap.Port() == 0 {
				t.Fatalf("peer %d NIC %d: master lists %q, want %v:port", i, r, s, netlab.Addr(i, r))
			}
		}
	}

	// Counts that the site's peers do not divide, and ones smaller than the site.
	for k, count := range []int{1, 2, 1000, 33331, 1 << 18} {
		sumOnEvery(ctx, t, comms, 3, count, k)
	}
	requireFabric(t, comms)

	avgAndIntegerOps(ctx, t, comms)

	t.Run("f32 quantized bit-identical", func(t *testing.T) { quantizedSum(ctx, t, comms) })

	// Three tags at once: the master commences at most one of them alone; the others run their site
	// phases on the site rings' links. Every result is right.
	t.Run("three tags at once", func(t *testing.T) {
		var wg sync.WaitGroup
		for tag := range 3 {
			wg.Go(func() { sumOnEvery(ctx, t, comms, uint64(10+tag), 40000+tag, 50+tag) })
		}
		wg.Wait()
	})
}

// TestSiteFabricNICFault takes a NIC down on one peer while a hierarchical AllReduce moves data on the
// fabric: hot repair moves its paths to the other NIC, and the collective completes with the right
// result on every peer and no error.
func TestSiteFabricNICFault(t *testing.T) {
	const sites, per, nics = 2, 2, 2
	ctx, lab, _, comms, _ := onFabric(t, sites, per, nics, 100)
	requireHierarchical(t, comms, sites, per)
	sumOnEvery(ctx, t, comms, 1, 1000, 1) // opens the fabric
	_, gen0 := requireFabric(t, comms)

	const count = 4 << 20 // 16 MiB: each site half takes about 0.35 s on two 100 Mbit/s NICs
	failovers := 0
	// The NIC must go down inside the collective; on a loaded machine the collective can finish
	// first, and then the attempt is made again with the NIC back up (at most three attempts).
	for attempt := 0; attempt < 3 && failovers == 0; attempt++ {
		if attempt > 0 {
			t.Logf("attempt %d: the NIC went down after the collective; again", attempt)
			if err := lab.SetNIC(0, 1, true); err != nil {
				t.Fatal(err)
			}
		}
		bufs, want := inputs(len(comms), count, 9+attempt)
		done := sumWhileMoving(ctx, t, comms, bufs, nil, 0, 512<<10)
		if err := lab.SetNIC(0, 1, false); err != nil {
			t.Fatal(err)
		}
		errs := <-done
		for i, err := range errs {
			if err != nil {
				t.Fatalf("peer %d: %v, want no error", i, err)
			}
			checkSum(t, fmt.Sprintf("peer %d", i), bufs[i], want)
		}
		for _, c := range comms {
			_, _, _, _, f := pccl.SiteFabricForTest(c)
			failovers += f
		}
	}
	if failovers == 0 {
		t.Fatal("no path failed over: the NIC went down after the collective in three attempts")
	}
	if _, gen := requireFabric(t, comms); gen != gen0 {
		t.Fatalf("the fabric changed generation (%d to %d) for a NIC failure", gen0, gen)
	}
	// The next collective runs with the NIC still down, then with it back up.
	sumOnEvery(ctx, t, comms, 3, 100001, 3)
	if err := lab.SetNIC(0, 1, true); err != nil {
		t.Fatal(err)
	}
	sumOnEvery(ctx, t, comms, 4, 100001, 4)
}

// TestSiteFabricAbortOpensNextGeneration cancels one caller's context while a hierarchical AllReduce
// moves data on the fabric: every peer's call fails with buffers untouched, every peer retires the
// fabric, and the retry runs on the next generation, the same on every peer, with the right result.
func TestSiteFabricAbortOpensNextGeneration(t *testing.T) {
	const sites, per, nics = 2, 2, 2
	ctx, _, _, comms, _ := onFabric(t, sites, per, nics, 200)
	sumOnEvery(ctx, t, comms, 1, 1000, 1)
	epoch0, gen0 := requireFabric(t, comms)

	const count = 4 << 20
	bufs, _ := inputs(len(comms), count, 5)
	orig := make([][]byte, len(comms))
	for i := range bufs {
		orig[i] = bytes.Clone(pccl.Bytes(bufs[i]))
	}
	callCtx, stop := context.WithCancel(ctx)
	done := sumWhileMoving(ctx, t, comms, bufs, func(i int) context.Context {
		if i == 1 {
			return callCtx
		}
		return ctx
	}, 1, 1<<20)
	stop()
	for i, err := range <-done {
		if err == nil {
			t.Fatalf("peer %d: the aborted collective succeeded", i)
		}
		if i == 1 && !errors.Is(err, context.Canceled) {
			t.Fatalf("peer 1 (cancelled): %v, want context.Canceled", err)
		}
		if !bytes.Equal(pccl.Bytes(bufs[i]), orig[i]) {
			t.Fatalf("peer %d: buffer changed by the aborted call", i)
		}
		if open, _, _, _, _ := pccl.SiteFabricForTest(comms[i]); open {
			t.Fatalf("peer %d: the fabric of the aborted collective is still open", i)
		}
	}
	sumOnEvery(ctx, t, comms, 2, count, 6)
	epoch, gen := requireFabric(t, comms)
	if epoch != epoch0 || gen == gen0 {
		t.Fatalf("after the abort the fabric is generation (%d, %d), before it (%d, %d)", epoch, gen, epoch0, gen0)
	}
}

// TestSiteFabricPeerDies kills a peer (its NICs and its links) while a hierarchical AllReduce moves
// data on the fabric: every survivor gets ErrPeerLeft with its buffer untouched, and the retry after
// UpdateTopology is correct.
func TestSiteFabricPeerDies(t *testing.T) {
	const sites, per, nics = 2, 2, 2
	ctx, lab, g, comms, hosts := onFabric(t, sites, per, nics, 200)
	sumOnEvery(ctx, t, comms, 1, 1000, 1)
	requireFabric(t, comms)

	killMidCollective(ctx, t, g, comms, hosts, 3, func(victim int) {
		for r := range nics {
			if err := lab.SetNIC(victim, r, false); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// killMidCollective starts an f32 Sum AllReduce of 4Mi elements on every peer and, once the victim
// has received 1 MiB on its fabric, takes its NICs down (downNICs) and crashes its host. Every
// survivor must get ErrPeerLeft with its buffer untouched, and the retry after UpdateTopology must be
// right.
func killMidCollective(ctx context.Context, t *testing.T, g *group, comms []*pccl.Communicator, hosts []string, victim int, downNICs func(victim int)) {
	t.Helper()
	const count = 4 << 20
	bufs, _ := inputs(len(comms), count, 7)
	orig := make([][]byte, len(comms))
	for i := range bufs {
		orig[i] = bytes.Clone(pccl.Bytes(bufs[i]))
	}
	done := sumWhileMoving(ctx, t, comms, bufs, nil, victim, 1<<20)
	downNICs(victim)
	g.net.Crash(hosts[victim])
	errs := <-done
	comms[victim].Close()
	survivors, sbufs, want := survivorsAborted(t, comms, errs, bufs, orig, victim)
	errs = each(survivors, func(i int, c *pccl.Communicator) error {
		if err := c.UpdateTopology(ctx); err != nil {
			return err
		}
		b := pccl.Bytes(sbufs[i])
		return c.AllReduce(ctx, b, b, pccl.Desc{Tag: 2, Count: count, DType: pccl.F32, Op: pccl.Sum})
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("survivor %d retry: %v", i, err)
		}
		checkSum(t, fmt.Sprintf("survivor %d", i), sbufs[i], want)
	}
}

// TestSiteFabricOnLoopback runs the intra-site tier on the loopback interface, which every peer names
// by address (each gets its own ports): no namespaces needed. A peer that crashes mid-collective
// aborts it with ErrPeerLeft on every survivor.
func TestSiteFabricOnLoopback(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	g := newGroup(t, master.Config{})
	comms, hosts := g.startSitesWith(ctx, 2, 2, func(_ int, cfg *pccl.Config) { cfg.NICs = []string{"127.0.0.1"} })
	defer closeAll(comms)
	for k, count := range []int{3, 4099, 1 << 16} {
		sumOnEvery(ctx, t, comms, 1, count, k)
	}
	requireFabric(t, comms)
	for i, c := range comms {
		if s := c.Stats(); s.SiteCollectives != 3 || s.SiteGenerations != 1 || s.SiteBytes == 0 {
			t.Fatalf("peer %d: stats %+v, want 3 collectives on one fabric", i, s)
		}
	}

	const count, victim = 1 << 22, 1
	bufs, _ := inputs(len(comms), count, 2)
	orig := make([][]byte, len(comms))
	for i := range bufs {
		orig[i] = bytes.Clone(pccl.Bytes(bufs[i]))
	}
	done := sumWhileMoving(ctx, t, comms, bufs, nil, 0, 1)
	g.net.Crash(hosts[victim])
	comms[victim].Close() // its fabric closes with it
	survivorsAborted(t, comms, <-done, bufs, orig, victim)
}

// sumWhileMoving starts an f32 Sum AllReduce of bufs (tag 2) on every peer, peer i under ctxOf(i) (ctx
// when ctxOf is nil), and returns once peer watch has received at least after more bytes on its
// intra-site fabric; the AllReduces' errors come on the channel.
func sumWhileMoving(ctx context.Context, t *testing.T, comms []*pccl.Communicator, bufs [][]float32, ctxOf func(int) context.Context, watch int, after int64) <-chan []error {
	t.Helper()
	before := comms[watch].Stats().SiteBytes
	done := make(chan []error, 1)
	go func() {
		done <- each(comms, func(i int, c *pccl.Communicator) error {
			cctx := ctx
			if ctxOf != nil {
				cctx = ctxOf(i)
			}
			b := pccl.Bytes(bufs[i])
			return c.AllReduce(cctx, b, b, pccl.Desc{Tag: 2, Count: len(bufs[i]), DType: pccl.F32, Op: pccl.Sum})
		})
	}()
	for deadline := time.Now().Add(30 * time.Second); comms[watch].Stats().SiteBytes < before+after; {
		if time.Now().After(deadline) {
			t.Fatal("the collective never moved data on the fabric")
		}
		time.Sleep(100 * time.Microsecond)
	}
	return done
}

// onFabric builds a lab for sites*per peers with nics NICs at mbit each (0: unlimited), connects the
// peers on it and admits them; everything is torn down when the test ends. The context bounds the test.
func onFabric(t *testing.T, sites, per, nics, mbit int) (context.Context, *netlab.Lab, *group, []*pccl.Communicator, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	lab := siteLab(t, sites*per, nics, mbit)
	g := newGroup(t, master.Config{})
	comms, hosts := g.startSitesWith(ctx, sites, per, onLab(lab, nics))
	t.Cleanup(func() { closeAll(comms) })
	return ctx, lab, g, comms, hosts
}

// TestSiteFabricDeadFallsBack takes every NIC of one peer down while its links keep working: each
// collective on the fabric fails at once with a retryable error, and after the second the epoch's
// collectives run their site phases on the site ring's links, so the README's retry loop succeeds on
// its third attempt with the right result.
func TestSiteFabricDeadFallsBack(t *testing.T) {
	const sites, per, nics = 2, 2, 1
	ctx, lab, _, comms, _ := onFabric(t, sites, per, nics, 0)
	sumOnEvery(ctx, t, comms, 1, 1000, 1)
	requireFabric(t, comms)
	if err := lab.SetNIC(1, 0, false); err != nil {
		t.Fatal(err)
	}
	const count = 5000
	for attempt := 1; ; attempt++ {
		bufs, want := inputs(len(comms), count, attempt)
		errs := each(comms, func(i int, c *pccl.Communicator) error {
			b := pccl.Bytes(bufs[i])
			return c.AllReduce(ctx, b, b, pccl.Desc{Tag: 2, Count: count, DType: pccl.F32, Op: pccl.Sum})
		})
		if errors.Join(errs...) == nil {
			if attempt != 3 {
				t.Fatalf("the collective succeeded at attempt %d, want 3 (two on the fabric, then the links)", attempt)
			}
			for i := range comms {
				checkSum(t, fmt.Sprintf("peer %d", i), bufs[i], want)
			}
			break
		}
		if attempt == 3 {
			t.Fatalf("attempt 3 failed: %v", errs)
		}
		for i, err := range errs {
			if !pccl.Retryable(err) {
				t.Fatalf("attempt %d: peer %d: %v, want a retryable error", attempt, i, err)
			}
		}
		errs = each(comms, func(_ int, c *pccl.Communicator) error { return c.UpdateTopology(ctx) })
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
}
