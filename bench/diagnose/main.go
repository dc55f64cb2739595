// Command diagnose checks the master's slow-link and slow-peer diagnosis end to end.
//
// Peers run in this process on the in-memory network (pccl.NewNetwork), whose links have emulated
// bandwidth and latency; the master, the peers' data path and the link timings they report are the
// real ones. The command first runs clean AllReduces and counts the syndromes raised (false_events),
// then injects in turn a slowed ring link, a slowed sender (all its links out), a slowed receiver
// (all its links in) and a peer that sleeps before each operation, and counts the operations until
// the master raises the right syndrome about the right culprit (ops_to_classify; -1: not within
// --max-ops). After the slow link is found, the master's re-ordering policy must route the ring around
// it on its own, with no OptimizeTopology or other call by the application, within a few more
// operations (auto_reorder), and the AllReduce must get back at least 90% of the clean throughput
// (reroute_recovered). With --reorder=false the policy is off and the bench calls OptimizeTopology
// instead, as an application had to before. The last line is JSON.
//
// With --sites k the peers are spread over k sites (peer i in site i·k/n), so that every AllReduce
// runs hierarchically: reduce-scatter on each site's ring, all-reduce across sites on the WAN rings,
// all-gather in the site. Its Done carries the timings of the sub-rings' links, and the same faults
// must be classified from them: the slowed link is then a link of a site ring, and a slowed sender's
// (receiver's) links out (in) are its site link and its WAN link. A site ring paced by one slow link
// never fills the in-memory network's in-flight window, so no sender is held back there and the stall
// per byte shows nothing; each link's transit (the time its frames spend arriving, timed by the
// receiver) does: a frame crosses a fast link paced by a slow upstream peer fast, and crosses the
// slow link slowly. The detector judges a link's transit against the group's other links of its kind
// (within a site, or between sites), so the slowed link, sender and receiver are classified from
// their sub-rings' timings alone, with no bandwidth test, and the sleeping peer from the votes. The
// re-ordering policy acts only on a slow link of the flat ring in force, which a site ring's link
// need not be: with --sites, auto_reorder and reroute_recovered may stay false.
//
// A one-way ring shows one link out and one link in per peer, so on the ring alone a slowed sender
// or receiver looks like a slow link. The master tells them apart on its own: when a ring link looks
// slow in one operation and nothing else is known of its sender's links out or its receiver's links
// in, it asks for six short bandwidth tests around it (two links out of the sender, two into the
// receiver, two between other peers), run beside the next operations, whose results are in by the
// third slow operation, when a syndrome can first be raised. probes counts the master's requests per
// case (each a "probe" event). Should the syndrome still be ambiguous, with --probe (the default)
// the bench runs one OptimizeTopology, whose bandwidth tests measure every link, and keeps counting
// operations; bandwidth_tests says so per case, and all_classified counts only cases classified
// within 3 operations without one.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

func main() {
	peers := flag.Int("peers", 8, "number of peers")
	size := flag.Int("size", 8<<20, "AllReduce size in bytes per peer")
	clean := flag.Int("clean", 200, "operations of the clean run")
	maxOps := flag.Int("max-ops", 8, "operations a fault may take to be classified before it counts as missed")
	bw := flag.Float64("bandwidth", 50e6, "emulated bandwidth of every link, bytes/s")
	slow := flag.Float64("slowdown", 8, "factor a slowed link's bandwidth is divided by")
	probe := flag.Bool("probe", true, "run one OptimizeTopology (it measures every link) when a slow link may be a slow peer")
	sites := flag.Int("sites", 1, "number of sites the peers are spread over; above 1 every AllReduce is hierarchical")
	reorder := flag.Bool("reorder", true, "the master re-orders the ring around the slow link on its own; false: the bench calls OptimizeTopology")
	flag.Parse()
	// Defaults: sends stall only once a connection holds more than the in-memory network's 4 MiB in
	// flight, and the stall is what marks a slow link; 8 MiB per peer moves 14 MiB per ring link.
	if *peers < 4 {
		log.Fatal("need at least 4 peers")
	}
	if *sites < 1 || (*sites > 1 && *peers < 2**sites) {
		log.Fatal("--sites must be at least 1, and at most half the peers (a site of one peer is no site)")
	}
	out, err := run(*peers, *size, *clean, *maxOps, *bw, *slow, *probe, *sites, *reorder)
	if err != nil {
		log.Fatal(err)
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}

// caseResult is one injected fault.
type caseResult struct {
	Fault         string `json:"fault"`
	Want          string `json:"want"`
	Culprit       string `json:"culprit"`
	Classified    bool   `json:"classified"`
	OpsToClassify int    `json:"ops_to_classify"`
	// BandwidthTests is how many OptimizeTopology measurements the case needed: a single one-way ring
	// shows one link out and one link in per peer, so a slow sender or receiver first looks like a
	// slow link, which the detector says; the bench then measures every link once.
	BandwidthTests int `json:"bandwidth_tests"`
	// Probes is how many times the master asked for bandwidth tests around a suspect link on its
	// own during the case.
	Probes int      `json:"probes"`
	Raised []string `json:"raised"` // every syndrome raised during the case, in order
}

type bench struct {
	ctx   context.Context
	netw  *pccl.Network
	srv   *master.Server
	hosts []string
	comms []*pccl.Communicator
	index map[uint64]int
	size  int
	base  pccl.LinkConfig
	sleep []time.Duration // per peer, before each operation
	probe bool            // measure every link once when the detector says a slow link may be a slow peer
	bufs  [][]float32     // per peer, the AllReduce buffer
	sites int             // peers are spread over this many sites
	site  []string        // per peer, its site ("" with one site)

	mu     sync.Mutex
	events []master.Event
}

func run(n, size, clean, maxOps int, bw, slow float64, probe bool, sites int, reorder bool) (map[string]any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	b := &bench{ctx: ctx, netw: pccl.NewNetwork(), size: size, index: map[uint64]int{}, sleep: make([]time.Duration, n), probe: probe,
		base: pccl.LinkConfig{Bandwidth: bw, Latency: 200 * time.Microsecond}, sites: sites, site: make([]string, n)}
	b.hosts = make([]string, n)
	for i := range b.hosts {
		b.hosts[i] = fmt.Sprintf("peer%d", i)
		if sites > 1 {
			b.site[i] = fmt.Sprintf("site%d", i*sites/n)
		}
	}
	for i := range n {
		for j := range n {
			if i != j {
				b.netw.SetLink(b.hosts[i], b.hosts[j], b.base)
			}
		}
	}
	ln, err := b.netw.Host("master").Listen("master:7000")
	if err != nil {
		return nil, err
	}
	// The WAN heartbeat timing: the in-memory network copies every byte on this machine's cores, and a
	// loaded machine must not make the master drop peers in the middle of the measurement.
	mcfg := master.WAN()
	mcfg.MeasureDuration, mcfg.SolveBudget, mcfg.ImproveBudget = 300*time.Millisecond, 200*time.Millisecond, time.Second
	mcfg.Diagnosis.Reorder.Off = !reorder
	b.srv = master.NewServer(master.ServerConfig{Config: mcfg, OnEvent: b.note})
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- b.srv.Serve(sctx, ln) }()
	defer func() { stop(); <-served }()
	if err := b.join(n); err != nil {
		return nil, err
	}
	defer func() {
		for _, c := range b.comms {
			c.Close()
		}
	}()

	// Clean run: every syndrome raised is a false event.
	from := b.mark()
	t0 := time.Now()
	for range clean {
		if err := b.op(); err != nil {
			return nil, err
		}
	}
	cleanSec := time.Since(t0).Seconds() / float64(clean)
	var falseDetails []string
	for _, e := range b.raisedSince(from) {
		falseDetails = append(falseDetails, e.Kind+": "+e.Detail)
	}
	falseEvents := len(falseDetails)
	cleanProbes := b.countSince(from, "probe")
	fmt.Fprintf(os.Stderr, "clean: %.1f ms per op, %d syndromes raised, %d probe requests\n", cleanSec*1e3, falseEvents, cleanProbes)

	ring := b.ring()
	a, c := ring[0], b.successor(ring, ring[0]) // a link that carries data: a sends to c
	x := ring[3]                                // the slow peer of the other cases
	var cases []caseResult
	var reroute map[string]any

	// 1. A slow link, then the reroute around it.
	b.netw.SetLink(b.hosts[a], b.hosts[c], slowed(b.base, slow))
	optimizeCalls := 0
	r, err := b.classify("slowed link", "slow-link", fmt.Sprintf("%d→%d", b.comms[a].ID(), b.comms[c].ID()), maxOps,
		func(e master.Event) bool {
			return e.Kind == "slow-link" && e.Peer == b.comms[a].ID() && containsLink(e.Detail, b.comms[a].ID(), b.comms[c].ID())
		})
	if err != nil {
		return nil, err
	}
	cases = append(cases, r)
	optimizeCalls += r.BandwidthTests
	// The master re-orders the ring at a collective's votes once its solve is in: run operations
	// until the ring changes, at most --max-ops. Without the policy, the application's call.
	from = b.mark()
	opsToReorder := -1
	if reorder {
		for k := 1; k <= maxOps && opsToReorder < 0; k++ {
			if err := b.op(); err != nil {
				return nil, err
			}
			if !slices.Equal(b.ring(), ring) {
				opsToReorder = k
			}
		}
	} else {
		optimizeCalls++
		if err := b.all(func(cm *pccl.Communicator) error { return cm.OptimizeTopology(ctx) }); err != nil {
			return nil, err
		}
	}
	var reorderEvents []string
	for _, e := range b.eventsSince(from, "reorder") {
		reorderEvents = append(reorderEvents, e.Detail)
	}
	newRing := b.ring()
	avoids := !b.carries(newRing, a, c)
	autoReorder := reorder && opsToReorder > 0 && optimizeCalls == 0 && len(reorderEvents) > 0
	t0 = time.Now()
	const timed = 10
	for range timed {
		if err := b.op(); err != nil {
			return nil, err
		}
	}
	rerouteSec := time.Since(t0).Seconds() / timed
	reroute = map[string]any{"ring_before": ring, "ring_after": newRing, "avoids_slow_link": avoids,
		"clean_op_seconds": cleanSec, "rerouted_op_seconds": rerouteSec, "recovered_fraction": cleanSec / rerouteSec,
		"limit_fraction": 0.9, "ops_to_reorder": opsToReorder, "optimize_topology_calls": optimizeCalls,
		"reorder_events": reorderEvents}
	fmt.Fprintf(os.Stderr, "reroute: ring %v -> %v after %d ops, %d OptimizeTopology calls, %.1f ms per op (clean %.1f)\n",
		ring, newRing, opsToReorder, optimizeCalls, rerouteSec*1e3, cleanSec*1e3)
	recovered := avoids && cleanSec/rerouteSec >= 0.9
	b.netw.SetLink(b.hosts[a], b.hosts[c], b.base)
	if err := b.settle(); err != nil {
		return nil, err
	}

	// 2. A slow sender: every link out of x.
	x = b.ring()[3]
	for j := range n {
		if j != x {
			b.netw.SetLink(b.hosts[x], b.hosts[j], slowed(b.base, slow))
		}
	}
	r, err = b.classify("slowed sender", "slow-sender", fmt.Sprint(b.comms[x].ID()), maxOps,
		func(e master.Event) bool { return e.Kind == "slow-sender" && e.Peer == b.comms[x].ID() })
	if err != nil {
		return nil, err
	}
	cases = append(cases, r)
	b.restore()
	if err := b.settle(); err != nil {
		return nil, err
	}

	// 3. A slow receiver: every link into x.
	for j := range n {
		if j != x {
			b.netw.SetLink(b.hosts[j], b.hosts[x], slowed(b.base, slow))
		}
	}
	r, err = b.classify("slowed receiver", "slow-receiver", fmt.Sprint(b.comms[x].ID()), maxOps,
		func(e master.Event) bool { return e.Kind == "slow-receiver" && e.Peer == b.comms[x].ID() })
	if err != nil {
		return nil, err
	}
	cases = append(cases, r)
	b.restore()
	if err := b.settle(); err != nil {
		return nil, err
	}

	// 4. A peer that sleeps before each operation, for as long as a clean operation takes, twice.
	b.sleep[x] = time.Duration(2 * cleanSec * float64(time.Second))
	r, err = b.classify("sleeping peer", "slow-compute", fmt.Sprint(b.comms[x].ID()), maxOps,
		func(e master.Event) bool { return e.Kind == "slow-compute" && e.Peer == b.comms[x].ID() })
	if err != nil {
		return nil, err
	}
	cases = append(cases, r)
	b.sleep[x] = 0

	// all_classified holds when every case was classified within 3 operations with no bandwidth
	// test; all_classified_after_bandwidth_test allows the one measurement of every link.
	all, withTest := true, true
	perCase := map[string]int{}
	for _, c := range cases {
		all = all && c.Classified && c.OpsToClassify <= 3 && c.BandwidthTests == 0
		withTest = withTest && c.Classified && c.OpsToClassify <= 3
		perCase[c.Fault] = c.OpsToClassify
	}
	return map[string]any{"peers": n, "sites": sites, "bytes": size, "network": "in-process peers on the in-memory network",
		"link_bandwidth": b.base.Bandwidth, "link_latency_seconds": b.base.Latency.Seconds(), "slowdown": slow,
		"clean_ops": clean, "clean_probes": cleanProbes, "false_events": falseEvents, "false_events_limit": 0, "false_event_details": falseDetails,
		"cases": cases, "ops_to_classify": perCase, "ops_limit": 3, "all_classified": all,
		"all_classified_after_bandwidth_test": withTest,
		"reroute":                             reroute, "reroute_recovered": recovered, "auto_reorder": autoReorder}, nil
}

func slowed(c pccl.LinkConfig, f float64) pccl.LinkConfig {
	c.Bandwidth /= f
	return c
}

// restore gives every link its base configuration.
func (b *bench) restore() {
	for i := range b.hosts {
		for j := range b.hosts {
			if i != j {
				b.netw.SetLink(b.hosts[i], b.hosts[j], b.base)
			}
		}
	}
}

func (b *bench) note(e master.Event) {
	b.mu.Lock()
	b.events = append(b.events, e)
	b.mu.Unlock()
}

func (b *bench) mark() int {
	b.srv.Snapshot() // every event of the operations before is noted once the event loop answers
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.events)
}

// raisedSince returns the syndromes raised since mark from.
func (b *bench) raisedSince(from int) []master.Event {
	b.srv.Snapshot()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []master.Event
	for _, e := range b.events[from:] {
		if strings.HasPrefix(e.Kind, "slow-") {
			out = append(out, e)
		}
	}
	return out
}

// eventsSince returns the master's events of kind since mark from.
func (b *bench) eventsSince(from int, kind string) []master.Event {
	b.srv.Snapshot()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []master.Event
	for _, e := range b.events[from:] {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// countSince counts the master's events of kind since mark from.
func (b *bench) countSince(from int, kind string) int {
	b.srv.Snapshot()
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, e := range b.events[from:] {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

// classify runs operations until match holds for a raised syndrome, at most maxOps.
func (b *bench) classify(fault, want, culprit string, maxOps int, match func(master.Event) bool) (caseResult, error) {
	r := caseResult{Fault: fault, Want: want, Culprit: culprit, OpsToClassify: -1}
	from := b.mark()
	for k := 1; k <= maxOps; k++ {
		t0 := time.Now()
		if err := b.op(); err != nil {
			return r, err
		}
		if os.Getenv("DIAG_DEBUG") != "" {
			s := b.srv.Snapshot()
			fmt.Fprintf(os.Stderr, "op %d: %v; links %+v\n", k, time.Since(t0), s.Groups[0].Links)
		}
		evs := b.raisedSince(from)
		r.Raised = r.Raised[:0]
		for _, e := range evs {
			r.Raised = append(r.Raised, e.Kind+": "+e.Detail)
		}
		r.Probes = b.countSince(from, "probe")
		if slices.ContainsFunc(evs, match) {
			r.Classified, r.OpsToClassify = true, k
			break
		}
		ambiguous := slices.ContainsFunc(evs, func(e master.Event) bool { return strings.Contains(e.Detail, "would look the same") })
		if ambiguous && r.BandwidthTests == 0 && b.probe {
			r.BandwidthTests++
			if err := b.all(func(c *pccl.Communicator) error { return c.OptimizeTopology(b.ctx) }); err != nil {
				return r, err
			}
		}
	}
	fmt.Fprintf(os.Stderr, "%s: classified %v after %d ops (%d probe requests); raised %q\n", fault, r.Classified, r.OpsToClassify, r.Probes, r.Raised)
	return r, nil
}

// settle runs clean operations until no syndrome is active, so that the next case starts clean.
func (b *bench) settle() error {
	for range 30 {
		if len(b.srv.Snapshot().Groups) > 0 && len(b.srv.Snapshot().Groups[0].Syndromes) == 0 {
			return nil
		}
		if err := b.op(); err != nil {
			return err
		}
	}
	return errors.New("syndromes did not clear after the fault was removed")
}

// op runs one AllReduce on every peer.
func (b *bench) op() error {
	count := b.size / 4
	if b.bufs == nil {
		// One buffer per peer, reused: filling fresh buffers before every operation would itself be
		// uneven work outside communication, which the diagnosis rightly notices.
		b.bufs = make([][]float32, len(b.comms))
		for i := range b.bufs {
			b.bufs[i] = make([]float32, count)
		}
	}
	return b.allIdx(func(i int, c *pccl.Communicator) error {
		if d := b.sleep[i]; d > 0 {
			time.Sleep(d) // the injected fault: busy outside communication
		}
		v := b.bufs[i]
		return c.AllReduce(b.ctx, pccl.Bytes(v), pccl.Bytes(v), pccl.Desc{Tag: 1, Count: count, DType: pccl.F32, Op: pccl.Sum})
	})
}

func (b *bench) all(f func(*pccl.Communicator) error) error {
	return b.allIdx(func(_ int, c *pccl.Communicator) error { return f(c) })
}

func (b *bench) allIdx(f func(int, *pccl.Communicator) error) error {
	errs := make([]error, len(b.comms))
	var wg sync.WaitGroup
	for i, c := range b.comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i, c)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// ring returns the ring in force as peer indices.
func (b *bench) ring() []int {
	var out []int
	for _, id := range b.comms[0].Ring() {
		out = append(out, b.index[id])
	}
	return out
}

// join connects n peers, each admitted by the ones before.
func (b *bench) join(n int) error {
	connect := func(i int) (*pccl.Communicator, error) {
		return pccl.Connect(b.ctx, pccl.Config{Master: "master:7000", ListenAddr: b.hosts[i] + ":9000",
			Transport: b.netw.Host(b.hosts[i]), Site: b.site[i]})
	}
	b.comms = make([]*pccl.Communicator, n)
	var err error
	if b.comms[0], err = connect(0); err != nil {
		return err
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.comms[i], errs[i] = connect(i)
		}()
	}
	for len(b.srv.Snapshot().Peers) < n {
		time.Sleep(time.Millisecond)
	}
	if err := b.comms[0].UpdateTopology(b.ctx); err != nil {
		return err
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for i, c := range b.comms {
		b.index[c.ID()] = i
	}
	return nil
}

// successor returns the peer that x sends to in ring: its successor in the flat ring, or with sites
// in its site's ring (the peers of its site in ring order), which is what a hierarchical AllReduce
// runs on.
func (b *bench) successor(ring []int, x int) int {
	if b.sites <= 1 {
		return ring[(slices.Index(ring, x)+1)%len(ring)]
	}
	var site []int
	for _, p := range ring {
		if b.site[p] == b.site[x] {
			site = append(site, p)
		}
	}
	return site[(slices.Index(site, x)+1)%len(site)]
}

// carries reports whether the AllReduce on ring sends data from a to c: a link of the flat ring,
// or with sites of a site ring. (A WAN ring pairs the peers of one rank in each site; the bench
// slows a site ring's link, so the WAN rings need not be checked.)
func (b *bench) carries(ring []int, a, c int) bool {
	if b.sites <= 1 {
		return hasEdge(ring, a, c)
	}
	return b.successor(ring, a) == c
}

// hasEdge reports whether ring sends from a to c.
func hasEdge(ring []int, a, c int) bool {
	for i, x := range ring {
		if x == a && ring[(i+1)%len(ring)] == c {
			return true
		}
	}
	return false
}

// containsLink reports whether an event's detail names the link from→to.
func containsLink(detail string, from, to uint64) bool {
	return strings.Contains(detail, fmt.Sprintf("%d→%d", from, to))
}
