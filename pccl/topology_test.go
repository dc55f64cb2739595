package pccl_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// TestOptimizeTopologyGroupsSites joins peers of two sites alternately, makes links between the sites
// slow, and checks that OptimizeTopology leaves a ring that crosses between sites only twice, and that
// collectives are correct on it.
func TestOptimizeTopologyGroupsSites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{MeasureDuration: 200 * time.Millisecond, SolveBudget: 50 * time.Millisecond, ImproveBudget: time.Second})
		comms, hosts := g.start(ctx, 4)
		defer closeAll(comms)
		site := map[string]int{}
		for i, h := range hosts {
			site[h] = i % 2
		}
		for _, a := range hosts {
			for _, b := range hosts {
				if a == b {
					continue
				}
				if site[a] == site[b] {
					g.net.SetLink(a, b, pccl.LinkConfig{Bandwidth: 100e6})
				} else {
					g.net.SetLink(a, b, pccl.LinkConfig{Bandwidth: 10e6, Latency: 5 * time.Millisecond})
				}
			}
		}
		var wg sync.WaitGroup
		errs := make([]error, len(comms))
		optimize := func() {
			for i, c := range comms {
				wg.Add(1)
				go func(i int, c *pccl.Communicator) {
					defer wg.Done()
					errs[i] = c.OptimizeTopology(ctx)
				}(i, c)
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("peer %d: %v", i, err)
				}
			}
		}
		// Start from the worst ring: sites alternate (hosts alternate sites).
		var worst []uint64
		for _, c := range comms {
			worst = append(worst, c.ID())
		}
		g.srv.ForceRing(worst) // applied at the next OptimizeTopology
		before := worst
		// The measurements run in real time on a shared machine, so a noisy round may leave the ring as
		// it was (under the race detector, beside other packages' tests, a round has measured some links
		// as zero); the sites must be grouped within six rounds (the first usually only measures, and the
		// background search's better ring applies at the next one).
		var ring []uint64
		for range 6 {
			optimize()
			ring = comms[0].Ring()
			if crossingsOf(ring, siteOfIDs(comms, hosts, site)) == 2 {
				break
			}
		}
		for _, c := range comms {
			if !slices.Equal(c.Ring(), ring) {
				t.Fatalf("peers disagree on the ring: %v vs %v", c.Ring(), ring)
			}
		}
		siteOf := map[uint64]int{}
		for i, c := range comms {
			siteOf[c.ID()] = site[hosts[i]]
		}
		crossings := func(r []uint64) int {
			n := 0
			for i := range r {
				if siteOf[r[i]] != siteOf[r[(i+1)%len(r)]] {
					n++
				}
			}
			return n
		}
		if crossings(before) != 4 || crossings(ring) != 2 {
			// before is the forced ring, whose sites alternate; ring is the optimized one.
			snap := g.srv.Snapshot()
			t.Fatalf("crossings before %d (ring %v), after %d (ring %v); want 4 then 2; sites %v; measured (ring order %v) %v",
				crossings(before), before, crossings(ring), ring, siteOf, snap.Ring, snap.Bandwidth)
		}
		if bw := g.srv.Snapshot().Bandwidth; len(bw) != 4 {
			t.Fatalf("bandwidth matrix %v", bw)
		}
		// Collectives work on the new ring.
		for i, c := range comms {
			wg.Add(1)
			go func(i int, c *pccl.Communicator) {
				defer wg.Done()
				v := []int32{int32(i), 1}
				errs[i] = c.AllReduce(ctx, pccl.Bytes(v), pccl.Bytes(v), pccl.Desc{Tag: 1, Count: 2, DType: pccl.I32, Op: pccl.Sum})
				if errs[i] == nil && (v[0] != 6 || v[1] != 4) {
					t.Errorf("peer %d: %v", i, v)
				}
			}(i, c)
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("peer %d: %v", i, err)
			}
		}
	})
}

func TestAggregateUsesTheUnionOfWindows(t *testing.T) {
	// Two streams of 10 MB each over the same 1 s window: 20 MB/s. Two streams one after the other
	// (a loaded machine delayed the second): still 20 MB over 2 s, 10 MB/s, not 20.
	same := []*wire.BenchResult{{Bytes: 10e6, Nanos: 1e9, Start: 5e9}, {Bytes: 10e6, Nanos: 1e9, Start: 5e9}}
	apart := []*wire.BenchResult{{Bytes: 10e6, Nanos: 1e9, Start: 5e9}, {Bytes: 10e6, Nanos: 1e9, Start: 6e9}, nil}
	if got := pccl.AggregateForTest(same); got != 20e6 {
		t.Fatalf("overlapping windows: %v", got)
	}
	if got := pccl.AggregateForTest(apart); got != 10e6 {
		t.Fatalf("disjoint windows: %v", got)
	}
}

// siteOfIDs maps each communicator's id to the site of its host.
func siteOfIDs(comms []*pccl.Communicator, hosts []string, site map[string]int) map[uint64]int {
	m := map[uint64]int{}
	for i, c := range comms {
		m[c.ID()] = site[hosts[i]]
	}
	return m
}

// crossingsOf counts the links of ring r between different sites.
func crossingsOf(r []uint64, siteOf map[uint64]int) int {
	n := 0
	for i := range r {
		if siteOf[r[i]] != siteOf[r[(i+1)%len(r)]] {
			n++
		}
	}
	return n
}
