package atsp

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// fixedClock is a clock that never moves, so budgets never bind.
func fixedClock() time.Time { return time.Unix(1_700_000_000, 0) }

// randomMatrix returns an n x n matrix of integer costs in [0, maxCost] with
// a fraction missing of the off-diagonal edges set to +Inf.
func randomMatrix(rng *rand.Rand, n, maxCost int, missing float64) [][]float64 {
	m := make([][]float64, n)
	for i := range m {
		m[i] = make([]float64, n)
		for j := range m[i] {
			switch {
			case i == j:
				m[i][j] = -7 // the diagonal is ignored, whatever it holds
			case rng.Float64() < missing:
				m[i][j] = math.Inf(1)
			default:
				m[i][j] = float64(rng.IntN(maxCost + 1))
			}
		}
	}
	return m
}

// bruteForce returns the best score under obj over all tours starting at 0,
// and whether any tour has finite total.
func bruteForce(cost [][]float64, obj Objective) (Score, bool) {
	n := len(cost)
	rest := make([]int, 0, n-1)
	for v := 1; v < n; v++ {
		rest = append(rest, v)
	}
	var best Score
	found := false
	var rec func(k int)
	rec = func(k int) {
		if k == len(rest) {
			t := append(Tour{0}, rest...)
			s := Evaluate(cost, t)
			if math.IsInf(s.Total, 1) {
				return
			}
			if !found || s.Better(best, obj) {
				best, found = s, true
			}
			return
		}
		for i := k; i < len(rest); i++ {
			rest[k], rest[i] = rest[i], rest[k]
			rec(k + 1)
			rest[k], rest[i] = rest[i], rest[k]
		}
	}
	rec(0)
	return best, found
}

// same reports whether two scores are equally good under obj.
func same(a, b Score, obj Objective) bool {
	return !a.Better(b, obj) && !b.Better(a, obj)
}

// checkTour fails the test unless t is a permutation of 0..n-1 starting at 0
// whose score under cost is s.
func checkTour(t *testing.T, cost [][]float64, tour Tour, s Score) {
	t.Helper()
	if !isPermutation(tour, len(cost)) {
		t.Fatalf("tour %v is not a permutation of 0..%d", tour, len(cost)-1)
	}
	if tour[0] != 0 {
		t.Fatalf("tour %v does not start at node 0", tour)
	}
	if got := Evaluate(cost, tour); got != s {
		t.Fatalf("reported score %+v, Evaluate gives %+v", s, got)
	}
}

func TestEvaluate(t *testing.T) {
	cost := [][]float64{
		{0, 1, 9},
		{4, 0, 2},
		{3, 8, 0},
	}
	if got, want := Evaluate(cost, Tour{0, 1, 2}), (Score{Bottleneck: 3, Total: 6}); got != want {
		t.Fatalf("Evaluate(0 1 2) = %+v, want %+v", got, want)
	}
	if got, want := Evaluate(cost, Tour{0, 2, 1}), (Score{Bottleneck: 9, Total: 21}); got != want {
		t.Fatalf("Evaluate(0 2 1) = %+v, want %+v", got, want)
	}
	if got := Evaluate(cost, Tour{0}); got != (Score{}) {
		t.Fatalf("Evaluate of one node = %+v, want zero", got)
	}
}

func TestScoreBetter(t *testing.T) {
	tests := []struct {
		s, o           Score
		bottle, totalO bool
	}{
		{Score{1, 10}, Score{2, 5}, true, false},
		{Score{2, 5}, Score{1, 10}, false, true},
		{Score{2, 5}, Score{2, 6}, true, true},
		{Score{2, 6}, Score{2, 6}, false, false},
		{Score{3, 6}, Score{2, 6}, false, false},
		{Score{math.Inf(1), math.Inf(1)}, Score{math.Inf(1), math.Inf(1)}, false, false},
	}
	for _, tt := range tests {
		if got := tt.s.Better(tt.o, Bottleneck); got != tt.bottle {
			t.Errorf("%+v.Better(%+v, Bottleneck) = %v, want %v", tt.s, tt.o, got, tt.bottle)
		}
		if got := tt.s.Better(tt.o, Total); got != tt.totalO {
			t.Errorf("%+v.Better(%+v, Total) = %v, want %v", tt.s, tt.o, got, tt.totalO)
		}
	}
}

func TestExactMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 120; trial++ {
		n := 2 + trial%7 // 2..8
		missing := 0.0
		if trial%3 == 2 {
			missing = 0.35
		}
		cost := randomMatrix(rng, n, 20, missing)
		for _, obj := range []Objective{Bottleneck, Total} {
			want, ok := bruteForce(cost, obj)
			tour, got, err := Solve(cost, Options{Objective: obj, Now: fixedClock})
			if !ok {
				if !errors.Is(err, ErrNoTour) {
					t.Fatalf("trial %d n=%d %v: err %v, want ErrNoTour", trial, n, obj, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("trial %d n=%d %v: %v", trial, n, obj, err)
			}
			checkTour(t, cost, tour, got)
			if !same(got, want, obj) {
				t.Fatalf("trial %d n=%d %v: score %+v, brute force %+v", trial, n, obj, got, want)
			}
		}
	}
}

func TestExactMatchesBruteForceSlow(t *testing.T) {
	if testing.Short() {
		t.Skip("brute force over 9 nodes")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 4; trial++ {
		cost := randomMatrix(rng, 9, 50, 0)
		for _, obj := range []Objective{Bottleneck, Total} {
			want, _ := bruteForce(cost, obj)
			tour, got, err := Solve(cost, Options{Objective: obj, Now: fixedClock})
			if err != nil {
				t.Fatal(err)
			}
			checkTour(t, cost, tour, got)
			if !same(got, want, obj) {
				t.Fatalf("trial %d %v: score %+v, brute force %+v", trial, obj, got, want)
			}
		}
	}
}

// plantedCycle returns a matrix whose edges along a random Hamiltonian cycle
// cost 1 and whose other edges cost between 2 and 100, except for a few
// cheap decoy edges of cost 0 that lie on no Hamiltonian cycle of cost-1
// edges alone.
func plantedCycle(rng *rand.Rand, n int) ([][]float64, []int) {
	perm := rng.Perm(n)
	cost := randomMatrix(rng, n, 98, 0)
	for i := range cost {
		for j := range cost[i] {
			if i != j {
				cost[i][j] += 2
			}
		}
	}
	for k := range perm {
		cost[perm[k]][perm[(k+1)%n]] = 1
	}
	return cost, perm
}

func TestBottleneckPlanted(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, tc := range []struct {
		n        int
		exactMax int
	}{{12, 0}, {17, 0}, {40, 0}, {90, 0}, {14, -1}} {
		cost, _ := plantedCycle(rng, tc.n)
		opt := Options{Objective: Bottleneck, ExactMax: tc.exactMax, Iterations: 200, Now: fixedClock}
		tour, s, err := Solve(cost, opt)
		if err != nil {
			t.Fatalf("n=%d: %v", tc.n, err)
		}
		checkTour(t, cost, tour, s)
		if want := (Score{Bottleneck: 1, Total: float64(tc.n)}); s != want {
			t.Fatalf("n=%d exactMax=%d: score %+v, want %+v", tc.n, tc.exactMax, s, want)
		}
	}
}

func TestBottleneckBeatsTotal(t *testing.T) {
	// The cheapest tour 0 1 2 3 uses one expensive edge; the bottleneck tour
	// avoids it at a higher total.
	cost := [][]float64{
		{0, 1, 5, 5},
		{5, 0, 1, 6},
		{5, 5, 0, 10},
		{1, 6, 6, 0},
	}
	tour, s, err := Solve(cost, Options{Objective: Total})
	if err != nil {
		t.Fatal(err)
	}
	if want := (Tour{0, 1, 2, 3}); !slices.Equal(tour, want) || s != (Score{Bottleneck: 10, Total: 13}) {
		t.Fatalf("Total: tour %v score %+v, want %v {10 13}", tour, s, want)
	}
	tour, s, err = Solve(cost, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (Score{Bottleneck: 6, Total: 17}); s != want {
		t.Fatalf("Bottleneck: tour %v score %+v, want %+v", tour, s, want)
	}
	checkTour(t, cost, tour, s)
}

func TestHeuristicValidTours(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, n := range []int{8, 9, 20, 57} {
		for _, missing := range []float64{0, 0.5} {
			cost := randomMatrix(rng, n, 1000, missing)
			// Keep one Hamiltonian cycle of finite edges.
			perm := rng.Perm(n)
			for k := range perm {
				cost[perm[k]][perm[(k+1)%n]] = float64(rng.IntN(1000))
			}
			for _, obj := range []Objective{Bottleneck, Total} {
				opt := Options{Objective: obj, ExactMax: -1, Iterations: 60, Now: fixedClock, Seed: int64(n)}
				tour, s, err := Solve(cost, opt)
				if err != nil {
					t.Fatalf("n=%d missing=%v %v: %v", n, missing, obj, err)
				}
				checkTour(t, cost, tour, s)
				if math.IsInf(s.Total, 1) {
					t.Fatalf("n=%d: tour uses a missing edge", n)
				}
			}
		}
	}
}

func TestHeuristicFindsSmallOptima(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for trial := 0; trial < 6; trial++ {
		n := 10 + trial%4
		cost := randomMatrix(rng, n, 100, 0)
		for _, obj := range []Objective{Bottleneck, Total} {
			exactTour, want, err := Solve(cost, Options{Objective: obj, Now: fixedClock})
			if err != nil {
				t.Fatal(err)
			}
			checkTour(t, cost, exactTour, want)
			tour, got, err := Solve(cost, Options{Objective: obj, ExactMax: -1, Iterations: 300, Now: fixedClock})
			if err != nil {
				t.Fatal(err)
			}
			checkTour(t, cost, tour, got)
			if !same(got, want, obj) {
				t.Fatalf("trial %d n=%d %v: heuristic %+v, exact %+v", trial, n, obj, got, want)
			}
		}
	}
}

func TestDeterministicForSeed(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	cost := randomMatrix(rng, 60, 1000, 0.1)
	for _, obj := range []Objective{Bottleneck, Total} {
		opt := Options{Objective: obj, Seed: 42, Iterations: 150, Now: fixedClock}
		t1, s1, err := Solve(cost, opt)
		if err != nil {
			t.Fatal(err)
		}
		t2, s2, err := Solve(cost, opt)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(t1, t2) || s1 != s2 {
			t.Fatalf("%v: same seed gave %v %+v and %v %+v", obj, t1, s1, t2, s2)
		}
	}
}

func TestBudgetFallsBackToHeuristic(t *testing.T) {
	// Every reading of this clock is an hour after the previous one, so the
	// exact search is aborted at its first check.
	now := fixedClock()
	clock := func() time.Time { now = now.Add(time.Hour); return now }
	rng := rand.New(rand.NewPCG(13, 14))
	cost := randomMatrix(rng, 17, 100, 0)
	for _, obj := range []Objective{Bottleneck, Total} {
		tour, s, err := Solve(cost, Options{Objective: obj, Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		checkTour(t, cost, tour, s)
	}
}

func TestSolveErrors(t *testing.T) {
	inf := math.Inf(1)
	tests := []struct {
		name string
		cost [][]float64
		want error
	}{
		{"empty", nil, ErrEmpty},
		{"ragged", [][]float64{{0, 1}, {1}}, ErrNotSquare},
		{"negative", [][]float64{{0, -1}, {1, 0}}, ErrInvalidCost},
		{"nan", [][]float64{{0, math.NaN()}, {1, 0}}, ErrInvalidCost},
		{"no out edge", [][]float64{{0, inf, inf}, {1, 0, 1}, {1, 1, 0}}, ErrNoTour},
		{"two 2-cycles", [][]float64{
			{0, 1, inf, inf},
			{1, 0, inf, inf},
			{inf, inf, 0, 1},
			{inf, inf, 1, 0},
		}, ErrNoTour},
	}
	for _, tt := range tests {
		for _, obj := range []Objective{Bottleneck, Total} {
			if _, _, err := Solve(tt.cost, Options{Objective: obj}); !errors.Is(err, tt.want) {
				t.Errorf("%s %v: err %v, want %v", tt.name, obj, err, tt.want)
			}
		}
	}
}

func TestSolveTiny(t *testing.T) {
	tour, s, err := Solve([][]float64{{5}}, Options{})
	if err != nil || !slices.Equal(tour, Tour{0}) || s != (Score{}) {
		t.Fatalf("n=1: %v %+v %v", tour, s, err)
	}
	tour, s, err = Solve([][]float64{{0, 2}, {3, 0}}, Options{})
	if err != nil || !slices.Equal(tour, Tour{0, 1}) || s != (Score{Bottleneck: 3, Total: 5}) {
		t.Fatalf("n=2: %v %+v %v", tour, s, err)
	}
}

func TestBottleneckLowerBound(t *testing.T) {
	inf := math.Inf(1)
	// Every node has a cost-1 edge in and out, but the cost-1 edges form two
	// 2-cycles; joining them needs the cost-5 edges.
	cost := [][]float64{
		{0, 1, 5, 9},
		{1, 0, 9, 9},
		{9, 9, 0, 1},
		{5, 9, 1, 0},
	}
	if got := BottleneckLowerBound(cost); got != 5 {
		t.Fatalf("two 2-cycles: bound %v, want 5", got)
	}
	cost[3][0], cost[0][2] = inf, inf
	if got := BottleneckLowerBound(cost); got != 9 {
		t.Fatalf("bound %v, want 9", got)
	}
	if got := BottleneckLowerBound([][]float64{{0, inf}, {1, 0}}); !math.IsInf(got, 1) {
		t.Fatalf("no edge 0->1: bound %v, want +Inf", got)
	}
	rng := rand.New(rand.NewPCG(15, 16))
	for trial := 0; trial < 50; trial++ {
		cost := randomMatrix(rng, 2+trial%7, 30, 0.2)
		want, ok := bruteForce(cost, Bottleneck)
		if got := BottleneckLowerBound(cost); ok && got > want.Bottleneck {
			t.Fatalf("trial %d: bound %v above the optimum %v", trial, got, want.Bottleneck)
		}
	}
}
