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

func TestSuccessorBySite(t *testing.T) {
	// Peers 0-3 in site0, 4-7 in site1; the site rings keep the flat ring's order.
	b := &bench{sites: 2, site: []string{"site0", "site0", "site0", "site0", "site1", "site1", "site1", "site1"}}
	ring := []int{0, 7, 6, 4, 5, 3, 2, 1}
	for _, c := range []struct{ x, want int }{{0, 3}, {3, 2}, {1, 0}, {7, 6}, {4, 5}, {5, 7}} {
		if got := b.successor(ring, c.x); got != c.want {
			t.Errorf("successor(%d) = %d, want %d", c.x, got, c.want)
		}
	}
	if !b.carries(ring, 0, 3) || b.carries(ring, 0, 7) || b.carries(ring, 3, 0) {
		t.Error("carries does not follow the site rings")
	}
	flat := &bench{sites: 1, site: make([]string, 8)}
	if flat.successor(ring, 1) != 0 || !flat.carries(ring, 0, 7) || flat.carries(ring, 0, 3) {
		t.Error("one site: successor and carries do not follow the flat ring")
	}
}
