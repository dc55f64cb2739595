package pccl

import (
	"errors"
	"slices"
	"testing"
)

func TestDeriveHierarchy(t *testing.T) {
	sites := map[uint64]string{1: "a", 2: "b", 3: "a", 4: "b", 5: "a", 6: "b"}
	site := func(id uint64) string { return sites[id] }
	ring := []uint64{1, 2, 3, 4, 5, 6}
	for _, tc := range []struct {
		me         uint64
		site, wan  []uint64
		sr, wr     int
		next, prev [numSubRings]uint64
	}{
		{me: 1, site: []uint64{1, 3, 5}, wan: []uint64{1, 2}, sr: 0, wr: 0, next: [2]uint64{3, 2}, prev: [2]uint64{5, 2}},
		{me: 4, site: []uint64{2, 4, 6}, wan: []uint64{3, 4}, sr: 1, wr: 1, next: [2]uint64{6, 3}, prev: [2]uint64{2, 3}},
		{me: 5, site: []uint64{1, 3, 5}, wan: []uint64{5, 6}, sr: 2, wr: 0, next: [2]uint64{1, 6}, prev: [2]uint64{3, 6}},
	} {
		h, ok := deriveHierarchy(ring, site, tc.me)
		if !ok {
			t.Fatalf("peer %d: flat, want hierarchical", tc.me)
		}
		if !slices.Equal(h.site, tc.site) || !slices.Equal(h.wan, tc.wan) || h.siteRank != tc.sr || h.wanRank != tc.wr || h.world != 6 {
			t.Fatalf("peer %d: %+v", tc.me, h)
		}
		for r := range numSubRings {
			if h.next(r) != tc.next[r] || h.prev(r) != tc.prev[r] {
				t.Fatalf("peer %d %v ring: next %d prev %d, want %d %d", tc.me, r, h.next(r), h.prev(r), tc.next[r], tc.prev[r])
			}
		}
	}
	flat := []struct {
		name  string
		ring  []uint64
		sites map[uint64]string
	}{
		{"one site", []uint64{1, 2, 3}, map[uint64]string{1: "a", 2: "a", 3: "a"}},
		{"singletons", []uint64{1, 2, 3}, map[uint64]string{1: "a", 2: "b", 3: "c"}},
		{"unequal sites", []uint64{1, 2, 3, 4, 5}, map[uint64]string{1: "a", 2: "b", 3: "a", 4: "b", 5: "a"}},
		{"not a member", []uint64{2, 3, 4, 5}, map[uint64]string{2: "a", 3: "a", 4: "b", 5: "b"}},
	}
	for _, tc := range flat {
		if h, ok := deriveHierarchy(tc.ring, func(id uint64) string { return tc.sites[id] }, 1); ok {
			t.Errorf("%s: hierarchical %+v, want flat", tc.name, h)
		}
	}
}

func TestValidateNICs(t *testing.T) {
	for _, tc := range []struct {
		nics []string
		ok   bool
	}{
		{nil, true},
		{[]string{"eth0", "10.0.0.2"}, true},
		{[]string{"eth0", ""}, false},
		{[]string{"eth0", "eth1", "eth0"}, false},
	} {
		err := Config{Master: "m:1", NICs: tc.nics}.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("NICs %q: %v", tc.nics, err)
		}
	}
}
