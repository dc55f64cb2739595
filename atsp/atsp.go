package atsp

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"
)

// Objective selects what Solve and Improve minimise.
type Objective uint8

const (
	// Bottleneck minimises the largest edge cost of the tour, then the sum of
	// the edge costs. It is the zero value and the default.
	Bottleneck Objective = iota
	// Total minimises the sum of the edge costs only.
	Total
)

// String returns the name of the objective.
func (o Objective) String() string {
	switch o {
	case Bottleneck:
		return "bottleneck"
	case Total:
		return "total"
	default:
		return fmt.Sprintf("Objective(%d)", uint8(o))
	}
}

const (
	defaultBudget   = time.Second
	defaultExactMax = 17
	// maxExact caps Options.ExactMax: Held-Karp at 20 nodes needs about 80 MB.
	maxExact = 20
)

// Options configures Solve and Improve. The zero value works: Bottleneck
// objective, a one-second budget, seed 0, exact solving up to 17 nodes and
// the system clock.
type Options struct {
	// Objective is what to minimise; the zero value is Bottleneck.
	Objective Objective
	// Budget is the wall-clock time Solve may spend. Zero means one second.
	// Improve ignores it and runs until its context ends.
	Budget time.Duration
	// Seed makes the heuristic search deterministic: the same matrix, seed and
	// options give the same tour whenever the budget does not cut the search
	// short (see Iterations).
	Seed int64
	// ExactMax is the largest node count solved exactly. Zero means 17, a
	// negative value disables exact solving, and values above 20 are treated
	// as 20 because the dynamic programme's memory doubles with every node.
	ExactMax int
	// Iterations, when positive, caps the number of perturbation steps of each
	// heuristic search phase, so that the result does not depend on the clock
	// as long as the budget is not exhausted first. Zero means no cap: the
	// search runs until the budget (Solve) or the context (Improve) ends.
	Iterations int
	// Now is the clock used to enforce Budget. Nil means time.Now.
	Now func() time.Time
}

func (o Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

func (o Options) budget() time.Duration {
	if o.Budget <= 0 {
		return defaultBudget
	}
	return o.Budget
}

func (o Options) exactMax() int {
	switch {
	case o.ExactMax == 0:
		return defaultExactMax
	case o.ExactMax > maxExact:
		return maxExact
	default:
		return o.ExactMax
	}
}

// Tour is a cyclic order of the nodes 0..n-1, rotated so that it starts at
// node 0. The edge from the last node back to the first is part of the tour.
type Tour []int

// Score is the quality of a tour: its largest edge cost and its total cost.
type Score struct {
	// Bottleneck is the largest edge cost of the tour.
	Bottleneck float64
	// Total is the sum of the edge costs of the tour.
	Total float64
}

// Better reports whether s is strictly better than o under obj. For
// Bottleneck the comparison is lexicographic on (Bottleneck, Total); for
// Total only the totals are compared.
func (s Score) Better(o Score, obj Objective) bool {
	if obj == Total {
		return s.Total < o.Total
	}
	if s.Bottleneck != o.Bottleneck {
		return s.Bottleneck < o.Bottleneck
	}
	return s.Total < o.Total
}

// Result is one tour reported by Improve.
type Result struct {
	// Tour is the improved tour, starting at node 0. The receiver owns it.
	Tour Tour
	// Score is the tour's score under the cost matrix given to Improve.
	Score Score
}

// Errors returned by this package. Callers branch on them with errors.Is.
var (
	// ErrNotSquare means the cost matrix has a row whose length differs from
	// the number of rows.
	ErrNotSquare = errors.New("atsp: cost matrix is not square")
	// ErrEmpty means the cost matrix has no nodes.
	ErrEmpty = errors.New("atsp: cost matrix is empty")
	// ErrInvalidCost means an off-diagonal cost is negative, NaN or -Inf.
	ErrInvalidCost = errors.New("atsp: invalid edge cost")
	// ErrNoTour means no Hamiltonian cycle of finite edges exists (proved for
	// exact sizes), or none was found (heuristic sizes).
	ErrNoTour = errors.New("atsp: no Hamiltonian cycle of finite edges")
	// ErrFormat means a TSPLIB file could not be parsed.
	ErrFormat = errors.New("atsp: malformed TSPLIB file")
)

// Evaluate returns the score of tour t under cost. The diagonal is never
// read. t must be a permutation of 0..len(cost)-1; Evaluate panics on an
// index out of range. A single-node tour has score zero.
func Evaluate(cost [][]float64, t Tour) Score {
	var s Score
	if len(t) < 2 {
		return s
	}
	for k, from := range t {
		to := t[0]
		if k+1 < len(t) {
			to = t[k+1]
		}
		c := cost[from][to]
		s.Total += c
		if k == 0 || c > s.Bottleneck {
			s.Bottleneck = c
		}
	}
	return s
}

// validate checks the shape and the off-diagonal values of cost.
func validate(cost [][]float64) error {
	n := len(cost)
	if n == 0 {
		return ErrEmpty
	}
	for i, row := range cost {
		if len(row) != n {
			return fmt.Errorf("%w: row %d has %d entries, want %d", ErrNotSquare, i, len(row), n)
		}
		for j, c := range row {
			if i != j && (math.IsNaN(c) || c < 0) {
				return fmt.Errorf("%w: cost[%d][%d] = %v", ErrInvalidCost, i, j, c)
			}
		}
	}
	return nil
}

// degreeCheck returns ErrNoTour when some node has no finite outgoing or no
// finite incoming edge, which rules out every Hamiltonian cycle.
func degreeCheck(cost [][]float64) error {
	n := len(cost)
	for i := 0; i < n; i++ {
		out, in := false, false
		for j := 0; j < n; j++ {
			if i == j {
				continue
			}
			out = out || !math.IsInf(cost[i][j], 1)
			in = in || !math.IsInf(cost[j][i], 1)
		}
		if !out || !in {
			return fmt.Errorf("%w: node %d has no finite outgoing or incoming edge", ErrNoTour, i)
		}
	}
	return nil
}

// Solve returns a tour through every node of cost, its score and an error.
// Instances with at most Options.ExactMax nodes are solved exactly unless
// the budget runs out, in which case Solve falls back to the heuristic.
// Larger instances are solved by iterated local search until the budget ends
// (or Options.Iterations steps are done). Errors: ErrEmpty, ErrNotSquare,
// ErrInvalidCost and ErrNoTour.
func Solve(cost [][]float64, opt Options) (Tour, Score, error) {
	if err := validate(cost); err != nil {
		return nil, Score{}, err
	}
	n := len(cost)
	if n == 1 {
		return Tour{0}, Score{}, nil
	}
	if err := degreeCheck(cost); err != nil {
		return nil, Score{}, err
	}
	deadline := opt.now().Add(opt.budget())
	expired := func() bool { return opt.now().After(deadline) }
	if n <= opt.exactMax() || n <= smallEnumerate {
		t, err := solveExact(cost, opt.Objective, expired)
		switch {
		case err == nil:
			return t, Evaluate(cost, t), nil
		case !errors.Is(err, errAborted):
			return nil, Score{}, err
		}
		// The budget ran out: a short heuristic run still gives a good tour.
		opt.Iterations = 1
		expired = func() bool { return false }
	}
	t := solveHeuristic(cost, opt, deadline, expired)
	s := Evaluate(cost, t)
	if math.IsInf(s.Total, 1) {
		return nil, Score{}, fmt.Errorf("%w: heuristic search found none", ErrNoTour)
	}
	return t, s, nil
}

// normalise rotates t in place so that its smallest node comes first and
// returns it.
func normalise(t []int) []int {
	if len(t) == 0 {
		return t
	}
	k := 0
	for i, v := range t {
		if v < t[k] {
			k = i
		}
	}
	rotated := make([]int, 0, len(t))
	rotated = append(rotated, t[k:]...)
	rotated = append(rotated, t[:k]...)
	copy(t, rotated)
	return t
}

// distinctCosts returns the sorted distinct finite off-diagonal costs.
func distinctCosts(cost [][]float64) []float64 {
	n := len(cost)
	vals := make([]float64, 0, n*(n-1))
	for i := range cost {
		for j, c := range cost[i] {
			if i != j && !math.IsInf(c, 1) {
				vals = append(vals, c)
			}
		}
	}
	sort.Float64s(vals)
	out := vals[:0]
	for i, v := range vals {
		if i == 0 || v != out[len(out)-1] {
			out = append(out, v)
		}
	}
	return out
}

// BottleneckLowerBound returns a lower bound on the bottleneck of every
// tour of cost: the smallest edge cost T such that the edges costing at most
// T give every node an outgoing and an incoming edge and connect all nodes
// strongly. It returns +Inf when even the finite edges do not, and 0 for a
// single node. cost must be square; the diagonal is ignored.
func BottleneckLowerBound(cost [][]float64) float64 {
	return bottleneckLowerBound(cost)
}

func bottleneckLowerBound(cost [][]float64) float64 {
	n := len(cost)
	if n < 2 {
		return 0
	}
	lb := math.Inf(-1)
	for i := 0; i < n; i++ {
		out, in := math.Inf(1), math.Inf(1)
		for j := 0; j < n; j++ {
			if i != j {
				out = math.Min(out, cost[i][j])
				in = math.Min(in, cost[j][i])
			}
		}
		lb = math.Max(lb, math.Max(out, in))
	}
	if math.IsInf(lb, 1) {
		return lb
	}
	vals := distinctCosts(cost)
	lo, hi := sort.SearchFloat64s(vals, lb), len(vals)-1
	if !stronglyConnected(cost, vals[hi]) {
		return math.Inf(1)
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		if stronglyConnected(cost, vals[mid]) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return vals[hi]
}

// stronglyConnected reports whether the edges of cost at most limit connect
// every node to node 0 and node 0 to every node.
func stronglyConnected(cost [][]float64, limit float64) bool {
	n := len(cost)
	seen := make([]bool, n)
	stack := make([]int, 0, n)
	for _, forward := range []bool{true, false} {
		clear(seen)
		seen[0] = true
		stack = append(stack[:0], 0)
		count := 1
		for len(stack) > 0 {
			u := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for v := 0; v < n; v++ {
				c := cost[u][v]
				if !forward {
					c = cost[v][u]
				}
				if v != u && !seen[v] && c <= limit {
					seen[v] = true
					count++
					stack = append(stack, v)
				}
			}
		}
		if count != n {
			return false
		}
	}
	return true
}

// newRand returns the deterministic generator for a seed.
func newRand(seed int64) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15))
}
