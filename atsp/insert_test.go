package atsp

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestInsertCheapestMatchesEveryPosition(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	for trial := 0; trial < 200; trial++ {
		n := 2 + trial%9
		cost := randomMatrix(rng, n, 30, 0)
		node := rng.IntN(n)
		var sub Tour
		for _, v := range rng.Perm(n) {
			if v != node {
				sub = append(sub, v)
			}
		}
		before := slices.Clone(sub)
		for _, obj := range []Objective{Bottleneck, Total} {
			got := InsertCheapest(cost, sub, node, obj)
			if !slices.Equal(sub, before) {
				t.Fatal("InsertCheapest modified its input")
			}
			if len(got) != n || Remove(got, node) == nil || !slices.Equal(Remove(got, node), Remove(sub, -1)) {
				t.Fatalf("trial %d: %v is not %v with %d inserted", trial, got, sub, node)
			}
			if slices.Min(got) != got[0] {
				t.Fatalf("trial %d: %v does not start at its smallest node", trial, got)
			}
			// The best of every possible insertion position.
			var best Score
			for i := range sub {
				cand := slices.Concat(sub[:i+1], Tour{node}, sub[i+1:])
				if s := Evaluate(cost, cand); i == 0 || s.Better(best, obj) {
					best = s
				}
			}
			if s := Evaluate(cost, got); !same(s, best, obj) {
				t.Fatalf("trial %d %v: inserted score %+v, best position gives %+v", trial, obj, s, best)
			}
		}
	}
}

func TestInsertCheapestEdgeCases(t *testing.T) {
	cost := [][]float64{{0, 1, 9}, {9, 0, 1}, {1, 9, 0}}
	if got := InsertCheapest(cost, nil, 2, Total); !slices.Equal(got, Tour{2}) {
		t.Fatalf("into empty: %v", got)
	}
	if got := InsertCheapest(cost, Tour{1}, 0, Total); !slices.Equal(got, Tour{0, 1}) {
		t.Fatalf("into single: %v", got)
	}
	if got := InsertCheapest(cost, Tour{2, 0, 1}, 1, Total); !slices.Equal(got, Tour{0, 1, 2}) {
		t.Fatalf("already present: %v", got)
	}
	if got := InsertCheapest(cost, Tour{1, 0}, 2, Total); !slices.Equal(got, Tour{0, 1, 2}) {
		t.Fatalf("cheapest position: %v, want 0 1 2", got)
	}
}

func TestRemove(t *testing.T) {
	tests := []struct {
		t    Tour
		node int
		want Tour
	}{
		{Tour{0, 3, 1, 2}, 3, Tour{0, 1, 2}},
		{Tour{0, 3, 1, 2}, 0, Tour{1, 2, 3}},
		{Tour{0, 3, 1, 2}, 2, Tour{0, 3, 1}},
		{Tour{0, 3, 1, 2}, 7, Tour{0, 3, 1, 2}},
		{Tour{4}, 4, Tour{}},
		{Tour{2, 5, 1}, 5, Tour{1, 2}},
	}
	for _, tt := range tests {
		in := slices.Clone(tt.t)
		got := Remove(in, tt.node)
		if !slices.Equal(got, tt.want) {
			t.Errorf("Remove(%v, %d) = %v, want %v", tt.t, tt.node, got, tt.want)
		}
		if !slices.Equal(in, tt.t) {
			t.Errorf("Remove modified its input to %v", in)
		}
	}
}

func TestRemoveThenInsertRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	cost := randomMatrix(rng, 12, 100, 0)
	tour, _, err := Solve(cost, Options{Objective: Total, Now: fixedClock})
	if err != nil {
		t.Fatal(err)
	}
	// In an optimal tour, re-inserting a removed node at its cheapest place
	// can only give back the optimum.
	for node := 0; node < 12; node++ {
		got := InsertCheapest(cost, Remove(tour, node), node, Total)
		if Evaluate(cost, got).Total != Evaluate(cost, tour).Total {
			t.Fatalf("node %d: round trip gave %v (%v), optimum %v (%v)", node, got, Evaluate(cost, got), tour, Evaluate(cost, tour))
		}
	}
}
