package plan

import (
	"cmp"
	"fmt"
	"slices"
)

// Path says how a channel's bytes reach the NIC that sends them.
type Path int

const (
	// Native: the channel's own NIC.
	Native Path = iota
	// PCIe: a NIC on the same PCIe switch.
	PCIe
	// NUMALocal: a NIC in the same NUMA domain, through the PCIe root complex.
	NUMALocal
	// CPULink: a NIC in another NUMA domain, across the CPU link (or relayed over NVLink by a GPU next
	// to that NIC).
	CPULink
)

// String returns the path's name.
func (p Path) String() string {
	switch p {
	case Native:
		return "native"
	case PCIe:
		return "pcie"
	case NUMALocal:
		return "numa"
	case CPULink:
		return "cpu_link"
	}
	return fmt.Sprintf("path(%d)", int(p))
}

// Route is one piece of a node's channel traffic assigned to a NIC.
type Route struct {
	// Channel is the GPU channel whose bytes these are (channel c natively uses NIC c).
	Channel int
	// NIC is the local NIC that sends them.
	NIC int
	// Bytes counts message bytes: the executor scales them by the ring's volume factor.
	Bytes int64
	// Path is how the bytes get from the channel's GPU to the NIC.
	Path Path
}

// Part is one contiguous byte range of the message and the ring that reduces it.
type Part struct {
	// Offset and Bytes delimit the part within the message.
	Offset, Bytes int64
	// Ring lists the nodes running a ring AllReduce on the part, in ring order.
	Ring []int
	// Owners gives, in Ring order, the bytes of the part each ring node owns in the reduce-scatter
	// (and finalizes); they sum to Bytes.
	Owners []int64
	// Leaves lists nodes outside Ring that send their input for the part to its owners and receive
	// the finished bytes from them (OptCC).
	Leaves []int
	// BroadcastTo lists nodes outside Ring that receive the part's result by pipelined broadcast after
	// the reduction (R²CCL-AllReduce, recursive); their own input for the part is reduced into it by
	// their ring neighbour first. It is in dependency order: faster nodes first (they forward to the
	// slower ones), ties by node index.
	BroadcastTo []int
	// LinkRails gives, in Ring order, how the bytes of the link from each ring node to the next spread
	// over rails (Estimate.LinkRails); nil means by the routes.
	LinkRails [][]RailShare
}

// Plan is a chosen schedule with everything an executor needs: the parts, their rings and owners,
// and each node's channel-to-NIC routes. Byte counts are exact: parts sum to Bytes, owners to their
// part, and each node's routes to Bytes.
type Plan struct {
	Estimate
	// Bytes is the message size planned for.
	Bytes int64
	// FaultFreeSeconds is [FaultFree] for the same message.
	FaultFreeSeconds float64
	// IdealSeconds is [Ideal] for the same message.
	IdealSeconds float64
	// Parts splits the message over the schedule's rings, in Estimate.Rings order.
	Parts []Part
	// Routes gives, per node, how its channels' bytes map onto its NICs.
	Routes [][]Route
	// Version is the planner's topology version the plan was made for.
	Version uint64
}

// Build turns an estimate into a plan for a message of bytes bytes, every share a multiple of align
// bytes (except a tail when bytes is not). It is deterministic.
func Build(t Topology, e Estimate, bytes int64, align int64, m Model) (Plan, error) {
	if err := t.check(); err != nil {
		return Plan{}, err
	}
	p := Plan{Estimate: e, Bytes: bytes}
	var err error
	if p.FaultFreeSeconds, err = FaultFree(t, float64(bytes), m); err != nil {
		return Plan{}, err
	}
	if p.IdealSeconds, err = Ideal(t, float64(bytes)); err != nil {
		return Plan{}, err
	}
	sizes := Apportion(bytes, e.Shares, align)
	var off int64
	for k, ring := range e.Rings {
		part := Part{Offset: off, Bytes: sizes[k], Ring: slices.Clone(ring)}
		if e.Owners != nil {
			part.Owners = Apportion(sizes[k], e.Owners[k], align)
		} else {
			part.Owners = Apportion(sizes[k], equal(len(ring)), align)
		}
		if k < len(e.LinkRails) {
			part.LinkRails = e.LinkRails[k]
		}
		if k > 0 {
			outside := without(e.Rings[0], ring)
			if e.Strategy == OptCC {
				part.Leaves = outside
			} else {
				slices.SortStableFunc(outside, func(x, y int) int {
					if c := cmp.Compare(t.NodeBandwidth(y), t.NodeBandwidth(x)); c != 0 {
						return c
					}
					return x - y
				})
				part.BroadcastTo = outside
			}
		}
		p.Parts = append(p.Parts, part)
		off += sizes[k]
	}
	p.Routes = make([][]Route, len(t.Nodes))
	for u, n := range t.Nodes {
		switch e.Strategy {
		case Ring, HotRepair:
			p.Routes[u] = repairRoutes(n, t.ranks(), bytes, align)
		default:
			p.Routes[u] = BalanceRoutes(n, t.ranks(), bytes, align)
		}
	}
	return p, nil
}

func equal(n int) []float64 {
	w := make([]float64, n)
	for i := range w {
		w[i] = 1
	}
	return w
}

// without returns the elements of all not in sub, in all's order.
func without(all, sub []int) []int {
	var out []int
	for _, v := range all {
		if !slices.Contains(sub, v) {
			out = append(out, v)
		}
	}
	return out
}

// pathOf maps a NIC distance to the path the bytes take.
func pathOf(d int) Path {
	return Path(d)
}

// repairRoutes maps every channel's equal share to its NIC, or to its backup NIC when that is down
// (hot repair: no rebalancing).
func repairRoutes(n Node, channels int, bytes, align int64) []Route {
	shares := Apportion(bytes, equal(channels), align)
	routes := make([]Route, 0, channels)
	for c, b := range shares {
		j := channelNIC(n, c)
		routes = append(routes, Route{Channel: c, NIC: j, Bytes: b, Path: pathOf(distance(n, c%len(n.NICs), j))})
	}
	return routes
}

// BalanceRoutes spreads a node's bytes over its healthy NICs in proportion to their bandwidth, per
// channel. NIC j's target is bytes·bw_j/Σbw. Every channel first keeps what fits on its own NIC; the
// rest of each channel (in channel order) fills the remaining targets nearest first: the same PCIe
// switch, then the same NUMA domain, then across the CPU link, ties to the lower NIC index. The
// routes' bytes sum to bytes, each NIC's total is its target, and the result is deterministic.
func BalanceRoutes(n Node, channels int, bytes, align int64) []Route {
	bw := make([]float64, len(n.NICs))
	for j, nic := range n.NICs {
		bw[j] = nic.Bandwidth()
	}
	capLeft := Apportion(bytes, bw, align)
	native := Apportion(bytes, equal(channels), align)
	var routes []Route
	surplus := make([]int64, channels)
	for c, b := range native {
		j := c % len(n.NICs)
		keep := min(b, capLeft[j])
		if keep > 0 {
			routes = append(routes, Route{Channel: c, NIC: j, Bytes: keep, Path: Native})
			capLeft[j] -= keep
		}
		surplus[c] = b - keep
	}
	for c := range surplus {
		home := c % len(n.NICs)
		order := make([]int, len(n.NICs))
		for j := range order {
			order[j] = j
		}
		slices.SortStableFunc(order, func(x, y int) int {
			return cmp.Compare(distance(n, home, x), distance(n, home, y))
		})
		for _, j := range order {
			if surplus[c] == 0 {
				break
			}
			take := min(surplus[c], capLeft[j])
			if take <= 0 {
				continue
			}
			routes = append(routes, Route{Channel: c, NIC: j, Bytes: take, Path: pathOf(distance(n, home, j))})
			capLeft[j] -= take
			surplus[c] -= take
		}
	}
	return routes
}

// crossFraction returns the fraction of a node's bytes that Balance routes across the CPU link.
func crossFraction(n Node, channels int) float64 {
	const unit = 1 << 30
	var cross int64
	for _, r := range BalanceRoutes(n, channels, unit, 1) {
		if r.Path == CPULink {
			cross += r.Bytes
		}
	}
	return float64(cross) / unit
}
