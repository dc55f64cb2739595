package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/concord-ccl/concord/bench/internal/crashhost"
	"github.com/concord-ccl/concord/diloco"
	"github.com/concord-ccl/concord/internal/wanemu"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/rings"
	"github.com/concord-ccl/concord/sharedstate"
)

// wan runs groups on the three sites of a test bed.
type wan struct {
	tb *wanemu.Testbed
}

// wanBytes is the number of bytes that have crossed between sites so far.
func (w *wan) wanBytes() uint64 {
	var sum uint64
	for s := range w.tb.Sites() {
		for d := range w.tb.Sites() {
			if s != d {
				sum += w.tb.Stats(s, d).Bytes
			}
		}
	}
	return sum
}

// group is a master in site 0 and the peers of a run.
type group struct {
	w     *wan
	addr  string
	stop  context.CancelFunc
	done  chan error
	mu    sync.Mutex
	peers []*peer
}

// peer is one participant: its site, transport and communicator.
type peer struct {
	site int
	tr   *crashhost.Transport
	comm *pccl.Communicator
}

func (w *wan) startGroup(ctx context.Context) (*group, error) {
	ln, err := w.tb.Netns(0).Listen("tcp", w.tb.Addr(0).String()+":0")
	if err != nil {
		return nil, err
	}
	sctx, stop := context.WithCancel(ctx)
	g := &group{w: w, addr: ln.Addr().String(), stop: stop, done: make(chan error, 1)}
	srv := master.NewServer(master.ServerConfig{Config: master.Config{}})
	go func() { g.done <- srv.Serve(sctx, ln) }()
	return g, nil
}

// connect starts a peer in site and connects it; it returns once the peer is accepted.
func (g *group) connect(ctx context.Context, site int) (*peer, error) {
	p := &peer{site: site, tr: crashhost.New(g.w.tb.Netns(site))}
	cfg := pccl.WAN()
	cfg.Master, cfg.Transport, cfg.PoolSize = g.addr, p.tr, 8
	cfg.ListenAddr = g.w.tb.Addr(site).String() + ":0"
	cfg.ProgressTimeout, cfg.MasterTimeout = time.Minute, time.Minute
	c, err := pccl.Connect(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("peer in site %d: %w", site, err)
	}
	p.comm = c
	g.mu.Lock()
	g.peers = append(g.peers, p)
	g.mu.Unlock()
	return p, nil
}

// assemble connects one peer in each of the first n sites, all at once, and has the accepted ones
// admit the others until all n are in the ring.
func (g *group) assemble(ctx context.Context, n int) ([]*peer, error) {
	peers := make([]*peer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for site := range n {
		wg.Go(func() {
			p, err := g.connect(ctx, site)
			for err == nil && p.comm.WorldSize() < n {
				var pending bool
				if pending, err = p.comm.ArePeersPending(ctx); err == nil && pending {
					err = p.comm.UpdateTopology(ctx)
				} else if err == nil {
					time.Sleep(20 * time.Millisecond) // the others have not registered yet
				}
			}
			peers[site], errs[site] = p, err
		})
	}
	wg.Wait()
	return peers, errors.Join(errs...)
}

func (g *group) close() {
	g.mu.Lock()
	for _, p := range g.peers {
		p.comm.Close()
	}
	g.mu.Unlock()
	g.stop()
	<-g.done
}

// sleeper is the worker of the WAN runs: an inner step sleeps for the accelerator's compute, then
// moves a window of parameters by an amount of this peer's own, so that outer gradients differ from
// peer to peer and from zero.
type sleeper struct {
	n     int
	step  time.Duration
	rank  int
	pos   uint64
	steps int // inner steps done
}

const sleeperWindow = 4096

func (s *sleeper) NumParams() int { return s.n }
func (s *sleeper) Samples() int   { return 0 }

func (s *sleeper) Init(p []float32) {
	for i := range p {
		p[i] = float32(i%1024) / 1024
	}
}

func (s *sleeper) Seek(rank, world int, epoch, consumed uint64) { s.rank, s.pos = rank, consumed }

func (s *sleeper) Step(p []float32) float32 {
	time.Sleep(s.step)
	s.pos++
	off := int(s.pos*2654435761) % max(1, len(p)-sleeperWindow)
	d := float32(s.rank+1) / 4096
	for k := off; k < min(len(p), off+sleeperWindow); k++ {
		p[k] -= d
	}
	s.steps++
	return 0
}

// measured is what one WAN run yields.
type measured struct {
	util          float64
	waitShare     float64 // of the window, waiting for fragments in flight
	bytesPerInner float64
	identical     bool
	inner         int
	window        time.Duration
	aborts        int
}

// mark is one peer's report of one outer step.
type mark struct {
	at     time.Time
	inner  time.Duration // time in inner steps so far
	wait   time.Duration // time waiting for fragments in flight so far
	steps  int           // inner steps so far
	bytes  uint64        // WAN bytes so far
	digest sharedstate.Digest
}

// streaming runs cfg on one peer per site with a model of size bytes for o.outer outer steps.
func (w *wan) streaming(ctx context.Context, o *options, cfg diloco.TrainerConfig, size int) (measured, error) {
	g, err := w.startGroup(ctx)
	if err != nil {
		return measured{}, err
	}
	defer g.close()
	cfg.Steps, cfg.MinWorld = o.outer, 3
	marks := make([][]mark, 3)
	sums := make([]diloco.Summary, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	// Each peer starts training once connected: the ones already training admit the next.
	for site := range 3 {
		p, err := g.connect(ctx, site)
		if err != nil {
			return measured{}, err
		}
		wk := &sleeper{n: size / 4, step: time.Duration(o.stepMs) * time.Millisecond}
		c := cfg
		c.Progress = func(pr diloco.Progress) {
			marks[site] = append(marks[site], mark{at: time.Now(), inner: pr.InnerTime, wait: pr.SyncWait, steps: wk.steps, bytes: w.wanBytes(), digest: pr.Digest})
			if site == 0 {
				fmt.Fprintf(os.Stderr, "wantrain: outer step %d, %d inner steps\n", pr.Step, wk.steps)
			}
		}
		wg.Go(func() { sums[site], errs[site] = diloco.RunStreaming(ctx, p.comm, c, wk) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return measured{}, err
	}
	m := measured{identical: true}
	var utils, waits []float64
	// The window runs from the end of the first outer step to the end of the last but one: the
	// last fragment of the last is waited for before Run returns, which a longer run would not do.
	for site, ms := range marks {
		if len(ms) != o.outer {
			return measured{}, fmt.Errorf("site %d reported %d outer steps, want %d", site, len(ms), o.outer)
		}
		first, last := ms[0], ms[len(ms)-2]
		utils = append(utils, float64(last.inner-first.inner)/float64(last.at.Sub(first.at)))
		waits = append(waits, float64(last.wait-first.wait)/float64(last.at.Sub(first.at)))
		for k, mk := range ms {
			if !sameDigest(mk.digest, marks[0][k].digest) {
				m.identical = false
			}
		}
		m.aborts += sums[site].Aborts
	}
	for _, s := range sums[1:] {
		m.identical = m.identical && slices.Equal(s.Params, sums[0].Params)
	}
	m.util, m.waitShare = mean(utils), mean(waits)
	first, last := marks[0][0], marks[0][len(marks[0])-2]
	m.inner = last.steps - first.steps
	m.window = last.at.Sub(first.at)
	m.bytesPerInner = float64(last.bytes-first.bytes) / float64(m.inner)
	return m, nil
}

// ddp runs the DDP loop on one peer per site: every inner step sleeps, then all-reduces the whole
// model, for o.ddpSteps steps.
func (w *wan) ddp(ctx context.Context, o *options) (measured, error) {
	g, err := w.startGroup(ctx)
	if err != nil {
		return measured{}, err
	}
	defer g.close()
	step := time.Duration(o.stepMs) * time.Millisecond
	type ddpMark struct {
		at    time.Time
		bytes uint64
		hash  uint64
	}
	marks := make([][]ddpMark, 3)
	errs := make([]error, 3)
	peers, err := g.assemble(ctx, 3)
	if err != nil {
		return measured{}, err
	}
	var wg sync.WaitGroup
	for site, p := range peers {
		wg.Go(func() {
			grad := make([]float32, o.model/4)
			var hashing time.Duration // left out of the wall time
			for s := range o.ddpSteps {
				time.Sleep(step)
				for k := range sleeperWindow {
					grad[(s*sleeperWindow+k)%len(grad)] += float32(site + 1)
				}
				b := rings.Bytes(grad)
				if err := p.comm.AllReduce(ctx, b, b, pccl.Desc{Tag: 1, Count: len(grad), DType: pccl.F32, Op: pccl.Avg}); err != nil {
					errs[site] = err
					return
				}
				at := time.Now().Add(-hashing)
				mk := ddpMark{at: at, bytes: w.wanBytes(), hash: xxh3.Hash(b)}
				hashing += time.Since(at.Add(hashing))
				marks[site] = append(marks[site], mk)
				if site == 0 {
					fmt.Fprintf(os.Stderr, "wantrain: ddp step %d\n", s+1)
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return measured{}, err
	}
	m := measured{identical: true}
	var utils []float64
	for _, ms := range marks {
		first, last := ms[0], ms[len(ms)-1]
		utils = append(utils, float64(time.Duration(len(ms)-1)*step)/float64(last.at.Sub(first.at)))
		for k, mk := range ms {
			m.identical = m.identical && mk.hash == marks[0][k].hash
		}
	}
	m.util = mean(utils)
	first, last := marks[0][0], marks[0][len(marks[0])-1]
	m.inner = len(marks[0]) - 1
	m.window = last.at.Sub(first.at)
	m.bytesPerInner = float64(last.bytes-first.bytes) / float64(m.inner)
	return m, nil
}

// churnResult is the JSON of the churn run.
type churnResult struct {
	ModelBytes    int   `json:"model_bytes"`
	OuterSteps    int   `json:"outer_steps"`
	SurvivorAbort []int `json:"survivor_aborts"`
	NewcomerSteps int   `json:"newcomer_steps"`
	NewcomerBytes int64 `json:"newcomer_fetched_bytes"`
	StepsChecked  int   `json:"steps_checked"`
	BitIdentical  bool  `json:"bit_identical"`
}

// churnStepMs is the inner step of the churn run, which checks state, not speed.
const churnStepMs = 20

// churnOuter is the number of outer steps of the churn run, and churnKillAt the first outer step
// after which the peer of site 2 may die (once it is in).
const (
	churnOuter  = 6
	churnKillAt = 2
)

// churn runs cfg with a model of o.churnModel bytes; after outer step 1 the peer of site 2 dies and
// a newcomer in site 2 joins.
func (w *wan) churn(ctx context.Context, o *options, cfg diloco.TrainerConfig) (*churnResult, error) {
	g, err := w.startGroup(ctx)
	if err != nil {
		return nil, err
	}
	defer g.close()
	cfg.Steps, cfg.MinWorld = churnOuter, 2
	var mu sync.Mutex
	digests := map[uint64][]sharedstate.Digest{}
	var victim *peer
	killed := make(chan struct{})
	var once sync.Once
	type run struct {
		sum diloco.Summary
		err error
	}
	start := func(p *peer, hook func(diloco.Progress)) chan run {
		wk := &sleeper{n: o.churnModel / 4, step: churnStepMs * time.Millisecond}
		c := cfg
		c.Progress = func(pr diloco.Progress) {
			mu.Lock()
			digests[pr.Step] = append(digests[pr.Step], pr.Digest)
			mu.Unlock()
			if hook != nil {
				hook(pr)
			}
		}
		ch := make(chan run, 1)
		go func() {
			s, err := diloco.RunStreaming(ctx, p.comm, c, wk)
			ch <- run{s, err}
		}()
		return ch
	}
	// Each peer starts training once connected: the ones already training admit the next.
	var runs []chan run
	for site := range 3 {
		p, err := g.connect(ctx, site)
		if err != nil {
			return nil, err
		}
		var hook func(diloco.Progress)
		if site == 0 {
			hook = func(pr diloco.Progress) {
				mu.Lock()
				v := victim
				mu.Unlock()
				if pr.Step >= churnKillAt && v != nil && pr.World == 3 {
					once.Do(func() {
						fmt.Fprintf(os.Stderr, "wantrain: churn: the peer of site 2 dies after outer step %d\n", pr.Step)
						v.tr.Crash()
						close(killed)
					})
				}
			}
		}
		runs = append(runs, start(p, hook))
		if site == 2 {
			mu.Lock()
			victim = p
			mu.Unlock()
		}
	}
	select {
	case <-killed:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// The dead peer's process is gone: its communicator would otherwise retry the master until
	// Config.MasterTimeout.
	victim.comm.Close()
	if r := <-runs[2]; r.err == nil {
		return nil, errors.New("the killed peer's run ended without an error")
	}
	newcomer, err := g.connect(ctx, 2)
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(os.Stderr, "wantrain: churn: a newcomer in site 2 is in")
	nr := start(newcomer, nil)
	res := &churnResult{ModelBytes: o.churnModel, OuterSteps: churnOuter, BitIdentical: true}
	var finals []diloco.Summary
	for _, ch := range []chan run{runs[0], runs[1], nr} {
		r := <-ch
		if r.err != nil {
			return nil, r.err
		}
		finals = append(finals, r.sum)
	}
	for _, s := range finals[:2] {
		res.SurvivorAbort = append(res.SurvivorAbort, s.Aborts)
	}
	res.NewcomerSteps, res.NewcomerBytes = finals[2].LocalSteps, finals[2].BytesFetched
	for _, s := range finals[1:] {
		res.BitIdentical = res.BitIdentical && slices.Equal(s.Params, finals[0].Params) && sameDigest(s.Digest, finals[0].Digest)
	}
	for step := uint64(1); step <= churnOuter; step++ {
		ds := digests[step]
		if len(ds) < 2 {
			return nil, fmt.Errorf("outer step %d completed by %d peers", step, len(ds))
		}
		res.StepsChecked++
		for _, d := range ds[1:] {
			res.BitIdentical = res.BitIdentical && sameDigest(d, ds[0])
		}
	}
	if res.NewcomerSteps == 0 {
		return nil, errors.New("the newcomer completed no outer step")
	}
	fmt.Fprintf(os.Stderr, "wantrain: churn: survivors' aborts %v, newcomer %d steps, bit-identical %v\n", res.SurvivorAbort, res.NewcomerSteps, res.BitIdentical)
	return res, nil
}

// sameDigest reports whether a and b have the same revision and entries.
func sameDigest(a, b sharedstate.Digest) bool {
	return a.Revision == b.Revision && slices.Equal(a.Entries, b.Entries)
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
