package plan

import (
	"errors"
	"math"
	"testing"
)

func dot(c, x []float64) float64 {
	var s float64
	for i := range c {
		s += c[i] * x[i]
	}
	return s
}

// checkFeasible fails unless x ≥ 0 and a·x = b within tol.
func checkFeasible(t *testing.T, a [][]float64, b, x []float64) {
	t.Helper()
	for j, v := range x {
		if v < -1e-9 {
			t.Fatalf("x[%d] = %v < 0", j, v)
		}
	}
	for i, r := range a {
		if got := dot(r, x); math.Abs(got-b[i]) > 1e-9 {
			t.Fatalf("row %d: %v, want %v", i, got, b[i])
		}
	}
}

func TestSimplexSolvesSmallPrograms(t *testing.T) {
	// Maximize 3x + 5y subject to x ≤ 4, 2y ≤ 12, 3x + 2y ≤ 18 (slacks s1..s3): optimum 36 at
	// x = 2, y = 6.
	c := []float64{-3, -5, 0, 0, 0}
	a := [][]float64{{1, 0, 1, 0, 0}, {0, 2, 0, 1, 0}, {3, 2, 0, 0, 1}}
	b := []float64{4, 12, 18}
	x, err := simplex(c, a, b)
	if err != nil {
		t.Fatal(err)
	}
	checkFeasible(t, a, b, x)
	if math.Abs(x[0]-2) > 1e-9 || math.Abs(x[1]-6) > 1e-9 {
		t.Fatalf("x, y = %v, %v, want 2, 6", x[0], x[1])
	}

	// Equalities and a negative right-hand side need phase 1: x + y = 2, x − y = −1 (y = 1.5,
	// x = 0.5), minimize x + 2y.
	c = []float64{1, 2}
	a = [][]float64{{1, 1}, {1, -1}}
	b = []float64{2, -1}
	if x, err = simplex(c, a, b); err != nil {
		t.Fatal(err)
	}
	checkFeasible(t, a, b, x)

	// A redundant equality (twice the first) leaves an artificial variable at zero.
	a = [][]float64{{1, 1}, {2, 2}}
	b = []float64{2, 4}
	if x, err = simplex(c, a, b); err != nil {
		t.Fatal(err)
	}
	checkFeasible(t, a, b, x)
	if got := dot(c, x); math.Abs(got-2) > 1e-9 {
		t.Fatalf("objective %v, want 2", got)
	}
}

func TestSimplexReportsInfeasibleAndUnbounded(t *testing.T) {
	// x + y = 1 and x + y = 2.
	if _, err := simplex([]float64{1, 1}, [][]float64{{1, 1}, {1, 1}}, []float64{1, 2}); !errors.Is(err, errInfeasible) {
		t.Fatalf("infeasible program: %v", err)
	}
	// Minimize −x subject to x − y = 0.
	if _, err := simplex([]float64{-1, 0}, [][]float64{{1, -1}}, []float64{0}); !errors.Is(err, errUnbounded) {
		t.Fatalf("unbounded program: %v", err)
	}
}

// Beale's program cycles under Dantzig's rule with the lowest-index tie-break: every pivot from the
// start is degenerate, and after six of them the basis is the first one again.
func TestSimplexDoesNotCycleOnBealesProgram(t *testing.T) {
	c := []float64{0, 0, 0, -0.75, 20, -0.5, 6}
	a := [][]float64{
		{1, 0, 0, 0.25, -8, -1, 9},
		{0, 1, 0, 0.5, -12, -0.5, 3},
		{0, 0, 1, 0, 0, 1, 0},
	}
	b := []float64{0, 0, 1}
	x, err := simplex(c, a, b)
	if err != nil {
		t.Fatal(err)
	}
	checkFeasible(t, a, b, x)
	if got := dot(c, x); math.Abs(got+1.25) > 1e-9 {
		t.Fatalf("objective %v, want −1.25 (x = %v)", got, x)
	}
}

// A measured topology (one NIC down) on which gonum's simplex, which the weighted rings' program
// used before, pivoted forever: the program must end, and its solution must satisfy it.
func TestWeightedProgramEndsOnAMeasuredTopology(t *testing.T) {
	betas := []float64{
		1.9726258219674313e-08, 2.011659119344973e-08, 2.0296702925215148e-08, 2.027244109127793e-08,
		1.951469313308709e-08, 1.9969446406977687e-08, 2.0294220494605918e-08, 2.0240507320974365e-08,
		2.0261029474666703e-08, 1.957340551865018e-08, 1.972861273758543e-08, 1.9699852605288408e-08,
		1.9537677681962643e-08, 2.000197409748164e-08, -1.9467249734047472e-08, 2.028444234025129e-08,
	}
	top := Uniform(4, 4, 1, 300e-6, 50e6)
	for i := range top.Nodes {
		for j := range top.Nodes[i].NICs {
			b := betas[4*i+j]
			top.Nodes[i].NICs[j].Beta, top.Nodes[i].NICs[j].Down = math.Abs(b), b < 0
		}
	}
	e, err := Cost(top, Weighted, 256<<20, Model{})
	if err != nil {
		t.Fatal(err)
	}
	if math.IsInf(e.Seconds, 1) {
		t.Fatal("the weighted rings do not apply")
	}
	// Every ring's blocks tile the message, and the time is no better than the bound.
	for k, o := range e.Owners {
		var s float64
		for _, v := range o {
			if v < 0 {
				t.Fatalf("ring %d: negative block %v", k, v)
			}
			s += v
		}
		if math.Abs(s-1) > 1e-9 {
			t.Fatalf("ring %d: blocks sum to %v", k, s)
		}
	}
	ideal, err := Ideal(top, 256<<20)
	if err != nil {
		t.Fatal(err)
	}
	if e.Seconds < ideal*(1-1e-9) {
		t.Fatalf("weighted rings %v s, below the bound %v s", e.Seconds, ideal)
	}
	t.Logf("weighted rings %.4f s, bound %.4f s", e.Seconds, ideal)
}
