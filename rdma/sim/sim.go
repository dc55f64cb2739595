// Package sim is a deterministic, in-memory fabric provider for package rdma: a discrete-event simulator
// in virtual time, with per-NIC bandwidth and latency and failure injection (a local or remote NIC, a
// link between two NICs, flapping) triggered at a chosen chunk of a chosen direction.
//
// # Model
//
// Every NIC has a transmit and a receive queue served at its bandwidth. A data chunk leaves its NIC
// after the chunks queued before it and travels for the network's latency; the remote NIC's receive
// queue serves chunks in the order their first bytes reach it, so a chunk still waiting behind others
// at a busy sender does not hold up one from an idle sender. Control chunks are sent at the NIC's rate
// without queueing behind data, and probes are zero bytes; both bypass the queues. A completion
// travels back in one latency.
//
// A chunk is lost when its sending NIC, its receiving NIC or the link between them fails while it is
// in flight (between being posted and its completion arriving back). Like a reliable RDMA connection,
// a connection that lost a chunk delivers nothing more; its sender gets ConnDown after the network's
// RetryTimeout (the analogue of retry-exceeded), or at once when its own NIC went down. The receiver of
// a broken connection is told nothing: that asymmetry is what bilateral awareness exists for.
//
// # Running
//
// Nothing runs in the background. All endpoints share one scheduler; [Network.Run] and
// [Network.RunUntil] execute events in virtual-time order in the caller's goroutine, which is the event
// context of every endpoint. Events at the same instant run in the order they were scheduled, so a run
// is a pure function of its inputs. Thousands of nodes fit in one process: a node costs a few structs,
// not goroutines.
package sim

import (
	"container/heap"
	"fmt"
	"sync"
	"time"

	"github.com/concord-ccl/concord/rdma"
)

// Config describes a simulated network. The zero value works.
type Config struct {
	// Latency is the one-way propagation delay between any two NICs. Zero means 2 µs.
	Latency time.Duration
	// RetryTimeout is how long a sender's broken connection lingers before ConnDown is delivered (an
	// RDMA NIC's retry-exceeded). Zero means 1 s, long enough that the runtime's own deadlines fire
	// first, as they must on real hardware.
	RetryTimeout time.Duration
	// Start is the wall-clock time that virtual time zero stands for. Zero means 2026-01-01 UTC.
	Start time.Time
}

func (c Config) withDefaults() Config {
	if c.Latency == 0 {
		c.Latency = 2 * time.Microsecond
	}
	if c.RetryTimeout == 0 {
		c.RetryTimeout = time.Second
	}
	if c.Start.IsZero() {
		c.Start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	}
	return c
}

// Network is a simulated fabric: its nodes, their NICs, the links between NICs and the scheduler.
//
// Network's methods other than Post, and the Endpoint methods that Post delegates to, must be called
// from one goroutine at a time: the one running the scheduler, or any goroutine while it is not running.
type Network struct {
	cfg   Config
	now   time.Duration
	mu    sync.Mutex // guards queue and seq against Post from other goroutines
	queue eventQueue
	seq   uint64

	nodes   map[rdma.NodeID]*Endpoint
	pending map[pairKey]*Conn  // Connect calls waiting for the other end
	cut     map[linkKey]int    // cut links: how many cuts are in force
	linkGen map[linkKey]uint64 // bumped each time a link is cut
	armed   []*armed
	struck  []time.Duration
	nextKey uint64

	// Stats counts what moved, for reports.
	Stats Stats
}

// Stats are counters of a network's traffic.
type Stats struct {
	// DataBytes and DataChunks count data chunks posted.
	DataBytes, DataChunks uint64
	// LostChunks counts data chunks lost to failures.
	LostChunks uint64
}

// New returns an empty network.
func New(cfg Config) *Network {
	return &Network{cfg: cfg.withDefaults(), nodes: map[rdma.NodeID]*Endpoint{}, pending: map[pairKey]*Conn{},
		cut: map[linkKey]int{}, linkGen: map[linkKey]uint64{}}
}

// Now returns the virtual time elapsed since the start.
func (n *Network) Now() time.Duration { return n.now }

// AddNode creates node id with the given NICs (their IDs are set to their indices). It panics if the
// id is taken or there are no NICs.
func (n *Network) AddNode(id rdma.NodeID, nics []rdma.NIC) *Endpoint {
	if _, ok := n.nodes[id]; ok || len(nics) == 0 {
		panic(fmt.Sprintf("sim: AddNode %d: duplicate id or no NICs", id))
	}
	e := &Endpoint{net: n, id: id, nics: make([]rdma.NIC, len(nics)), ports: make([]port, len(nics)),
		regions: map[uint64]*rdma.Region{}}
	for i, nic := range nics {
		nic.ID = rdma.NICID(i)
		if nic.Name == "" {
			nic.Name = fmt.Sprintf("nic%d", i)
		}
		e.nics[i] = nic
	}
	n.nodes[id] = e
	return e
}

// Node returns the endpoint of node id, or nil.
func (n *Network) Node(id rdma.NodeID) *Endpoint { return n.nodes[id] }

// Run executes events until none is left.
func (n *Network) Run() {
	for n.step(-1) {
	}
}

// RunUntil executes events until none is left at or before virtual time t, then sets the clock to t.
func (n *Network) RunUntil(t time.Duration) {
	for n.step(t) {
	}
	n.mu.Lock()
	if n.now < t {
		n.now = t
	}
	n.mu.Unlock()
}

// RunWhile executes events while cond returns true and events are left. It reports whether cond still
// held when it stopped.
func (n *Network) RunWhile(cond func() bool) bool {
	for cond() {
		if !n.step(-1) {
			return cond()
		}
	}
	return false
}

// step runs the next event if there is one due at or before limit (any, when limit < 0).
func (n *Network) step(limit time.Duration) bool {
	n.mu.Lock()
	if len(n.queue) == 0 || (limit >= 0 && n.queue[0].at > limit) {
		n.mu.Unlock()
		return false
	}
	ev := heap.Pop(&n.queue).(*item)
	if ev.at > n.now {
		n.now = ev.at // under mu: Post reads it from other goroutines
	}
	n.mu.Unlock()
	if ev.cancelled {
		return true
	}
	ev.fn()
	return true
}

// at schedules fn at virtual time t (not before now).
func (n *Network) at(t time.Duration, fn func()) *item {
	n.mu.Lock()
	defer n.mu.Unlock()
	if t < n.now {
		t = n.now
	}
	n.seq++
	it := &item{at: t, seq: n.seq, fn: fn}
	heap.Push(&n.queue, it)
	return it
}

// At runs fn at virtual time t (or now, if t has passed), in the event context.
func (n *Network) At(t time.Duration, fn func()) { n.at(t, fn) }

type item struct {
	at        time.Duration
	seq       uint64
	fn        func()
	cancelled bool
	index     int
}

type eventQueue []*item

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i]; q[i].index = i; q[j].index = j }
func (q *eventQueue) Push(x any)   { it := x.(*item); it.index = len(*q); *q = append(*q, it) }
func (q *eventQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return it
}
