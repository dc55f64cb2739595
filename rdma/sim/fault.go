package sim

import (
	"fmt"
	"time"

	"github.com/concord-ccl/concord/rdma"
)

// FaultKind says what a Fault breaks.
type FaultKind uint8

const (
	// NICDown takes a NIC's port down: its node gets a PortChanged event and ConnDown on every
	// connection through it at once; its peers notice nothing but silence.
	NICDown FaultKind = iota
	// LinkDown cuts the path between two NICs, in both directions; both ports stay up.
	LinkDown
	// Flap takes a NIC's port down and up again, Flaps times.
	Flap
)

// String returns "nic-down", "link-down" or "flap".
func (k FaultKind) String() string {
	switch k {
	case NICDown:
		return "nic-down"
	case LinkDown:
		return "link-down"
	case Flap:
		return "flap"
	}
	return fmt.Sprintf("fault(%d)", uint8(k))
}

// Fault is a failure of one element of the fabric.
type Fault struct {
	Kind FaultKind
	// Node and NIC name the failing NIC (NICDown, Flap) or one end of the link (LinkDown).
	Node rdma.NodeID
	NIC  rdma.NICID
	// Peer and PeerNIC name the other end of the link (LinkDown only).
	Peer    rdma.NodeID
	PeerNIC rdma.NICID
	// For is how long the element stays down before it heals by itself: for NICDown and LinkDown,
	// zero means forever; for Flap it is each flap's down time (zero means 1 ms).
	For time.Duration
	// Flaps is how many times a Flap goes down (zero means 3); Period is the time from one flap's start
	// to the next (zero means twice the down time).
	Flaps  int
	Period time.Duration
}

// Trigger says when an injected fault strikes: while a chosen data chunk is in flight in a chosen
// direction.
type Trigger struct {
	// From and To give the direction: data chunks posted by node From to node To.
	From, To rdma.NodeID
	// NIC is From's NIC the chunk leaves on.
	NIC rdma.NICID
	// Nth picks the chunk: the Nth (from 0) data chunk posted from From's NIC to To after Inject.
	Nth uint64
	// Delay is when the fault strikes after that chunk is posted. Zero means halfway between its posting
	// and its arrival, so the chunk is surely lost.
	Delay time.Duration
}

type armed struct {
	t     Trigger
	f     Fault
	count uint64
	done  bool
}

// Inject arms a fault that strikes when its trigger's chunk is posted. Each armed fault strikes once.
func (n *Network) Inject(t Trigger, f Fault) {
	n.armed = append(n.armed, &armed{t: t, f: f})
}

// trigger is called for each data chunk posted on c, which will arrive at arrive.
func (n *Network) trigger(c *Conn, now, arrive time.Duration) {
	for _, a := range n.armed {
		if a.done || a.t.From != c.ep.id || a.t.To != c.spec.Peer || a.t.NIC != c.spec.Local {
			continue
		}
		if a.count++; a.count-1 != a.t.Nth {
			continue
		}
		a.done = true
		d := a.t.Delay
		if d == 0 {
			d = (arrive - now) / 2
		}
		f := a.f
		n.at(now+d, func() { n.Apply(f) })
	}
}

// Apply makes a fault strike now (in the event context or between runs).
func (n *Network) Apply(f Fault) {
	n.struck = append(n.struck, n.now)
	switch f.Kind {
	case NICDown:
		n.SetPort(f.Node, f.NIC, false)
		if f.For > 0 {
			n.at(n.now+f.For, func() { n.SetPort(f.Node, f.NIC, true) })
		}
	case LinkDown:
		n.SetLink(f.Node, f.NIC, f.Peer, f.PeerNIC, false)
		if f.For > 0 {
			n.at(n.now+f.For, func() { n.SetLink(f.Node, f.NIC, f.Peer, f.PeerNIC, true) })
		}
	case Flap:
		down, flaps, period := f.For, f.Flaps, f.Period
		if down == 0 {
			down = time.Millisecond
		}
		if flaps == 0 {
			flaps = 3
		}
		if period == 0 {
			period = 2 * down
		}
		for i := range flaps {
			start := n.now + time.Duration(i)*period
			n.at(start, func() { n.SetPort(f.Node, f.NIC, false) })
			n.at(start+down, func() { n.SetPort(f.Node, f.NIC, true) })
		}
	}
}

// Struck returns the virtual times at which faults struck (Apply ran), in order.
func (n *Network) Struck() []time.Duration { return append([]time.Duration(nil), n.struck...) }

// SetPort takes a NIC's port down or up. Down breaks every connection through the NIC (probe
// connections included: they must be renewed, as an RDMA queue pair in the error state) and reports
// ConnDown (wrapping rdma.ErrNICDown) on them to the NIC's node; both transitions report PortChanged.
func (n *Network) SetPort(node rdma.NodeID, nic rdma.NICID, up bool) {
	e := n.nodes[node]
	if e == nil || int(nic) >= len(e.ports) {
		panic(fmt.Sprintf("sim: SetPort: no NIC %d on node %d", nic, node))
	}
	p := &e.ports[nic]
	if up == (p.health != rdma.Down) {
		return
	}
	if up {
		p.health = rdma.Healthy
		e.deliver(rdma.PortChanged{NIC: nic, Health: rdma.Healthy})
		return
	}
	p.health = rdma.Down
	p.gen++
	e.deliver(rdma.PortChanged{NIC: nic, Health: rdma.Down})
	for _, c := range e.conns {
		if c.spec.Local == nic && (c.state == established || c.state == connecting) {
			c.fail(fmt.Errorf("sim: node %d %v: %w", node, c.spec, rdma.ErrNICDown), 0)
		}
	}
}

// SetLink cuts or restores the path between two NICs.
func (n *Network) SetLink(a rdma.NodeID, an rdma.NICID, b rdma.NodeID, bn rdma.NICID, up bool) {
	k := newLinkKey(a, an, b, bn)
	if up {
		if n.cut[k] > 0 {
			n.cut[k]--
		}
		return
	}
	n.cut[k]++
	n.linkGen[k]++
}
