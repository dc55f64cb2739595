package master

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// hamiltonian reports, by brute force over every order, whether some ring of ids avoids cut.
func hamiltonian(ids []PeerID, cut func(a, b PeerID) bool) bool {
	rest := slices.Clone(ids[1:])
	var perm func(k int) bool
	perm = func(k int) bool {
		if k == len(rest) {
			ring := append([]PeerID{ids[0]}, rest...)
			for i, a := range ring {
				if cut(a, ring[(i+1)%len(ring)]) {
					return false
				}
			}
			return true
		}
		for i := k; i < len(rest); i++ {
			rest[k], rest[i] = rest[i], rest[k]
			if perm(k + 1) {
				return true
			}
			rest[k], rest[i] = rest[i], rest[k]
		}
		return false
	}
	return perm(0)
}

// TestRingAvoiding checks the ring search against brute force on random small groups and random
// cuts: it finds a ring exactly when one exists, and what it returns is an order of the same peers
// with no cut pair adjacent.
func TestRingAvoiding(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 2000 {
		n := 2 + rng.IntN(6)
		ids := make([]PeerID, n)
		for i := range ids {
			ids[i] = PeerID(10 + i)
		}
		rng.Shuffle(n, func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		cuts := map[edge]bool{}
		for range rng.IntN(n + 2) {
			a, b := ids[rng.IntN(n)], ids[rng.IntN(n)]
			if a != b {
				cuts[pairOf(a, b)] = true
			}
		}
		cut := func(a, b PeerID) bool { return cuts[pairOf(a, b)] }
		got := ringAvoiding(ids, cut, 1<<20)
		if want := hamiltonian(ids, cut); (got != nil) != want {
			t.Fatalf("trial %d: ring %v, cuts %v: found %v, but a ring exists: %v", trial, ids, cuts, got, want)
		}
		if got == nil {
			continue
		}
		if !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(ids))) {
			t.Fatalf("trial %d: %v is not an order of %v", trial, got, ids)
		}
		for i, a := range got {
			if n > 1 && cut(a, got[(i+1)%n]) {
				t.Fatalf("trial %d: ring %v uses the cut pair %d-%d", trial, got, a, got[(i+1)%n])
			}
		}
	}
}

// TestRingAvoidingKeepsTheRing checks that one cut in a large ring changes only a few links, and that
// the search stays within its budget on a ring of thousands of peers.
func TestRingAvoidingKeepsTheRing(t *testing.T) {
	const n = 5000
	ring := make([]PeerID, n)
	for i := range ring {
		ring[i] = PeerID(i + 1)
	}
	cut := func(a, b PeerID) bool { return pairOf(a, b) == pairOf(1000, 1001) }
	got := ringAvoiding(ring, cut, 64*n+1024)
	if got == nil {
		t.Fatal("no ring found")
	}
	old := map[edge]bool{}
	for i, a := range ring {
		old[edge{a, ring[(i+1)%n]}] = true
	}
	changed := 0
	for i, a := range got {
		if !old[edge{a, got[(i+1)%n]}] {
			changed++
		}
		if cut(a, got[(i+1)%n]) {
			t.Fatalf("the ring uses the cut link %d-%d", a, got[(i+1)%n])
		}
	}
	if changed > 3 {
		t.Fatalf("%d links changed, want at most 3", changed)
	}
}

// TestCutExpires checks that a cut lasts LinkCutTimeout and is then forgotten.
func TestCutExpires(t *testing.T) {
	m := New(Config{})
	g := m.group(0)
	for _, id := range []PeerID{1, 2} {
		m.peers[id] = &peer{id: id, group: g, state: Accepted}
	}
	m.now = m.now.Add(1)
	m.cut(g, 1, 2, "test")
	if !m.isCut(2, 1) || !g.ringDirty {
		t.Fatal("the cut is not in force, or the ring is not marked for re-wiring")
	}
	m.now = m.now.Add(m.cfg.LinkCutTimeout - 1)
	if !m.isCut(1, 2) {
		t.Fatal("the cut ended before LinkCutTimeout")
	}
	m.now = m.now.Add(1)
	if m.isCut(1, 2) || len(m.cuts) != 0 {
		t.Fatal("the cut outlived LinkCutTimeout")
	}
	m.cut(g, 1, 3, "a peer that is gone")
	if len(m.cuts) != 0 {
		t.Fatal("a link to an unknown peer was cut")
	}
}
