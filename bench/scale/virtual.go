package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/concord-ccl/concord/bench/internal/virtual"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/sharedstate"
	"github.com/concord-ccl/concord/stress/sim"
)

// Targets of the virtual mode.
const (
	targetRewiredP99Ms  = 1000.0 // rewired_ms p99 at 64 peers, at most
	targetRewiredRatio  = 1.2    // rewired_ms p50 at 64 peers over at the smallest size, at most
	targetRewiredRatioL = 2.0    // rewired_ms p50 at 1024 peers over at the smallest size, at most
	virtualCrashAfter   = 100 * time.Millisecond
	virtualIdle         = 10 * time.Second // virtual time of the idle window that prices heartbeats
	virtualLimit        = 2 * time.Hour    // bound of one size's run in virtual time
)

// virtualResult is the JSON result of --virtual.
type virtualResult struct {
	Mode        string        `json:"mode"`
	Note        string        `json:"note"`
	Topology    string        `json:"topology"`
	BufferBytes int           `json:"buffer_bytes"`
	StateBytes  int           `json:"state_bytes"`
	Kills       int           `json:"kills_per_size"`
	Seed        uint64        `json:"seed"`
	Sizes       []virtualSize `json:"sizes"`
	// The targets, measured in the same run.
	RewiredP99At64Ms       float64 `json:"rewired_p99_ms_at_64"`
	RewiredP99At64LimitMs  float64 `json:"rewired_p99_ms_at_64_limit"`
	RewiredP50Ratio64      float64 `json:"rewired_p50_ratio_64"`
	RewiredP50Ratio64Limit float64 `json:"rewired_p50_ratio_64_limit"`
	RewiredP50Ratio1024    float64 `json:"rewired_p50_ratio_1024"`
	RewiredP50Ratio1024Lim float64 `json:"rewired_p50_ratio_1024_limit"`
	RatioOf                string  `json:"ratio_of"`
	TargetsMet             bool    `json:"targets_met"`
}

// virtualSize is the measurement at one number of peers. Times are milliseconds of virtual time;
// the master's CPU is real.
type virtualSize struct {
	Peers  int `json:"peers"`
	Rounds int `json:"rounds"`
	// Rewired: from the crash until every survivor's retry had started on the new ring (its
	// AllReduce called after the UpdateTopology that dropped the dead peer).
	Rewired dist `json:"rewired_ms"`
	// Resume: from the crash until every survivor's retry completed.
	Resume dist `json:"resume_ms"`
	// Admit: from the newcomer's Connect until every member's UpdateTopology admitted it.
	Admit dist `json:"admit_ms"`
	// Join: the newcomer's first SyncSharedState, which fetches the shared state.
	Join dist `json:"join_ms"`
	// Ratios of the p50s to the smallest size's.
	RewiredP50Ratio float64 `json:"rewired_p50_ratio"`
	ResumeP50Ratio  float64 `json:"resume_p50_ratio"`
	AdmitP50Ratio   float64 `json:"admit_p50_ratio"`
	JoinP50Ratio    float64 `json:"join_p50_ratio"`
	// The master's CPU time (real, from the CPU profile's samples of its goroutines) per event:
	// a crash until every survivor's retry started, an admission, a join. Each is net of the
	// heartbeats, priced by an idle window (MasterIdleCPUMsPerS, per second of virtual time).
	MasterCPUMsPerCrash float64 `json:"master_cpu_ms_per_crash"`
	MasterCPUMsPerAdmit float64 `json:"master_cpu_ms_per_admit"`
	MasterCPUMsPerJoin  float64 `json:"master_cpu_ms_per_join"`
	MasterIdleCPUMsPerS float64 `json:"master_idle_cpu_ms_per_virtual_s"`
	// Rings holds the ring's site crossings after the setup (a ring grouped by site crosses 3).
	SiteCrossings int     `json:"site_crossings"`
	WallSeconds   float64 `json:"wall_seconds"`
	Failure       string  `json:"failure,omitempty"`
}

// vpeer is one simulated peer of the virtual mode.
type vpeer struct {
	host string
	id   uint64
	comm *pccl.Communicator
	buf  []float32
	st   *sharedstate.State
	dead bool
}

// runVirtualScale measures every size in a bubble of its own.
func runVirtualScale(sizes []int, o options, progress func(string, ...any)) virtualResult {
	res := virtualResult{Mode: "virtual", BufferBytes: o.bytes, StateBytes: o.stateBytes, Kills: o.kills, Seed: o.seed,
		Topology: "3 sites (eu, us, ap) 50/100/150 ms apart (round trip), 1 ms inside a site, 1 Gbit/s per link; master in eu; WAN presets",
		Note: "the master and every peer, their real code, on the in-memory network in a synctest bubble: times are virtual " +
			"(CPU work takes none), so they show the protocol's round trips at these RTTs; the master's CPU is real",
		RewiredP99At64LimitMs: targetRewiredP99Ms, RewiredP50Ratio64Limit: targetRewiredRatio, RewiredP50Ratio1024Lim: targetRewiredRatioL}
	meter := newCPUMeter("sim.role", "master")
	defer meter.close()
	for _, n := range sizes {
		progress("virtual: %d peers", n)
		wall := time.Now()
		var s virtualSize
		err := virtual.Run(func(t *testing.T) { s = virtualRun(n, o, meter, progress) })
		s.WallSeconds = time.Since(wall).Seconds()
		if err != nil && s.Failure == "" {
			s.Failure = err.Error()
		}
		progress("virtual: %d peers: rewired p50 %.0f p99 %.0f ms, resume p50 %.0f ms, admit p50 %.0f ms, join p50 %.0f ms (%.1f s wall) %s",
			n, s.Rewired.P50, s.Rewired.P99, s.Resume.P50, s.Admit.P50, s.Join.P50, s.WallSeconds, s.Failure)
		res.Sizes = append(res.Sizes, s)
	}
	base := res.Sizes[0]
	ratio := func(a, b float64) float64 {
		if b <= 0 {
			return 0
		}
		return a / b
	}
	for i := range res.Sizes {
		s := &res.Sizes[i]
		s.RewiredP50Ratio = ratio(s.Rewired.P50, base.Rewired.P50)
		s.ResumeP50Ratio = ratio(s.Resume.P50, base.Resume.P50)
		s.AdmitP50Ratio = ratio(s.Admit.P50, base.Admit.P50)
		s.JoinP50Ratio = ratio(s.Join.P50, base.Join.P50)
		switch s.Peers {
		case 64:
			res.RewiredP99At64Ms, res.RewiredP50Ratio64 = s.Rewired.P99, s.RewiredP50Ratio
		case 1024:
			res.RewiredP50Ratio1024 = s.RewiredP50Ratio
		}
	}
	res.RatioOf = fmt.Sprintf("p50 at each size over p50 at %d peers", base.Peers)
	res.TargetsMet = true
	for _, s := range res.Sizes {
		if s.Failure != "" {
			res.TargetsMet = false
		}
		switch s.Peers {
		case 64:
			res.TargetsMet = res.TargetsMet && s.Rewired.P99 <= targetRewiredP99Ms && s.RewiredP50Ratio <= targetRewiredRatio
		case 1024:
			res.TargetsMet = res.TargetsMet && s.RewiredP50Ratio <= targetRewiredRatioL
		}
	}
	return res
}

// virtualRun measures n peers; it runs in the bubble.
func virtualRun(n int, o options, meter *cpuMeter, progress func(string, ...any)) (s virtualSize) {
	s.Peers = n
	fail := func(err error) virtualSize {
		s.Failure = err.Error()
		return s
	}
	topo := sim.WAN()
	mcfg := master.WAN()
	mcfg.MinPeers = 2
	cl, err := sim.NewCluster(topo, mcfg)
	if err != nil {
		return fail(err)
	}
	if err := cl.StartMaster(1); err != nil {
		return fail(err)
	}
	defer cl.StopMaster()
	ctx, cancel := context.WithTimeout(context.Background(), virtualLimit)
	defer cancel()
	rng := rand.New(rand.NewPCG(o.seed, uint64(n)))
	count := o.bytes / 4
	desc := pccl.Desc{Tag: 1, Count: count, DType: pccl.F32, Op: pccl.Sum}
	stateData := make([]byte, o.stateBytes) // the members share it: donors only read it
	for i := range stateData {
		stateData[i] = byte(i * 31)
	}
	spawned := 0
	newPeer := func(site int) *vpeer {
		// Identities from the seed, so that a run's ring, and with it who neighbours whom, repeats.
		p := &vpeer{host: fmt.Sprintf("p%d", spawned), buf: make([]float32, count), id: rng.Uint64()>>16 | 1}
		spawned++
		cl.Place(p.host, site)
		return p
	}
	connect := func(p *vpeer) error {
		cfg := pccl.WAN()
		site, _ := cl.SiteOf(p.host)
		cfg.Master, cfg.Transport, cfg.ListenAddr, cfg.Site = sim.MasterAddr, cl.Net.Host(p.host), p.host+":9000", topo.SiteName(site)
		cfg.ID = p.id
		c, err := pccl.Connect(ctx, cfg)
		p.comm = c
		return err
	}
	var peers []*vpeer
	defer func() {
		for _, p := range peers {
			if p.comm != nil {
				p.comm.Close()
			}
		}
	}()
	// The group: the first peer alone, then all others admitted together.
	for i := range n {
		peers = append(peers, newPeer(i%topo.NumSites()))
	}
	if err := connect(peers[0]); err != nil {
		return fail(err)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Go(func() { errs[i] = connect(peers[i]) })
	}
	if err := cl.WaitRegistered(ctx, n); err != nil {
		return fail(err)
	}
	if err := sim.Admit(ctx, []*pccl.Communicator{peers[0].comm}, n); err != nil {
		return fail(fmt.Errorf("setup: %w", err))
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fail(fmt.Errorf("setup: %w", err))
	}
	s.SiteCrossings = crossings(cl, peers)
	rev := uint64(1)
	for _, p := range peers {
		p.st = newVirtualState(stateData, false)
	}
	if err := syncMembers(ctx, peers, rev, nil); err != nil {
		return fail(fmt.Errorf("founders' sync: %w", err))
	}
	// A warm-up collective, then the heartbeats' price in an idle window.
	if err := allReduce(ctx, peers, desc); err != nil {
		return fail(fmt.Errorf("warm-up AllReduce: %w", err))
	}
	meter.start()
	time.Sleep(virtualIdle)
	idle := meter.stop()
	s.MasterIdleCPUMsPerS = idle / virtualIdle.Seconds()
	net := func(ms float64, took time.Duration) float64 { return ms - s.MasterIdleCPUMsPerS*took.Seconds() }
	var crashCPU, admitCPU, joinCPU float64
	for round := range o.kills {
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
		// Crash: every member starts an AllReduce; virtualCrashAfter (plus up to as much again)
		// later the victim's host crashes and its communicator is closed.
		victim := peers[rng.IntN(len(peers))]
		survivors := slices.DeleteFunc(slices.Clone(peers), func(p *vpeer) bool { return p == victim })
		crashAt := time.Now().Add(virtualCrashAfter + time.Duration(rng.Int64N(int64(virtualCrashAfter))))
		var mu sync.Mutex
		var rewired, resumed time.Time
		completed, retried := 0, 0
		allRewired := make(chan struct{}) // closed when every survivor's retry started
		roundErrs := make([]error, len(peers))
		for i, p := range peers {
			wg.Go(func() {
				err := p.comm.AllReduce(ctx, pccl.Bytes(p.buf), pccl.Bytes(p.buf), desc)
				if p == victim {
					return
				}
				if err == nil {
					mu.Lock()
					completed++
					mu.Unlock()
					return
				}
				for pccl.Retryable(err) {
					if err = p.comm.UpdateTopology(ctx); err != nil {
						break
					}
					started := time.Now()
					mu.Lock()
					if retried++; retried == len(survivors) {
						close(allRewired)
					}
					mu.Unlock()
					if err = p.comm.AllReduce(ctx, pccl.Bytes(p.buf), pccl.Bytes(p.buf), desc); err == nil {
						mu.Lock()
						rewired, resumed = latest(rewired, started), latest(resumed, time.Now())
						mu.Unlock()
					}
				}
				roundErrs[i] = err
			})
		}
		time.Sleep(time.Until(crashAt))
		meter.start()
		cl.Net.Crash(victim.host)
		victim.comm.Close()
		victim.comm, victim.dead = nil, true
		// The master's part of a crash: from it until every survivor retries on the new ring.
		cpu := -1.0
		select {
		case <-allRewired:
			cpu = meter.stop()
		case <-ctx.Done():
		}
		wg.Wait()
		if cpu < 0 {
			meter.stop()
		}
		if err := errors.Join(roundErrs...); err != nil {
			return fail(fmt.Errorf("round %d: %w", round, err))
		}
		if completed > 0 {
			progress("virtual: %d peers, round %d: %d survivors completed before the crash; not a sample", n, round, completed)
		} else {
			s.Rewired.add(ms(rewired.Sub(crashAt)))
			s.Resume.add(ms(resumed.Sub(crashAt)))
			crashCPU += net(cpu, rewired.Sub(crashAt))
			s.Rounds++
		}
		peers = survivors
		// Admission: a newcomer in the victim's site registers; the members admit it.
		site, _ := cl.SiteOf(victim.host)
		nc := newPeer(site)
		t0 := time.Now()
		meter.start()
		var cerr error
		connected := make(chan struct{})
		go func() {
			cerr = connect(nc)
			close(connected)
		}()
		if err := cl.WaitRegistered(ctx, len(peers)+1); err != nil {
			return fail(err)
		}
		comms := make([]*pccl.Communicator, len(peers))
		for i, p := range peers {
			comms[i] = p.comm
		}
		if err := sim.Admit(ctx, comms, len(peers)+1); err != nil {
			return fail(fmt.Errorf("round %d: admission: %w", round, err))
		}
		admitted := time.Since(t0)
		<-connected
		admitCPU += net(meter.stop(), admitted)
		if cerr != nil {
			return fail(fmt.Errorf("round %d: newcomer: %w", round, cerr))
		}
		s.Admit.add(ms(admitted))
		// Join: everyone syncs; the newcomer, with zeroed state, fetches it.
		nc.st = newVirtualState(stateData, true)
		peers = append(peers, nc)
		rev++
		meter.start()
		var joined time.Duration
		if err := syncMembers(ctx, peers, rev, func(p *vpeer, d time.Duration) {
			if p == nc {
				joined = d
			}
		}); err != nil {
			return fail(fmt.Errorf("round %d: join: %w", round, err))
		}
		joinCPU += net(meter.stop(), joined)
		s.Join.add(ms(joined))
	}
	if s.Rounds > 0 {
		s.MasterCPUMsPerCrash = crashCPU / float64(s.Rounds)
	}
	s.MasterCPUMsPerAdmit = admitCPU / float64(o.kills)
	s.MasterCPUMsPerJoin = joinCPU / float64(o.kills)
	for _, d := range []*dist{&s.Rewired, &s.Resume, &s.Admit, &s.Join} {
		d.finish()
	}
	return s
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// newVirtualState is a member's state (one entry over data, which the members share) or, for a
// newcomer, zeros of the same size.
func newVirtualState(data []byte, zero bool) *sharedstate.State {
	st := sharedstate.NewState()
	if zero {
		data = make([]byte, len(data))
	}
	st.Add(&sharedstate.Entry{Name: "params", DType: pccl.U8, Data: data, Version: 1})
	return st
}

// syncMembers syncs every peer at revision rev and reports each one's call time.
func syncMembers(ctx context.Context, peers []*vpeer, rev uint64, done func(*vpeer, time.Duration)) error {
	errs := make([]error, len(peers))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Go(func() {
			p.st.Revision = rev
			t0 := time.Now()
			_, errs[i] = p.comm.SyncSharedState(ctx, p.st, pccl.SyncOptions{})
			if done != nil && errs[i] == nil {
				mu.Lock()
				done(p, time.Since(t0))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// allReduce runs one AllReduce on every peer.
func allReduce(ctx context.Context, peers []*vpeer, desc pccl.Desc) error {
	errs := make([]error, len(peers))
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Go(func() { errs[i] = p.comm.AllReduce(ctx, pccl.Bytes(p.buf), pccl.Bytes(p.buf), desc) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// crossings counts the links of the first peer's ring that join two sites.
func crossings(cl *sim.Cluster, peers []*vpeer) int {
	siteOf := map[uint64]int{}
	for _, p := range peers {
		site, _ := cl.SiteOf(p.host)
		siteOf[p.comm.ID()] = site
	}
	ring := peers[0].comm.Ring()
	n := 0
	for i, id := range ring {
		if siteOf[id] != siteOf[ring[(i+1)%len(ring)]] {
			n++
		}
	}
	return n
}
