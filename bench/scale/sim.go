package main

import (
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"runtime"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/pccl/master/status"
	"github.com/concord-ccl/concord/rings"
	"github.com/concord-ccl/concord/sharedstate"
)

// simPeer is the driver's model of one simulated peer: what the master told it.
type simPeer struct {
	conn     master.ConnID
	id       master.PeerID // from Welcome
	gone     bool          // dropped by the master, or killed by the driver
	accepted bool          // named in a Topology
	epoch    uint64        // epoch of the last Connect
	linked   bool          // answered the last Connect
	seq      uint64        // seq of the collective it runs (from Commence), 0 if none
}

// tally counts what the master sent, for the protocol checks.
type tally struct {
	welcomes, connects, topologies, changed, commences int
	pending, syncPlans, syncCompletes, acks, kicks     int
	outcomes                                           map[wire.Code]int
}

// cost is the measured cost of a kind of input: how many were stepped, the CPU time and the wall time
// spent in Step, and the heap allocations made meanwhile. CPU time is the process's, so it includes
// the garbage collector's work and not the waits for a CPU on a loaded machine; where the platform
// cannot tell it, it is the wall time.
type cost struct {
	Events int
	Nanos  int64 // CPU
	Wall   int64
	Allocs int64
}

func (c cost) perEvent() float64 {
	if c.Events == 0 {
		return 0
	}
	return float64(c.Nanos) / float64(c.Events)
}

func (c cost) wallPerEvent() float64 {
	if c.Events == 0 {
		return 0
	}
	return float64(c.Wall) / float64(c.Events)
}

func (c *cost) add(o cost) {
	c.Events, c.Nanos, c.Wall, c.Allocs = c.Events+o.Events, c.Nanos+o.Nanos, c.Wall+o.Wall, c.Allocs+o.Allocs
}

// cluster is n simulated peers of one group that drive a master.Machine in process, phase by phase:
// every peer's input of a phase (its heartbeat, its vote, its Done) is stepped in one timed batch,
// then the master's actions are delivered to the peers' models, which make the next phase's inputs.
// The clock is simulated; only the time spent inside Step is measured.
type cluster struct {
	m      *master.Machine
	now    time.Time
	peers  []*simPeer // by connection - 1
	byConn map[master.ConnID]*simPeer
	acts   []master.Action // the actions of the current batch
	tally  tally
	costs  map[string]*cost
	rev    uint64 // shared-state revision of the last sync

	connectBytes int64  // bytes of the Connect frames the master sent
	connectEpoch uint64 // epoch of the Connect last encoded, and its frame's size
	connectSize  int64

	rng    *rand.Rand // ids chosen by peers
	digest []byte     // every peer's state digest
	hb     time.Duration
}

// heartbeatInterval is the simulated peers' heartbeat interval (the LAN preset).
const heartbeatInterval = 250 * time.Millisecond

// window is the number of cycles (a heartbeat interval each) in one heartbeat timeout of the LAN
// preset (6). The silence heap re-examines each peer about once per timeout, so a measurement over a
// whole number of windows takes in that work evenly.
var window = int(master.LAN().HeartbeatTimeout / master.LAN().HeartbeatInterval)

func newCluster() *cluster {
	cfg := master.LAN()
	d := sharedstate.Digest{Revision: 0, Entries: []sharedstate.EntryDigest{{Name: "weights", DType: rings.F32, Count: 1 << 20, Hash: 0xfeed}}}
	return &cluster{
		m:      master.New(cfg),
		now:    time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		byConn: map[master.ConnID]*simPeer{},
		tally:  tally{outcomes: map[wire.Code]int{}},
		costs:  map[string]*cost{},
		digest: sharedstate.EncodeDigest(d),
		hb:     cfg.HeartbeatInterval,
		rng:    rand.New(rand.NewPCG(1, 2)),
	}
}

// batch steps inputs under the cost of kind, then delivers the actions to the peers.
func (c *cluster) batch(kind string, inputs []master.Input) cost {
	c.acts = c.acts[:0]
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cpu0, _ := processCPU()
	start := time.Now()
	for _, in := range inputs {
		c.acts = append(c.acts, c.m.Step(c.now, in)...)
	}
	wall := time.Since(start)
	cpu1, ok := processCPU()
	runtime.ReadMemStats(&after)
	cpu := cpu1 - cpu0
	if !ok {
		cpu = wall
	}
	k := cost{Events: len(inputs), Nanos: cpu.Nanoseconds(), Wall: wall.Nanoseconds(), Allocs: int64(after.Mallocs - before.Mallocs)}
	if c.costs[kind] == nil {
		c.costs[kind] = &cost{}
	}
	c.costs[kind].add(k)
	for _, a := range c.acts {
		c.deliver(a)
	}
	return k
}

// deliver updates the peers' models with one action of the master.
func (c *cluster) deliver(a master.Action) {
	switch a := a.(type) {
	case master.Drop:
		if p := c.byConn[a.Conn]; p != nil {
			p.gone = true
		}
	case master.Send:
		p := c.byConn[a.To]
		if p == nil {
			return
		}
		switch msg := a.Msg.(type) {
		case *wire.Welcome:
			p.id = msg.Peer
			c.tally.welcomes++
		case *wire.Connect:
			p.epoch, p.linked = msg.Epoch, false
			c.tally.connects++
			if msg.Epoch != c.connectEpoch {
				// Every Connect of a round is the same ring: encode one.
				c.connectEpoch, c.connectSize = msg.Epoch, int64(len(wire.AppendFrame(nil, msg)))
			}
			c.connectBytes += c.connectSize
		case *wire.Topology:
			p.accepted = true
			c.tally.topologies++
			if msg.Changed {
				c.tally.changed++
			}
		case *wire.Commence:
			p.seq = msg.Seq
			c.tally.commences++
		case *wire.Outcome:
			c.tally.outcomes[msg.Code]++
		case *wire.Pending:
			c.tally.pending++
		case *wire.SyncPlan:
			c.tally.syncPlans++
		case *wire.SyncComplete:
			c.tally.syncCompletes++
		case *wire.HeartbeatAck:
			c.tally.acks++
		case *wire.Kick:
			c.tally.kicks++
		}
	}
}

// live returns the peers the master has not dropped, in connection order.
func (c *cluster) live() []*simPeer {
	var ps []*simPeer
	for _, p := range c.peers {
		if !p.gone {
			ps = append(ps, p)
		}
	}
	return ps
}

// each makes one input per live peer that is accepted (or, with all, every live peer).
func (c *cluster) each(accepted bool, msg func(p *simPeer) wire.Message) []master.Input {
	var ins []master.Input
	for _, p := range c.live() {
		if !accepted || p.accepted {
			ins = append(ins, master.Received{Conn: p.conn, Msg: msg(p)})
		}
	}
	return ins
}

// join connects k new peers, each with a Hello, in one batch of kind. With chosen, each chooses a
// random 64-bit id, as peers that keep their id across reconnections should; otherwise the master
// assigns the connection number.
func (c *cluster) join(kind string, k int, chosen bool) cost {
	ins := make([]master.Input, 0, k)
	for range k {
		p := &simPeer{conn: master.ConnID(len(c.peers) + 1)}
		c.peers = append(c.peers, p)
		c.byConn[p.conn] = p
		h := &wire.Hello{Addr: fmt.Sprintf("10.0.%d.%d:7000", p.conn/256, p.conn%256)}
		if chosen {
			h.Peer = c.rng.Uint64() | 1<<63
		}
		ins = append(ins, master.Received{Conn: p.conn, Msg: h})
	}
	return c.batch(kind, ins)
}

// link answers every outstanding Connect with LinksReady, until no Connect is outstanding.
func (c *cluster) link(kind string) cost {
	var total cost
	for {
		var ins []master.Input
		for _, p := range c.live() {
			if p.epoch != 0 && !p.linked {
				p.linked = true
				ins = append(ins, master.Received{Conn: p.conn, Msg: &wire.LinksReady{Epoch: p.epoch, OK: true}})
			}
		}
		if len(ins) == 0 {
			return total
		}
		total.add(c.batch(kind, ins))
	}
}

// updateTopology has every accepted peer vote UpdateTopology and answers the wiring round if one
// starts.
func (c *cluster) updateTopology() cost {
	k := c.batch("vote_topology", c.each(true, func(*simPeer) wire.Message { return &wire.VoteTopology{} }))
	k.add(c.link("links_ready"))
	return k
}

// heartbeats sends one heartbeat interval's worth: every live peer's heartbeat, spread over four
// quarters of the interval with a Tick after each, as the server ticks every interval/4.
func (c *cluster) heartbeats() {
	live := c.live()
	for q := range 4 {
		var ins []master.Input
		for i := q; i < len(live); i += 4 {
			ins = append(ins, master.Received{Conn: live[i].conn, Msg: &wire.Heartbeat{Seq: 1}})
		}
		c.now = c.now.Add(c.hb / 4)
		c.batch("heartbeat", ins)
		c.batch("tick", []master.Input{master.Tick{}})
	}
}

// collective runs one AllReduce over every accepted peer: Initiate, then Done with a link timing.
func (c *cluster) collective(tag uint64) cost {
	desc := wire.Desc{Count: 1 << 20, DType: uint8(rings.F32), Op: 0}
	k := c.batch("initiate", c.each(true, func(*simPeer) wire.Message { return &wire.Initiate{Tag: tag, Desc: desc} }))
	k.add(c.batch("done", c.each(true, func(p *simPeer) wire.Message {
		return &wire.Done{Tag: tag, Seq: p.seq, Code: wire.CodeOK, LinkBytes: 4 << 20, LinkNanos: 2_000_000}
	})))
	return k
}

// sync runs one shared-state sync in which every peer holds the same state at the next revision.
func (c *cluster) sync() cost {
	c.rev++
	d, _ := sharedstate.DecodeDigest(c.digest)
	d.Revision = c.rev
	enc := sharedstate.EncodeDigest(d)
	k := c.batch("vote_sync", c.each(true, func(*simPeer) wire.Message {
		return &wire.VoteSync{Strategy: uint8(sharedstate.EnforcePopular), Digest: enc}
	}))
	k.add(c.batch("sync_done", c.each(true, func(*simPeer) wire.Message { return &wire.SyncDone{OK: true} })))
	return k
}

// cycle is one round of the steady state: a heartbeat interval, ArePeersPending, a collective,
// UpdateTopology with nothing to do, a step report and a sync.
func (c *cluster) cycle(tag uint64) {
	c.heartbeats()
	c.batch("vote_pending", c.each(true, func(*simPeer) wire.Message { return &wire.VotePending{} }))
	c.collective(tag)
	c.updateTopology()
	c.batch("step_report", c.each(true, func(*simPeer) wire.Message { return &wire.StepReport{Step: 1} }))
	c.sync()
}

// kill closes a peer's connection as if its process died.
func (c *cluster) kill(kind string, p *simPeer) cost {
	p.gone = true
	return c.batch(kind, []master.Input{master.Closed{Conn: p.conn, Err: "connection reset by peer"}})
}

// accepted counts the live peers the master accepted.
func (c *cluster) accepted() int {
	n := 0
	for _, p := range c.live() {
		if p.accepted {
			n++
		}
	}
	return n
}

// statusPage renders the status page and its JSON from a snapshot, in process, and returns the CPU
// time of the fastest of three renderings and the bytes rendered.
func (c *cluster) statusPage() (time.Duration, int) {
	h := status.Handler(func() master.Snapshot { return c.m.Snapshot(c.now) }, nil)
	// A first rendering off the clock: it parses the page's template.
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/status.json", nil))
	best, size := time.Duration(0), 0
	for i := range 3 {
		start, _ := processCPU()
		t0 := time.Now()
		size = 0
		for _, path := range []string{"/", "/status.json"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
			size += rec.Body.Len()
		}
		end, ok := processCPU()
		d := end - start
		if !ok {
			d = time.Since(t0)
		}
		if i == 0 || d < best {
			best = d
		}
	}
	return best, size
}

// simResult is the in-process measurement at one number of peers.
type simResult struct {
	Peers  int     `json:"peers"`
	Cycles int     `json:"cycles"`
	Events int     `json:"events"`
	NsPer  float64 `json:"ns_per_event"` // CPU time
	// WallNsPer is the wall time per event, which also counts the waits for a CPU.
	WallNsPer float64 `json:"wall_ns_per_event"`
	// AllocsPer is the heap allocations per event, the master's and the messages' it sends.
	AllocsPer float64 `json:"allocs_per_event"`
	// PerKind is the cost per event of each kind of input of the steady state.
	PerKind map[string]kindCost `json:"per_kind"`
	// Operations are whole protocol operations at this size, in microseconds of CPU time in Step.
	HelloNs        float64 `json:"hello_ns_per_event"` // a Hello of the bootstrap, the master assigning ids
	AdmitAllUs     float64 `json:"admit_all_us"`       // wiring in every peer but the first at once
	AdmitPerPeerNs float64 `json:"admit_per_peer_ns"`  // the same per admitted peer
	CollectiveUs   float64 `json:"collective_us"`      // one AllReduce over every peer: votes and Dones
	JoinUs         float64 `json:"join_us"`            // one newcomer choosing a random id: Hello, UpdateTopology, wiring round
	DeathAbortUs   float64 `json:"death_abort_us"`     // one peer dies mid-collective: the abort
	DeathRecoverUs float64 `json:"death_recover_us"`   // the same through the re-wired ring
	SyncUs         float64 `json:"sync_us"`            // one shared-state sync
	StatusPageUs   float64 `json:"status_page_us"`     // the status page and status.json
	// RewireBytes is the size of the Connect frames of the wiring round after the death: every member
	// gets the whole ring, so it grows with the square of the ring.
	RewireBytes int64  `json:"rewire_connect_bytes"`
	StatusBytes int    `json:"status_bytes"`
	Checks      checks `json:"checks"`
}

type kindCost struct {
	Events    int     `json:"events"`
	NsPer     float64 `json:"ns_per_event"`
	WallNsPer float64 `json:"wall_ns_per_event"`
	AllocsPer float64 `json:"allocs_per_event"`
}

// checks are the protocol outcomes the run verified.
type checks struct {
	AllAccepted    bool `json:"all_accepted"`
	CollectivesOK  bool `json:"collectives_ok"`
	DeathAborted   bool `json:"death_aborted"`
	DeathRewired   bool `json:"death_rewired"`
	NewcomerJoined bool `json:"newcomer_joined"`
	SyncsComplete  bool `json:"syncs_complete"`
}

func (k checks) ok() bool {
	return k.AllAccepted && k.CollectivesOK && k.DeathAborted && k.DeathRewired && k.NewcomerJoined && k.SyncsComplete
}

// steadyKinds are the inputs whose cost makes the per-event figure: what a master serves all the
// time, as opposed to the operations of joining and dying.
var steadyKinds = []string{"heartbeat", "tick", "vote_pending", "initiate", "done", "vote_topology", "step_report", "vote_sync", "sync_done"}

// runSimulated measures the master in process at n peers over the given number of steady-state
// cycles. progress, if not nil, receives one line per stage.
func runSimulated(n, cycles int, progress func(string, ...any)) (simResult, error) {
	if progress == nil {
		progress = func(string, ...any) {}
	}
	r := simResult{Peers: n, Cycles: cycles, PerKind: map[string]kindCost{}}
	c := newCluster()
	us := func(k cost) float64 { return float64(k.Nanos) / 1e3 }

	// Bootstrap: the first Hello is wired alone; the accepted peer's UpdateTopology admits the rest.
	hello := c.join("hello", n, false)
	r.HelloNs = hello.perEvent()
	c.link("links_ready")
	admit := c.updateTopology()
	r.AdmitAllUs = us(admit)
	if n > 1 {
		r.AdmitPerPeerNs = float64(admit.Nanos) / float64(n-1)
	}
	r.Checks.AllAccepted = c.accepted() == n && len(c.m.Snapshot(c.now).Ring) == n
	progress("n=%d: %d peers accepted in %.1f ms of CPU time in Step", n, c.accepted(), r.AdmitAllUs/1e3)

	// The steady state, measured apart from the operations. One heartbeat timeout's worth of cycles
	// runs first, off the record: every peer joined at the same instant, so the first expiry of the
	// heartbeat deadlines comes in one burst, which the steady state never sees again.
	for i := range window {
		c.cycle(uint64(i%4 + 1))
	}
	before := c.tally
	before.outcomes = map[wire.Code]int{wire.CodeOK: c.tally.outcomes[wire.CodeOK]}
	c.costs = map[string]*cost{}
	for i := range cycles {
		c.cycle(uint64(i%4 + 1))
	}
	var total cost
	for _, kind := range steadyKinds {
		k := c.costs[kind]
		if k == nil {
			continue
		}
		total.add(*k)
		r.PerKind[kind] = kindCost{Events: k.Events, NsPer: k.perEvent(), WallNsPer: k.wallPerEvent(),
			AllocsPer: float64(k.Allocs) / float64(k.Events)}
	}
	r.Events, r.NsPer, r.WallNsPer = total.Events, total.perEvent(), total.wallPerEvent()
	r.AllocsPer = float64(total.Allocs) / float64(max(total.Events, 1))
	r.Checks.CollectivesOK = c.tally.outcomes[wire.CodeOK]-before.outcomes[wire.CodeOK] == cycles*n &&
		c.tally.commences-before.commences == cycles*n
	r.Checks.SyncsComplete = c.tally.syncCompletes-before.syncCompletes == cycles*n
	progress("n=%d: %d steady-state events, %.0f ns/event of CPU (%.0f wall), %.2f allocs/event", n, r.Events, r.NsPer, r.WallNsPer, r.AllocsPer)

	// Operations.
	r.CollectiveUs = us(c.collective(7))
	r.SyncUs = us(c.sync())

	topoBefore := c.tally.changed
	join := c.join("hello", 1, true)
	join.add(c.updateTopology())
	r.JoinUs = us(join)
	r.Checks.NewcomerJoined = c.accepted() == n+1 && c.tally.changed-topoBefore == n+1

	// A peer in the middle of the ring dies while a collective runs.
	desc := wire.Desc{Count: 1 << 20, DType: uint8(rings.F32)}
	recover := c.batch("initiate", c.each(true, func(*simPeer) wire.Message { return &wire.Initiate{Tag: 9, Desc: desc} }))
	leftBefore := c.tally.outcomes[wire.CodePeerLeft]
	victim := c.live()[len(c.live())/2]
	abort := c.kill("death", victim)
	r.DeathAbortUs = us(abort)
	recover.add(abort)
	aborted := c.tally.outcomes[wire.CodePeerLeft] - leftBefore
	recover.add(c.batch("done", c.each(true, func(p *simPeer) wire.Message {
		return &wire.Done{Tag: 9, Seq: p.seq, Code: wire.CodePeerLeft, Detail: "neighbour gone"}
	})))
	changedBefore, bytesBefore := c.tally.changed, c.connectBytes
	recover.add(c.updateTopology())
	r.RewireBytes = c.connectBytes - bytesBefore
	r.DeathRecoverUs = us(recover)
	ring := c.m.Snapshot(c.now).Ring
	r.Checks.DeathAborted = aborted == n
	r.Checks.DeathRewired = c.tally.changed-changedBefore == n && len(ring) == n && !slices.Contains(ring, victim.id)

	d, size := c.statusPage()
	r.StatusPageUs, r.StatusBytes = float64(d.Nanoseconds())/1e3, size
	progress("n=%d: collective %.0f µs, join %.0f µs, death abort %.0f µs, recovery %.0f µs, status page %.0f µs",
		n, r.CollectiveUs, r.JoinUs, r.DeathAbortUs, r.DeathRecoverUs, r.StatusPageUs)
	if !r.Checks.ok() {
		return r, fmt.Errorf("n=%d: protocol check failed: %+v", n, r.Checks)
	}
	return r, nil
}
