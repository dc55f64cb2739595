package links

import (
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
		h, ok := Derive(ring, site, tc.me)
		if !ok {
			t.Fatalf("peer %d: flat, want hierarchical", tc.me)
		}
		if !slices.Equal(h.Site, tc.site) || !slices.Equal(h.WAN, tc.wan) || h.SiteRank != tc.sr || h.MySite != tc.wr || h.World != 6 {
			t.Fatalf("peer %d: %+v", tc.me, h)
		}
		if h.SiteNext() != tc.next[SiteRing] || h.SitePrev() != tc.prev[SiteRing] {
			t.Fatalf("peer %d site ring: next %d prev %d, want %d %d", tc.me, h.SiteNext(), h.SitePrev(), tc.next[SiteRing], tc.prev[SiteRing])
		}
		if !slices.Equal(h.WANNext, []uint64{tc.next[WANRing]}) || !slices.Equal(h.WANPrev, []uint64{tc.prev[WANRing]}) {
			t.Fatalf("peer %d WAN partners: next %v prev %v, want %d %d", tc.me, h.WANNext, h.WANPrev, tc.next[WANRing], tc.prev[WANRing])
		}
		// With sites of one size the WAN pieces are the site blocks, each on the ring of one site rank.
		for _, fabric := range []bool{false, true} {
			for _, count := range []int{1, 2, 3, 7, 1000} {
				mine, ok := h.MyPieces(count, fabric)
				if !ok {
					t.Fatalf("peer %d: %d elements not covered by the WAN partners", tc.me, count)
				}
				want := SiteBlocks(count, 3, fabric)[tc.sr]
				if want.Len == 0 {
					if len(mine) != 0 {
						t.Fatalf("peer %d, %d elements: pieces %+v of an empty block", tc.me, count, mine)
					}
					continue
				}
				if len(mine) != 1 || mine[0].Span != want || !slices.Equal(mine[0].Ring, tc.wan) {
					t.Fatalf("peer %d, %d elements, fabric %v: pieces %+v, want %v on %v", tc.me, count, fabric, mine, want, tc.wan)
				}
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
		{"a single peer in a site", []uint64{1, 2, 3}, map[uint64]string{1: "a", 2: "b", 3: "a"}},
		{"not a member", []uint64{2, 3, 4, 5}, map[uint64]string{2: "a", 3: "a", 4: "b", 5: "b"}},
	}
	for _, tc := range flat {
		if h, ok := Derive(tc.ring, func(id uint64) string { return tc.sites[id] }, 1); ok {
			t.Errorf("%s: hierarchical %+v, want flat", tc.name, h)
		}
	}
}

// TestWANPiecesUnequalSites checks the WAN pieces of sites of different sizes: they tile the buffer,
// each piece lies in the block of its owner in every site, every peer's pieces tile its block, and
// the links every piece's ring passes over are among the partners its peers keep links to, for every
// buffer of at least the cube of the largest site's size in elements.
func TestWANPiecesUnequalSites(t *testing.T) {
	for _, sizes := range [][]int{{3, 2}, {2, 3}, {4, 3}, {5, 2}, {4, 2}, {3, 2, 4}, {6, 4, 5}} {
		var ring []uint64
		sites := map[uint64]string{}
		id := uint64(1)
		for s, n := range sizes {
			for range n {
				ring = append(ring, id)
				sites[id] = string(rune('a' + s))
				id++
			}
		}
		site := func(id uint64) string { return sites[id] }
		hs := map[uint64]Hierarchy{}
		for _, me := range ring {
			h, ok := Derive(ring, site, me)
			if !ok || h.WAN != nil {
				t.Fatalf("sites %v: peer %d: hierarchical %v, one-size WAN ring %v", sizes, me, ok, h.WAN)
			}
			hs[me] = h
		}
		maxSite := slices.Max(sizes)
		for _, fabric := range []bool{false, true} {
			for count := 1; count <= 400; count++ {
				pieces := hs[1].Pieces(count, fabric)
				end := 0
				for _, p := range pieces {
					if p.Span.Off != end || p.Span.Len <= 0 || len(p.Ring) != len(sizes) {
						t.Fatalf("sites %v, %d elements: piece %+v after %d", sizes, count, p, end)
					}
					end += p.Span.Len
				}
				if end != count {
					t.Fatalf("sites %v, %d elements: pieces end at %d", sizes, count, end)
				}
				covered := true
				for _, me := range ring {
					h := hs[me]
					mine, ok := h.MyPieces(count, fabric)
					covered = covered && ok
					if !ok {
						continue
					}
					block := SiteBlocks(count, len(h.Site), fabric)[h.SiteRank]
					off := block.Off
					for _, p := range mine {
						if p.Span.Off != off {
							t.Fatalf("sites %v, %d elements: peer %d's pieces %+v do not tile its block %+v", sizes, count, me, mine, block)
						}
						off += p.Span.Len
						if !slices.Contains(h.WANNext, h.Next(p)) || !slices.Contains(h.WANPrev, h.Prev(p)) {
							t.Fatalf("sites %v, %d elements: peer %d piece %+v: next %d, prev %d not among its partners %v, %v",
								sizes, count, me, p, h.Next(p), h.Prev(p), h.WANNext, h.WANPrev)
						}
						if !slices.Contains(hs[h.Next(p)].WANPrev, me) {
							t.Fatalf("sites %v, %d elements: peer %d does not expect peer %d", sizes, count, h.Next(p), me)
						}
					}
					if off != block.Off+block.Len {
						t.Fatalf("sites %v, %d elements: peer %d's pieces %+v do not tile its block %+v", sizes, count, me, mine, block)
					}
				}
				if !covered && count >= maxSite*maxSite*maxSite {
					t.Errorf("sites %v, %d elements, fabric %v: not covered by the WAN partners", sizes, count, fabric)
				}
			}
		}
	}
}

// TestSegments checks the pipeline's cut: up to MaxSegments segments of at least minBytes tile
// the buffer, on the fabric's blocks and on the site ring's alike. Every peer's
// pieces of a segment are its pieces of a buffer of the segment's size, and the indices of all the
// pieces of all segments are distinct within a site, as every piece needs an inbox of its own on
// the ring of its owners, one per site.
func TestSegments(t *testing.T) {
	const minBytes = 64 << 10
	var ring []uint64
	sites := map[uint64]string{}
	for id := uint64(1); id <= 7; id++ { // sites of four and three
		ring = append(ring, id)
		sites[id] = string(rune('a' + (id-1)/4))
	}
	site := func(id uint64) string { return sites[id] }
	for _, c := range []struct{ count, size, want int }{
		{1000, 4, 1}, {minBytes/4 - 1, 4, 1}, {2 * minBytes / 4, 4, 2}, {3*minBytes/2 + 7, 2, 3},
		{100 * minBytes, 1, MaxSegments},
	} {
		for _, fabric := range []bool{false, true} {
			want := c.want
			seen := map[[2]int]uint64{} // by site and index
			for _, me := range ring {
				h, _ := Derive(ring, site, me)
				segs, ok := h.Segments(c.count, c.size, minBytes, fabric)
				if !ok || len(segs) != want {
					t.Fatalf("%d elements of %d bytes, fabric %v: %d segments (ok %v), want %d", c.count, c.size, fabric, len(segs), ok, want)
				}
				end := 0
				for _, sg := range segs {
					if sg.Span.Off != end || sg.Span.Len <= 0 || want > 1 && sg.Span.Len*c.size < minBytes {
						t.Fatalf("%d elements, fabric %v: segment %+v after %d", c.count, fabric, sg.Span, end)
					}
					end += sg.Span.Len
					alone, _ := h.MyPieces(sg.Span.Len, fabric)
					if len(alone) != len(sg.Pieces) {
						t.Fatalf("segment %+v: %d pieces, %d in a buffer of its size", sg.Span, len(sg.Pieces), len(alone))
					}
					for i, p := range sg.Pieces {
						if p.Span != alone[i].Span || !slices.Equal(p.Ring, alone[i].Ring) {
							t.Fatalf("segment %+v: piece %+v, %+v in a buffer of its size", sg.Span, p, alone[i])
						}
						k := [2]int{h.MySite, p.Index}
						if other, dup := seen[k]; dup && other != me {
							t.Fatalf("piece index %d of peer %d taken by peer %d of its site too", p.Index, me, other)
						}
						seen[k] = me
					}
				}
				if end != c.count {
					t.Fatalf("%d elements, fabric %v: segments end at %d", c.count, fabric, end)
				}
			}
		}
	}
}

// TestSubPoolSize checks the connections per sub-ring successor: the flat ring's pool in a site ring,
// and across the WAN the pool over the largest site, at least one, so that a site's WAN rings open
// about as many connections over its link as the flat ring.
func TestSubPoolSize(t *testing.T) {
	h := func(sizes ...int) Hierarchy {
		var x Hierarchy
		id := uint64(1)
		for _, n := range sizes {
			var site []uint64
			for range n {
				site = append(site, id)
				id++
			}
			x.Sites = append(x.Sites, site)
		}
		return x
	}
	for _, c := range []struct {
		pool      int
		sites     []int
		site, wan int
	}{
		{1, []int{4, 4}, 1, 1}, {2, []int{4, 4}, 2, 1}, {4, []int{4, 4}, 4, 1}, {16, []int{4, 4}, 16, 4},
		{8, []int{4, 3}, 8, 2}, {32, []int{2, 2, 2}, 16, 8}, {4, nil, 4, 4},
	} {
		x := h(c.sites...)
		if got := SubPoolSize(x, c.pool, SiteRing); got != c.site {
			t.Errorf("pool %d, sites %v: site ring %d, want %d", c.pool, c.sites, got, c.site)
		}
		if got := SubPoolSize(x, c.pool, WANRing); got != c.wan {
			t.Errorf("pool %d, sites %v: WAN ring %d, want %d", c.pool, c.sites, got, c.wan)
		}
	}
}
