// Command topology measures what OptimizeTopology gains on a WAN of several sites.
//
// Peers join in round-robin site order, so the join-order ring crosses between sites at every hop.
// Sites are emulated with the in-memory network: fast links inside a site, slow and asymmetric links
// between sites. The command times AllReduce on the join-order ring (naive_seconds), runs
// OptimizeTopology (measure_seconds is its bandwidth measurement), times AllReduce again
// (optimized_seconds), then finds the best ring by exhaustive search over the true link parameters
// (n <= 9), installs it and times AllReduce on it (best_seconds). The last line is JSON.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

func main() {
	peers := flag.Int("peers", 8, "number of peers")
	sites := flag.Int("sites", 3, "number of sites")
	size := flag.Int("size", 16<<20, "AllReduce size in bytes per peer")
	iters := flag.Int("iters", 3, "timed AllReduces per configuration (median)")
	measure := flag.Duration("measure", time.Second, "duration of one bandwidth test")
	seed := flag.Uint64("seed", 1, "seed of the emulated link parameters")
	flag.Parse()
	if *peers < 2 || *sites < 1 || *sites > *peers {
		log.Fatalf("need peers >= 2 and 1 <= sites <= peers")
	}
	if err := run(*peers, *sites, *size, *iters, *measure, *seed); err != nil {
		log.Fatal(err)
	}
}

type link struct {
	bw  float64 // bytes/s
	lat time.Duration
}

func run(n, nsites, size, iters int, measure time.Duration, seed uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	netw := pccl.NewNetwork()
	hosts := make([]string, n)
	siteOf := make([]int, n)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("peer%d", i)
		siteOf[i] = i % nsites
	}
	// Links: 300 MB/s and 0.5 ms inside a site; between sites 20-80 MB/s and 5-30 ms, different in each
	// direction (asymmetric). The in-memory network copies every byte on this machine's two cores, so
	// speeds are scaled down until eight simultaneous tests are not CPU-bound.
	r := rand.New(rand.NewPCG(seed, 99))
	siteBW := make([][]float64, nsites)
	siteLat := make([][]time.Duration, nsites)
	for a := range siteBW {
		siteBW[a] = make([]float64, nsites)
		siteLat[a] = make([]time.Duration, nsites)
		for b := range siteBW[a] {
			siteBW[a][b] = (20 + 60*r.Float64()) * 1e6
			siteLat[a][b] = time.Duration(5+r.IntN(25)) * time.Millisecond
		}
	}
	truth := make([][]link, n)
	for i := range truth {
		truth[i] = make([]link, n)
		for j := range truth[i] {
			if i == j {
				continue
			}
			l := link{bw: 300e6, lat: 500 * time.Microsecond}
			if siteOf[i] != siteOf[j] {
				l = link{bw: siteBW[siteOf[i]][siteOf[j]], lat: siteLat[siteOf[i]][siteOf[j]]}
			}
			truth[i][j] = l
			netw.SetLink(hosts[i], hosts[j], pccl.LinkConfig{Bandwidth: l.bw, Latency: l.lat})
		}
	}

	ln, err := netw.Host("master").Listen("master:7000")
	if err != nil {
		return err
	}
	srv := master.NewServer(master.ServerConfig{Config: master.Config{MeasureDuration: measure, MeasureStreams: 2,
		SolveBudget: 200 * time.Millisecond, ImproveBudget: 5 * time.Second}})
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, ln) }()
	defer func() { stop(); <-served }()

	comms := make([]*pccl.Communicator, n)
	connect := func(i int) (*pccl.Communicator, error) {
		return pccl.Connect(ctx, pccl.Config{Master: "master:7000", ListenAddr: hosts[i] + ":9000",
			Transport: netw.Host(hosts[i]), Site: fmt.Sprintf("site%d", siteOf[i]), PoolSize: 2})
	}
	// Join one at a time so that the ring is in join order.
	if comms[0], err = connect(0); err != nil {
		return err
	}
	for i := 1; i < n; i++ {
		done := make(chan error, 1)
		go func(i int) {
			var err error
			comms[i], err = connect(i)
			done <- err
		}(i)
		for len(srv.Snapshot().Peers) < i+1 {
			time.Sleep(time.Millisecond)
		}
		if err := all(comms[:i], func(c *pccl.Communicator) error { return c.UpdateTopology(ctx) }); err != nil {
			return err
		}
		if err := <-done; err != nil {
			return err
		}
	}
	defer func() {
		for _, c := range comms {
			c.Close()
		}
	}()
	index := map[uint64]int{}
	for i, c := range comms {
		index[c.ID()] = i
	}
	ringIdx := func() []int {
		var out []int
		for _, id := range comms[0].Ring() {
			out = append(out, index[id])
		}
		return out
	}

	// The naive ring is join order; newcomer placement may already have improved on it, so install it.
	joinOrder := make([]uint64, n)
	for i, c := range comms {
		joinOrder[i] = c.ID()
	}
	srv.ForceRing(joinOrder)
	if err := all(comms, func(c *pccl.Communicator) error { return c.OptimizeTopology(ctx) }); err != nil {
		return err
	}
	naiveRing := ringIdx()
	fmt.Fprintf(os.Stderr, "naive ring %v\n", naiveRing)
	naive, err := timeAllReduce(ctx, comms, size, iters)
	if err != nil {
		return err
	}
	t0 := time.Now()
	if err := all(comms, func(c *pccl.Communicator) error { return c.OptimizeTopology(ctx) }); err != nil {
		return err
	}
	optimizeSeconds := time.Since(t0).Seconds()
	measureSeconds := comms[0].LastOptimize().Measure.Seconds()
	optRing := ringIdx()
	// How good were the measurements? Compare with the emulated truth, in ring order of the snapshot.
	snap := srv.Snapshot()
	maxErr := 0.0
	for a, ida := range snap.Ring {
		for b, idb := range snap.Ring {
			if a == b || snap.Bandwidth == nil || snap.Bandwidth[a][b] == 0 {
				continue
			}
			want := truth[index[ida]][index[idb]].bw
			e := math.Abs(snap.Bandwidth[a][b]-want) / want
			maxErr = max(maxErr, e)
			if e > 0.25 {
				fmt.Fprintf(os.Stderr, "link %d->%d measured %.0f MB/s, true %.0f MB/s\n", index[ida], index[idb], snap.Bandwidth[a][b]/1e6, want/1e6)
			}
		}
	}
	fmt.Fprintf(os.Stderr, "optimized ring %v (optimize %.2fs, measure %.2fs)\n", optRing, optimizeSeconds, measureSeconds)
	optimized, err := timeAllReduce(ctx, comms, size, iters)
	if err != nil {
		return err
	}

	out := map[string]any{"peers": n, "sites": nsites, "bytes": size, "iters": iters,
		"naive_seconds": naive, "optimized_seconds": optimized, "measure_seconds": measureSeconds,
		"optimize_seconds": optimizeSeconds, "measure_test_seconds": measure.Seconds(),
		"measure_limit_seconds": float64(n-1) * measure.Seconds() * 1.2,
		"naive_ring":            naiveRing, "optimized_ring": optRing, "measure_max_rel_error": maxErr,
		"naive_crossings": crossings(naiveRing, siteOf), "optimized_crossings": crossings(optRing, siteOf),
		"model_naive_seconds": model(truth, naiveRing, size), "model_optimized_seconds": model(truth, optRing, size)}
	if n <= 9 {
		best := exhaustive(truth)
		out["best_ring"], out["best_crossings"], out["model_best_seconds"] = best, crossings(best, siteOf), model(truth, best, size)
		ids := make([]uint64, n)
		for i, k := range best {
			ids[i] = comms[k].ID()
		}
		srv.ForceRing(ids)
		if err := all(comms, func(c *pccl.Communicator) error { return c.OptimizeTopology(ctx) }); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "best ring %v\n", ringIdx())
		bestSeconds, err := timeAllReduce(ctx, comms, size, iters)
		if err != nil {
			return err
		}
		out["best_seconds"] = bestSeconds
		out["optimized_vs_best"] = optimized / bestSeconds
		out["target_met"] = optimized <= 1.02*bestSeconds && optimized < naive && measureSeconds <= float64(n-1)*measure.Seconds()*1.2
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	return nil
}

func crossings(ring []int, siteOf []int) int {
	c := 0
	for i := range ring {
		if siteOf[ring[i]] != siteOf[ring[(i+1)%len(ring)]] {
			c++
		}
	}
	return c
}

// model estimates a pipelined ring AllReduce from the true links: the data streams at the slowest
// link's pace, after a fill of two laps of one part (transfer plus latency) around the ring.
func model(truth [][]link, ring []int, size int) float64 {
	n := len(ring)
	minBW, fill := math.Inf(1), 0.0
	for i := range ring {
		l := truth[ring[i]][ring[(i+1)%n]]
		minBW = min(minBW, l.bw)
		fill += (1<<20)/l.bw + l.lat.Seconds()
	}
	return 2*float64(n-1)/float64(n)*float64(size)/minBW + 2*fill
}

// exhaustive returns the ring (starting at 0) that is best under the objective the master optimises,
// evaluated on the true link parameters: the largest bottleneck bandwidth, where rings within
// master.RingTolerance of it count as equal, then the smallest fill time.
func exhaustive(truth [][]link) []int {
	n := len(truth)
	var rings [][]int
	rest := make([]int, n-1)
	for i := range rest {
		rest[i] = i + 1
	}
	var perm func(k int)
	perm = func(k int) {
		if k == len(rest) {
			rings = append(rings, append([]int{0}, rest...))
			return
		}
		for i := k; i < len(rest); i++ {
			rest[k], rest[i] = rest[i], rest[k]
			perm(k + 1)
			rest[k], rest[i] = rest[i], rest[k]
		}
	}
	perm(0)
	score := func(ring []int) (bottleneck, fill float64) {
		for i := range ring {
			l := truth[ring[i]][ring[(i+1)%n]]
			bottleneck = max(bottleneck, 1/l.bw)
			fill += (1<<20)/l.bw + l.lat.Seconds()
		}
		return
	}
	bestB := math.Inf(1)
	for _, r := range rings {
		b, _ := score(r)
		bestB = min(bestB, b)
	}
	var best []int
	bestF := math.Inf(1)
	for _, r := range rings {
		if b, f := score(r); b <= bestB*(1+master.RingTolerance) && f < bestF {
			best, bestF = r, f
		}
	}
	return best
}

func all(comms []*pccl.Communicator, f func(*pccl.Communicator) error) error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(c)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("peer %d: %w", i, err)
		}
	}
	return nil
}

// timeAllReduce returns the median time of iters AllReduces (after one warm-up), checking results.
func timeAllReduce(ctx context.Context, comms []*pccl.Communicator, size, iters int) (float64, error) {
	count := size / 4
	bufs := make([][]float32, len(comms))
	var times []float64
	for it := -1; it < iters; it++ {
		for i := range bufs {
			bufs[i] = make([]float32, count)
			for j := range bufs[i] {
				bufs[i][j] = float32(i + 1)
			}
		}
		t0 := time.Now()
		err := all(comms, func(c *pccl.Communicator) error {
			i := slices.Index(comms, c)
			b := pccl.Bytes(bufs[i])
			return c.AllReduce(ctx, b, b, pccl.Desc{Tag: 1, Count: count, DType: pccl.F32, Op: pccl.Sum})
		})
		if err != nil {
			return 0, err
		}
		el := time.Since(t0).Seconds()
		want := float32(len(comms) * (len(comms) + 1) / 2)
		for i := range bufs {
			for j, v := range bufs[i] {
				if v != want {
					return 0, fmt.Errorf("peer %d element %d: %v, want %v", i, j, v, want)
				}
			}
		}
		if it >= 0 {
			times = append(times, el)
		}
	}
	sort.Float64s(times)
	return times[len(times)/2], nil
}
