package pccl

// The hierarchical AllReduce. When the peers of a ring share sites, AllReduce runs as one plan on a
// staging buffer under one commit, in three steps:
//
//	reduce-scatter among the peers of this peer's site (the site ring), unfinalized;
//	all-reduce of this peer's block across sites, finalized once by the total peer count: with sites
//	        of one size on the WAN ring of the peers with the same site rank, one per site; otherwise
//	        piece by piece, each on the ring of its owners (wanPieces), all at once;
//	all-gather among the peers of the site.
//
// A large buffer goes through them as a pipeline of segments (sitePipeline, mySegments): while the
// WAN rings carry one segment, the site reduce-scatters the next, so the WAN link and the site's
// links are busy at once.
//
// Each site ring and each WAN partner has its own connections, opened by the links next to the flat
// ring's when the master wires an epoch. The hierarchy is derived from the master's Connect (the ring
// of the epoch and the site each peer announced), so every peer of an epoch computes the same one, and
// a peer's death leaves its site ring and its WAN rings in the one membership change that removes it
// from the ring. When the peers of every site run the intra-site tier (Config.NICs) and the master
// commenced the collective alone, the two site phases run on the rdma fabric instead of the site
// rings' links (sitetier.go), and the WAN phase reduces the fabric's block of this peer.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/rings"
)

// Sub-ring connections are admitted through the flat ring's listener and LinkHello; their pool
// indices tell them apart: [0, hierIndexBase) is the flat ring, then one block of hierPoolMax per
// sub-ring.
const (
	hierIndexBase = 64
	hierPoolMax   = 16
)

// subRing names the two kinds of sub-ring a peer belongs to.
type subRing int

const (
	siteRing subRing = iota
	wanRing
	numSubRings
)

// base is the first pool index of the sub-ring's connections.
func (r subRing) base() int { return hierIndexBase + int(r)*hierPoolMax }

// The data frames of a hierarchical collective carry the collective's tag with marker bits flipped,
// one marker per phase, so that each phase has its own inbox under the collective's sequence number
// (which alone makes an operation unique).
const (
	markSiteReduce = uint64(1) << 63
	markWAN        = uint64(1) << 62
	markSiteGather = uint64(3) << 62
	// A WAN piece's index (wanPiece.index) is flipped in from this bit up, under the markers.
	pieceShift = 40
)

// hierarchy is one peer's place in the hierarchical AllReduce of a ring.
type hierarchy struct {
	site     []uint64   // the site ring, in order
	siteRank int        // position in site
	sites    [][]uint64 // every site's ring, sites in the order of their first peer in the ring
	mySite   int        // this peer's site: sites[mySite] is site
	world    int        // total peer count
	// wan is the WAN ring of this peer's site rank (one peer per site, in site order; this peer is
	// wan[mySite]) when the sites are of one size, nil otherwise.
	wan []uint64
	// wanNext and wanPrev are the peers of the next and the previous site that this peer may meet in a
	// WAN ring (wanPartner): the successors it keeps links to, the predecessors whose links it keeps.
	wanNext, wanPrev []uint64
	// everySite says the peers of every site announced NICs the fabric can run on (fabricReady). The
	// WAN rings pair blocks that each site's phases define, and the fabric cuts them differently from
	// the site ring, so the site phases run on the fabric in every site or in none.
	everySite bool
}

// deriveHierarchy computes the hierarchy of peer me in ring, given each peer's site. Sites are ordered
// by their first peer in ring order and the peers of a site keep their ring order, so every peer
// derives the same hierarchy from the same view. It returns false, meaning the flat ring, when there
// are fewer than two sites or when some site is a single peer.
//
// Sites may differ in size. After the reduce-scatter inside each site, each peer of a site owns one
// block of the buffer; the blocks of two sites of different sizes do not line up, so the WAN phase
// all-reduces pieces, the spans on which every site's owner is the same peer (wanPieces), each on the
// ring of its owners. With sites of one size the pieces are the blocks and the rings are the peers of
// one site rank.
func deriveHierarchy(ring []uint64, site func(uint64) string, me uint64) (hierarchy, bool) {
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
		return hierarchy{}, false
	}
	h := hierarchy{world: len(ring)}
	equal := true
	for i, s := range names {
		if len(members[s]) < 2 {
			return hierarchy{}, false
		}
		equal = equal && len(members[s]) == len(members[names[0]])
		h.sites = append(h.sites, members[s])
		if s == site(me) {
			h.mySite = i
		}
	}
	h.site = h.sites[h.mySite]
	h.siteRank = slices.Index(h.site, me)
	if equal {
		for _, m := range h.sites {
			h.wan = append(h.wan, m[h.siteRank])
		}
	}
	nextSite := h.sites[(h.mySite+1)%len(h.sites)]
	prevSite := h.sites[(h.mySite+len(h.sites)-1)%len(h.sites)]
	for r, id := range nextSite {
		if h.wanPartner(h.mySite, h.siteRank, r) {
			h.wanNext = append(h.wanNext, id)
		}
	}
	for r, id := range prevSite {
		if h.wanPartner((h.mySite+len(h.sites)-1)%len(h.sites), r, h.siteRank) {
			h.wanPrev = append(h.wanPrev, id)
		}
	}
	return h, true
}

// wanPartner reports whether the peer of site rank r in site s may pass data to the peer of rank q
// in the next site in a WAN ring: with sites of one size, when r = q; otherwise when the blocks they
// own after their sites' reduce-scatter overlap, or touch, as fractions of the buffer, in the site
// ring's blocks (rings.Shard) or the fabric's (siteShard). Rounding moves a block's ends by less than
// its site's size in elements, so in a buffer of at least the cube of the largest site's size, two
// blocks that share elements overlap or touch as fractions; myPieces checks it for the buffer at hand.
func (h hierarchy) wanPartner(s, r, q int) bool {
	if h.wan != nil {
		return r == q
	}
	a, b := len(h.sites[s]), len(h.sites[(s+1)%len(h.sites)])
	touch := func(i, j int) bool { return i*b <= (j+1)*a && j*a <= (i+1)*b } // [i/a, (i+1)/a] ∩ [j/b, (j+1)/b]
	return touch(rings.OwnedChunk(r, a), rings.OwnedChunk(q, b)) || touch(r, q)
}

// wanPiece is a span of the buffer whose owner after the site phase is one peer in every site: the
// WAN phase all-reduces it on the ring of those owners, in site order.
type wanPiece struct {
	index int        // position among all the pieces, in buffer order: tells their frames apart
	span  rings.Span // in elements
	ring  []uint64   // the owner in each site
}

// siteBlocks returns the block each site rank of a site of n peers owns after the site's
// reduce-scatter of count elements, on the fabric or on the site ring.
func siteBlocks(count, n int, fabric bool) []rings.Span {
	b := make([]rings.Span, n)
	for r := range b {
		if fabric {
			b[r] = siteShard(count, r, n)
		} else {
			b[r] = rings.Shard(count, r, n)
		}
	}
	return b
}

// wanPieces returns every WAN piece of a collective of count elements, in buffer order: the spans
// between consecutive block ends of all sites. Empty blocks (count smaller than a site) own nothing.
func (h hierarchy) wanPieces(count int, fabric bool) []wanPiece {
	blocks := make([][]rings.Span, len(h.sites))
	cuts := []int{0, count}
	for s, m := range h.sites {
		blocks[s] = siteBlocks(count, len(m), fabric)
		for _, b := range blocks[s] {
			cuts = append(cuts, b.Off, b.Off+b.Len)
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	var out []wanPiece
	for i := 0; i+1 < len(cuts); i++ {
		p := wanPiece{index: len(out), span: rings.Span{Off: cuts[i], Len: cuts[i+1] - cuts[i]}}
		for s, bs := range blocks {
			r := slices.IndexFunc(bs, func(b rings.Span) bool { return b.Off <= p.span.Off && p.span.Off < b.Off+b.Len })
			p.ring = append(p.ring, h.sites[s][r])
		}
		out = append(out, p)
	}
	return out
}

// myPieces returns the pieces this peer owns, in buffer order, and whether every one of all pieces
// passes only between WAN partners (wanPartner), whose links the peers keep. When not, the collective
// runs on the flat ring: every peer decides alike, from the same pieces.
func (h hierarchy) myPieces(count int, fabric bool) ([]wanPiece, bool) {
	return h.mine(h.wanPieces(count, fabric))
}

// mine returns this peer's pieces of all, and whether every one of them passes only between WAN
// partners (see myPieces).
func (h hierarchy) mine(all []wanPiece) ([]wanPiece, bool) {
	me := h.site[h.siteRank]
	rank := map[uint64]int{}
	for _, m := range h.sites {
		for r, id := range m {
			rank[id] = r
		}
	}
	var mine []wanPiece
	for _, p := range all {
		for s := range p.ring {
			if !h.wanPartner(s, rank[p.ring[s]], rank[p.ring[(s+1)%len(p.ring)]]) {
				return nil, false
			}
		}
		if p.ring[h.mySite] == me {
			mine = append(mine, p)
		}
	}
	return mine, true
}

// A hierarchical AllReduce is a pipeline over segments of the buffer (sitePipeline): up to
// pipeSegments of them, each at least pipeMinBytes (a variable for the tests, which make it small so
// that their buffers take the pipeline). A buffer under twice that is one segment. The site phases of
// the first segment and of the last one are all that the WAN phase does not hide, so the more
// segments, the closer the collective comes to its WAN phase alone.
const pipeSegments = 16

var pipeMinBytes = 4 << 20

// hierSegment is one segment of a hierarchical AllReduce and this peer's WAN pieces of it: their spans
// relative to the segment, their indices unique over the whole collective.
type hierSegment struct {
	span   rings.Span // in elements of the buffer
	pieces []wanPiece
}

// mySegments cuts a collective of count elements of size bytes into its segments and returns this
// peer's pieces of each, and whether every segment's pieces pass only between WAN partners
// (myPieces). Every peer cuts alike.
func (h hierarchy) mySegments(count, size int, fabric bool) ([]hierSegment, bool) {
	spans := rings.Partition(count, max(1, min(pipeSegments, count*size/pipeMinBytes)))
	segs := make([]hierSegment, 0, len(spans))
	base := 0
	for _, sp := range spans {
		all := h.wanPieces(sp.Len, fabric)
		mine, ok := h.mine(all)
		if !ok {
			return nil, false
		}
		for i := range mine {
			mine[i].index += base
		}
		base += len(all)
		segs = append(segs, hierSegment{span: sp, pieces: mine})
	}
	return segs, true
}

// siteNext and sitePrev return the successor and predecessor of this peer in its site ring.
func (h hierarchy) siteNext() uint64 { return h.site[(h.siteRank+1)%len(h.site)] }
func (h hierarchy) sitePrev() uint64 { return h.site[(h.siteRank+len(h.site)-1)%len(h.site)] }

// next and prev return this peer's successor and predecessor in the WAN ring of piece p.
func (h hierarchy) next(p wanPiece) uint64 { return p.ring[(h.mySite+1)%len(p.ring)] }
func (h hierarchy) prev(p wanPiece) uint64 {
	return p.ring[(h.mySite+len(p.ring)-1)%len(p.ring)]
}

// segStreams are the streams of one segment of a hierarchical AllReduce: its site phases' on the site
// ring (nil on the fabric) and its WAN pieces', in the order of the segment's pieces.
type segStreams struct {
	reduce, gather rings.Stream
	wan            []rings.Stream
}

// plan builds the plan of a hierarchical AllReduce of count elements of d.DType: one external phase,
// a sitePipeline over segs, whose site phases run on the intra-site fabric f (t's) or, when f is nil,
// on the site ring, and whose WAN phases reduce each segment's pieces of this peer's block, every
// piece on its stream.
func (h hierarchy) plan(count int, d Desc, partBytes int, t *siteTier, f *siteFabric, segs []hierSegment, streams []segStreams) rings.Plan {
	size := d.DType.Size()
	// A site phase on the site ring: one ring phase, as a Runner.
	ring := func(k rings.Kind, s rings.Stream, n int, div rings.Divisor) rings.Runner {
		return &rings.Concurrent{DType: d.DType, Op: d.Op, PartBytes: partBytes, Phases: []rings.Phase{
			{Kind: k, Stream: s, Rank: h.siteRank, World: len(h.site), Len: n * size, Divisor: div}}}
	}
	fop := d.Op
	if fop == rings.Avg {
		fop = rings.Sum // unfinalized inside the site: the WAN ring divides by the total peer count
	}
	p := &sitePipeline{}
	for k, sg := range segs {
		n := sg.span.Len
		ps := pipeSegment{lo: sg.span.Off * size, hi: (sg.span.Off + n) * size}
		if f != nil {
			ps.reduce = &sitePhase{t: t, f: f, dt: d.DType, op: fop, count: n}
			ps.gather = &sitePhase{t: t, f: f, gather: true, dt: d.DType, op: fop, count: n}
		} else {
			ps.reduce = ring(rings.KindReduceScatter, streams[k].reduce, n, rings.NoFinalize)
			ps.gather = ring(rings.KindAllGather, streams[k].gather, n, rings.DivideByWorld)
		}
		if len(sg.pieces) > 0 {
			// The pieces run at once: one after the other, the pieces of all peers would form a
			// chain, each waiting for the one before.
			c := &rings.Concurrent{DType: d.DType, Op: d.Op, PartBytes: partBytes}
			for i, pc := range sg.pieces {
				c.Phases = append(c.Phases, h.wanPhase(streams[k].wan[i], pc.span, d))
			}
			ps.wan = c
		}
		p.segs = append(p.segs, ps)
	}
	return rings.Plan{DType: d.DType, Op: d.Op, PartBytes: partBytes, Phases: []rings.Phase{
		{Kind: rings.KindExternal, Runner: p, Rank: h.siteRank, World: len(h.site), Len: count * size}}}
}

// sitePipeline runs a hierarchical AllReduce as a pipeline over segments of the buffer. The site
// reduce-scatters the segments one after the other; a segment's WAN pieces are all-reduced across
// sites as soon as its reduce-scatter is done, while the site goes on with the next; then the site
// all-gathers the segments in order, each once its WAN pieces are done. So the WAN carries one
// segment while the site works on another, and the collective takes about the longer of the two
// tiers rather than their sum. The fabric runs one collective at a time, matched by order, so every
// peer of a site runs its site phases in the same order: every reduce-scatter, then every
// all-gather.
type sitePipeline struct {
	segs []pipeSegment
}

// pipeSegment is one segment of a sitePipeline: its bytes of the buffer, its site phases and its WAN
// phases (nil when this peer owns no piece of it).
type pipeSegment struct {
	lo, hi         int
	reduce, gather rings.Runner
	wan            rings.Runner
}

// Run runs the pipeline; nothing of it touches in or out once Run returns.
func (p *sitePipeline) Run(ctx context.Context, in, out []byte) (err error) {
	fail := func(e error) {
		if err == nil {
			err = e
			p.Abort(e)
		}
	}
	wanDone := make([]chan error, 0, len(p.segs))
	for _, sg := range p.segs {
		if e := sg.reduce.Run(ctx, in[sg.lo:sg.hi], out[sg.lo:sg.hi]); e != nil {
			fail(e)
			break
		}
		done := make(chan error, 1)
		wanDone = append(wanDone, done)
		if sg.wan == nil {
			done <- nil
			continue
		}
		go func() { done <- sg.wan.Run(ctx, out[sg.lo:sg.hi], out[sg.lo:sg.hi]) }()
	}
	for k, done := range wanDone {
		if e := <-done; e != nil {
			fail(e)
		}
		if err == nil {
			sg := p.segs[k]
			if e := sg.gather.Run(ctx, out[sg.lo:sg.hi], out[sg.lo:sg.hi]); e != nil {
				fail(e)
			}
		}
	}
	return err
}

// Abort aborts every phase (the fabric's stop with the collective: sitePhase.Abort).
func (p *sitePipeline) Abort(err error) {
	for _, sg := range p.segs {
		sg.reduce.Abort(err)
		if sg.wan != nil {
			sg.wan.Abort(err)
		}
		sg.gather.Abort(err)
	}
}

// wanPhase is the all-reduce of piece (in elements) across sites on a WAN ring, finalized once by the
// total peer count.
func (h hierarchy) wanPhase(wan rings.Stream, piece rings.Span, d Desc) rings.Phase {
	size := d.DType.Size()
	return rings.Phase{Kind: rings.KindAllReduce, Stream: wan, Rank: h.mySite, World: len(h.sites),
		Off: piece.Off * size, Len: piece.Len * size, Divisor: rings.Divisor(h.world), Quant: d.Quant}
}

// subPool is the pool of connections to this peer's successor in a sub-ring.
type subPool struct {
	next uint64
	out  []*outConn
}

// hierLinks is the state the links keep for hierarchical collectives. Guarded by links.mu.
type hierLinks struct {
	sites map[uint64]string   // every peer's announced site, from the master's Connect
	nics  map[uint64][]string // every peer's announced NICs, likewise
	cur   hierarchy           // the hierarchy of the last wired ring
	ok    bool                // cur is hierarchical
	site  subPool             // to the successor in the site ring
	wan   []subPool           // to each WAN partner in the next site (hierarchy.wanNext)
}

// expects reports whether from is a predecessor of this peer in a sub-ring of the wired ring, whose
// incoming connections are kept.
func (hl *hierLinks) expects(from uint64) bool {
	return hl.ok && (hl.cur.sitePrev() == from || slices.Contains(hl.cur.wanPrev, from))
}

// closeAll closes every sub-ring connection (links.mu held).
func (hl *hierLinks) closeAll() {
	for _, p := range append([]subPool{hl.site}, hl.wan...) {
		for _, oc := range p.out {
			oc.close()
		}
	}
	hl.site, hl.wan = subPool{}, nil
}

// install makes pools[0] the site ring's pool and the others the WAN pools, leaving out empty ones
// (links.mu held).
func (hl *hierLinks) install(pools []subPool) {
	hl.site = pools[0]
	hl.wan = slices.DeleteFunc(slices.Clone(pools[1:]), func(p subPool) bool { return p.next == 0 })
}

// subPoolSize is the number of connections to the successor in sub-ring r of hierarchy h. A site ring
// has the flat ring's pool. The WAN rings of a site all cross its link to the next site, so together
// they open about as many connections over it as the flat ring would: the pool over the largest
// site's peer count, at least one; more flows on one shared link only overflow its queue together.
// Every peer derives the same h, so the two ends of a link agree.
func (l *links) subPoolSize(h hierarchy, r subRing) int {
	k := min(l.c.cfg.PoolSize, hierPoolMax)
	if r == wanRing {
		largest := 0
		for _, site := range h.sites {
			largest = max(largest, len(site))
		}
		if largest > 0 {
			k = max(1, (k+largest-1)/largest)
		}
	}
	return k
}

// wireHier records the sites of the ring in m and opens the sub-ring pools of its hierarchy, keeping
// those that already lead to the right successor unless a link broke. It runs before the flat ring is
// wired, so that the predecessors it expects keep their incoming connections. On failure it returns
// the peers it could not reach.
func (l *links) wireHier(m *wire.Connect) ([]uint64, error) {
	ring := make([]uint64, len(m.Ring))
	l.mu.Lock()
	if l.hier.sites == nil {
		l.hier.sites = map[uint64]string{}
		l.hier.nics = map[uint64][]string{}
	}
	for i, p := range m.Ring {
		ring[i] = p.ID
		l.hier.sites[p.ID] = p.Site
		l.hier.nics[p.ID] = p.NICs
	}
	sites := l.hier.sites
	h, ok := deriveHierarchy(ring, func(id uint64) string { return sites[id] }, l.c.id)
	l.hier.cur, l.hier.ok = h, ok
	redial := l.isDirty
	// The pools to keep: one to the site ring's successor, one to each WAN partner.
	var want []uint64
	if ok {
		want = append([]uint64{h.siteNext()}, h.wanNext...)
	}
	current := append([]subPool{l.hier.site}, l.hier.wan...)
	kept := make([]subPool, len(want))
	var stale []*outConn
	for j, p := range current {
		i := -1
		r := wanRing
		if j == 0 {
			r = siteRing
		}
		if p.next != 0 && !redial && len(p.out) == l.subPoolSize(h, r) {
			// current[0] and want[0] are the site ring's pool, dialled on its own pool indices.
			if i = slices.Index(want, p.next); i >= 0 && (kept[i].next != 0 || (i == 0) != (j == 0)) {
				i = -1
			}
		}
		if i < 0 {
			stale = append(stale, p.out...)
			continue
		}
		kept[i] = p
	}
	// The stale pools are closed below, outside the lock; the kept ones stay.
	l.hier.site, l.hier.wan = subPool{}, nil
	if len(kept) > 0 {
		l.hier.install(kept)
	}
	// Whether this epoch's site phases may run on the fabric, and this site's NICs for it.
	var fabricNICs map[uint64][]string
	if ok && everySiteReady(h.sites, l.hier.nics) {
		fabricNICs = make(map[uint64][]string, len(h.site))
		for _, id := range h.site {
			fabricNICs[id] = l.hier.nics[id]
		}
	}
	l.mu.Unlock()
	for _, oc := range stale {
		oc.close()
	}
	// A fabric of an earlier epoch serves no collective of this one: close its sockets now rather than
	// at the next hierarchical collective, which may never come. When this epoch's collectives may
	// run their site phases on the fabric, open its first generation now (sitetier.go).
	l.c.site.retireBefore(m.Epoch)
	if !ok {
		return nil, nil
	}
	if fabricNICs != nil {
		l.c.site.prepare(fabricGen{m.Epoch, 0}, h.site, fabricNICs, l.c.id)
	}
	addr := map[uint64]wire.PeerInfo{}
	for _, p := range m.Ring {
		addr[p.ID] = p
	}
	// Every missing pool at once, each of its links at once (dialPool).
	type dialed struct {
		conns []net.Conn
		k     int
		err   error
	}
	results := make([]dialed, len(want))
	var wg sync.WaitGroup
	for i, next := range want {
		if kept[i].next != 0 {
			continue
		}
		r := wanRing
		if i == 0 {
			r = siteRing
		}
		wg.Go(func() {
			conns, k, err := l.dialPool(addr[next], r.base(), l.subPoolSize(h, r))
			results[i] = dialed{conns, k, err}
		})
	}
	wg.Wait()
	var failed []uint64
	var errs []error
	for i, d := range results {
		if d.err != nil {
			to := addr[want[i]]
			failed = append(failed, to.ID)
			errs = append(errs, fmt.Errorf("sub-ring link %d to peer %d at %s: %w", d.k, to.ID, to.Addr, d.err))
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isClosed || len(failed) > 0 {
		for _, d := range results {
			for _, c := range d.conns {
				c.Close()
			}
		}
		if len(failed) > 0 {
			return failed, errors.Join(errs...)
		}
		return nil, ErrClosed
	}
	for i, d := range results {
		if d.conns == nil {
			continue
		}
		pool := make([]*outConn, 0, len(d.conns))
		for _, conn := range d.conns {
			pool = append(pool, l.newOutConn(conn))
		}
		kept[i] = subPool{next: want[i], out: pool}
	}
	l.hier.install(kept)
	return nil, nil
}

// hierarchyFor returns the hierarchy of ring if the wired view makes it hierarchical.
func (l *links) hierarchyFor(ring []uint64) (hierarchy, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hier.sites == nil {
		return hierarchy{}, false
	}
	sites := l.hier.sites
	h, ok := deriveHierarchy(ring, func(id uint64) string { return sites[id] }, l.c.id)
	if !ok {
		return h, false
	}
	h.everySite = everySiteReady(h.sites, l.hier.nics)
	return h, true
}

// everySiteReady reports whether the peers of every site announced NICs the fabric can run on
// (hierarchy.everySite).
func everySiteReady(sites [][]uint64, nics map[uint64][]string) bool {
	for _, site := range sites {
		if !fabricReady(site, nics) {
			return false
		}
	}
	return true
}

// siteNICs returns the announced NICs of the peers of site.
func (l *links) siteNICs(site []uint64) map[uint64][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[uint64][]string, len(site))
	for _, id := range site {
		out[id] = l.hier.nics[id]
	}
	return out
}

// subStream opens the stream of one phase of collective (tag, seq) on sub-ring r, to successor next
// and from predecessor prev.
func (l *links) subStream(tag, seq, epoch uint64, r subRing, next, prev uint64, h2 *opHandle) (*stream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	pools := l.hier.wan
	if r == siteRing {
		pools = []subPool{l.hier.site}
	}
	i := slices.IndexFunc(pools, func(p subPool) bool { return p.next == next && len(p.out) > 0 })
	if i < 0 {
		l.isDirty = true
		return nil, fmt.Errorf("%w: no link to peer %d in the %s ring", ErrPeerLeft, next, r)
	}
	return l.openStream(inboxKey{tag, seq}, epoch, pools[i].out, prev, r.base(), l.subPoolSize(l.hier.cur, r), h2), nil
}

func (r subRing) String() string {
	if r == siteRing {
		return "site"
	}
	return "WAN"
}

// fabricWanted reports whether the site phases of collective st run on the intra-site fabric: the
// master commenced it alone, the epoch has not aborted too many on the fabric, and the peers of every
// site announced NICs the fabric can run on. Every peer of the epoch decides alike.
func fabricWanted(st *opStart, hv hierarchy) bool { return st.alone && !st.siteOff && hv.everySite }

// siteFabricFor returns the intra-site fabric the site phases of collective st run on, with the tier
// locked for it, or nil when they run on the site ring's links (fabricWanted, sitetier.go).
func (c *Communicator) siteFabricFor(st *opStart, hv hierarchy) (*siteFabric, error) {
	if !fabricWanted(st, hv) {
		return nil, nil
	}
	nics := c.links.siteNICs(hv.site)
	if c.site == nil || !c.site.usable(hv.site, nics) {
		// Cannot be: this peer announced its tier's NICs, and the site's peers as many.
		return nil, fmt.Errorf("%w: the NICs the master lists for site %v do not match this peer's intra-site tier", ErrInvalid, hv.site)
	}
	return c.site.acquire(fabricGen{st.epoch, st.siteGen}, hv.site, nics, c.id)
}

// runHierarchical moves the data of a commenced collective over hierarchy hv and reports it to the
// master, as runOp does for the flat ring. segs are the collective's segments with this peer's WAN
// pieces of each (hierarchy.mySegments).
func (c *Communicator) runHierarchical(ctx context.Context, call uint64, ch chan reply, h *opHandle, st *opStart, hv hierarchy, segs []hierSegment, send, recv []byte, d Desc) error {
	what := fmt.Sprintf("pccl: allreduce tag %d seq %d", d.Tag, st.seq)
	// One stream per phase on the links: its tag (the collective's with marker bits flipped), its
	// sub-ring and its neighbours there.
	type phaseLink struct {
		tag        uint64
		ring       subRing
		next, prev uint64
	}
	fab, err := c.siteFabricFor(st, hv)
	if err != nil {
		return c.report(call, ch, d.Tag, &wire.Done{Code: codeOf(err), Detail: err.Error()}, what)
	}
	if fab != nil {
		defer c.site.release()
	}
	// Per segment: its site reduce-scatter (unless on the fabric), its WAN pieces, its site
	// all-gather (likewise). A site phase's segment index is flipped in as a piece's index is.
	var links []phaseLink
	for k, sg := range segs {
		if fab == nil {
			links = append(links, phaseLink{d.Tag ^ markSiteReduce ^ uint64(k)<<pieceShift, siteRing, hv.siteNext(), hv.sitePrev()})
		}
		for _, p := range sg.pieces {
			links = append(links, phaseLink{d.Tag ^ markWAN ^ uint64(p.index)<<pieceShift, wanRing, hv.next(p), hv.prev(p)})
		}
		if fab == nil {
			links = append(links, phaseLink{d.Tag ^ markSiteGather ^ uint64(k)<<pieceShift, siteRing, hv.siteNext(), hv.sitePrev()})
		}
	}
	streams := make([]*stream, 0, len(links))
	defer func() {
		for _, s := range streams {
			c.links.release(s)
		}
	}()
	for _, l := range links {
		s, err := c.links.subStream(l.tag, st.seq, st.epoch, l.ring, l.next, l.prev, h)
		if err != nil {
			return c.report(call, ch, d.Tag, &wire.Done{Code: wire.CodePeerLeft, Detail: err.Error()}, what)
		}
		streams = append(streams, s)
	}
	stop := context.AfterFunc(ctx, func() { h.abort(ctx.Err()) })
	defer stop()
	// The fabric's phases stop when the collective is aborted, by the caller, by the master or by a
	// broken link of another phase, and say why (sitePhase.Run).
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-h.aborted:
			cancel(h.cause)
		case <-rctx.Done():
		}
	}()

	reported := false
	var verdict error
	commit := func() error {
		reported = true
		// No link telemetry: the master attributes it to the flat ring's edges, which carried
		// nothing of this collective.
		verdict = c.report(call, ch, d.Tag, &wire.Done{Code: wire.CodeOK}, what)
		return verdict
	}
	// The streams, in the order of links.
	ps, next := make([]segStreams, len(segs)), 0
	take := func() rings.Stream { next++; return streams[next-1] }
	for k, sg := range segs {
		if fab == nil {
			ps[k].reduce = take()
		}
		for range sg.pieces {
			ps[k].wan = append(ps[k].wan, take())
		}
		if fab == nil {
			ps[k].gather = take()
		}
	}
	p := hv.plan(d.Count, d, c.cfg.PartBytes, c.site, fab, segs, ps)
	err = p.Execute(rctx, send, recv, commit)
	if fab != nil {
		c.site.account(fab)
	}
	if err == nil {
		return nil
	}
	if fab != nil {
		// Every peer of the site retires this generation: the master aborts the collective on all.
		c.site.retire()
	}
	if reported {
		if verdict != nil {
			return verdict
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	code := codeOf(err)
	if ctx.Err() != nil {
		code = wire.CodeAborted
	}
	done := &wire.Done{Code: code, Detail: err.Error()}
	for i, s := range streams {
		if l := s.silentLink(links[i].prev, links[i].next); l.Peer != 0 {
			done.Silent = l
			break
		}
	}
	if verr := c.report(call, ch, d.Tag, done, what); verr != nil {
		if ctx.Err() != nil {
			return errors.Join(verr, ctx.Err())
		}
		return verr
	}
	return fmt.Errorf("%s: %w", what, err)
}
