package atsp

import (
	"math"
	"math/rand/v2"
	"sort"
	"time"
)

// nnStarts is how many nearest-neighbour tours the construction tries.
const nnStarts = 8

// construct returns the cheapest of several nearest-neighbour tours and the
// greedy-edge tour under ws.
func construct(ws *weights, rng *rand.Rand) []int {
	n := ws.n
	best := greedyEdge(ws)
	bestW := tourWeight(ws, best)
	for k := 0; k < min(n, nnStarts); k++ {
		start := 0
		if k > 0 {
			start = rng.IntN(n)
		}
		t := nearestNeighbour(ws, start)
		if w := tourWeight(ws, t); w < bestW {
			best, bestW = t, w
		}
	}
	return best
}

func tourWeight(ws *weights, t []int) float64 {
	total := 0.0
	for k, v := range t {
		next := t[0]
		if k+1 < len(t) {
			next = t[k+1]
		}
		total += ws.w[v*ws.n+next]
	}
	return total
}

// nearestNeighbour walks from start to the cheapest unvisited successor
// until every node is visited.
func nearestNeighbour(ws *weights, start int) []int {
	n := ws.n
	seen := make([]bool, n)
	t := make([]int, 0, n)
	v := start
	for {
		t = append(t, v)
		seen[v] = true
		if len(t) == n {
			return t
		}
		next, nw := -1, math.Inf(1)
		row := ws.w[v*n : v*n+n]
		for j, c := range row {
			if !seen[j] && c < nw {
				next, nw = j, c
			}
		}
		v = next
	}
}

// greedyEdge adds arcs in order of weight whenever they keep every node at
// in- and out-degree at most one and close no cycle, then closes the single
// remaining path.
func greedyEdge(ws *weights) []int {
	n := ws.n
	type arc struct {
		w    float64
		i, j int32
	}
	arcs := make([]arc, 0, n*(n-1))
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			if i != j {
				arcs = append(arcs, arc{ws.w[i*n+j], int32(i), int32(j)})
			}
		}
	}
	sort.Slice(arcs, func(a, b int) bool {
		if arcs[a].w != arcs[b].w {
			return arcs[a].w < arcs[b].w
		}
		if arcs[a].i != arcs[b].i {
			return arcs[a].i < arcs[b].i
		}
		return arcs[a].j < arcs[b].j
	})
	next := make([]int, n)
	hasIn := make([]bool, n)
	parent := make([]int, n)
	for i := range next {
		next[i] = -1
		parent[i] = i
	}
	find := func(x int) int {
		for parent[x] != x {
			parent[x] = parent[parent[x]]
			x = parent[x]
		}
		return x
	}
	added := 0
	for _, a := range arcs {
		if added == n-1 {
			break
		}
		i, j := int(a.i), int(a.j)
		if next[i] >= 0 || hasIn[j] {
			continue
		}
		ri, rj := find(i), find(j)
		if ri == rj {
			continue
		}
		next[i] = j
		hasIn[j] = true
		parent[ri] = rj
		added++
	}
	head := 0
	for v := 0; v < n; v++ {
		if !hasIn[v] {
			head = v
			break
		}
	}
	t := make([]int, 0, n)
	for v := head; v >= 0; v = next[v] {
		t = append(t, v)
	}
	return t
}

// solveHeuristic runs the iterated local search for opt.Objective until
// expired reports true (or the iteration caps are reached) and returns the
// best tour, normalised.
func solveHeuristic(cost [][]float64, opt Options, deadline time.Time, expired func() bool) Tour {
	rng := newRand(opt.Seed)
	ws := newWeights(cost, math.Inf(1))
	start := construct(ws, rng)
	if opt.Objective == Total {
		s := newSearch(ws, start, rng, expired)
		s.optimise()
		s.run(opt.Iterations, nil, nil)
		return normalise(append([]int(nil), s.best...))
	}

	// Bottleneck: a quarter of the budget for a good total tour, most of the
	// rest for a binary search over thresholds below its bottleneck, and the
	// remainder to polish the total inside the best threshold found.
	until := func(end time.Time) func() bool {
		return func() bool { return expired() || opt.now().After(end) }
	}
	share := func(frac float64) time.Time {
		left := deadline.Sub(opt.now())
		return opt.now().Add(time.Duration(float64(left) * frac))
	}
	s := newSearch(ws, start, rng, until(share(0.25)))
	s.optimise()
	s.run(opt.Iterations, nil, nil)
	best := append([]int(nil), s.best...)
	bn := Evaluate(cost, best).Bottleneck
	if math.IsInf(bn, 1) {
		return normalise(best)
	}
	vals := distinctCosts(cost)
	lo := sort.SearchFloat64s(vals, bottleneckLowerBound(cost))
	hi := sort.SearchFloat64s(vals, bn)
	for lo < hi && !expired() {
		probes := 1
		for span := hi - lo; span > 0; span >>= 1 {
			probes++
		}
		mid := lo + (hi-lo)/2
		pw := newWeights(cost, vals[mid])
		p := newSearch(pw, best, rng, until(share(0.8/float64(probes))))
		feasible := func(w float64) bool { return w < pw.over }
		p.optimise()
		p.run(opt.Iterations, feasible, nil)
		if feasible(p.bestW) {
			copy(best, p.best)
			hi = sort.SearchFloat64s(vals, Evaluate(cost, best).Bottleneck)
		} else {
			lo = mid + 1
		}
	}
	fw := newWeights(cost, vals[hi])
	f := newSearch(fw, best, rng, expired)
	f.optimise()
	f.run(opt.Iterations, nil, nil)
	return normalise(append([]int(nil), f.best...))
}
