package sim

import (
	"fmt"
	"time"

	"github.com/concord-ccl/concord/rdma"
)

// port is the simulated state of one NIC.
type port struct {
	health rdma.Health
	gen    uint64        // bumped each time the port goes down: a chunk in flight across a bump is lost
	txFree time.Duration // when the transmit queue drains
	rxFree time.Duration // when the receive queue drains
	sent   uint64        // data bytes posted through this NIC
}

// Endpoint is one simulated node. It implements rdma.Endpoint; see the package doc for its goroutine
// rules.
type Endpoint struct {
	net     *Network
	id      rdma.NodeID
	nics    []rdma.NIC
	ports   []port
	regions map[uint64]*rdma.Region
	conns   []*Conn
	handler func(rdma.Event)
	backlog []rdma.Event
	closed  bool
}

var _ rdma.Endpoint = (*Endpoint)(nil)

// SentBytes returns how many data bytes were posted through a local NIC since the node was added.
func (e *Endpoint) SentBytes(nic rdma.NICID) uint64 { return e.ports[nic].sent }

// Node returns the node's id.
func (e *Endpoint) Node() rdma.NodeID { return e.id }

// NICs returns the node's NICs.
func (e *Endpoint) NICs() []rdma.NIC { return e.nics }

// Health returns a local NIC's port state (Down for an unknown NIC).
func (e *Endpoint) Health(nic rdma.NICID) rdma.Health {
	if int(nic) >= len(e.ports) {
		return rdma.Down
	}
	return e.ports[nic].health
}

// Register records buf as registered on every NIC.
func (e *Endpoint) Register(buf []byte) (*rdma.Region, error) {
	if e.closed {
		return nil, rdma.ErrClosed
	}
	e.net.nextKey++
	r := &rdma.Region{Key: e.net.nextKey, Bytes: buf}
	e.regions[r.Key] = r
	return r, nil
}

// Deregister forgets a region.
func (e *Endpoint) Deregister(r *rdma.Region) error {
	if r == nil || e.regions[r.Key] != r {
		return fmt.Errorf("%w: region not registered here", rdma.ErrInvalid)
	}
	delete(e.regions, r.Key)
	return nil
}

// Connect opens the local end of a connection; it pairs with the peer's mirrored call.
func (e *Endpoint) Connect(spec rdma.ConnSpec) (rdma.Conn, error) {
	if e.closed {
		return nil, rdma.ErrClosed
	}
	peer := e.net.nodes[spec.Peer]
	if peer == nil || spec.Peer == e.id || int(spec.Local) >= len(e.nics) || int(spec.Remote) >= len(peer.nics) ||
		spec.Class > rdma.ProbeClass {
		return nil, fmt.Errorf("%w: connect %v from node %d", rdma.ErrInvalid, spec, e.id)
	}
	c := &Conn{ep: e, spec: spec}
	e.conns = append(e.conns, c)
	key := newPairKey(e.id, spec)
	other := e.net.pending[key]
	if other == nil || other.ep == e {
		e.net.pending[key] = c
		return c, nil
	}
	delete(e.net.pending, key)
	c.peer, other.peer = other, c
	up := func() {
		if c.path().intact() {
			for _, x := range []*Conn{other, c} {
				if x.state == connecting {
					x.state = established
					x.ep.deliver(rdma.ConnUp{Conn: x})
					x.flush()
				}
			}
			return
		}
		for _, x := range []*Conn{other, c} {
			x.fail(fmt.Errorf("sim: connect %v: path down", x.spec), e.net.cfg.RetryTimeout)
		}
	}
	e.net.at(e.net.now+e.net.cfg.Latency, up)
	return c, nil
}

// Start begins delivering events to h.
func (e *Endpoint) Start(h func(rdma.Event)) error {
	if e.handler != nil {
		return fmt.Errorf("%w: Start called twice", rdma.ErrInvalid)
	}
	e.handler = h
	backlog := e.backlog
	e.backlog = nil
	if len(backlog) > 0 {
		e.net.at(e.net.now, func() {
			for _, ev := range backlog {
				e.deliver(ev)
			}
		})
	}
	return nil
}

func (e *Endpoint) deliver(ev rdma.Event) {
	if e.closed {
		return
	}
	if e.handler == nil {
		e.backlog = append(e.backlog, ev)
		return
	}
	e.handler(ev)
}

// Now returns the simulated wall-clock time.
func (e *Endpoint) Now() time.Time { return e.net.cfg.Start.Add(e.net.now) }

// AfterFunc runs f in the event context after d of virtual time.
func (e *Endpoint) AfterFunc(d time.Duration, f func()) rdma.Timer {
	t := &timer{}
	t.it = e.net.at(e.net.now+d, func() {
		t.ran = true
		if !e.closed {
			f()
		}
	})
	return t
}

// Post runs f in the event context at the current virtual time, after what is already queued. It is
// safe from any goroutine.
func (e *Endpoint) Post(f func()) {
	e.net.mu.Lock()
	now := e.net.now
	e.net.mu.Unlock()
	e.net.at(now, func() {
		if !e.closed {
			f()
		}
	})
}

// Close closes every connection and stops delivering events.
func (e *Endpoint) Close() error {
	if e.closed {
		return nil
	}
	for _, c := range e.conns {
		c.state = closed
	}
	e.closed = true
	return nil
}

type timer struct {
	it  *item
	ran bool
}

func (t *timer) Stop() bool {
	if t.ran || t.it.cancelled {
		return false
	}
	t.it.cancelled = true
	return true
}

type connState uint8

const (
	connecting connState = iota
	established
	broken // lost a chunk or its NIC went down; ConnDown delivered or scheduled
	closed
)

// Conn is one end of a simulated connection. It implements rdma.Conn.
type Conn struct {
	ep     *Endpoint
	spec   rdma.ConnSpec
	peer   *Conn
	state  connState
	queued []rdma.Chunk // sent before the connection was up
	downAt bool         // ConnDown scheduled
}

var _ rdma.Conn = (*Conn)(nil)

// Spec returns the connection's spec.
func (c *Conn) Spec() rdma.ConnSpec { return c.spec }

// Send posts a chunk.
func (c *Conn) Send(ch rdma.Chunk) error {
	switch {
	case c.spec.Class == rdma.ProbeClass:
		return rdma.ErrWrongClass
	case c.state == closed || c.state == broken || c.ep.closed:
		return rdma.ErrClosed
	case c.state == connecting:
		c.queued = append(c.queued, ch)
		return nil
	}
	c.transmit(ch)
	return nil
}

func (c *Conn) flush() {
	q := c.queued
	c.queued = nil
	for _, ch := range q {
		if c.state == established {
			c.transmit(ch)
		}
	}
}

// Probe posts a zero-byte probe.
func (c *Conn) Probe(id uint64) error {
	switch {
	case c.spec.Class != rdma.ProbeClass:
		return rdma.ErrWrongClass
	case c.state == closed || c.ep.closed:
		return rdma.ErrClosed
	}
	n := c.ep.net
	if c.ep.ports[c.spec.Local].health == rdma.Down || c.peer == nil || c.state == broken {
		err := fmt.Errorf("probe %v: %w", c.spec, rdma.ErrNICDown)
		if c.ep.ports[c.spec.Local].health != rdma.Down {
			err = fmt.Errorf("probe %v: %w", c.spec, rdma.ErrClosed)
		}
		n.at(n.now, func() {
			if c.state != closed {
				c.ep.deliver(rdma.ProbeDone{Conn: c, ID: id, Err: err})
			}
		})
		return nil
	}
	p := c.path()
	start := n.now
	n.at(n.now+2*n.cfg.Latency, func() {
		if c.state != closed && p.intact() {
			c.ep.deliver(rdma.ProbeDone{Conn: c, ID: id, RTT: n.now - start})
		}
	})
	return nil
}

// Close tears the connection down.
func (c *Conn) Close() error {
	c.state = closed
	return nil
}

// fail breaks the connection and schedules its ConnDown after delay.
func (c *Conn) fail(err error, delay time.Duration) {
	if c.state == closed || c.downAt {
		return
	}
	c.state = broken
	c.downAt = true
	n := c.ep.net
	n.at(n.now+delay, func() {
		if c.state == broken {
			c.ep.deliver(rdma.ConnDown{Conn: c, Err: err})
		}
	})
}

// transmit models the chunk's trip and schedules its arrival and completion.
func (c *Conn) transmit(ch rdma.Chunk) {
	n := c.ep.net
	lp, rp := &c.ep.ports[c.spec.Local], &c.peer.ep.ports[c.spec.Remote]
	size := time.Duration(0)
	if len(ch.Data) > 0 {
		bw := c.ep.nics[c.spec.Local].Bandwidth
		if rb := c.peer.ep.nics[c.spec.Remote].Bandwidth; rb > 0 && (bw <= 0 || rb < bw) {
			bw = rb
		}
		if bw > 0 {
			size = time.Duration(float64(len(ch.Data)) / bw * float64(time.Second))
		}
	}
	p := c.path()
	if c.spec.Class != rdma.DataClass {
		n.at(n.now+n.cfg.Latency+size, func() { c.arrive(ch, p) })
		return
	}
	start := max(n.now, lp.txFree)
	lp.txFree = start + size
	n.Stats.DataBytes += uint64(len(ch.Data))
	lp.sent += uint64(len(ch.Data))
	n.Stats.DataChunks++
	n.trigger(c, n.now, lp.txFree+n.cfg.Latency)
	// The receiving port takes chunks in the order their first bytes reach it, not in the order they
	// were posted: a chunk still queued behind others at a busy sender does not hold up one from an
	// idle sender.
	end := lp.txFree + n.cfg.Latency
	n.at(start+n.cfg.Latency, func() {
		arrive := max(end, rp.rxFree+size)
		rp.rxFree = arrive
		n.at(arrive, func() { c.arrive(ch, p) })
	})
}

func (c *Conn) arrive(ch rdma.Chunk, p path) {
	n := c.ep.net
	if c.state != established || c.peer.state == closed {
		return
	}
	if !p.intact() {
		c.lose()
		return
	}
	c.peer.ep.deliver(rdma.Arrived{Conn: c.peer, Tag: ch.Tag, Seq: ch.Seq, Data: ch.Data})
	n.at(n.now+n.cfg.Latency, func() {
		if c.state != established {
			return
		}
		if !p.intact() {
			c.lose()
			return
		}
		c.ep.deliver(rdma.Completed{Conn: c, Tag: ch.Tag, Seq: ch.Seq})
	})
}

func (c *Conn) lose() {
	n := c.ep.net
	if c.spec.Class == rdma.DataClass {
		n.Stats.LostChunks++
	}
	// The receiving end stays silent, as a reliable connection's responder does.
	c.fail(fmt.Errorf("sim: %v: transport retry exceeded", c.spec), n.cfg.RetryTimeout)
}

// path is a snapshot of the elements a chunk crosses, with their failure generations.
type path struct {
	n          *Network
	a, b       *port
	genA, genB uint64
	link       linkKey
	genLink    uint64
}

func (c *Conn) path() path {
	a, b := &c.ep.ports[c.spec.Local], &c.peer.ep.ports[c.spec.Remote]
	k := newLinkKey(c.ep.id, c.spec.Local, c.spec.Peer, c.spec.Remote)
	return path{n: c.ep.net, a: a, b: b, genA: a.gen, genB: b.gen, link: k, genLink: c.ep.net.linkGen[k]}
}

func (p path) intact() bool {
	return p.a.health != rdma.Down && p.b.health != rdma.Down && p.a.gen == p.genA && p.b.gen == p.genB &&
		p.n.cut[p.link] == 0 && p.n.linkGen[p.link] == p.genLink
}

type pairKey struct {
	lo, hi       rdma.NodeID
	loNIC, hiNIC rdma.NICID
	class        rdma.Class
	index        uint32
}

func newPairKey(self rdma.NodeID, s rdma.ConnSpec) pairKey {
	if self < s.Peer {
		return pairKey{self, s.Peer, s.Local, s.Remote, s.Class, s.Index}
	}
	return pairKey{s.Peer, self, s.Remote, s.Local, s.Class, s.Index}
}

type linkKey struct {
	lo, hi       rdma.NodeID
	loNIC, hiNIC rdma.NICID
}

func newLinkKey(a rdma.NodeID, an rdma.NICID, b rdma.NodeID, bn rdma.NICID) linkKey {
	if a < b {
		return linkKey{a, b, an, bn}
	}
	return linkKey{b, a, bn, an}
}
