package atsp

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
)

// smallEnumerate is the node count up to which the exact solver is always
// used, whatever Options.ExactMax says: the local search needs room for its
// moves.
const smallEnumerate = 7

// errAborted reports that an exact computation was stopped before it ended.
var errAborted = errors.New("atsp: exact search aborted")

// stopEvery is how many subsets the dynamic programmes visit between two
// calls of their stop function.
const stopEvery = 1 << 11

// solveExact solves cost exactly for obj. stop is polled during the dynamic
// programmes; when it returns true the search returns errAborted.
func solveExact(cost [][]float64, obj Objective, stop func() bool) (Tour, error) {
	n := len(cost)
	if n == 1 {
		return Tour{0}, nil
	}
	limit := math.Inf(1)
	if obj == Bottleneck {
		t, err := exactBottleneck(cost, stop)
		if err != nil {
			return nil, err
		}
		limit = t
	}
	t, err := heldKarp(cost, limit, stop)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// exactBottleneck returns the smallest edge cost T such that the edges of
// cost at most T contain a Hamiltonian cycle.
func exactBottleneck(cost [][]float64, stop func() bool) (float64, error) {
	vals := distinctCosts(cost)
	lb := bottleneckLowerBound(cost)
	lo := sort.SearchFloat64s(vals, lb)
	hi := len(vals) - 1
	if hi < 0 || lo > hi {
		return 0, ErrNoTour
	}
	ok, err := hamiltonian(cost, vals[hi], stop)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, ErrNoTour
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		ok, err := hamiltonian(cost, vals[mid], stop)
		if err != nil {
			return 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return vals[hi], nil
}

// hamiltonian reports whether the edges of cost that cost at most limit
// contain a Hamiltonian cycle. reach[mask] holds, as a bit set, the nodes
// at which a path from node 0 through exactly the nodes of mask can end;
// node k+1 is bit k. n must be at most 32.
func hamiltonian(cost [][]float64, limit float64, stop func() bool) (bool, error) {
	n := len(cost)
	m := n - 1
	ok := func(i, j int) bool { return i != j && cost[i][j] <= limit }
	in := make([]uint32, m) // in[k]: predecessors j of node k+1 among 1..n-1
	var closing uint32      // nodes j+1 with an edge back to node 0
	for k := 0; k < m; k++ {
		for j := 0; j < m; j++ {
			if ok(j+1, k+1) {
				in[k] |= 1 << j
			}
		}
		if ok(k+1, 0) {
			closing |= 1 << k
		}
	}
	full := uint32(1)<<m - 1
	reach := make([]uint32, full+1)
	for k := 0; k < m; k++ {
		if ok(0, k+1) {
			reach[1<<k] = 1 << k
		}
	}
	for mask := uint32(1); mask <= full; mask++ {
		if mask%stopEvery == 0 && stop() {
			return false, errAborted
		}
		r := reach[mask]
		if r == 0 {
			continue
		}
		for rest := full &^ mask; rest != 0; rest &= rest - 1 {
			k := bits.TrailingZeros32(rest)
			if in[k]&r != 0 {
				reach[mask|1<<k] |= 1 << k
			}
		}
	}
	return reach[full]&closing != 0, nil
}

// heldKarp returns a tour of minimum total cost among those whose every edge
// costs at most limit, by the Held-Karp dynamic programme over subsets of
// the nodes 1..n-1. dp[mask*m+j] is the cheapest path from node 0 through
// exactly mask that ends at node j+1.
func heldKarp(cost [][]float64, limit float64, stop func() bool) (Tour, error) {
	n := len(cost)
	m := n - 1
	inf := math.Inf(1)
	w := func(i, j int) float64 {
		c := cost[i][j]
		if c > limit {
			return inf
		}
		return c
	}
	full := 1<<m - 1
	dp := make([]float64, (full+1)*m)
	for i := range dp {
		dp[i] = inf
	}
	for j := 0; j < m; j++ {
		dp[(1<<j)*m+j] = w(0, j+1)
	}
	for mask := 1; mask <= full; mask++ {
		if mask%stopEvery == 0 && stop() {
			return nil, errAborted
		}
		row := dp[mask*m : mask*m+m]
		for set := mask; set != 0; set &= set - 1 {
			j := bits.TrailingZeros(uint(set))
			v := row[j]
			if math.IsInf(v, 1) {
				continue
			}
			cj := cost[j+1]
			for rest := full &^ mask; rest != 0; rest &= rest - 1 {
				k := bits.TrailingZeros(uint(rest))
				c := cj[k+1]
				if c > limit {
					continue
				}
				idx := (mask|1<<k)*m + k
				if nv := v + c; nv < dp[idx] {
					dp[idx] = nv
				}
			}
		}
	}
	best, last := inf, -1
	for j := 0; j < m; j++ {
		if v := dp[full*m+j] + w(j+1, 0); v < best {
			best, last = v, j
		}
	}
	if last < 0 {
		return nil, fmt.Errorf("%w: exact search over %d nodes", ErrNoTour, n)
	}
	// Walk back: the predecessor is any node whose path value plus the edge
	// reproduces the stored value bit for bit.
	rev := make([]int, 0, n)
	mask, j := full, last
	for {
		rev = append(rev, j+1)
		prev := mask &^ (1 << j)
		if prev == 0 {
			break
		}
		target := dp[mask*m+j]
		found := -1
		for set := prev; set != 0; set &= set - 1 {
			i := bits.TrailingZeros(uint(set))
			if dp[prev*m+i]+w(i+1, j+1) == target {
				found = i
				break
			}
		}
		if found < 0 {
			return nil, fmt.Errorf("atsp: held-karp walk-back lost the path at %d nodes", bits.OnesCount(uint(mask)))
		}
		mask, j = prev, found
	}
	t := make(Tour, 0, n)
	t = append(t, 0)
	for k := len(rev) - 1; k >= 0; k-- {
		t = append(t, rev[k])
	}
	return t, nil
}
