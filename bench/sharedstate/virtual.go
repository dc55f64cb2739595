package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/concord-ccl/concord/bench/internal/virtual"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/sharedstate"
	"github.com/concord-ccl/concord/stress/sim"
)

// targetDonorBound is the limit join_vs_donor_bound is compared to in virtual time.
const targetDonorBound = 1.2

// virtualResult is the JSON result of --virtual.
type virtualResult struct {
	Mode       string `json:"mode"`
	Note       string `json:"note"`
	Peers      int    `json:"peers"`
	StateBytes int    `json:"state_bytes"`
	Entries    int    `json:"entries"`
	Topology   string `json:"topology"`
	// JoinSeconds is the newcomer's sync call, in virtual time; JoinTotalSeconds adds the
	// admitting UpdateTopology round.
	JoinSeconds      float64 `json:"join_seconds"`
	JoinTotalSeconds float64 `json:"join_total_seconds"`
	JoinFetchedBytes int64   `json:"join_fetched_bytes"`
	// JoinFirstRangeSeconds and JoinLastRangeSeconds are when, from the start of the newcomer's
	// sync call, its first and its last fetched range were installed.
	JoinFirstRangeSeconds float64 `json:"join_first_range_seconds"`
	JoinLastRangeSeconds  float64 `json:"join_last_range_seconds"`
	// DonorBoundSeconds is the state's size over the sum of the donors' upload bandwidths: no join
	// can be faster.
	DonorBoundSeconds float64 `json:"donor_bound_seconds"`
	JoinVsDonorBound  float64 `json:"join_vs_donor_bound"`
	JoinVsBoundTarget float64 `json:"join_vs_donor_bound_target"`
	// DonorBytes is what each donor sent the newcomer (the share of each).
	DonorBytes []int64 `json:"donor_bytes"`
	// RawTransferSeconds moves the state over one connection of one donor's link, 1 MiB per write,
	// in virtual time: what a single stream gets over the link.
	RawTransferSeconds float64 `json:"raw_transfer_seconds"`
	JoinRatio          float64 `json:"join_ratio"`
	BitIdentical       bool    `json:"bit_identical"`
	WallSeconds        float64 `json:"wall_seconds"`
	TargetsMet         bool    `json:"targets_met"`
	Failure            string  `json:"failure,omitempty"`
}

// runVirtual measures a newcomer's join in virtual time: a master and n donors holding the state
// (in the sites of sim.WAN() in turn, each with 1 Gbit/s to the newcomer), and a newcomer with
// zeroed state in the first site.
func runVirtual(n, size, entries int) virtualResult {
	topo := sim.WAN()
	res := virtualResult{Mode: "virtual", Peers: n, StateBytes: size, Entries: entries, JoinVsBoundTarget: targetDonorBound,
		Topology: "3 sites (eu, us, ap) 50/100/150 ms apart (round trip), 1 ms inside a site, 1 Gbit/s per link",
		Note: "a master, the donors and the newcomer, their real code, on the in-memory network in a synctest bubble: " +
			"every time is virtual (CPU work takes none), so the join is bounded by the links alone"}
	wall := time.Now()
	err := virtual.Run(func(t *testing.T) {
		if err := joinVirtual(&res, topo, n, size, entries); err != nil {
			res.Failure = err.Error()
		}
	})
	res.WallSeconds = time.Since(wall).Seconds()
	if err != nil && res.Failure == "" {
		res.Failure = err.Error()
	}
	res.TargetsMet = res.Failure == "" && res.BitIdentical && res.JoinVsDonorBound <= targetDonorBound
	return res
}

// virtualState builds the state: the donors' entries share one buffer each (they only read it), the
// newcomer's are zeros.
func virtualState(shared [][]byte, size, entries int, zero bool) (*sharedstate.State, [][]byte, error) {
	st := sharedstate.NewState()
	per := size / entries / 4 * 4
	if shared == nil {
		shared = make([][]byte, entries)
		for i := range shared {
			m := per
			if i == entries-1 {
				m = size - per*(entries-1)
			}
			shared[i] = make([]byte, m)
			fillEntry(shared[i], uint32(i))
		}
	}
	for i, d := range shared {
		if zero {
			d = make([]byte, len(d))
		}
		if err := st.Add(&sharedstate.Entry{Name: entryName(i), DType: pccl.F32, Data: d, Version: 1}); err != nil {
			return nil, nil, err
		}
	}
	return st, shared, nil
}

// joinVirtual runs inside the bubble.
func joinVirtual(res *virtualResult, topo sim.Topology, n, size, entries int) error {
	cl, err := sim.NewCluster(topo, master.WAN())
	if err != nil {
		return err
	}
	if err := cl.StartMaster(1); err != nil {
		return err
	}
	defer cl.StopMaster()
	// Bounded in virtual time: a run that wedges fails instead of running its clock forever.
	ctx, cancel := context.WithTimeout(context.Background(), virtualLimit)
	defer cancel()
	hosts := make([]string, n+1)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("p%d", i)
		cl.Place(hosts[i], i%topo.NumSites())
	}
	newcomer := hosts[n]
	cl.Place(newcomer, 0)
	connect := func(i int) (*pccl.Communicator, error) {
		cfg := pccl.WAN()
		cfg.Master, cfg.Transport, cfg.ListenAddr = sim.MasterAddr, cl.Net.Host(hosts[i]), hosts[i]+":9000"
		site, _ := cl.SiteOf(hosts[i])
		cfg.Site = topo.SiteName(site)
		return pccl.Connect(ctx, cfg)
	}
	comms := make([]*pccl.Communicator, n+1)
	defer func() {
		for _, c := range comms {
			if c != nil {
				c.Close()
			}
		}
	}()
	// The founders: the first connects alone, the others are admitted together.
	if comms[0], err = connect(0); err != nil {
		return err
	}
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Go(func() { comms[i], errs[i] = connect(i) })
	}
	if err := cl.WaitRegistered(ctx, n); err != nil {
		return err
	}
	if err := sim.Admit(ctx, comms[:1], n); err != nil {
		return err
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	states := make([]*sharedstate.State, n+1)
	var shared [][]byte
	for i := range n {
		if states[i], shared, err = virtualState(shared, size, entries, false); err != nil {
			return err
		}
	}
	if states[n], _, err = virtualState(shared, size, entries, true); err != nil {
		return err
	}
	// The founders' first sync (every one hashes its state once; Version keeps the hashes).
	if err := syncAll(ctx, comms[:n], states[:n], 1, nil, nil); err != nil {
		return fmt.Errorf("founders' sync: %w", err)
	}
	// The newcomer registers and is admitted, then everyone syncs.
	go func() { comms[n], errs[n] = connect(n) }()
	t0 := time.Now()
	if err := cl.WaitRegistered(ctx, n+1); err != nil {
		return err
	}
	if err := sim.Admit(ctx, comms[:n], n+1); err != nil {
		return err
	}
	for comms[n] == nil && errs[n] == nil {
		time.Sleep(time.Millisecond)
	}
	if errs[n] != nil {
		return errs[n]
	}
	admitted := time.Since(t0)
	before := make([]int64, n)
	for i := range n {
		before[i] = cl.Net.Stats(hosts[i], newcomer)
	}
	var results []pccl.SyncResult
	var joined time.Duration
	var first, last time.Time
	progress := func(done, total int64) {
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		last = now
	}
	t1 := time.Now()
	if err := syncAll(ctx, comms, states, 2, progress, func(i int, r pccl.SyncResult, d time.Duration) {
		if i == n {
			joined, results = d, append(results, r)
		}
	}); err != nil {
		return fmt.Errorf("join sync: %w", err)
	}
	res.JoinSeconds = joined.Seconds()
	res.JoinFirstRangeSeconds, res.JoinLastRangeSeconds = first.Sub(t1).Seconds(), last.Sub(t1).Seconds()
	res.JoinTotalSeconds = (admitted + joined).Seconds()
	res.JoinFetchedBytes = results[0].FetchedBytes
	for i := range n {
		res.DonorBytes = append(res.DonorBytes, cl.Net.Stats(hosts[i], newcomer)-before[i])
	}
	res.DonorBoundSeconds = float64(size) / (float64(n) * topo.Bandwidth)
	res.JoinVsDonorBound = res.JoinSeconds / res.DonorBoundSeconds
	// Every peer re-hashes its whole state: all must agree.
	want := digestOf(states[0])
	res.BitIdentical = digestOf(states[n]) == want
	// One stream over a donor's link to the newcomer inside its site.
	raw, err := rawVirtual(cl, hosts[0], newcomer, size)
	if err != nil {
		return err
	}
	res.RawTransferSeconds = raw.Seconds()
	res.JoinRatio = res.JoinSeconds / res.RawTransferSeconds
	return nil
}

// virtualLimit bounds a virtual run in virtual time.
const virtualLimit = time.Hour

// syncAll syncs every peer at revision rev and reports each one's result and call time; the last
// peer's sync reports its progress.
func syncAll(ctx context.Context, comms []*pccl.Communicator, states []*sharedstate.State, rev uint64, progress func(done, total int64),
	done func(int, pccl.SyncResult, time.Duration)) error {
	errs := make([]error, len(comms))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Go(func() {
			states[i].Revision = rev
			t0 := time.Now()
			opt := pccl.SyncOptions{}
			if i == len(comms)-1 {
				opt.Progress = progress
			}
			r, err := c.SyncSharedState(ctx, states[i], opt)
			errs[i] = err
			if done != nil && err == nil {
				mu.Lock()
				done(i, r, time.Since(t0))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// digestOf hashes every entry of st afresh.
func digestOf(st *sharedstate.State) string { return stateDigest(st) }

// rawVirtual moves size bytes from host from to host to over one connection of the simulated
// network, 1 MiB per write, and returns the time until the last byte was read.
func rawVirtual(cl *sim.Cluster, from, to string, size int) (time.Duration, error) {
	ln, err := cl.Net.Host(to).Listen(to + ":0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	done := make(chan error, 1)
	var took time.Duration
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		buf := make([]byte, 1<<20)
		var got int
		for got < size {
			k, err := c.Read(buf)
			got += k
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	c, err := cl.Net.Host(from).Dial(context.Background(), ln.Addr().String())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	t0 := time.Now()
	buf := make([]byte, 1<<20)
	for sent := 0; sent < size; sent += len(buf) {
		if _, err := c.Write(buf[:min(len(buf), size-sent)]); err != nil {
			return 0, err
		}
	}
	err = <-done
	took = time.Since(t0)
	return took, err
}
