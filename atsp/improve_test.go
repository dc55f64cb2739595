package atsp

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"go.uber.org/goleak"
)

// collect drains ch and checks that every result is a valid tour whose
// score is strictly better than the previous one (the first one than
// start's).
func collect(t *testing.T, cost [][]float64, start Tour, obj Objective, ch <-chan Result) []Result {
	t.Helper()
	prev := Evaluate(cost, start)
	var out []Result
	for r := range ch {
		checkTour(t, cost, r.Tour, r.Score)
		if !r.Score.Better(prev, obj) {
			t.Fatalf("result %d %+v is not strictly better than %+v", len(out), r.Score, prev)
		}
		prev = r.Score
		out = append(out, r)
	}
	return out
}

func identity(n int) Tour {
	t := make(Tour, n)
	for i := range t {
		t[i] = i
	}
	return t
}

func TestImproveReportsStrictlyBetterAndCloses(t *testing.T) {
	defer goleak.VerifyNone(t)
	rng := rand.New(rand.NewPCG(21, 22))
	for _, n := range []int{30, 64} {
		cost := randomMatrix(rng, n, 1000, 0)
		for _, obj := range []Objective{Bottleneck, Total} {
			start := identity(n)
			opt := Options{Objective: obj, Iterations: 300, Seed: 3}
			res := collect(t, cost, start, obj, Improve(context.Background(), cost, start, opt))
			if len(res) == 0 {
				t.Fatalf("n=%d %v: no improvement over the identity tour", n, obj)
			}
		}
	}
}

func TestImproveExactSizeReachesOptimum(t *testing.T) {
	defer goleak.VerifyNone(t)
	rng := rand.New(rand.NewPCG(23, 24))
	cost := randomMatrix(rng, 11, 100, 0)
	for _, obj := range []Objective{Bottleneck, Total} {
		_, want, err := Solve(cost, Options{Objective: obj, Now: fixedClock})
		if err != nil {
			t.Fatal(err)
		}
		start := identity(11)
		res := collect(t, cost, start, obj, Improve(context.Background(), cost, start, Options{Objective: obj}))
		if same(Evaluate(cost, start), want, obj) {
			if len(res) != 0 {
				t.Fatalf("%v: start is optimal, got %d results", obj, len(res))
			}
			continue
		}
		if len(res) != 1 || !same(res[0].Score, want, obj) {
			t.Fatalf("%v: results %+v, want one with %+v", obj, res, want)
		}
	}
}

func TestImproveStopsOnCancel(t *testing.T) {
	defer goleak.VerifyNone(t)
	rng := rand.New(rand.NewPCG(25, 26))
	cost := randomMatrix(rng, 80, 1000, 0)
	for _, obj := range []Objective{Bottleneck, Total} {
		ctx, cancel := context.WithCancel(context.Background())
		ch := Improve(ctx, cost, identity(80), Options{Objective: obj})
		// Take the first result, then walk away without draining.
		if _, ok := <-ch; !ok {
			t.Fatalf("%v: channel closed before any result", obj)
		}
		cancel()
		for range ch {
		}
	}
}

func TestImproveAbandonedReceiver(t *testing.T) {
	defer goleak.VerifyNone(t)
	rng := rand.New(rand.NewPCG(27, 28))
	cost := randomMatrix(rng, 40, 1000, 0)
	ctx, cancel := context.WithCancel(context.Background())
	ch := Improve(ctx, cost, identity(40), Options{Objective: Total})
	cancel() // never read: the goroutine must still end
	for range ch {
	}
}

func TestImproveInvalidInputCloses(t *testing.T) {
	defer goleak.VerifyNone(t)
	cost := [][]float64{{0, 1, 2}, {1, 0, 2}, {2, 1, 0}}
	for _, start := range []Tour{nil, {0, 1}, {0, 1, 1}, {0, 1, 3}} {
		if _, ok := <-Improve(context.Background(), cost, start, Options{}); ok {
			t.Fatalf("start %v: got a result, want a closed channel", start)
		}
	}
	if _, ok := <-Improve(context.Background(), [][]float64{{0, 1}}, Tour{0}, Options{}); ok {
		t.Fatal("ragged matrix: got a result, want a closed channel")
	}
}

func TestImproveDeterministicWithIterations(t *testing.T) {
	defer goleak.VerifyNone(t)
	rng := rand.New(rand.NewPCG(29, 30))
	cost := randomMatrix(rng, 50, 1000, 0)
	run := func() []Result {
		return collect(t, cost, identity(50), Total,
			Improve(context.Background(), cost, identity(50), Options{Objective: Total, Iterations: 200, Seed: 9}))
	}
	a, b := run(), run()
	if len(a) != len(b) {
		t.Fatalf("runs gave %d and %d results", len(a), len(b))
	}
	for i := range a {
		if !slices.Equal(a[i].Tour, b[i].Tour) || a[i].Score != b[i].Score {
			t.Fatalf("result %d differs: %+v vs %+v", i, a[i], b[i])
		}
	}
}
