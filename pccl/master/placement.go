package master

import "slices"

// placeNewcomers inserts the newcomers ids into ring one after another, each where placeNewcomer
// would put it, and returns the new ring. It gives the same rings as calling placeNewcomer for each
// newcomer in turn, but in O(n) time per newcomer for a ring of n peers instead of the O(n²) of a full
// cost matrix: it keeps the cost of every link of the ring between insertions and looks up only the
// links to and from the newcomer. The ring may be modified.
func (m *Machine) placeNewcomers(ring []PeerID, ids []PeerID) []PeerID {
	if len(ids) == 0 {
		return ring
	}
	pl := placer{m: m, worst: m.worstCost(), ring: ring}
	for _, id := range pl.ring {
		pl.site = append(pl.site, m.siteOf(id))
		pl.count(id)
	}
	if len(pl.ring) >= 2 {
		pl.links()
	}
	for _, id := range ids {
		pl.place(id)
	}
	return pl.ring
}

// worstCost is the cost (seconds per byte) of the slowest measured link, or 1 when none was measured.
// It is what costMatrix prices unknown links from.
func (m *Machine) worstCost() float64 {
	worst := 0.0
	for _, bw := range m.bw {
		worst = max(worst, 1/bw)
	}
	if worst == 0 {
		worst = 1
	}
	return worst
}

func (m *Machine) siteOf(id PeerID) string {
	if p := m.peers[id]; p != nil {
		return p.hello.Site
	}
	return ""
}

// placer is the state of placeNewcomers: the ring so far and the cost and hop time of each of its
// links. It prices a link exactly as costMatrix and hopMatrix do.
type placer struct {
	m       *Machine
	worst   float64
	ring    []PeerID
	site    []string  // site[i] is the site of ring[i]
	cost    []float64 // cost[i] is the cost of the link ring[i] -> ring[i+1 mod n]
	hop     []float64 // hop[i] is the hop time of the same link
	to, fro []float64 // scratch: to[i] is the cost of ring[i] -> newcomer, fro[i] of newcomer -> ring[i]
	priced  int       // links of the ring that cost less than an unknown link between sites (10*worst)
	walled  int       // peers of the ring that cannot be dialled (behind NAT)
}

// count notes peer id joining the ring.
func (pl *placer) count(id PeerID) {
	if p := pl.m.peers[id]; p != nil && !p.inbound {
		pl.walled++
	}
}

// dialable reports whether others can dial peer id.
func (pl *placer) dialable(id PeerID) bool {
	p := pl.m.peers[id]
	return p == nil || p.inbound
}

// linkCost is costMatrix's entry for the link a -> b of peers at sites sa and sb.
func (pl *placer) linkCost(a, b PeerID, sa, sb string) float64 {
	reach := pl.m.reachPenalty(a, b)
	if bw := pl.m.bw[edge{a, b}]; bw > 0 {
		return pl.m.linkPenalty(a, b) * reach / bw
	}
	if sa != "" && sa == sb {
		return 5 * pl.worst * reach
	}
	return 10 * pl.worst * reach
}

// linkHop is hopMatrix's entry for the link a -> b of cost c.
func (pl *placer) linkHop(a, b PeerID, c float64) float64 {
	return c*hopPartBytes + pl.m.lat[edge{a, b}].Seconds()
}

// links prices every link of the ring.
func (pl *placer) links() {
	n := len(pl.ring)
	pl.cost, pl.hop = make([]float64, n), make([]float64, n)
	for i, a := range pl.ring {
		j := (i + 1) % n
		b := pl.ring[j]
		pl.cost[i] = pl.linkCost(a, b, pl.site[i], pl.site[j])
		pl.hop[i] = pl.linkHop(a, b, pl.cost[i])
		if pl.cost[i] != pl.unknown() {
			pl.priced++
		}
	}
}

// unknown is the cost of a link never measured between peers of different or unnamed sites: the
// highest cost there is.
func (pl *placer) unknown() float64 { return 10 * pl.worst }

// indifferent reports whether every position of the ring is as good as any other for newcomer id at
// site: nothing was measured, the newcomer names no site, every link of the ring is an unknown one,
// and no link to the newcomer would join two peers behind NAT, so that every insertion gives the same
// bottleneck and fill, and placeNewcomer appends.
func (pl *placer) indifferent(id PeerID, site string) bool {
	return len(pl.m.bw) == 0 && len(pl.m.lat) == 0 && site == "" && pl.priced == 0 &&
		(pl.walled == 0 || pl.dialable(id))
}

// place inserts id as placeNewcomer does: at the position atsp.InsertCheapest picks under the
// bottleneck objective if that ring beats appending by a margin worth it (rscore.better), else at the
// end. The sums run in the same order as atsp's, so the choice is the same to the last bit.
func (pl *placer) place(id PeerID) {
	site := pl.m.siteOf(id)
	defer pl.count(id)
	k := len(pl.ring)
	if k < 2 {
		pl.ring, pl.site = append(pl.ring, id), append(pl.site, site)
		if len(pl.ring) == 2 {
			pl.links()
		}
		return
	}
	if pl.indifferent(id, site) {
		// Append in O(1): the links to and from the newcomer are unknown ones too, so every link of
		// the ring stays unknown.
		u, last := pl.unknown(), k-1
		pl.cost[last], pl.hop[last] = u, pl.linkHop(pl.ring[last], id, u)
		pl.cost, pl.hop = append(pl.cost, u), append(pl.hop, pl.linkHop(id, pl.ring[0], u))
		pl.ring, pl.site = append(pl.ring, id), append(pl.site, site)
		return
	}
	pl.to, pl.fro = pl.to[:0], pl.fro[:0]
	for i, q := range pl.ring {
		pl.to = append(pl.to, pl.linkCost(q, id, pl.site[i], site))
		pl.fro = append(pl.fro, pl.linkCost(id, q, site, pl.site[i]))
	}

	// atsp.InsertCheapest: the bottleneck of the ring without one link, then the best position.
	top, second, topCount, total := 0.0, 0.0, 0, 0.0
	for _, c := range pl.cost {
		total += c
		switch {
		case topCount == 0 || c > top:
			second, top, topCount = top, c, 1
		case c == top:
			topCount++
		case c > second:
			second = c
		}
	}
	if topCount > 1 {
		second = top
	}
	at, bestB, bestT := -1, 0.0, 0.0
	for i, c := range pl.cost {
		rest := top
		if c == top && topCount == 1 {
			rest = second
		}
		succ := (i + 1) % k
		b := max(rest, pl.to[i], pl.fro[succ])
		t := total - c + pl.to[i] + pl.fro[succ]
		if at < 0 || b < bestB || (b == bestB && t < bestT) {
			at, bestB, bestT = i, b, t
		}
	}

	// The ring with the newcomer appended, and with it after position at, scored as ringScore does.
	last := k - 1
	if at != last && !pl.score(id, at).better(pl.score(id, last)) {
		at = last
	}
	pl.insert(id, site, at)
}

// score returns ringScore of the ring with id inserted after position at; the costs of the links to
// and from id are in pl.to and pl.fro. The tour starts at ring[0], as atsp.Evaluate's does.
func (pl *placer) score(id PeerID, at int) rscore {
	var s rscore
	first := true
	add := func(c, h float64) {
		if first || c > s.bottleneck {
			s.bottleneck = c
		}
		first = false
		s.fill += h
	}
	for i := range pl.ring {
		if i != at {
			add(pl.cost[i], pl.hop[i])
			continue
		}
		succ := (at + 1) % len(pl.ring)
		add(pl.to[at], pl.linkHop(pl.ring[at], id, pl.to[at]))
		add(pl.fro[succ], pl.linkHop(id, pl.ring[succ], pl.fro[succ]))
	}
	return s
}

// insert puts id at site after position at, and prices its two links.
func (pl *placer) insert(id PeerID, site string, at int) {
	succ := (at + 1) % len(pl.ring)
	in, out := pl.to[at], pl.fro[succ]
	if pl.cost[at] != pl.unknown() {
		pl.priced--
	}
	if in != pl.unknown() {
		pl.priced++
	}
	if out != pl.unknown() {
		pl.priced++
	}
	pl.cost[at], pl.hop[at] = in, pl.linkHop(pl.ring[at], id, in)
	pl.cost = slices.Insert(pl.cost, at+1, out)
	pl.hop = slices.Insert(pl.hop, at+1, pl.linkHop(id, pl.ring[succ], out))
	pl.ring = slices.Insert(pl.ring, at+1, id)
	pl.site = slices.Insert(pl.site, at+1, site)
}
