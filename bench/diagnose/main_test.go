package main

import "testing"

func TestHasEdge(t *testing.T) {
	ring := []int{3, 0, 2, 1}
	for _, c := range []struct {
		a, b int
		want bool
	}{{3, 0, true}, {1, 3, true}, {0, 3, false}, {0, 1, false}, {2, 1, true}} {
		if got := hasEdge(ring, c.a, c.b); got != c.want {
			t.Errorf("hasEdge(%v, %d, %d) = %v, want %v", ring, c.a, c.b, got, c.want)
		}
	}
}

func TestContainsLink(t *testing.T) {
	if !containsLink("slow-link 5→7 (confidence 0.5)", 5, 7) || containsLink("slow-link 5→77", 7, 5) {
		t.Fatal("containsLink does not match the link it names only")
	}
}
