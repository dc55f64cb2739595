package plan

import (
	"errors"
	"fmt"
	"slices"
)

// ErrInvalidTopology is returned (wrapped, naming the bad field) when a [Topology] cannot be planned on.
var ErrInvalidTopology = errors.New("plan: invalid topology")

// ErrNoPath is returned when a node has no healthy NIC left, so no schedule can reach it.
var ErrNoPath = errors.New("plan: node has no healthy NIC")

// NIC describes one network interface of a node as the fabric reports and measures it.
type NIC struct {
	// Rail is the switch plane the NIC is cabled to. In a rail-optimized fabric a NIC reaches another
	// node's NIC directly only on the same rail.
	Rail int
	// NUMA is the NUMA domain of the NIC's PCIe root. A detour to a NIC in another domain crosses the
	// CPU link.
	NUMA int
	// PCIeSwitch identifies the PCIe switch the NIC hangs off; NICs on the same switch are closest.
	PCIeSwitch int
	// Alpha is the measured per-message latency in seconds.
	Alpha float64
	// Beta is the measured transfer time in seconds per byte (the inverse of the bandwidth).
	Beta float64
	// Down marks a failed NIC, cable or port. The zero value is a healthy NIC.
	Down bool
}

// Bandwidth returns the NIC's usable bandwidth in bytes per second: 0 when it is down.
func (n NIC) Bandwidth() float64 {
	if n.Down || n.Beta <= 0 {
		return 0
	}
	return 1 / n.Beta
}

// Node is one server: its NICs, indexed by local NIC number. GPU (channel) c natively uses NIC c.
type Node struct {
	NICs []NIC
}

// Topology is the planner's view of one site: the nodes, the ranks (GPUs) each contributes to a flat
// ring, and the logical ring order. A Topology is a value: methods never modify it, and [Topology.Clone]
// gives an independent copy.
type Topology struct {
	// Nodes lists the servers. Every node must have the same number of NICs.
	Nodes []Node
	// GPUsPerNode is g, the ranks each node contributes to a flat ring over all n·g ranks. Zero means
	// one rank per NIC.
	GPUsPerNode int
	// Ring is the logical ring order of the node indices. Nil means 0, 1, ..., n-1.
	Ring []int
	// CPULinkBandwidth is the bandwidth in bytes per second of the CPU link (UPI/QPI) a node's detours
	// to a NIC in another NUMA domain share. Zero means it never limits.
	CPULinkBandwidth float64
}

// Uniform returns a healthy topology of nodes×nics NICs, one rank per NIC, NICs spread evenly over
// numa NUMA domains (NIC i on rail i and on its own PCIe switch), every NIC with latency alpha
// seconds and bandwidth bw bytes per second.
func Uniform(nodes, nics, numa int, alpha, bw float64) Topology {
	if numa < 1 {
		numa = 1
	}
	t := Topology{Nodes: make([]Node, nodes), GPUsPerNode: nics}
	for i := range t.Nodes {
		t.Nodes[i].NICs = make([]NIC, nics)
		for j := range t.Nodes[i].NICs {
			t.Nodes[i].NICs[j] = NIC{Rail: j, NUMA: j * numa / nics, PCIeSwitch: j, Alpha: alpha, Beta: 1 / bw}
		}
	}
	return t
}

// Clone returns a deep copy of t.
func (t Topology) Clone() Topology {
	c := t
	c.Nodes = make([]Node, len(t.Nodes))
	for i, n := range t.Nodes {
		c.Nodes[i].NICs = slices.Clone(n.NICs)
	}
	c.Ring = slices.Clone(t.Ring)
	return c
}

// WithNICDown returns a copy of t with NIC nic of node node marked down (or up again when down is false).
func (t Topology) WithNICDown(node, nic int, down bool) Topology {
	c := t.Clone()
	c.Nodes[node].NICs[nic].Down = down
	return c
}

// Validate reports the first inconsistency, naming the field, wrapped around [ErrInvalidTopology].
func (t Topology) Validate() error {
	if len(t.Nodes) < 2 {
		return fmt.Errorf("%w: Nodes: need at least 2 nodes, have %d", ErrInvalidTopology, len(t.Nodes))
	}
	m := len(t.Nodes[0].NICs)
	if m == 0 {
		return fmt.Errorf("%w: Nodes[0].NICs: empty", ErrInvalidTopology)
	}
	if t.GPUsPerNode < 0 {
		return fmt.Errorf("%w: GPUsPerNode: %d is negative", ErrInvalidTopology, t.GPUsPerNode)
	}
	if t.CPULinkBandwidth < 0 {
		return fmt.Errorf("%w: CPULinkBandwidth: %g is negative", ErrInvalidTopology, t.CPULinkBandwidth)
	}
	for i, n := range t.Nodes {
		if len(n.NICs) != m {
			return fmt.Errorf("%w: Nodes[%d].NICs: %d NICs, node 0 has %d", ErrInvalidTopology, i, len(n.NICs), m)
		}
		for j, nic := range n.NICs {
			if !(nic.Beta > 0) || !(nic.Alpha >= 0) {
				return fmt.Errorf("%w: Nodes[%d].NICs[%d]: alpha %g, beta %g: need alpha >= 0, beta > 0",
					ErrInvalidTopology, i, j, nic.Alpha, nic.Beta)
			}
		}
	}
	if t.Ring != nil {
		if len(t.Ring) != len(t.Nodes) {
			return fmt.Errorf("%w: Ring: %d entries for %d nodes", ErrInvalidTopology, len(t.Ring), len(t.Nodes))
		}
		seen := make([]bool, len(t.Nodes))
		for _, v := range t.Ring {
			if v < 0 || v >= len(t.Nodes) || seen[v] {
				return fmt.Errorf("%w: Ring: not a permutation of the nodes (entry %d)", ErrInvalidTopology, v)
			}
			seen[v] = true
		}
	}
	return nil
}

// ranks returns g, the ranks per node.
func (t Topology) ranks() int {
	if t.GPUsPerNode > 0 {
		return t.GPUsPerNode
	}
	return len(t.Nodes[0].NICs)
}

// order returns the logical ring order.
func (t Topology) order() []int {
	if t.Ring != nil {
		return slices.Clone(t.Ring)
	}
	o := make([]int, len(t.Nodes))
	for i := range o {
		o[i] = i
	}
	return o
}

// NodeBandwidth returns the sum of node i's healthy NIC bandwidths in bytes per second: what the node
// sustains when its traffic is spread over all its healthy NICs.
func (t Topology) NodeBandwidth(i int) float64 {
	s := 0.0
	for _, nic := range t.Nodes[i].NICs {
		s += nic.Bandwidth()
	}
	return s
}

// HealthyBandwidth returns node i's bandwidth with every NIC up.
func (t Topology) HealthyBandwidth(i int) float64 {
	s := 0.0
	for _, nic := range t.Nodes[i].NICs {
		s += 1 / nic.Beta
	}
	return s
}

// Degraded reports whether any NIC of the topology is down.
func (t Topology) Degraded() bool {
	for _, n := range t.Nodes {
		for _, nic := range n.NICs {
			if nic.Down {
				return true
			}
		}
	}
	return false
}

// Rails returns the sorted set of rails on which node i has a healthy NIC.
func (t Topology) Rails(i int) []int {
	var r []int
	for _, nic := range t.Nodes[i].NICs {
		if nic.Bandwidth() > 0 && !slices.Contains(r, nic.Rail) {
			r = append(r, nic.Rail)
		}
	}
	slices.Sort(r)
	return r
}

// railBandwidth returns node i's healthy bandwidth on rail r.
func (t Topology) railBandwidth(i, r int) float64 {
	s := 0.0
	for _, nic := range t.Nodes[i].NICs {
		if nic.Rail == r {
			s += nic.Bandwidth()
		}
	}
	return s
}

// EdgeBandwidth returns the bandwidth in bytes per second from node u to node v when u's traffic is
// spread over its healthy NICs: the sum over the rails both have healthy of the smaller side's
// bandwidth on that rail (a rail-optimized fabric connects NICs only within a rail).
func (t Topology) EdgeBandwidth(u, v int) float64 {
	s := 0.0
	for _, r := range t.Rails(u) {
		s += min(t.railBandwidth(u, r), t.railBandwidth(v, r))
	}
	return s
}

// ringRate returns the bandwidth a ring over ring (node order, cyclic) sustains under Balance: its
// slowest edge's.
func (t Topology) ringRate(ring []int) float64 {
	if len(ring) == 1 {
		return t.NodeBandwidth(ring[0])
	}
	r := -1.0
	for i, u := range ring {
		e := t.EdgeBandwidth(u, ring[(i+1)%len(ring)])
		if r < 0 || e < r {
			r = e
		}
	}
	return r
}

// RingLatency returns the latency term of a ring AllReduce over ring: 2(N−1)·α over its N ranks, α
// the largest latency among the ring's healthy NICs.
func (t Topology) RingLatency(ring []int) float64 {
	return 2 * float64(len(ring)*t.ranks()-1) * t.alpha(ring)
}

// alpha returns the largest latency among the healthy NICs of the given nodes.
func (t Topology) alpha(nodes []int) float64 {
	a := 0.0
	for _, i := range nodes {
		for _, nic := range t.Nodes[i].NICs {
			if !nic.Down {
				a = max(a, nic.Alpha)
			}
		}
	}
	return a
}

// distance returns how far NIC b is from NIC a of one node: 0 the same NIC, 1 the same PCIe switch,
// 2 the same NUMA domain, 3 across the CPU link.
func distance(n Node, a, b int) int {
	switch {
	case a == b:
		return 0
	case n.NICs[a].PCIeSwitch == n.NICs[b].PCIeSwitch:
		return 1
	case n.NICs[a].NUMA == n.NICs[b].NUMA:
		return 2
	default:
		return 3
	}
}

// check validates t and that every node can still communicate.
func (t Topology) check() error {
	if err := t.Validate(); err != nil {
		return err
	}
	for i := range t.Nodes {
		if t.NodeBandwidth(i) <= 0 {
			return fmt.Errorf("node %d: %w", i, ErrNoPath)
		}
	}
	return nil
}
