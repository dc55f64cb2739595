package links

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"

	"github.com/concord-ccl/concord/internal/wire"
)

// subPool is the pool of connections to this peer's successor in a sub-ring.
type subPool struct {
	next uint64
	out  []*outConn
}

// hierLinks is the state the links keep for hierarchical collectives. Guarded by Links.mu.
type hierLinks struct {
	sites map[uint64]string   // every peer's announced site, from the master's Connect
	nics  map[uint64][]string // every peer's announced NICs, likewise
	cur   Hierarchy           // the hierarchy of the last wired ring
	ok    bool                // cur is hierarchical
	site  subPool             // to the successor in the site ring
	wan   []subPool           // to each WAN partner in the next site (Hierarchy.WANNext)
}

// expects reports whether from is a predecessor of this peer in a sub-ring of the wired ring, whose
// incoming connections are kept.
func (hl *hierLinks) expects(from uint64) bool {
	return hl.ok && (hl.cur.SitePrev() == from || slices.Contains(hl.cur.WANPrev, from))
}

// closeAll closes every sub-ring connection (Links.mu held).
func (hl *hierLinks) closeAll() {
	for _, p := range append([]subPool{hl.site}, hl.wan...) {
		for _, oc := range p.out {
			oc.close()
		}
	}
	hl.site, hl.wan = subPool{}, nil
}

// install makes pools[0] the site ring's pool and the others the WAN pools, leaving out empty ones
// (Links.mu held).
func (hl *hierLinks) install(pools []subPool) {
	hl.site = pools[0]
	hl.wan = slices.DeleteFunc(slices.Clone(pools[1:]), func(p subPool) bool { return p.next == 0 })
}

// wireHier records the sites of the ring in m and opens the sub-ring pools of its hierarchy, keeping
// those that already lead to the right successor unless a link broke. It runs before the flat ring is
// wired, so that the predecessors it expects keep their incoming connections. On failure it returns
// the peers it could not reach.
func (l *Links) wireHier(m *wire.Connect) ([]uint64, error) {
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
	h, ok := Derive(ring, func(id uint64) string { return sites[id] }, l.cfg.Self)
	l.hier.cur, l.hier.ok = h, ok
	redial := l.isDirty
	// The pools to keep: one to the site ring's successor, one to each WAN partner.
	var want []uint64
	if ok {
		want = append([]uint64{h.SiteNext()}, h.WANNext...)
	}
	current := append([]subPool{l.hier.site}, l.hier.wan...)
	kept := make([]subPool, len(want))
	var stale []*outConn
	for j, p := range current {
		i := -1
		r := WANRing
		if j == 0 {
			r = SiteRing
		}
		if p.next != 0 && !redial && len(p.out) == SubPoolSize(h, l.cfg.PoolSize, r) {
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
	if ok && EverySiteReady(h.Sites, l.hier.nics) {
		fabricNICs = make(map[uint64][]string, len(h.Site))
		for _, id := range h.Site {
			fabricNICs[id] = l.hier.nics[id]
		}
	}
	l.mu.Unlock()
	for _, oc := range stale {
		oc.close()
	}
	// A fabric of an earlier epoch serves no collective of this one, and one of this epoch may be
	// opened now (Config.OnWire).
	var fabricSite []uint64
	if fabricNICs != nil {
		fabricSite = h.Site
	}
	l.cfg.OnWire(m.Epoch, fabricSite, fabricNICs)
	if !ok {
		return nil, nil
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
		r := WANRing
		if i == 0 {
			r = SiteRing
		}
		wg.Go(func() {
			conns, k, err := l.dialPool(addr[next], r.base(), SubPoolSize(h, l.cfg.PoolSize, r))
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

// HierarchyFor returns the hierarchy of ring, with EverySite set, if the sites of the wired rings make
// it hierarchical.
func (l *Links) HierarchyFor(ring []uint64) (Hierarchy, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.hier.sites == nil {
		return Hierarchy{}, false
	}
	sites := l.hier.sites
	h, ok := Derive(ring, func(id uint64) string { return sites[id] }, l.cfg.Self)
	if !ok {
		return h, false
	}
	h.EverySite = EverySiteReady(h.Sites, l.hier.nics)
	return h, true
}

// SiteNICs returns the NICs the peers of site announced in the wired rings.
func (l *Links) SiteNICs(site []uint64) map[uint64][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[uint64][]string, len(site))
	for _, id := range site {
		out[id] = l.hier.nics[id]
	}
	return out
}

// SubStream opens the stream of one phase of collective op on sub-ring r, to successor next and from
// predecessor prev. The caller releases it when the collective is over.
func (l *Links) SubStream(op Op, r SubRing, next, prev uint64) (*Stream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	pools := l.hier.wan
	if r == SiteRing {
		pools = []subPool{l.hier.site}
	}
	i := slices.IndexFunc(pools, func(p subPool) bool { return p.next == next && len(p.out) > 0 })
	if i < 0 {
		l.isDirty = true
		return nil, fmt.Errorf("%w: no link to peer %d in the %s ring", ErrPeerLeft, next, r)
	}
	return l.openStream(op, pools[i].out, prev, r.base(), SubPoolSize(l.hier.cur, l.cfg.PoolSize, r)), nil
}

// OneSite reports whether the peers of ring all announced one site, and NICs the fabric can run on.
func (l *Links) OneSite(ring []uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(ring) < 2 || l.hier.sites == nil {
		return false
	}
	site := l.hier.sites[ring[0]]
	for _, id := range ring {
		if s, ok := l.hier.sites[id]; !ok || s != site {
			return false
		}
	}
	return site != "" && FabricReady(ring, l.hier.nics)
}
