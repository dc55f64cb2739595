package links

// The hierarchy of a ring whose peers share sites: the pure maths behind the hierarchical AllReduce.
// Every function here depends on its arguments only, so that every peer of an epoch, deriving from the
// same Connect, computes the same rings, pieces and segments.

import (
	"net/netip"
	"slices"

	"github.com/concord-ccl/concord/rings"
)

// Hierarchy is one peer's place in the hierarchical AllReduce of a ring.
type Hierarchy struct {
	Site     []uint64   // the site ring, in order
	SiteRank int        // position in Site
	Sites    [][]uint64 // every site's ring, sites in the order of their first peer in the ring
	MySite   int        // this peer's site: Sites[MySite] is Site
	World    int        // total peer count
	// WAN is the WAN ring of this peer's site rank (one peer per site, in site order; this peer is
	// WAN[MySite]) when the sites are of one size, nil otherwise.
	WAN []uint64
	// WANNext and WANPrev are the peers of the next and the previous site that this peer may meet in a
	// WAN ring (wanPartner): the successors it keeps links to, the predecessors whose links it keeps.
	WANNext, WANPrev []uint64
	// EverySite says the peers of every site announced NICs the fabric can run on (FabricReady). The
	// WAN rings pair blocks that each site's phases define, and the fabric cuts them differently from
	// the site ring, so the site phases run on the fabric in every site or in none.
	EverySite bool
}

// Derive computes the hierarchy of peer me in ring, given each peer's site. Sites are ordered by their
// first peer in ring order and the peers of a site keep their ring order, so every peer derives the
// same hierarchy from the same view. It returns false, meaning the flat ring, when there are fewer
// than two sites or when some site is a single peer.
//
// Sites may differ in size. After the reduce-scatter inside each site, each peer of a site owns one
// block of the buffer; the blocks of two sites of different sizes do not line up, so the WAN phase
// all-reduces pieces, the spans on which every site's owner is the same peer (Pieces), each on the
// ring of its owners. With sites of one size the pieces are the blocks and the rings are the peers of
// one site rank.
func Derive(ring []uint64, site func(uint64) string, me uint64) (Hierarchy, bool) {
	var names []string
	members := map[string][]uint64{}
	for _, id := range ring {
		s := site(id)
		if _, ok := members[s]; !ok {
			names = append(names, s)
		}
		members[s] = append(members[s], id)
	}
	if len(names) < 2 || !slices.Contains(ring, me) {
		return Hierarchy{}, false
	}
	h := Hierarchy{World: len(ring)}
	equal := true
	for i, s := range names {
		if len(members[s]) < 2 {
			return Hierarchy{}, false
		}
		equal = equal && len(members[s]) == len(members[names[0]])
		h.Sites = append(h.Sites, members[s])
		if s == site(me) {
			h.MySite = i
		}
	}
	h.Site = h.Sites[h.MySite]
	h.SiteRank = slices.Index(h.Site, me)
	if equal {
		for _, m := range h.Sites {
			h.WAN = append(h.WAN, m[h.SiteRank])
		}
	}
	nextSite := h.Sites[(h.MySite+1)%len(h.Sites)]
	prevSite := h.Sites[(h.MySite+len(h.Sites)-1)%len(h.Sites)]
	for r, id := range nextSite {
		if h.wanPartner(h.MySite, h.SiteRank, r) {
			h.WANNext = append(h.WANNext, id)
		}
	}
	for r, id := range prevSite {
		if h.wanPartner((h.MySite+len(h.Sites)-1)%len(h.Sites), r, h.SiteRank) {
			h.WANPrev = append(h.WANPrev, id)
		}
	}
	return h, true
}

// wanPartner reports whether the peer of site rank r in site s may pass data to the peer of rank q
// in the next site in a WAN ring: with sites of one size, when r = q; otherwise when the blocks they
// own after their sites' reduce-scatter overlap, or touch, as fractions of the buffer, in the site
// ring's blocks (rings.Shard) or the fabric's (SiteShard). Rounding moves a block's ends by less than
// its site's size in elements, so in a buffer of at least the cube of the largest site's size, two
// blocks that share elements overlap or touch as fractions; MyPieces checks it for the buffer at hand.
func (h Hierarchy) wanPartner(s, r, q int) bool {
	if h.WAN != nil {
		return r == q
	}
	a, b := len(h.Sites[s]), len(h.Sites[(s+1)%len(h.Sites)])
	touch := func(i, j int) bool { return i*b <= (j+1)*a && j*a <= (i+1)*b } // [i/a, (i+1)/a] ∩ [j/b, (j+1)/b]
	return touch(rings.OwnedChunk(r, a), rings.OwnedChunk(q, b)) || touch(r, q)
}

// SiteNext and SitePrev return the successor and predecessor of this peer in its site ring.
func (h Hierarchy) SiteNext() uint64 { return h.Site[(h.SiteRank+1)%len(h.Site)] }
func (h Hierarchy) SitePrev() uint64 { return h.Site[(h.SiteRank+len(h.Site)-1)%len(h.Site)] }

// Next and Prev return this peer's successor and predecessor in the WAN ring of piece p.
func (h Hierarchy) Next(p Piece) uint64 { return p.Ring[(h.MySite+1)%len(p.Ring)] }
func (h Hierarchy) Prev(p Piece) uint64 { return p.Ring[(h.MySite+len(p.Ring)-1)%len(p.Ring)] }

// Piece is a span of the buffer whose owner after the site phase is one peer in every site: the WAN
// phase all-reduces it on the ring of those owners, in site order.
type Piece struct {
	Index int        // position among all the pieces, in buffer order: tells their frames apart
	Span  rings.Span // in elements
	Ring  []uint64   // the owner in each site
}

// SiteShard returns the block of site rank rank of count elements when a site of world peers runs its
// phases on the intra-site fabric, in elements: blocks of ceil(count/world), the last ones short or
// empty.
func SiteShard(count, rank, world int) rings.Span {
	blk := (count + world - 1) / world
	lo := min(rank*blk, count)
	return rings.Span{Off: lo, Len: min(lo+blk, count) - lo}
}

// SiteBlocks returns the block each site rank of a site of n peers owns after the site's
// reduce-scatter of count elements, on the fabric (SiteShard) or on the site ring (rings.Shard).
func SiteBlocks(count, n int, fabric bool) []rings.Span {
	b := make([]rings.Span, n)
	for r := range b {
		if fabric {
			b[r] = SiteShard(count, r, n)
		} else {
			b[r] = rings.Shard(count, r, n)
		}
	}
	return b
}

// Pieces returns every WAN piece of a collective of count elements, in buffer order: the spans
// between consecutive block ends of all sites. Empty blocks (count smaller than a site) own nothing.
func (h Hierarchy) Pieces(count int, fabric bool) []Piece {
	blocks := make([][]rings.Span, len(h.Sites))
	cuts := []int{0, count}
	for s, m := range h.Sites {
		blocks[s] = SiteBlocks(count, len(m), fabric)
		for _, b := range blocks[s] {
			cuts = append(cuts, b.Off, b.Off+b.Len)
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []Piece
	for i := 0; i+1 < len(cuts); i++ {
		p := Piece{Index: len(out), Span: rings.Span{Off: cuts[i], Len: cuts[i+1] - cuts[i]}}
		for s, bs := range blocks {
			r := slices.IndexFunc(bs, func(b rings.Span) bool { return b.Off <= p.Span.Off && p.Span.Off < b.Off+b.Len })
			p.Ring = append(p.Ring, h.Sites[s][r])
		}
		out = append(out, p)
	}
	return out
}

// MyPieces returns the pieces this peer owns, in buffer order, and whether every one of all pieces
// passes only between WAN partners (wanPartner), whose links the peers keep. When not, the collective
// runs on the flat ring: every peer decides alike, from the same pieces.
func (h Hierarchy) MyPieces(count int, fabric bool) ([]Piece, bool) {
	return h.mine(h.Pieces(count, fabric))
}

// mine returns this peer's pieces of all, and whether every one of them passes only between WAN
// partners (see MyPieces).
func (h Hierarchy) mine(all []Piece) ([]Piece, bool) {
	me := h.Site[h.SiteRank]
	rank := map[uint64]int{}
	for _, m := range h.Sites {
		for r, id := range m {
			rank[id] = r
		}
	}
	var mine []Piece
	for _, p := range all {
		for s := range p.Ring {
			if !h.wanPartner(s, rank[p.Ring[s]], rank[p.Ring[(s+1)%len(p.Ring)]]) {
				return nil, false
			}
		}
		if p.Ring[h.MySite] == me {
			mine = append(mine, p)
		}
	}
	return mine, true
}

// MaxSegments bounds the segments of a hierarchical AllReduce's pipeline. The site phases of the first
// segment and of the last one are all that the WAN phase does not hide, so the more segments, the
// closer the collective comes to its WAN phase alone.
const MaxSegments = 16

// Segment is one segment of a hierarchical AllReduce and this peer's WAN pieces of it: their spans
// relative to the segment, their indices unique over the whole collective.
type Segment struct {
	Span   rings.Span // in elements of the buffer
	Pieces []Piece
}

// Segments cuts a collective of count elements of size bytes into up to MaxSegments segments of at
// least minBytes (a buffer under twice that is one segment), and returns this peer's pieces of each,
// and whether every segment's pieces pass only between WAN partners (MyPieces). Every peer cuts alike.
func (h Hierarchy) Segments(count, size, minBytes int, fabric bool) ([]Segment, bool) {
	spans := rings.Partition(count, max(1, min(MaxSegments, count*size/minBytes)))
	segs := make([]Segment, 0, len(spans))
	base := 0
	for _, sp := range spans {
		all := h.Pieces(sp.Len, fabric)
		mine, ok := h.mine(all)
		if !ok {
			return nil, false
		}
		for i := range mine {
			mine[i].Index += base
		}
		base += len(all)
		segs = append(segs, Segment{Span: sp, Pieces: mine})
	}
	return segs, true
}

// SubRing names the two kinds of sub-ring a peer belongs to.
type SubRing int

// The sub-rings.
const (
	SiteRing SubRing = iota
	WANRing
	numSubRings
)

func (r SubRing) String() string {
	if r == SiteRing {
		return "site"
	}
	return "WAN"
}

// Sub-ring connections are admitted through the flat ring's listener and LinkHello; their pool
// indices tell them apart: [0, hierIndexBase) is the flat ring, then one block of hierPoolMax per
// sub-ring.
const (
	hierIndexBase = 64
	hierPoolMax   = 16
)

// base is the first pool index of the sub-ring's connections.
func (r SubRing) base() int { return hierIndexBase + int(r)*hierPoolMax }

// SubPoolSize is the number of connections to the successor in sub-ring r of hierarchy h when the
// flat ring's pool has pool connections. A site ring has the flat ring's pool. The WAN rings of a site
// all cross its link to the next site, so together they open about as many connections over it as
// the flat ring would: the pool over the largest site's peer count, at least one; more flows on one
// shared link only overflow its queue together. Every peer derives the same h, so the two ends of a
// link agree.
func SubPoolSize(h Hierarchy, pool int, r SubRing) int {
	k := min(pool, hierPoolMax)
	if r == WANRing {
		largest := 0
		for _, site := range h.Sites {
			largest = max(largest, len(site))
		}
		if largest > 0 {
			k = max(1, (k+largest-1)/largest)
		}
	}
	return k
}

// FabricReady reports whether the peers of site announced the same number of NICs, at least one, every
// one an ip:port: what a peer of the site needs of the others to run the site's phases on the fabric.
func FabricReady(site []uint64, nics map[uint64][]string) bool {
	if len(site) == 0 || len(nics[site[0]]) == 0 {
		return false
	}
	for _, id := range site {
		addrs := nics[id]
		if len(addrs) != len(nics[site[0]]) {
			return false
		}
		for _, a := range addrs {
			if _, err := netip.ParseAddrPort(a); err != nil {
				return false
			}
		}
	}
	return true
}

// EverySiteReady reports whether the peers of every site announced NICs the fabric can run on
// (Hierarchy.EverySite).
func EverySiteReady(sites [][]uint64, nics map[uint64][]string) bool {
	for _, site := range sites {
		if !FabricReady(site, nics) {
			return false
		}
	}
	return true
}
