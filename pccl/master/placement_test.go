package master

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestPlaceNewcomersMatchesReference checks on random rings, sites, bandwidths and latencies that
// placeNewcomers builds exactly the ring that placeNewcomer, the full-matrix reference, builds when
// called for each newcomer in turn.
func TestPlaceNewcomersMatchesReference(t *testing.T) {
	sites := []string{"", "", "a", "b"}
	rng := rand.New(rand.NewPCG(1, 2))
	inserted := 0 // trials where some newcomer did not go to the end, so that both paths are covered
	for trial := range 400 {
		m := New(Config{})
		n := rng.IntN(12)
		k := 1 + rng.IntN(6)
		ids := rng.Perm(n + k + 5)[:n+k]
		named := trial%4 != 0 // a quarter of the trials name no site, so that nothing tells positions apart
		for _, i := range ids {
			id := PeerID(i + 1)
			// A third of the peers are behind NAT, so that rings avoid links between two of them.
			m.peers[id] = &peer{id: id, inbound: rng.IntN(3) != 0}
			if named {
				m.peers[id].hello.Site = sites[rng.IntN(len(sites))]
			}
		}
		all := make([]PeerID, len(ids))
		for i, id := range ids {
			all[i] = PeerID(id + 1)
		}
		// Measure a random part of the links; some trials measure none.
		density := rng.Float64() * float64(trial%3)
		for _, a := range all {
			for _, b := range all {
				if a != b && rng.Float64() < density/2 {
					m.bw[edge{a, b}] = float64(1+rng.IntN(4)) * 1e8
					m.lat[edge{a, b}] = time.Duration(rng.IntN(3)) * time.Millisecond
				}
			}
		}
		ring, newcomers := all[:n], all[n:]
		want := slices.Clone(ring)
		for _, id := range newcomers {
			want = m.placeNewcomer(want, id)
		}
		if !slices.Equal(want, append(slices.Clone(ring), newcomers...)) {
			inserted++
		}
		got := m.placeNewcomers(slices.Clone(ring), newcomers)
		if !slices.Equal(got, want) {
			t.Fatalf("trial %d: ring %v + newcomers %v: placeNewcomers = %v, placeNewcomer = %v", trial, ring, newcomers, got, want)
		}
	}
	if inserted < 40 {
		t.Fatalf("only %d of 400 trials placed a newcomer elsewhere than at the end", inserted)
	}
}
