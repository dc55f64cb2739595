package wanemu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// Link describes one direction of the emulated path from one site to another. The zero value is a
// perfect wire: no delay, no capacity limit, no per-flow cap and no loss.
type Link struct {
	// Delay is the one-way propagation delay added to every packet: half the round-trip time of a
	// symmetric path. Zero adds none.
	Delay time.Duration
	// CapacityMbit is the capacity of the link in Mbit/s (10^6 bits per second of IP packets, headers
	// included), shared by every flow on it. Zero means unlimited.
	CapacityMbit float64
	// FlowMbit caps each flow (one protocol, source and destination address and port: a 5-tuple) in
	// Mbit/s, as a WAN that shares its capacity per flow does. Zero means no per-flow cap.
	FlowMbit float64
	// Loss is the probability in [0, 1) that a packet is dropped at random on arrival. The draws come
	// from a generator seeded by [Config.Seed], so a run with the same packets drops the same ones.
	Loss float64
	// QueueBytes is the drop-tail limit in bytes of the link queue, the packets waiting for capacity.
	// Zero means one bandwidth-delay product, CapacityMbit × 2·Delay, but at least 64 packets of the MTU.
	// It has no effect without CapacityMbit.
	QueueBytes int
	// FlowQueueBytes is the drop-tail limit in bytes of each flow's queue, the packets waiting for
	// their flow's cap. Zero means FlowMbit × 2·Delay, but at least 64 packets of the MTU. It has no
	// effect without FlowMbit.
	FlowQueueBytes int
}

// Validate reports the first field of l that is out of range, by name.
func (l Link) Validate() error {
	if err := l.check(); err != nil {
		return fmt.Errorf("wanemu: Link.%w", err)
	}
	return nil
}

// check is Validate without the name of the struct, for callers that name it themselves.
func (l Link) check() error {
	switch {
	case l.Delay < 0:
		return fmt.Errorf("Delay %v is negative", l.Delay)
	case l.CapacityMbit < 0 || math.IsNaN(l.CapacityMbit) || math.IsInf(l.CapacityMbit, 0):
		return fmt.Errorf("CapacityMbit %v is not a finite rate >= 0", l.CapacityMbit)
	case l.FlowMbit < 0 || math.IsNaN(l.FlowMbit) || math.IsInf(l.FlowMbit, 0):
		return fmt.Errorf("FlowMbit %v is not a finite rate >= 0", l.FlowMbit)
	case !(l.Loss >= 0 && l.Loss < 1):
		return fmt.Errorf("Loss %v is not a probability in [0, 1)", l.Loss)
	case l.QueueBytes < 0:
		return fmt.Errorf("QueueBytes %d is negative", l.QueueBytes)
	case l.FlowQueueBytes < 0:
		return fmt.Errorf("FlowQueueBytes %d is negative", l.FlowQueueBytes)
	}
	return nil
}

// minQueuePackets is the smallest default queue, in packets of the MTU: enough for a handful of
// flows to get through slow start on a path whose bandwidth-delay product is tiny.
const minQueuePackets = 64

// burstWindow is how much traffic a token bucket lets through back to back after an idle spell,
// expressed as time at its rate; it is at least two packets of the MTU. Real shapers have bursts of
// this order, and a burst of a few packets keeps the emulation insensitive to scheduling jitter.
const burstWindow = time.Millisecond

// resolve fills in l's defaults for packets of at most mtu bytes.
func (l Link) resolve(mtu int) Link {
	rtt := 2 * l.Delay.Seconds()
	if l.QueueBytes == 0 {
		l.QueueBytes = max(int(mbitToBytesPerSec(l.CapacityMbit)*rtt), minQueuePackets*mtu)
	}
	if l.FlowQueueBytes == 0 {
		l.FlowQueueBytes = max(int(mbitToBytesPerSec(l.FlowMbit)*rtt), minQueuePackets*mtu)
	}
	return l
}

func mbitToBytesPerSec(mbit float64) float64 { return mbit * 1e6 / 8 }

// bucket is a token bucket that shapes a FIFO queue: a packet leaves when the bucket holds enough
// tokens for it. It is kept in the virtual-scheduling form (the time at which the bucket will be full
// again), so it needs no ticks: every departure time is computed when the packet arrives.
// A zero rate means unlimited. Times are nanoseconds on the forwarder's clock.
type bucket struct {
	rate  float64 // bytes per nanosecond; 0 means unlimited
	burst float64 // bytes
	full  int64   // the time from which the bucket is full, were nothing else to arrive
	last  int64   // the departure time of the previous packet, to keep the queue FIFO
}

func newBucket(mbit float64, mtu int) bucket {
	rate := mbitToBytesPerSec(mbit) / 1e9
	return bucket{rate: rate, burst: max(2*float64(mtu), rate*float64(burstWindow))}
}

// depart returns when a packet of size bytes that arrives at now leaves the bucket, and charges the
// bucket for it. Calls must come in the order the packets join the queue.
func (b *bucket) depart(now int64, size int) int64 {
	if b.rate == 0 {
		return now
	}
	cost := float64(size) / b.rate
	// The bucket holds burst - rate·(full - t) tokens at time t; the packet needs size of them.
	at := max(now, b.last, b.full-int64((b.burst-float64(size))/b.rate))
	b.full = max(b.full, at) + int64(cost)
	b.last = at
	return at
}

// backlog returns the bytes that are waiting in the queue in front of the bucket at now.
func (b *bucket) backlog(now int64) float64 {
	if b.rate == 0 {
		return 0
	}
	return max(0, b.rate*float64(b.full-now)-b.burst)
}

// idle reports whether the bucket is full at now, so forgetting it changes nothing.
func (b *bucket) idle(now int64) bool { return b.full <= now && b.last <= now }

// verdict is what happens to a packet at one stage of a path.
type verdict uint8

const (
	pass           verdict = iota // the packet goes on
	dropLoss                      // dropped at random
	dropFlowQueue                 // its flow's queue was full
	dropLinkQueue                 // the link queue was full
	dropUnroutable                // it was not an IPv4 packet for a site of the testbed
)

// LinkStats counts what happened to the packets that entered one directed link. Every packet that
// arrived is, once the link has drained, counted in exactly one of Delivered, LossDrops,
// FlowQueueDrops and QueueDrops.
type LinkStats struct {
	// Packets and Bytes count the packets that arrived at the link, whatever became of them.
	Packets, Bytes uint64
	// Delivered counts the packets handed to the destination site.
	Delivered uint64
	// LossDrops counts the packets dropped at random.
	LossDrops uint64
	// FlowQueueDrops counts the packets dropped because their flow's queue was full.
	FlowQueueDrops uint64
	// QueueDrops counts the packets dropped because the link queue was full.
	QueueDrops uint64
}

// linkCounters are the atomic counters behind [LinkStats]; the forwarder's scheduler writes them and
// anyone may read them.
type linkCounters struct {
	packets, bytes, delivered, loss, flowDrops, queueDrops atomic.Uint64
}

func (c *linkCounters) snapshot() LinkStats {
	return LinkStats{
		Packets:        c.packets.Load(),
		Bytes:          c.bytes.Load(),
		Delivered:      c.delivered.Load(),
		LossDrops:      c.loss.Load(),
		FlowQueueDrops: c.flowDrops.Load(),
		QueueDrops:     c.queueDrops.Load(),
	}
}

// flowSweepEvery is how many arrivals pass between two sweeps of idle flows from a path's table.
const flowSweepEvery = 4096

// path is the state of one directed link: loss, then a per-flow shaper, then the shared link shaper,
// then the propagation delay. It is pure: it does no I/O, reads no clock and is owned by one
// goroutine, which passes the time in.
type path struct {
	cfg      Link // with defaults resolved
	mtu      int
	link     bucket
	flows    map[flowKey]*bucket // per-flow shapers; nil while no flow is capped
	caps     map[flowKey]float64 // flows capped at their own rate in Mbit/s, kept across configure
	rng      *rand.Rand
	arrivals int   // since the last sweep of idle flows
	joined   int64 // the latest time a packet joined the link queue
	counters *linkCounters
}

func newPath(l Link, mtu int, seed, stream uint64, c *linkCounters) *path {
	p := &path{mtu: mtu, rng: rand.New(rand.NewPCG(seed, stream)), counters: c}
	p.configure(l)
	return p
}

// configure replaces the path's settings. Packets already queued keep the times they were given.
func (p *path) configure(l Link) {
	p.cfg = l.resolve(p.mtu)
	last := p.link.last
	p.link = newBucket(l.CapacityMbit, p.mtu)
	p.link.last, p.link.full = last, last // packets in the link queue keep their places
	p.flows = nil
	if l.FlowMbit > 0 || len(p.caps) > 0 {
		p.flows = make(map[flowKey]*bucket)
	}
}

// capFlow caps flow key at mbit instead of the link's FlowMbit; 0 removes the override. A shaper the
// flow already has takes the new rate for the packets that come next.
func (p *path) capFlow(key flowKey, mbit float64) {
	if mbit == 0 {
		delete(p.caps, key)
	} else {
		if p.caps == nil {
			p.caps = make(map[flowKey]float64)
		}
		p.caps[key] = mbit
	}
	if p.flows == nil {
		p.flows = make(map[flowKey]*bucket)
	}
	if b := p.flows[key]; b != nil {
		nb := newBucket(p.flowRate(key), p.mtu)
		nb.full, nb.last = b.full, b.last
		*b = nb
	}
}

// flowRate returns the cap of flow key in Mbit/s: its own, else the link's FlowMbit (0: none).
func (p *path) flowRate(key flowKey) float64 {
	if r, ok := p.caps[key]; ok {
		return r
	}
	return p.cfg.FlowMbit
}

// flowQueue returns the drop-tail limit of flow key's queue: FlowQueueBytes for the link's cap, or
// the same default rule applied to the flow's own cap.
func (p *path) flowQueue(key flowKey) float64 {
	if r, ok := p.caps[key]; ok {
		return float64(max(int(mbitToBytesPerSec(r)*2*p.cfg.Delay.Seconds()), minQueuePackets*p.mtu))
	}
	return float64(p.cfg.FlowQueueBytes)
}

// arrive admits a packet of size bytes of flow key that reached the link at now. It returns when the
// packet joins the link queue (now, or later when its flow is capped), or why it was dropped.
func (p *path) arrive(now int64, key flowKey, size int) (int64, verdict) {
	p.counters.packets.Add(1)
	p.counters.bytes.Add(uint64(size))
	if p.cfg.Loss > 0 && p.rng.Float64() < p.cfg.Loss {
		p.counters.loss.Add(1)
		return 0, dropLoss
	}
	if p.flows == nil {
		return now, pass
	}
	p.arrivals++
	if p.arrivals >= flowSweepEvery {
		p.arrivals = 0
		for k, b := range p.flows {
			if b.idle(now) {
				delete(p.flows, k)
			}
		}
	}
	b := p.flows[key]
	if b == nil {
		rate := p.flowRate(key)
		if rate == 0 {
			return now, pass
		}
		nb := newBucket(rate, p.mtu)
		b = &nb
		p.flows[key] = b
	}
	if b.backlog(now)+float64(size) > p.flowQueue(key) {
		p.counters.flowDrops.Add(1)
		return 0, dropFlowQueue
	}
	return b.depart(now, size), pass
}

// transmit puts a packet of size bytes that joins the link queue at time at through the link. It
// returns when the packet reaches the far end, or why it was dropped. Calls must come in
// nondecreasing order of at; a call that comes late is treated as joining at the latest time seen.
func (p *path) transmit(at int64, size int) (int64, verdict) {
	at = max(at, p.joined)
	p.joined = at
	if p.link.backlog(at)+float64(size) > float64(p.cfg.QueueBytes) {
		p.counters.queueDrops.Add(1)
		return 0, dropLinkQueue
	}
	return p.link.depart(at, size) + int64(p.cfg.Delay), pass
}
