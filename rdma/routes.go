package rdma

import (
	"math"
	"slices"

	"github.com/concord-ccl/concord/rdma/plan"
)

// piece is a fraction [lo, hi) of every block of one ring channel, carried by NIC nic[u] at node u,
// or, on a link of a plan that splits its links over rails (plan.Part.LinkRails), by NIC link[u, v].
type piece struct {
	lo, hi float64
	nic    map[int]NICID
	link   map[[2]int]NICID
}

// routeNICs returns node u's routes of channel c as cumulative fractions and their NICs.
func (x *planExecutor) routeNICs(u, c int) (cuts []float64, nics []NICID) {
	var total int64
	for _, r := range x.p.Routes[u] {
		if r.Channel == c {
			total += r.Bytes
		}
	}
	var acc int64
	for _, r := range x.p.Routes[u] {
		if r.Channel == c && r.Bytes > 0 {
			acc += r.Bytes
			cuts = append(cuts, float64(acc)/float64(total))
			nics = append(nics, NICID(r.NIC))
		}
	}
	if len(cuts) == 0 {
		return []float64{1}, []NICID{NICID(c)}
	}
	cuts[len(cuts)-1] = 1
	return cuts, nics
}

// pieces cuts channel c of part k's ring and leaves at every node's route boundaries and, where the
// part splits its links over rails, at every link's rail boundaries. Every channel of such a part
// splits each link's bytes the same way, so each link's rails carry the plan's shares of the part.
func (x *planExecutor) pieces(k, c int) []piece {
	pt := x.p.Parts[k]
	nodes := append(slices.Clone(pt.Ring), pt.Leaves...)
	bounds := []float64{0, 1}
	for _, u := range nodes {
		cuts, _ := x.routeNICs(u, c)
		bounds = append(bounds, cuts...)
	}
	links := x.linkRails(k)
	for _, l := range links {
		bounds = append(bounds, l.cuts...)
	}
	slices.Sort(bounds)
	bounds = slices.Compact(bounds)
	var out []piece
	for i := 0; i+1 < len(bounds); i++ {
		p := piece{lo: bounds[i], hi: bounds[i+1], nic: map[int]NICID{}}
		mid := (p.lo + p.hi) / 2
		for _, u := range nodes {
			cuts, nics := x.routeNICs(u, c)
			at, _ := slices.BinarySearch(cuts, mid)
			p.nic[u] = nics[min(at, len(nics)-1)]
		}
		if len(links) > 0 {
			p.link = map[[2]int]NICID{}
			for e, l := range links {
				at, _ := slices.BinarySearch(l.cuts, mid)
				p.link[e] = l.nics[min(at, len(l.nics)-1)]
			}
		}
		out = append(out, p)
	}
	return out
}

// railSplit is one link's split over NIC pairs: NIC pair nics[i] carries the fraction of every
// piece from cuts[i−1] (0 for the first) to cuts[i].
type railSplit struct {
	cuts []float64
	nics []NICID
}

// minRailShare is the smallest fraction of a link's bytes given a rail of its own: every channel of
// the ring is cut at each link's rail boundaries, and a sliver is not worth a cut (the link's other
// rails take it).
const minRailShare = 1.0 / 64

// linkRails returns the rail split of every link of part k's ring that the plan gives one
// (plan.Part.LinkRails), keyed by (from, to); nil when it gives none. A rail's NIC pair is the lowest
// NIC index on that rail healthy at both ends; a rail without one, or with less than minRailShare, is
// left out, and a link left with no rail is not split (pathNIC routes it).
func (x *planExecutor) linkRails(k int) map[[2]int]railSplit {
	pt := x.p.Parts[k]
	if len(pt.LinkRails) != len(pt.Ring) || len(pt.Ring) < 2 {
		return nil
	}
	out := map[[2]int]railSplit{}
	for p, u := range pt.Ring {
		v := pt.Ring[(p+1)%len(pt.Ring)]
		var l railSplit
		acc := 0.0
		for _, rs := range pt.LinkRails[p] {
			if j, ok := x.railNIC(u, v, rs.Rail); ok && rs.Share >= minRailShare {
				acc += rs.Share
				l.nics = append(l.nics, j)
				l.cuts = append(l.cuts, acc)
			}
		}
		if len(l.nics) == 0 {
			continue
		}
		for i := range l.cuts {
			l.cuts[i] /= acc
		}
		l.cuts[len(l.cuts)-1] = 1
		out[[2]int{u, v}] = l
	}
	return out
}

// railNIC returns the lowest NIC index on rail whose NIC is healthy at both u and v.
func (x *planExecutor) railNIC(u, v, rail int) (NICID, bool) {
	a, b := x.topo.Nodes[u].NICs, x.topo.Nodes[v].NICs
	for j := range a {
		if j < len(b) && a[j].Rail == rail && b[j].Rail == rail && !a[j].Down && !b[j].Down {
			return NICID(j), true
		}
	}
	return 0, false
}

// partPieces returns, per part and channel, the pieces of the part's ring and leaves (pieces). They
// depend on the plan's routes and link rails only, so they are cut once per plan.
func (x *planExecutor) partPieces() [][][]piece {
	if x.cuts == nil {
		x.cuts = make([][][]piece, len(x.p.Parts))
		for k := range x.p.Parts {
			for c := range x.n.nics {
				x.cuts[k] = append(x.cuts[k], x.pieces(k, c))
			}
		}
	}
	return x.cuts
}

// pathNIC returns the NIC pair index a piece of channel c uses from node u to node v: the link's rail
// for the piece where the plan splits the link over rails; otherwise the NIC of the end whose route
// is not the channel's own, unless that rail is down at the other end; then one of the rails healthy
// at both ends, if there is one.
func (x *planExecutor) pathNIC(p piece, c, u, v int) NICID {
	if j, ok := p.link[[2]int{u, v}]; ok {
		return j
	}
	j := p.nic[v]
	if p.nic[u] != NICID(c) {
		j = p.nic[u]
	}
	up := func(j NICID) bool {
		return !x.topo.Nodes[u].NICs[j].Down && !x.topo.Nodes[v].NICs[j].Down
	}
	if up(j) {
		return j
	}
	var common []NICID
	for k := range x.topo.Nodes[u].NICs {
		if up(NICID(k)) {
			common = append(common, NICID(k))
		}
	}
	if len(common) == 0 {
		return j
	}
	// Spread the pieces that need another rail over the common ones, by where the piece lies.
	return common[min(int((p.lo+p.hi)/2*float64(len(common))), len(common)-1)]
}

// cut returns the element range [lo, hi) of piece p within a block of n elements.
func (p piece) cut(n int) (int, int) {
	at := func(f float64) int { return int(math.Floor(f*float64(n) + 0.5)) }
	return at(p.lo), at(p.hi)
}

// hotRepairRoutes returns, per node, the standard ring's routes with each failed NIC's channel moved
// whole to its backup: the nearest healthy NIC by the fabric's distance, ties to the lower index.
func hotRepairRoutes(t plan.Topology, nics []NIC) [][]plan.Route {
	out := make([][]plan.Route, len(t.Nodes))
	for u, node := range t.Nodes {
		for c := range node.NICs {
			j := c
			if node.NICs[c].Down {
				j = -1
				for k, nic := range node.NICs {
					if nic.Down {
						continue
					}
					d := abs(nics[k].Distance - nics[c].Distance)
					if j < 0 || d < abs(nics[j].Distance-nics[c].Distance) {
						j = k
					}
				}
			}
			out[u] = append(out[u], plan.Route{Channel: c, NIC: max(j, 0), Bytes: 1})
		}
	}
	return out
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// RoutesFor returns the per-node channel routes the Node uses for strategy st on topology t (one
// channel per NIC), as fractions expressed in bytes of a notional message. It is pure, and safe for
// concurrent use.
func RoutesFor(t plan.Topology, st plan.Strategy, nics []NIC) [][]plan.Route {
	if st == plan.Ring || st == plan.HotRepair {
		return hotRepairRoutes(t, nics)
	}
	out := make([][]plan.Route, len(t.Nodes))
	for u, nd := range t.Nodes {
		out[u] = plan.BalanceRoutes(nd, len(nd.NICs), 1<<30, 1)
	}
	return out
}
