package master

import (
	"fmt"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// Links cut on the data path.
//
// A collective that failed because a link went silent past its progress deadline comes back with the
// link named in a Done (wire.Done.Silent). Both ends still reach the master, or their heartbeats and
// the gossip would declare them gone: what failed is the route between them, a black hole that the
// paths around it do not share. The master cuts that pair of peers, both directions, for
// LinkCutTimeout, and the next UpdateTopology wires a ring without it. A dial that fails between two
// accepted peers while a ring is wired is a cut too, and so is an accepted peer's first failed dial to
// a newcomer (cutUnreachable). Nobody is evicted for a cut while a ring without every cut pair
// exists; only when none does is the unreachable peer kicked, as before.
//
// A silence report is an inference. A link that stops starves every peer downstream in turn, and the
// first to report is usually the far end of the dead link, but not always: a receiver that still had
// bytes buffered from the dead link may starve after its successor does, and then the report names
// a healthy link. A dial that fails is direct evidence. So when the cuts leave no ring after a dial
// failed, the master gives up the inferred cuts in its way, once per link: the link is doubted for
// LinkCutTimeout, and a second silence report of a doubted link confirms its cut.

// linkCut is a cut link: until when, and whether it was inferred from a silence report and not
// confirmed since.
type linkCut struct {
	until    time.Time
	inferred bool
}

// pairOf returns the undirected key of the link between a and b.
func pairOf(a, b PeerID) edge {
	if a > b {
		a, b = b, a
	}
	return edge{a, b}
}

// cut removes the link between a and b from the rings of their group for LinkCutTimeout, as a silence
// report inferred. The ring in force is marked dirty, so the next UpdateTopology re-wires even when
// nobody joined or left.
func (m *Machine) cut(g *group, a, b PeerID, why string) {
	pa, pb := m.peers[a], m.peers[b]
	if a == b || pa == nil || pb == nil || pa.group != g || pb.group != g {
		return // a departed peer's links need no cut
	}
	k := pairOf(a, b)
	confirmed, had := m.isDoubted(k), m.isCut(a, b)
	if !had {
		m.counters.LinksCut++
		if confirmed {
			why += "; silent again after its cut was given up, so the cut is confirmed"
		}
		m.gnote(g, "link-cut", a, "link %d-%d avoided for %v: %s", a, b, m.cfg.LinkCutTimeout, why)
	}
	// A cut a dial failure or a second report confirmed stays confirmed.
	inferred := !confirmed && (!had || m.cuts[k].inferred)
	m.cuts[k] = linkCut{until: m.now.Add(m.cfg.LinkCutTimeout), inferred: inferred}
	g.ringDirty = true
}

// isCut reports whether the link between a and b is cut now, forgetting an expired cut.
func (m *Machine) isCut(a, b PeerID) bool {
	k := pairOf(a, b)
	c, ok := m.cuts[k]
	if !ok {
		return false
	}
	if !m.now.Before(c.until) {
		delete(m.cuts, k)
		return false
	}
	return true
}

// isDoubted reports whether the inferred cut of link k was given up less than LinkCutTimeout ago.
func (m *Machine) isDoubted(k edge) bool {
	until, ok := m.doubted[k]
	if ok && !m.now.Before(until) {
		delete(m.doubted, k)
		return false
	}
	return ok
}

// forgetCuts drops the cuts of a departed peer.
func (m *Machine) forgetCuts(id PeerID) {
	for k := range m.cuts {
		if k.from == id || k.to == id {
			delete(m.cuts, k)
		}
	}
	for k := range m.doubted {
		if k.from == id || k.to == id {
			delete(m.doubted, k)
		}
	}
}

// silentLink takes in p's report that its link to or from q went silent during a collective.
func (m *Machine) silentLink(g *group, p PeerID, l wire.LinkRef) {
	from, to := p, PeerID(l.Peer)
	if l.Dir == wire.LinkIn {
		from, to = to, from
	}
	m.cut(g, from, to, fmt.Sprintf("link %d→%d went silent during a collective (reported by %d)", from, to, p))
}

// hasCut reports whether ring uses a cut link.
func (m *Machine) hasCut(ring []PeerID) bool {
	if len(ring) < 2 || len(m.cuts) == 0 {
		return false
	}
	for i, a := range ring {
		if m.isCut(a, ring[(i+1)%len(ring)]) {
			return true
		}
	}
	return false
}

// avoidCuts returns ring, or a ring of the same peers that uses no cut link when ring does; the result
// keeps as many of ring's links as the search finds (each peer's old successor is tried first). When
// no such ring is found it returns ring unchanged, and the cut link is tried again.
func (m *Machine) avoidCuts(g *group, ring []PeerID) []PeerID {
	if !m.hasCut(ring) {
		return ring
	}
	out := ringAvoiding(ring, m.isCut, 64*len(ring)+1024)
	if out == nil {
		m.gnote(g, "ring", 0, "no ring of %d peers avoids the cut links; keeping %v", len(ring), ring)
		return ring
	}
	m.gnote(g, "ring", 0, "ring %v avoids the cut links of %v", out, ring)
	return out
}

// ringAvoiding searches, depth first, for an order of ring's peers in which no two neighbours (the
// last and the first included) are cut. From each peer it tries the peer's successor in ring first,
// then the others in ring order, so a ring with one cut link changes by a few links only. budget
// bounds the candidates examined; nil means none was found within it.
func ringAvoiding(ring []PeerID, cut func(a, b PeerID) bool, budget int) []PeerID {
	n := len(ring)
	if n < 2 {
		return ring
	}
	path := make([]int, 1, n) // positions in ring; the path starts at position 0
	tried := make([]int, n)   // per depth, the offset from the position at that depth tried last
	used := make([]bool, n)
	used[0] = true
	for len(path) > 0 {
		d := len(path) - 1
		u := path[d]
		if d == n-1 {
			if !cut(ring[u], ring[path[0]]) {
				out := make([]PeerID, n)
				for i, pos := range path {
					out[i] = ring[pos]
				}
				return out
			}
			used[u] = false
			path = path[:d]
			continue
		}
		next := -1
		for tried[d]++; tried[d] < n; tried[d]++ {
			if budget--; budget < 0 {
				return nil
			}
			v := (u + tried[d]) % n
			if !used[v] && !cut(ring[u], ring[v]) {
				next = v
				break
			}
		}
		if next < 0 {
			used[u] = false
			path = path[:d]
			continue
		}
		used[next] = true
		path = append(path, next)
		tried[d+1] = 0
	}
	return nil
}

// cutUnreachable handles a wiring round in which some members could not open their link to their
// successor. When every failure is an accepted peer's dial to an accepted peer, or to a newcomer not
// yet placed again, and a ring without those links (and every other cut) exists, the links are cut
// and the round is restarted on that ring, and it returns true; otherwise nothing is cut and the
// caller evicts the unreachable as before.
//
// A newcomer gets that second placement once. Its address may be reachable from some hosts and not
// from others (a private network that only part of the group shares), and then another predecessor
// can dial it; an address nobody can reach costs the group one more wiring round before the
// newcomer is evicted with the line that names the address.
func (m *Machine) cutUnreachable(g *group, r *round) bool {
	type failure struct {
		from, to PeerID
		detail   string
	}
	var fails []failure
	for _, id := range r.ring {
		rep := r.reported[id]
		if rep.OK {
			continue
		}
		if len(rep.Failed) == 0 {
			return false
		}
		to := PeerID(rep.Failed[0])
		p, q := m.peers[id], m.peers[to]
		if p == nil || q == nil || p.group != g || q.group != g || p.state != Accepted ||
			q.state != Accepted && q.placedAgain {
			return false
		}
		fails = append(fails, failure{id, to, rep.Detail})
	}
	if len(fails) == 0 {
		return false
	}
	// Search with the failed links counted as cut; they are recorded only if a ring avoids them.
	failed := make(map[edge]bool, len(fails))
	for _, f := range fails {
		failed[pairOf(f.from, f.to)] = true
	}
	ring := ringAvoiding(r.ring, func(a, b PeerID) bool { return failed[pairOf(a, b)] || m.isCut(a, b) },
		64*len(r.ring)+1024)
	if ring == nil {
		// The inferred cuts may be what is in the way: a ring that avoids the failed links and the
		// confirmed cuts gives them up (see the top of this file).
		ring = ringAvoiding(r.ring, func(a, b PeerID) bool {
			return failed[pairOf(a, b)] || m.isCut(a, b) && !m.cuts[pairOf(a, b)].inferred
		}, 64*len(r.ring)+1024)
		if ring == nil {
			return false // no ring without them: the caller evicts
		}
		for i, a := range ring {
			b := ring[(i+1)%len(ring)]
			if k := pairOf(a, b); m.isCut(a, b) {
				delete(m.cuts, k)
				m.doubted[k] = m.now.Add(m.cfg.LinkCutTimeout)
				m.gnote(g, "link-cut", k.from, "the cut of link %d-%d, inferred from a silence report, is given up: a dial failure leaves no ring around it", k.from, k.to)
			}
		}
	}
	for _, f := range fails {
		if q := m.peers[f.to]; q.state != Accepted {
			q.placedAgain = true
		}
		m.cuts[pairOf(f.from, f.to)] = linkCut{until: m.now.Add(m.cfg.LinkCutTimeout)}
		m.counters.LinksCut++
		m.gnote(g, "link-cut", f.from, "link %d-%d avoided for %v: %d could not reach %d while wiring",
			f.from, f.to, m.cfg.LinkCutTimeout, f.from, f.to)
		m.send(f.to, &wire.Notice{Text: m.unreachable(f.from, f.to, f.detail) + "; the ring goes around that link meanwhile"})
	}
	m.gnote(g, "ring", 0, "epoch %d: ring %v avoids the unreachable links of %v", r.epoch, ring, r.ring)
	r.ring = slices.Clone(ring)
	m.restartRound(g)
	return true
}
