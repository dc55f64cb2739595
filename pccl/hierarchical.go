package pccl

// The hierarchical AllReduce. When the peers of a ring share sites, AllReduce runs as one plan of
// three ring phases on a staging buffer under one commit:
//
//	reduce-scatter among the peers of this peer's site (the site ring), whole buffer, unfinalized;
//	all-reduce of this peer's shard across sites (the WAN ring: the peers with the same site rank,
//	        one per site), finalized once by the total peer count;
//	all-gather among the peers of the site, whole buffer.
//
// Each site ring and each WAN ring has its own connections, opened by the links next to the flat
// ring's when the master wires an epoch. The hierarchy is derived from the master's Connect (the ring
// of the epoch and the site each peer announced), so every peer of an epoch computes the same one, and
// a peer's death leaves its site ring and its WAN ring in the one membership change that removes it
// from the ring. When the peers of every site run the intra-site tier (Config.NICs) and the master
// commenced the collective alone, the two site phases run on the rdma fabric instead of the site
// rings' links (sitetier.go), and the WAN ring reduces the fabric's block of this peer.

import (
	"context"
	"errors"
	"fmt"
	"slices"

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
)

// hierarchy is one peer's place in the hierarchical AllReduce of a ring.
type hierarchy struct {
	site, wan []uint64 // the site ring and the WAN ring, each in order
	siteRank  int      // position in site
	wanRank   int      // position in wan
	world     int      // total peer count
	// everySite says every site's peers announced NICs the fabric can run on (fabricReady). The WAN
	// rings pair shards that each site's phases define, and the fabric's blocks are not the site
	// ring's, so the site phases run on the fabric in every site or in none.
	everySite bool
}

// deriveHierarchy computes the hierarchy of peer me in ring, given each peer's site. Sites are ordered
// by their first peer in ring order and the peers of a site keep their ring order, so every peer
// derives the same hierarchy from the same view. It returns false, meaning the flat ring, when there
// are fewer than two sites, when every site is a single peer, or when sites differ in size (the WAN
// rings pair peers by site rank).
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
	per := len(members[names[0]])
	if per < 2 {
		return hierarchy{}, false
	}
	for _, s := range names {
		if len(members[s]) != per {
			return hierarchy{}, false
		}
	}
	h := hierarchy{world: len(ring)}
	h.site = members[site(me)]
	h.siteRank = slices.Index(h.site, me)
	for i, s := range names {
		h.wan = append(h.wan, members[s][h.siteRank])
		if s == site(me) {
			h.wanRank = i
		}
	}
	return h, true
}

// next and prev return the successor and predecessor of this peer in sub-ring r.
func (h hierarchy) next(r subRing) uint64 {
	ring, i := h.ring(r)
	return ring[(i+1)%len(ring)]
}

func (h hierarchy) prev(r subRing) uint64 {
	ring, i := h.ring(r)
	return ring[(i+len(ring)-1)%len(ring)]
}

func (h hierarchy) ring(r subRing) ([]uint64, int) {
	if r == siteRing {
		return h.site, h.siteRank
	}
	return h.wan, h.wanRank
}

// fabricPlan builds the three phases over count elements of d.DType with the site phases on the
// intra-site fabric f: the WAN ring reduces this peer's block of the fabric's equal blocks.
func (h hierarchy) fabricPlan(count int, d Desc, partBytes int, t *siteTier, f *siteFabric, wan rings.Stream) rings.Plan {
	size := d.DType.Size()
	shard := siteShard(count, h.siteRank, len(h.site))
	op := d.Op
	if op == rings.Avg {
		op = rings.Sum // unfinalized inside the site: the WAN ring divides by the total peer count
	}
	return rings.Plan{DType: d.DType, Op: d.Op, PartBytes: partBytes, Phases: []rings.Phase{
		{Kind: rings.KindExternal, Runner: &sitePhase{t: t, f: f, dt: d.DType, op: op, count: count},
			Rank: h.siteRank, World: len(h.site), Len: count * size},
		h.wanPhase(wan, shard, d),
		{Kind: rings.KindExternal, Runner: &sitePhase{t: t, f: f, gather: true, dt: d.DType, op: op, count: count},
			Rank: h.siteRank, World: len(h.site), Len: count * size},
	}}
}

// plan builds the three phases over count elements of d.DType.
func (h hierarchy) plan(count int, d Desc, partBytes int, site1, wan, site2 rings.Stream) rings.Plan {
	size := d.DType.Size()
	shard := rings.Shard(count, h.siteRank, len(h.site))
	return rings.Plan{DType: d.DType, Op: d.Op, PartBytes: partBytes, Phases: []rings.Phase{
		{Kind: rings.KindReduceScatter, Stream: site1, Rank: h.siteRank, World: len(h.site),
			Len: count * size, Divisor: rings.NoFinalize},
		h.wanPhase(wan, shard, d),
		{Kind: rings.KindAllGather, Stream: site2, Rank: h.siteRank, World: len(h.site),
			Len: count * size, Divisor: rings.DivideByWorld},
	}}
}

// wanPhase is the all-reduce of shard (in elements) across sites on the WAN ring, finalized once by the
// total peer count.
func (h hierarchy) wanPhase(wan rings.Stream, shard rings.Span, d Desc) rings.Phase {
	size := d.DType.Size()
	return rings.Phase{Kind: rings.KindAllReduce, Stream: wan, Rank: h.wanRank, World: len(h.wan),
		Off: shard.Off * size, Len: shard.Len * size, Divisor: rings.Divisor(h.world), Quant: d.Quant}
}

// subPool is the pool of connections to this peer's successor in one sub-ring.
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
	pools [numSubRings]subPool
}

// expects reports whether from is a predecessor of this peer in a sub-ring of the wired ring, whose
// incoming connections are kept.
func (hl *hierLinks) expects(from uint64) bool {
	return hl.ok && (hl.cur.prev(siteRing) == from || hl.cur.prev(wanRing) == from)
}

// closeAll closes every sub-ring connection (links.mu held).
func (hl *hierLinks) closeAll() {
	for r := range hl.pools {
		for _, oc := range hl.pools[r].out {
			oc.close()
		}
		hl.pools[r] = subPool{}
	}
}

// hierPoolSize is the number of connections per sub-ring successor.
func (l *links) hierPoolSize() int { return min(l.c.cfg.PoolSize, hierPoolMax) }

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
	var stale []*outConn
	var want [numSubRings]uint64
	for r := range numSubRings {
		if ok {
			want[r] = h.next(r)
		}
		p := &l.hier.pools[r]
		if p.next != want[r] || redial || len(p.out) != l.hierPoolSize() {
			stale = append(stale, p.out...)
			*p = subPool{}
		}
	}
	pools := l.hier.pools
	l.mu.Unlock()
	for _, oc := range stale {
		oc.close()
	}
	// A fabric of an earlier epoch serves no collective of this one: close its sockets now rather than
	// at the next hierarchical collective, which may never come.
	l.c.site.retireBefore(m.Epoch)
	if !ok {
		return nil, nil
	}
	addr := map[uint64]wire.PeerInfo{}
	for _, p := range m.Ring {
		addr[p.ID] = p
	}
	for r := range numSubRings {
		if pools[r].next != 0 {
			continue
		}
		to := addr[want[r]]
		pool := make([]*outConn, 0, l.hierPoolSize())
		for k := range l.hierPoolSize() {
			conn, err := l.dial(to, r.base()+k)
			if err != nil {
				for _, oc := range pool {
					oc.close()
				}
				return []uint64{to.ID}, fmt.Errorf("sub-ring link %d to peer %d at %s: %w", k, to.ID, to.Addr, err)
			}
			pool = append(pool, l.newOutConn(conn))
		}
		l.mu.Lock()
		if l.isClosed {
			l.mu.Unlock()
			for _, oc := range pool {
				oc.close()
			}
			return nil, ErrClosed
		}
		l.hier.pools[r] = subPool{next: to.ID, out: pool}
		l.mu.Unlock()
	}
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
	members := map[string][]uint64{}
	for _, id := range ring {
		members[sites[id]] = append(members[sites[id]], id)
	}
	h.everySite = true
	for _, site := range members {
		h.everySite = h.everySite && fabricReady(site, l.hier.nics)
	}
	return h, true
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

// subStream opens the stream of one phase of collective (tag, seq) on sub-ring r of hierarchy h.
func (l *links) subStream(tag, seq, epoch uint64, h hierarchy, r subRing, h2 *opHandle) (*stream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.hier.pools[r]
	if len(p.out) == 0 || p.next != h.next(r) {
		l.isDirty = true
		return nil, fmt.Errorf("%w: no link to the successor in the %s ring", ErrPeerLeft, r)
	}
	return l.openStream(inboxKey{tag, seq}, epoch, p.out, h.prev(r), r.base(), l.hierPoolSize(), h2), nil
}

func (r subRing) String() string {
	if r == siteRing {
		return "site"
	}
	return "WAN"
}

// siteFabricFor returns the intra-site fabric the site phases of collective st run on, with the tier
// locked for it, or nil when they run on the site ring's links: the tier is off, the collective does
// not run alone, the epoch aborted too many, or a peer of some site lacks the NICs (sitetier.go).
func (c *Communicator) siteFabricFor(st *opStart, hv hierarchy) (*siteFabric, error) {
	if c.site == nil || !st.alone || st.siteOff || !hv.everySite {
		return nil, nil
	}
	nics := c.links.siteNICs(hv.site)
	if !c.site.usable(hv.site, nics) {
		return nil, nil
	}
	return c.site.acquire(fabricGen{st.epoch, st.siteGen}, hv.site, nics, c.id)
}

// runHierarchical moves the data of a commenced collective over hierarchy hv and reports it to the
// master, as runOp does for the flat ring.
func (c *Communicator) runHierarchical(ctx context.Context, call uint64, ch chan reply, h *opHandle, st *opStart, hv hierarchy, send, recv []byte, d Desc) error {
	what := fmt.Sprintf("pccl: allreduce tag %d seq %d", d.Tag, st.seq)
	type mark struct {
		mark uint64
		ring subRing
	}
	marks := []mark{{markSiteReduce, siteRing}, {markWAN, wanRing}, {markSiteGather, siteRing}}
	fab, err := c.siteFabricFor(st, hv)
	if err != nil {
		return c.report(call, ch, d.Tag, &wire.Done{Code: codeOf(err), Detail: err.Error()}, what)
	}
	if fab != nil {
		// The site phases run on the intra-site fabric; only the WAN ring needs a stream.
		defer c.site.release()
		marks = []mark{{markWAN, wanRing}}
	}
	streams := make([]*stream, 0, len(marks))
	defer func() {
		for _, s := range streams {
			c.links.release(s)
		}
	}()
	for _, m := range marks {
		s, err := c.links.subStream(d.Tag^m.mark, st.seq, st.epoch, hv, m.ring, h)
		if err != nil {
			return c.report(call, ch, d.Tag, &wire.Done{Code: wire.CodePeerLeft, Detail: err.Error()}, what)
		}
		streams = append(streams, s)
	}
	stop := context.AfterFunc(ctx, func() { h.abort(ctx.Err()) })
	defer stop()
	// The fabric's phases stop when the collective is aborted, by the caller or by the master.
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-h.aborted:
			cancel()
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
	var p rings.Plan
	if fab != nil {
		p = hv.fabricPlan(d.Count, d, c.cfg.PartBytes, c.site, fab, streams[0])
	} else {
		p = hv.plan(d.Count, d, c.cfg.PartBytes, streams[0], streams[1], streams[2])
	}
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
		if l := s.silentLink(hv.prev(marks[i].ring), hv.next(marks[i].ring)); l.Peer != 0 {
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
