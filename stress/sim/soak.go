package sim

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/stress/invariant"
)

// FaultClasses are the faults the simulated soak deals, in the order of its summary: the real soak's
// classes, then those no test bed of real processes can stage.
var FaultClasses = []string{"kill", "stop", "spawn", "join", "blackhole", "slow", "leave", "master-stall", "master-restart",
	"junk", "link-blackhole", "link-slow", "partition", "clock-jump", "asym", "restart"}

// Bounds of the soak, those of the real one where it has them.
const (
	minPeers = 2
	// stallLimit is twice the real soak's 10 s: every re-wire here costs WAN round trips (up to
	// 150 ms) where loopback's cost microseconds, and after a ring link goes silent the group
	// needs several (the peers downstream of it give up their own idle links too).
	stallLimit    = 20 * time.Second
	hangLimit     = 10 * time.Second // a peer told to leave must have exited by then
	leakWait      = 3 * time.Second  // a closed session's goroutines must have ended by then
	tickEvery     = 100 * time.Millisecond
	maxExtraPeers = 2 // spawn and join faults grow the pool at most this far above Peers
	eventLogLen   = 100
	progressLimit = 3 * time.Second // pccl.Config.ProgressTimeout of every peer

	linkHoleMin        = 4 * time.Second  // a ring link's black hole outlasts the progress deadline
	linkHoleGrace      = 10 * time.Second // an eviction it causes within this is no violation
	masterStallEvery   = 20 * time.Second // master-stall faults are at least this far apart
	masterRestartEvery = 60 * time.Second // master-restart faults are at least this far apart
	restartSettle      = 5 * time.Second  // no peer frozen, removed or added this soon after a master restart
	freezeGap          = 2 * time.Second  // one freeze at a time, this far apart
	junkPerFault       = 40               // connections one junk fault opens to the master
	maxClockError      = 2 * time.Hour    // a clock jump brings a clock further off than this back
)

// Options configures a simulated soak. Durations are virtual time.
type Options struct {
	// Duration is how long the soak runs. Default 2 minutes.
	Duration time.Duration
	// Seed chooses the faults and every random choice of the harness. A seed reproduces the fault
	// schedule, not the goroutines' interleaving.
	Seed uint64
	// Peers is the number of peer processes kept running. Default 5.
	Peers int
	// FaultMin and FaultMax bound the time between two faults. Default 3 to 6 seconds.
	FaultMin, FaultMax time.Duration
	// Step is the least time between two steps of a peer's loop. Default 100 ms, the real soak's.
	Step time.Duration
	// OptimizeEvery makes the group run OptimizeTopology after steps at revisions divisible by it.
	// Default 64; -1 never.
	OptimizeEvery int
	// Break plants a bug (see plantedBugs): "stale-update" makes every peer apply the state
	// update of a failed step; "hears-silent" makes the master count silent peers as heard.
	// Empty: none.
	Break string
	// Topology places the hosts. Default: WAN().
	Topology *Topology
	// StallLimit is the longest time without a completed collective while two healthy peers are in
	// the group. Default 20 s.
	StallLimit time.Duration
	// Classes lists the fault classes dealt (see FaultClasses). Empty: all.
	Classes []string
	// KeepGoing runs on after the first violation (by default the soak stops there).
	KeepGoing bool
	// Log receives a status line every StatusEvery of virtual time, and the report of a violation.
	// Nil: none.
	Log io.Writer
	// StatusEvery is the virtual time between status lines. Default 10 minutes.
	StatusEvery time.Duration
	// Wall reads the real clock, for the status lines and the summary's wall time: inside the
	// bubble time.Now is virtual. Nil: no wall time is reported.
	Wall func() time.Time
}

func (o Options) withDefaults() Options {
	if o.Duration == 0 {
		o.Duration = 2 * time.Minute
	}
	if o.Peers == 0 {
		o.Peers = 5
	}
	if o.FaultMin == 0 && o.FaultMax == 0 {
		o.FaultMin, o.FaultMax = 3*time.Second, 6*time.Second
	}
	if o.Step == 0 {
		o.Step = 100 * time.Millisecond
	}
	if o.OptimizeEvery == 0 {
		o.OptimizeEvery = 64
	}
	if o.Topology == nil {
		t := WAN()
		o.Topology = &t
	}
	if o.StallLimit == 0 {
		o.StallLimit = stallLimit
	}
	if o.StatusEvery == 0 {
		o.StatusEvery = 10 * time.Minute
	}
	return o
}

// Validate names the first bad field.
func (o Options) Validate() error {
	o = o.withDefaults()
	switch {
	case o.Duration < 0:
		return fmt.Errorf("sim: Options.Duration %v: must be positive", o.Duration)
	case o.Peers < 3:
		return fmt.Errorf("sim: Options.Peers %d: need at least 3 (faults keep two peers that hold the state)", o.Peers)
	case o.FaultMin <= 0 || o.FaultMax < o.FaultMin:
		return fmt.Errorf("sim: Options.FaultMin %v and FaultMax %v: need 0 < min <= max", o.FaultMin, o.FaultMax)
	case o.Step < 0:
		return fmt.Errorf("sim: Options.Step %v: must not be negative", o.Step)
	case slices.ContainsFunc(o.Classes, func(c string) bool { return !slices.Contains(FaultClasses, c) }):
		return fmt.Errorf("sim: Options.Classes %v: the classes are %v", o.Classes, FaultClasses)
	case o.Break != string(breakNone) && plantedBugs[breakMode(o.Break)].about == "":
		return fmt.Errorf("sim: Options.Break %q: the planted bugs are %v", o.Break, slices.Sorted(maps.Keys(plantedBugs)))
	}
	return o.Topology.Validate()
}

// Stats are the percentiles of one fault class's recovery times, in milliseconds of virtual time.
type Stats struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P90     float64 `json:"p90_ms"`
	P99     float64 `json:"p99_ms"`
	Max     float64 `json:"max_ms"`
}

// Summary is what a simulated soak reports.
type Summary struct {
	Seed     uint64  `json:"seed"`
	Break    string  `json:"break,omitempty"`
	Peers    int     `json:"peers"`
	VirtualS float64 `json:"virtual_s"`
	WallS    float64 `json:"wall_s,omitempty"`
	// Counts of what was checked.
	Iterations     int   `json:"iterations"`    // revisions whose step completed
	OpsCompleted   int64 `json:"ops_completed"` // AllReduce calls completed and checked, all peers
	Syncs          int   `json:"syncs"`         // syncs checked, all peers
	Aborts         int   `json:"aborts"`
	SyncFailures   int   `json:"sync_failures"`
	Sessions       int   `json:"sessions"`
	LeakChecks     int   `json:"leak_checks"` // sessions whose goroutines were counted after Close
	UnfaultedKicks int   `json:"unfaulted_kicks"`
	// StepsLostToMaster counts the fetches excused after a master restart: a collective completes
	// on the master's outcome, which the dead master sent to some peers only.
	StepsLostToMaster int `json:"steps_lost_to_master_restart"`
	// LinkHoleEvictions counts peers evicted as unreachable from a ring neighbour whose link was
	// black-holed (no ring without that link existed then).
	LinkHoleEvictions int                   `json:"link_hole_evictions"`
	MaxRevision       uint64                `json:"max_revision"`
	LongestGapMs      float64               `json:"longest_gap_ms"`   // longest virtual time without a completed collective
	LongestGapAtS     float64               `json:"longest_gap_at_s"` // when it ended, from the start
	Faults            map[string]int        `json:"faults"`
	FaultsTotal       int                   `json:"faults_total"`
	FaultKinds        map[string]int        `json:"fault_kinds"` // the shapes of partitions and asymmetric links
	MinFaultClass     int                   `json:"min_faults_per_class"`
	Recovery          map[string]Stats      `json:"recovery_ms"`
	Invariants        []string              `json:"invariants"`
	Violations        int                   `json:"violations"`
	FirstViolationS   float64               `json:"first_violation_s,omitempty"` // virtual seconds from the start
	ViolationList     []invariant.Violation `json:"violation_list,omitempty"`

	// HeldCuts counts the partitions that left the master hearing fewer than half of the group,
	// whose kicks for silence were checked against PartitionTimeout (partition_kick).
	HeldCuts int `json:"held_cuts"`
}

// invariantList names what the soak checks, for the summary.
var invariantList = []string{
	"exact AllReduce elements over the ring that ran (" + invariant.WrongElement + ")",
	"failed AllReduce leaves its buffer unchanged (" + invariant.NotRestored + ")",
	"one state hash per accepted revision (" + invariant.TwoHashes + ")",
	"revision +1 per sync in a session (" + invariant.RevisionStep + "), none skipped by the group (" + invariant.RevisionGap + ")",
	"a peer that held the state never fetches it (" + invariant.Diverged + ")",
	"no stall over the stall limit (20s unless set) with two healthy peers (" + invariant.Stall + ")",
	"a leaving peer exits within " + hangLimit.String() + " (" + invariant.Hang + ")",
	"no goroutine of a session left " + leakWait.String() + " after Close, none of any process at the end (" + invariant.Leak + ")",
	"no unexpected error, no healthy peer kicked (" + invariant.Peer + ")",
	"a master that hears fewer than half of the group kicks nobody for silence before PartitionTimeout (" + invariant.PartitionKick + ")",
	"no panic (a panic ends the test binary)",
}

// linkFault is a change to the links between two peers: a black hole, a slow-down, or an asymmetric
// slow-down of one direction.
type linkFault struct {
	class    string
	from, to *proc
	both     bool // both directions
	until    time.Time
	over     bool // ended; kept until linkHoleGrace after, to excuse an eviction it caused
}

// partition is a cut of the network in two: near holds the master.
type partition struct {
	kind  string
	near  map[string]bool
	far   map[string]bool
	until time.Time

	// The master's rule for the cut (judgeCut): while it hears fewer than half of the group, it
	// kicks none of the far side's peers for silence before PartitionTimeout − kickSlack has passed
	// since the cut (cutAt). members is the group as the master held it at the cut, kept up to date
	// from the master's events: who left it and when, and how many joined it since.
	holdKicks bool
	members   map[uint64]*member
	joined    int
	cutAt     time.Time
	farDelay  time.Duration // the longest one-way delay from a cut-off peer to the master at the cut
	lost      int64         // the master's events lost before the cut (soak.lostEvents); more later voids the check
}

// member is a peer of the group at a cut, placed by the soak.
type member struct {
	side   side
	goneAt time.Time // when the master removed it (zero: still in the group)
}

// side is where the soak places a peer of the group at a cut.
type side int

const (
	heardSide  side = iota // on the master's side and alive: the master hears it
	farSide                // cut off from the master
	silentSide             // killed: heard on neither side
)

// slowMin and slowMax bound the latency a slow fault adds to a link.
const (
	slowMin = 20 * time.Millisecond
	slowMax = 100 * time.Millisecond
)

// kickSlack is how much earlier than PartitionTimeout after the cut the master may kick a silent
// peer when it hears fewer than half of the group: the peer's last heartbeat may have come up to a
// HeartbeatInterval before the cut, and the master ticks four times per interval.
const kickSlack = time.Second

// pendingFault is a fault whose recovery is being timed.
type pendingFault struct {
	class  string
	at     time.Time
	victim *proc
}

// soak is one run; the bubble's root goroutine owns every field.
type soak struct {
	o      Options
	mcfg   master.Config
	cl     *Cluster
	rng    *rand.Rand
	check  *invariant.Checker
	events chan event
	pp     peerParams
	start  time.Time
	wall0  time.Time
	ctx    context.Context
	// masterEvents carries the master's membership events (joins, departures, kicks for silence)
	// from its event loop; lostEvents counts those a full queue dropped.
	masterEvents chan master.Event
	lostEvents   *atomic.Int64

	procs   []*proc // spawn order
	spawned int

	masterPausedUntil time.Time
	lastMasterStall   time.Time
	lastMasterRestart time.Time
	nextFault         time.Time
	joinArmed         bool
	freezeOver        time.Time
	closing           bool
	part              *partition
	linkFaults        []linkFault
	pending           []pendingFault
	recovery          map[string][]float64
	iterations        map[uint64]bool
	lastStep          time.Time
	lastWorld         int
	ring              []uint64
	junkDone          []chan struct{}
	log               eventLog
	lastStatus        time.Time
	sum               Summary
}

// Run runs a simulated soak. It must be called inside a testing/synctest bubble (synctest.Test), from
// the bubble's goroutine, and returns once every process of the cluster has ended.
func Run(o Options) (Summary, error) {
	if err := o.Validate(); err != nil {
		return Summary{}, err
	}
	o = o.withDefaults()
	mcfg := master.LAN()
	mcfg.MinPeers = minPeers
	// The bandwidth tests of OptimizeTopology move real bytes through the in-memory network, which
	// copies each twice: short tests keep the run's CPU on the protocol.
	mcfg.MeasureDuration = 25 * time.Millisecond
	mcfg.ImproveBudget = 500 * time.Millisecond
	mcfg.PartitionTimeout = 5 * mcfg.HeartbeatTimeout // the default, named for the partition check
	cl, err := NewCluster(*o.Topology, mcfg)
	if err != nil {
		return Summary{}, err
	}
	if b := breakMode(o.Break); plantedBugs[b].master {
		cl.Planted = []string{o.Break}
	}
	s := &soak{
		o: o, cl: cl, mcfg: mcfg,
		rng:        rand.New(rand.NewPCG(o.Seed, 0x51a1)),
		check:      invariant.New(o.StallLimit, minPeers),
		events:     make(chan event, 4096),
		recovery:   map[string][]float64{},
		iterations: map[uint64]bool{},
		ctx:        context.Background(),
		sum: Summary{Seed: o.Seed, Break: o.Break, Peers: o.Peers, Faults: map[string]int{}, FaultKinds: map[string]int{},
			Recovery: map[string]Stats{}, Invariants: invariantList},
	}
	if o.Wall != nil {
		s.wall0 = o.Wall()
	}
	for _, c := range FaultClasses {
		s.sum.Faults[c] = 0
	}
	optimize := uint64(0)
	if o.OptimizeEvery > 0 {
		optimize = uint64(o.OptimizeEvery)
	}
	s.pp = peerParams{
		cfg:       pccl.Config{Master: MasterAddr, ProgressTimeout: progressLimit},
		step:      o.Step,
		optimize:  optimize,
		brk:       breakMode(o.Break),
		events:    s.events,
		leakWait:  leakWait,
		begun:     new(atomic.Bool),
		holdJoins: new(atomic.Int64),
	}
	s.start = time.Now()
	s.masterEvents = make(chan master.Event, 4096)
	s.lostEvents = new(atomic.Int64)
	cl.OnMasterEvent = func(e master.Event) {
		if e.Kind != "accepted" && e.Kind != "joined" {
			s.log.add(fmt.Sprintf("%10.3fs master: %s peer %d: %s", s.elapsed(e.Time).Seconds(), e.Kind, e.Peer, e.Detail))
		}
		switch e.Kind {
		case "timeout", "kicked", "left", "joined":
			if e.Group != 0 {
				break
			}
			select {
			case s.masterEvents <- e: // judged by the soak's goroutine (masterEvent)
			default:
				s.lostEvents.Add(1) // voids the partition check in force rather than raise a false one
			}
		}
	}
	if err := cl.StartMaster(s.incarnation()); err != nil {
		return s.sum, err
	}
	for range o.Peers {
		s.spawn("pool", 0)
	}
	s.nextFault = s.start.Add(2*time.Second + s.faultGap())
	s.loop()
	s.shutdown()
	s.finish()
	return s.sum, nil
}

// incarnation draws the master's next incarnation from the seed.
func (s *soak) incarnation() uint64 { return uint64(s.rng.Uint32()>>1) | 1 }

func (s *soak) faultGap() time.Duration {
	return s.o.FaultMin + time.Duration(s.rng.Int64N(int64(s.o.FaultMax-s.o.FaultMin)+1))
}

// elapsed is the virtual time since the start.
func (s *soak) elapsed(now time.Time) time.Duration { return now.Sub(s.start) }

// event records one line of the event log.
func (s *soak) event(format string, args ...any) {
	s.log.add(fmt.Sprintf("%10.3fs ", s.elapsed(time.Now()).Seconds()) + fmt.Sprintf(format, args...))
}

// eventLog keeps the last lines of the run: the supervisor's and the master's notes. Its methods are
// safe for concurrent use (the master notes from its event loop).
type eventLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *eventLog) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
	if len(l.lines) > 2*eventLogLen {
		l.lines = slices.Clone(l.lines[len(l.lines)-eventLogLen:])
	}
}

func (l *eventLog) last(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines[max(0, len(l.lines)-n):])
}

// loop takes in the peers' events and runs the timers until the duration is over (or, without
// KeepGoing, until the first violation).
func (s *soak) loop() {
	end := s.start.Add(s.o.Duration)
	tick := time.NewTicker(tickEvery)
	defer tick.Stop()
	for {
		select {
		case ev := <-s.events:
			s.handle(ev)
		case e := <-s.masterEvents:
			s.masterEvent(e)
		case now := <-tick.C:
			if !now.Before(end) {
				return
			}
			s.tick(now)
		}
		if len(s.check.Violations()) > 0 && !s.o.KeepGoing {
			return
		}
	}
}

// spawn starts a peer process on a new host (or, for a same-identity restart, on host with the
// identity id).
func (s *soak) spawn(why string, id uint64, host ...string) *proc {
	name := fmt.Sprintf("p%d", s.spawned)
	site := s.spawned % s.o.Topology.NumSites()
	if len(host) > 0 {
		name = host[0]
		site, _ = s.cl.SiteOf(name)
	}
	s.cl.Place(name, site)
	if s.part != nil {
		// A process started during a partition is on the master's side.
		for far := range s.part.far {
			s.cl.Net.Partition(name, far)
		}
		s.part.near[name] = true
		// It may bring the master's side to half of the group, where the master kicks the silent
		// ones after HeartbeatTimeout: the cut's check no longer holds.
		s.part.holdKicks = false
	}
	ctx, leave := context.WithCancel(s.ctx)
	p := &proc{name: name, label: fmt.Sprintf("%s.%d", name, s.spawned), site: site, tr: newProcTransport(s.cl.Net.Host(name)), ctx: ctx, leave: leave,
		rng: rand.New(rand.NewPCG(s.rng.Uint64(), s.rng.Uint64())), firstID: id, done: make(chan struct{})}
	s.procs = append(s.procs, p)
	pp := s.pp
	pp.cfg.Site = s.o.Topology.SiteName(site)
	s.spawned++
	go pprof.Do(ctx, pprof.Labels(labelRole, "peer"), func(context.Context) { p.run(pp) })
	s.event("spawn %s in site %d (%s)", name, site, why)
	return p
}

// key names a session of p for the checker.
func key(p *proc, sess uint64) string { return p.label + "/" + strconv.FormatUint(sess, 10) }

// handle takes in one event of a peer.
func (s *soak) handle(ev event) {
	p := ev.proc
	now := ev.at
	if p.killed && ev.kind != "session_end" {
		return // a dead process prints nothing: what it did after the kill is its goroutines' unwinding
	}
	k := key(p, ev.sess)
	switch ev.kind {
	case "connecting":
		p.connecting = ev.sess
	case "connected":
		p.lastSess = ev.sess
		if now.After(p.doomedAt) {
			p.sess, p.established = ev.sess, false
		}
		s.sum.Sessions++
		s.event("%s connected as %d (world %d)", p.label, ev.sess, ev.world)
	case "synced":
		s.pp.begun.Store(true)
		s.sum.Syncs++
		s.check.Synced(now, k, ev.rev, ev.hash, ev.fetched, ev.fresh)
		if ev.sess == p.sess && p.sess != 0 {
			p.established = true
		}
		if ev.fresh || ev.fetched > 0 {
			s.event("%s synced revision %d hash %016x (fresh %v, fetched %d)", k, ev.rev, ev.hash, ev.fresh, ev.fetched)
		}
	case "started":
		if s.joinArmed && p.established && now.Sub(s.lastMasterRestart) >= restartSettle && s.part == nil {
			s.joinArmed = false
			np := s.spawn("join while "+p.label+" runs revision "+strconv.FormatUint(ev.rev, 10), 0)
			s.faulted("join", now, np)
		}
	case "step":
		if gap := float64(now.Sub(s.lastStep)) / 1e6; !s.lastStep.IsZero() && gap > s.sum.LongestGapMs {
			s.sum.LongestGapMs, s.sum.LongestGapAtS = gap, s.elapsed(now).Seconds()
		}
		s.lastStep = now
		if len(ev.ring) > 0 {
			s.ring = ev.ring
		}
		s.check.Completed(now)
		s.sum.OpsCompleted += int64(ev.ops)
		s.iterations[ev.rev] = true
		s.lastWorld = ev.world
		s.sum.MaxRevision = max(s.sum.MaxRevision, ev.rev)
		kept := s.pending[:0]
		for _, f := range s.pending {
			if f.victim != p && !ev.started.Before(f.at) {
				s.recovery[f.class] = append(s.recovery[f.class], float64(now.Sub(f.at))/1e6)
				continue
			}
			kept = append(kept, f)
		}
		s.pending = kept
	case "aborted":
		s.sum.Aborts++
		s.check.Aborted(now, k, ev.rev, ev.restored, ev.detail)
		s.event("%s aborted at revision %d (%d ops done): %s: %s", k, ev.rev, ev.ops, ev.errKind, ev.detail)
	case "optimized":
		s.event("%s OptimizeTopology after revision %d took %v: %s", k, ev.rev, now.Sub(ev.started).Round(time.Millisecond), ev.detail)
	case "wrong":
		s.check.WrongElement(now, k, ev.rev, ev.detail)
	case "sync_failed":
		s.sum.SyncFailures++
		s.event("%s sync failed: %s", k, ev.detail)
	case "session_end":
		s.check.SessionEnded(k)
		s.sum.LeakChecks++
		s.event("%s session ended: %s: %s", k, ev.errKind, ev.detail)
		if ev.leak {
			s.check.Fail(now, invariant.Leak, 0, k, "%s", ev.detail)
		}
		if p.killed {
			return
		}
		switch ev.errKind {
		case "canceled", "deadline":
		case "kicked", "master_lost":
			if ev.sess == p.sess && p.sess != 0 {
				// Left the group although no fault hit it.
				s.sum.UnfaultedKicks++
				excused := invariant.LinkKick(ev.detail) && s.linkHoled(p, now)
				if excused {
					s.sum.LinkHoleEvictions++
				}
				if !excused && strings.Contains(ev.detail, "kicked by the master") && !strings.Contains(ev.detail, "no heartbeat") {
					s.check.Fail(now, invariant.Peer, 0, k, "a healthy peer was kicked: %s", ev.detail)
				}
			}
		default:
			s.check.Fail(now, invariant.Peer, 0, k, "session ended by an unexpected error: %s", ev.detail)
		}
		if ev.sess == p.sess {
			p.sess, p.established = 0, false
		}
	case "error":
		s.check.Fail(now, invariant.Peer, ev.rev, k, "%s", ev.detail)
	}
}

// faulted counts a fault and starts timing its recovery.
func (s *soak) faulted(class string, now time.Time, victim *proc) {
	s.sum.Faults[class]++
	s.sum.FaultsTotal++
	s.pending = append(s.pending, pendingFault{class: class, at: now, victim: victim})
	name := "master"
	if victim != nil {
		name = victim.label
	}
	s.event("FAULT %s %s", class, name)
}

// doom marks a victim's session as lost: it no longer counts as healthy or as holding the state.
func (s *soak) doom(p *proc, now time.Time) {
	p.sess, p.established, p.doomedAt = 0, false, now
}

// tick runs the timers: ends of stops, holes, slow links and partitions, exits, replacements, the
// next fault, the stall check and the status line.
func (s *soak) tick(now time.Time) {
	if !s.masterPausedUntil.IsZero() && !now.Before(s.masterPausedUntil) {
		s.masterPausedUntil = time.Time{}
		s.cl.ResumeMaster()
		s.freezeOver = now
		// Recovery counts from the master's return: its pause itself is the fault's cost.
		s.faulted("master-stall", now, nil)
	}
	if s.part != nil && !now.Before(s.part.until) {
		s.heal(now)
	}
	running, healthy := 0, 0
	for _, p := range s.procs {
		if p.exited {
			continue
		}
		if !p.stoppedUntil.IsZero() && !now.Before(p.stoppedUntil) {
			p.stoppedUntil = time.Time{}
			// A Connect that the stop froze may return just now: that session is doomed too.
			p.doomedAt = now.Add(100 * time.Millisecond)
			s.freezeOver = now
			s.event("%s resumed", p.label)
		}
		if !p.holedUntil.IsZero() && !now.Before(p.holedUntil) {
			p.holedUntil = time.Time{}
			s.cl.ResetLink(p.name, MasterHost)
			s.cl.ResetLink(MasterHost, p.name)
			s.freezeOver = now
			s.event("hole of %s over", p.label)
		}
		if !p.slowUntil.IsZero() && !now.Before(p.slowUntil) {
			p.slowUntil = time.Time{}
			s.cl.ResetLink(p.name, MasterHost)
			s.cl.ResetLink(MasterHost, p.name)
			s.event("slow link of %s over", p.label)
		}
		select {
		case <-p.done:
			p.exited = true
			s.event("%s exited", p.label)
			if !p.killed && p.leaveAt.IsZero() {
				s.check.Fail(now, invariant.Exit, 0, p.label, "exited without being told to")
			}
			continue
		default:
		}
		if !p.leaveAt.IsZero() && now.Sub(p.leaveAt) > hangLimit && !p.killed {
			s.check.Fail(now, invariant.Hang, 0, p.label, "still running %v after being told to leave", now.Sub(p.leaveAt).Round(time.Millisecond))
			s.kill(p, now)
		}
		if !p.gone() {
			running++
		}
		if p.healthy() {
			healthy++
		}
	}
	s.endLinkFaults(now)
	for ; running < s.o.Peers && !s.closing; running++ {
		s.spawn("replacement", 0)
	}
	if !now.Before(s.nextFault) && !s.closing {
		s.inject(now)
		s.nextFault = now.Add(s.faultGap())
	}
	if !s.masterPausedUntil.IsZero() {
		healthy = 0 // nobody can make progress while the master is paused
	}
	s.check.Tick(now, healthy)
	for len(s.pending) > 0 && now.Sub(s.pending[0].at) > 2*s.o.StallLimit {
		s.pending = s.pending[1:]
	}
	if s.o.Log != nil && now.Sub(s.lastStatus) >= s.o.StatusEvery {
		s.lastStatus = now
		fmt.Fprintln(s.o.Log, s.status(now))
	}
}

// status is the status line.
func (s *soak) status(now time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "sim: seed %d virtual %v", s.o.Seed, s.elapsed(now).Round(time.Second))
	if s.o.Wall != nil {
		fmt.Fprintf(&b, " wall %v", s.o.Wall().Sub(s.wall0).Round(100*time.Millisecond))
	}
	fmt.Fprintf(&b, " world %d revision %d ops %d aborts %d sessions %d violations %d faults",
		s.lastWorld, s.sum.MaxRevision, s.sum.OpsCompleted, s.sum.Aborts, s.sum.Sessions, len(s.check.Violations()))
	for _, c := range FaultClasses {
		fmt.Fprintf(&b, " %s=%d", c, s.sum.Faults[c])
	}
	return b.String()
}

// kill kills p as a SIGKILL would: nothing it opens from now on reaches anyone, every connection it
// holds is reset, and its goroutines unwind (its communicator is closed).
func (s *soak) kill(p *proc, now time.Time) {
	if s.check != nil && p.sess != 0 {
		s.check.SessionEnded(key(p, p.sess))
	}
	p.killed, p.killedAt = true, now
	p.tr.kill()
	s.cl.Net.Crash(p.name)
	p.leave()
	s.doom(p, now)
}

// candidates returns the processes a fault may hit: not gone, not frozen or cut off, and, for one
// that holds the state, only while at least three healthy ones do.
func (s *soak) candidates(needSession bool) []*proc {
	holders := s.holders()
	var out []*proc
	for _, p := range s.procs {
		if p.gone() || !p.stoppedUntil.IsZero() || !p.holedUntil.IsZero() || p.cutOff {
			continue
		}
		if needSession && p.sess == 0 {
			continue
		}
		if p.established && holders < 3 {
			continue
		}
		out = append(out, p)
	}
	return out
}

// holders counts the healthy processes that hold the state.
func (s *soak) holders() int {
	n := 0
	for _, p := range s.procs {
		if p.healthy() && p.established {
			n++
		}
	}
	return n
}

// inject deals one fault: a class picked at random among those possible now.
func (s *soak) inject(now time.Time) {
	running := 0
	var slowable, jumpable []*proc
	for _, p := range s.procs {
		if !p.gone() {
			running++
			jumpable = append(jumpable, p)
		}
		if p.healthy() && p.slowUntil.IsZero() {
			slowable = append(slowable, p)
		}
	}
	all, withSess := s.candidates(false), s.candidates(true)
	// One freeze at a time, freezeGap apart: each blocks the group until the master declares the
	// victim gone, and a chain of them would stall it by the schedule rather than by a bug.
	// And none before the group completed a collective since the last one ended: a freeze dealt
	// while the group still recovers (a long OptimizeTopology around a black-holed link, say)
	// would chain onto it.
	frozen := now.Sub(s.freezeOver) < freezeGap || s.lastStep.Before(s.freezeOver) || !s.masterPausedUntil.IsZero() || s.part != nil
	for _, p := range s.procs {
		if !p.exited && (!p.stoppedUntil.IsZero() || !p.holedUntil.IsZero()) {
			frozen = true
		}
	}
	// While the peers find a restarted master and it rebuilds the ring from their reports, no peer
	// is frozen, removed or added (see the real soak).
	settling := now.Sub(s.lastMasterRestart) < restartSettle
	if settling {
		frozen = true
	}
	for _, f := range s.linkFaults {
		if f.class == "link-blackhole" && !f.over {
			frozen = true
		}
	}
	links, inRing := s.ringLinks()
	cut := s.planPartition()
	var possible []string
	for _, c := range FaultClasses {
		if len(s.o.Classes) > 0 && !slices.Contains(s.o.Classes, c) {
			continue
		}
		ok := false
		switch c {
		case "master-stall":
			ok = !frozen && now.Sub(s.lastMasterStall) > masterStallEvery
		case "master-restart":
			ok = !frozen && now.Sub(s.lastMasterRestart) > masterRestartEvery
		case "junk":
			ok = true
		case "kill", "restart":
			ok = len(all) > 0 && !settling
		case "stop":
			ok = len(all) > 0 && !frozen
		case "blackhole":
			ok = len(withSess) > 0 && !frozen
		case "leave":
			ok = len(withSess) > 0 && !settling
		case "spawn", "join":
			ok = running < s.o.Peers+maxExtraPeers && !s.joinArmed && !settling && s.part == nil
		case "slow":
			ok = len(slowable) > 0
		case "link-blackhole":
			// Four healthy peers in the ring: a ring without the link exists.
			ok = len(links) > 0 && !frozen && inRing >= 4
		case "link-slow":
			ok = len(links) > 0
		case "partition":
			ok = !frozen && cut != nil
		case "clock-jump":
			ok = len(jumpable) > 0
		case "asym":
			ok = len(links) > 0 || (len(withSess) > 0 && !frozen)
		}
		if ok {
			possible = append(possible, c)
		}
	}
	if len(possible) == 0 {
		return
	}
	class := possible[s.rng.IntN(len(possible))]
	pick := func(ps []*proc) *proc { return ps[s.rng.IntN(len(ps))] }
	hold := 2*time.Second + time.Duration(s.rng.Int64N(int64(2*time.Second)))
	net := s.cl.Net
	switch class {
	case "kill":
		v := pick(all)
		s.kill(v, now)
		s.faulted(class, now, v)
	case "restart":
		// Killed and started again at once on the same host with the same identity, with no state:
		// the master may still hold the old session when the new one says hello.
		v := pick(all)
		id := v.lastSess
		s.kill(v, now)
		np := s.spawn("restart of "+v.label+" with its identity", id, v.name)
		s.faulted(class, now, np)
	case "stop":
		v := pick(all)
		v.stoppedUntil = now.Add(hold)
		net.Hold(v.name, v.stoppedUntil)
		s.doom(v, now)
		s.faulted(class, now, v)
	case "blackhole":
		v := pick(withSess)
		v.holedUntil = now.Add(hold)
		s.setLink(v.name, MasterHost, func(c *pccl.LinkConfig) { c.BlackHole = true })
		s.setLink(MasterHost, v.name, func(c *pccl.LinkConfig) { c.BlackHole = true })
		s.doom(v, now)
		s.faulted(class, now, v)
	case "leave":
		v := pick(withSess)
		v.leaveAt = now
		v.leave()
		s.doom(v, now)
		s.faulted(class, now, v)
	case "slow":
		v := pick(slowable)
		d := slowMin + time.Duration(s.rng.Int64N(int64(slowMax-slowMin)))
		v.slowUntil = now.Add(hold)
		s.setLink(v.name, MasterHost, func(c *pccl.LinkConfig) { c.Latency += d })
		s.setLink(MasterHost, v.name, func(c *pccl.LinkConfig) { c.Latency += d })
		s.faulted(class, now, v)
	case "link-blackhole":
		l := links[s.rng.IntN(len(links))]
		l.class, l.both = class, true
		l.until = now.Add(linkHoleMin + time.Duration(s.rng.Int64N(int64(2*time.Second))))
		s.setLink(l.from.name, l.to.name, func(c *pccl.LinkConfig) { c.BlackHole = true })
		s.setLink(l.to.name, l.from.name, func(c *pccl.LinkConfig) { c.BlackHole = true })
		s.linkFaults = append(s.linkFaults, l)
		s.event("link %s<->%s of ring %v black-holed until %.3fs", l.from.label, l.to.label, s.ring, s.elapsed(l.until).Seconds())
		s.faulted(class, now, nil)
	case "link-slow":
		l := links[s.rng.IntN(len(links))]
		l.class, l.until = class, now.Add(hold)
		d := slowMin + time.Duration(s.rng.Int64N(int64(slowMax-slowMin)))
		s.setLink(l.from.name, l.to.name, func(c *pccl.LinkConfig) { c.Latency += d })
		s.linkFaults = append(s.linkFaults, l)
		s.faulted(class, now, nil)
	case "partition":
		s.partition(now, cut)
		s.faulted(class, now, nil)
	case "clock-jump":
		v := pick(jumpable)
		d := time.Second + time.Duration(s.rng.Int64N(int64(time.Hour)))
		if s.rng.IntN(2) == 0 {
			d = -d
		}
		off := time.Duration(v.offset.Load())
		if (off + d).Abs() > maxClockError {
			d = -d
		}
		v.offset.Store(int64(off + d))
		s.event("clock of %s jumps by %v (now %v off)", v.label, d.Round(time.Millisecond), (off + d).Round(time.Millisecond))
		s.faulted(class, now, v)
	case "asym":
		s.asym(now, links, withSess, frozen)
	case "spawn":
		s.faulted(class, now, s.spawn("fault", 0))
	case "join":
		s.joinArmed = true // spawned at the next "started" event
	case "master-stall":
		s.cl.PauseMaster()
		s.masterPausedUntil = now.Add(2*time.Second + time.Duration(s.rng.Int64N(int64(6*time.Second))))
		s.lastMasterStall = now
		s.event("master paused until %.3fs", s.elapsed(s.masterPausedUntil).Seconds())
	case "master-restart":
		s.lastMasterRestart = now
		if s.part != nil {
			s.part.holdKicks = false // the new master's group is not the one the cut was judged on
		}
		// A peer that joins the new master before the old group reports is wired alone, and the
		// group then joins it one peer at a time, each skipping the revisions synced before it
		// came: documented, and kept out of the schedule as the real soak keeps its spawns out.
		s.pp.holdJoins.Store(now.Add(restartSettle).UnixNano())
		s.cl.KillMaster() // its error is the accept that the kill broke
		if err := s.cl.StartMaster(s.incarnation()); err != nil {
			s.check.Fail(now, invariant.Peer, 0, "master", "restart: %v", err)
			return
		}
		s.check.MasterRestarted()
		s.faulted(class, now, nil)
	case "junk":
		s.faulted(class, now, nil)
		s.junk(s.rng.Uint64())
	}
}

// setLink changes the link from a to b from its current config.
func (s *soak) setLink(a, b string, change func(*pccl.LinkConfig)) {
	c := s.cl.BaseLink(a, b)
	change(&c)
	s.cl.Net.SetLink(a, b, c)
}

// asym deals an asymmetric link: a peer's link to the master black-holed one way only (the master
// hears nothing while the peer hears it), or one direction of a ring link twenty times slower with
// 100 to 300 ms more latency while the other is as it was.
func (s *soak) asym(now time.Time, links []linkFault, withSess []*proc, frozen bool) {
	hold := 2*time.Second + time.Duration(s.rng.Int64N(int64(4*time.Second)))
	masterWay := len(withSess) > 0 && !frozen
	if masterWay && (len(links) == 0 || s.rng.IntN(2) == 0) {
		v := withSess[s.rng.IntN(len(withSess))]
		v.holedUntil = now.Add(hold)
		s.setLink(v.name, MasterHost, func(c *pccl.LinkConfig) { c.BlackHole = true })
		s.doom(v, now)
		s.sum.FaultKinds["asym-to-master-silent"]++
		s.faulted("asym", now, v)
		return
	}
	l := links[s.rng.IntN(len(links))]
	l.class, l.until = "asym", now.Add(hold)
	d := 100*time.Millisecond + time.Duration(s.rng.Int64N(int64(200*time.Millisecond)))
	s.setLink(l.from.name, l.to.name, func(c *pccl.LinkConfig) {
		c.Latency += d
		if c.Bandwidth > 0 {
			c.Bandwidth /= 20
		} else {
			c.Bandwidth = 5e6
		}
	})
	s.linkFaults = append(s.linkFaults, l)
	s.sum.FaultKinds["asym-ring-link-one-way-slow"]++
	s.faulted("asym", now, nil)
}

// planPartition chooses a cut of the healthy group that keeps at least two peers holding the state
// on the master's side and cuts off at least one, or returns nil when none exists. Its shape is one
// of: two halves, a minority cut off, or the master with a minority only.
func (s *soak) planPartition() *partition {
	var holders, others []*proc
	for _, p := range s.procs {
		switch {
		case p.gone() || p.cutOff:
		case p.healthy() && p.established:
			holders = append(holders, p)
		default:
			others = append(others, p)
		}
	}
	all := append(slices.Clone(holders), others...)
	n := len(all)
	if len(holders) < 3 || n < 3 {
		return nil
	}
	type shape struct {
		kind string
		near int // peers on the master's side
	}
	var shapes []shape
	shapes = append(shapes, shape{"halves", (n + 1) / 2})
	if n >= 4 {
		shapes = append(shapes, shape{"minority-cut-off", n - 1 - s.rng.IntN((n-1)/2)})
	}
	if len(holders) >= 2 && n >= 5 {
		shapes = append(shapes, shape{"master-with-minority", 2})
	}
	sh := shapes[s.rng.IntN(len(shapes))]
	// The master's side takes two holders first, then the rest at random.
	s.rng.Shuffle(len(holders), func(i, j int) { holders[i], holders[j] = holders[j], holders[i] })
	rest := append(slices.Clone(holders[2:]), others...)
	s.rng.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
	near := append(slices.Clone(holders[:2]), rest[:sh.near-2]...)
	far := rest[sh.near-2:]
	if len(far) == 0 {
		return nil
	}
	pt := &partition{kind: sh.kind, near: map[string]bool{MasterHost: true}, far: map[string]bool{}}
	for _, p := range near {
		pt.near[p.name] = true
	}
	for _, p := range far {
		pt.far[p.name] = true
	}
	return pt
}

// partition cuts the network as pt says, until 5 to 15 seconds from now.
func (s *soak) partition(now time.Time, pt *partition) {
	pt.until = now.Add(5*time.Second + time.Duration(s.rng.Int64N(int64(10*time.Second))))
	for a := range pt.near {
		for b := range pt.far {
			s.cl.Net.Partition(a, b)
		}
	}
	for _, p := range s.procs {
		if pt.far[p.name] && !p.gone() {
			p.cutOff = true
			s.doom(p, now)
		}
	}
	s.part = pt
	s.judgeCut(now, pt)
	s.sum.FaultKinds["partition-"+pt.kind]++
	s.event("partition (%s): %v | %v until %.3fs", pt.kind, keys(pt.near), keys(pt.far), s.elapsed(pt.until).Seconds())
}

// judgeCut works out which rule the master's tick applies to the silent side of pt: it asks the
// master which peers the group holds and places each on a side. When the master hears fewer than
// half of them, it waits PartitionTimeout before it kicks any of the others (a short cut of its own
// link heals without costing anyone), and pt is set to check that (masterEvent). A peer of the group
// whose process the soak cannot place (its session has not reported yet), or one that is leaving,
// makes the count uncertain, and the cut is not checked.
func (s *soak) judgeCut(now time.Time, pt *partition) {
	byID := map[uint64]*proc{}
	for _, p := range s.procs {
		for _, id := range []uint64{p.lastSess, p.connecting} {
			if id != 0 {
				byID[id] = p
			}
		}
	}
	srv := s.cl.Master()
	if srv == nil {
		return // no master at the moment: nothing to check
	}
	lost, far := s.lostEvents.Load(), 0
	members := map[uint64]*member{}
	for _, pi := range srv.Snapshot().Peers {
		if pi.Group != 0 {
			continue
		}
		p := byID[uint64(pi.ID)]
		switch {
		case p == nil || (p.gone() && !p.killed):
			return
		case p.killed:
			// Silent on either side: the master does not hear it, and its silence may predate the cut.
			members[uint64(pi.ID)] = &member{side: silentSide}
		case pt.near[p.name]:
			members[uint64(pi.ID)] = &member{side: heardSide}
		case pt.far[p.name]:
			members[uint64(pi.ID)] = &member{side: farSide}
			far++
			pt.farDelay = max(pt.farDelay, s.cl.BaseLink(p.name, MasterHost).Latency+slowMax)
		default:
			return
		}
	}
	pt.members, pt.cutAt, pt.lost = members, now, lost
	if heard, size := pt.hearing(now); 2*heard >= size || far == 0 {
		return
	}
	pt.holdKicks = true
	s.sum.HeldCuts++
}

// hearing counts the peers the master hears of the group at t and the group's size then, by the
// soak's account since the cut. A peer removed at t itself still counts: the master judges a tick's
// silent peers on the group as it was before that tick's kicks. Every peer that joined since the cut
// counts as heard, whenever it joined: it reached the master, and counting it only ever makes the
// check more lenient.
func (pt *partition) hearing(t time.Time) (heard, size int) {
	for _, m := range pt.members {
		if !m.goneAt.IsZero() && m.goneAt.Before(t) {
			continue
		}
		size++
		if m.side == heardSide {
			heard++
		}
	}
	return heard + pt.joined, size + pt.joined
}

// farHeardFor is how long after the cut of pt the master may still count a cut-off peer as heard:
// its hearWindow (half of HeartbeatTimeout) from the peer's last message, which was sent before the
// cut and reached the master up to the link's delay later, and a tick of the master's to spare.
func (s *soak) farHeardFor(pt *partition) time.Duration {
	return s.mcfg.HeartbeatTimeout/2 + pt.farDelay + s.mcfg.HeartbeatInterval/4
}

// masterEvent keeps the partition in force up to date with the group's membership and checks each
// kick for silence against it: while the master hears fewer than half of the group, it kicks none of
// the cut-off peers before PartitionTimeout. A kick is judged on the group as it was at that moment:
// the master may have removed dead peers since the cut and come to hear half of what is left, and
// then it rightly kicks the silent ones after HeartbeatTimeout.
func (s *soak) masterEvent(e master.Event) {
	pt := s.part
	if pt == nil || !pt.holdKicks || e.Time.Before(pt.cutAt) {
		return
	}
	id := uint64(e.Peer)
	switch e.Kind {
	case "joined":
		pt.joined++
		return
	case "kicked", "left":
		if m := pt.members[id]; m != nil && m.goneAt.IsZero() {
			m.goneAt = e.Time
		}
		return
	}
	m := pt.members[id]
	since := e.Time.Sub(pt.cutAt)
	if m == nil || m.side != farSide || since >= s.mcfg.PartitionTimeout-kickSlack || since <= s.farHeardFor(pt) ||
		s.lostEvents.Load() != pt.lost {
		return
	}
	heard, size := pt.hearing(e.Time)
	if 2*heard >= size {
		return
	}
	s.check.Fail(e.Time, invariant.PartitionKick, 0, strconv.FormatUint(id, 10),
		"kicked %v after a cut (%s) while the master heard %d of the group's %d peers, before PartitionTimeout (%v): %s",
		since.Round(time.Millisecond), pt.kind, heard, size, s.mcfg.PartitionTimeout, e.Detail)
}

// heal ends the partition.
func (s *soak) heal(now time.Time) {
	pt := s.part
	s.part = nil
	for a := range pt.near {
		for b := range pt.far {
			s.cl.Net.Heal(a, b)
		}
	}
	for _, p := range s.procs {
		if pt.far[p.name] {
			p.cutOff = false
			p.doomedAt = now.Add(100 * time.Millisecond)
		}
	}
	s.freezeOver = now
	s.event("partition healed")
}

func keys(m map[string]bool) []string { return slices.Sorted(maps.Keys(m)) }

// ringLinks returns the links of the latest ring between two healthy peers, untouched by another
// link fault, and how many healthy peers that ring holds.
func (s *soak) ringLinks() ([]linkFault, int) {
	bySess := map[uint64]*proc{}
	for _, p := range s.procs {
		if p.healthy() {
			bySess[p.sess] = p
		}
	}
	busy := map[*proc]bool{}
	for _, f := range s.linkFaults {
		if !f.over {
			busy[f.from], busy[f.to] = true, true
		}
	}
	var out []linkFault
	inRing := 0
	for i, id := range s.ring {
		from, to := bySess[id], bySess[s.ring[(i+1)%len(s.ring)]]
		if from != nil {
			inRing++
		}
		if from != nil && to != nil && from != to && !busy[from] && !busy[to] {
			out = append(out, linkFault{from: from, to: to})
		}
	}
	return out, inRing
}

// endLinkFaults ends the link faults that are due and forgets those over for linkHoleGrace.
func (s *soak) endLinkFaults(now time.Time) {
	kept := s.linkFaults[:0]
	for _, f := range s.linkFaults {
		if !f.over && !now.Before(f.until) {
			f.over = true
			s.cl.ResetLink(f.from.name, f.to.name)
			if f.both {
				s.cl.ResetLink(f.to.name, f.from.name)
			}
			if f.class == "link-blackhole" {
				s.freezeOver = now
			}
			s.event("%s %s->%s over", f.class, f.from.label, f.to.label)
		}
		if !f.over || now.Sub(f.until) < linkHoleGrace {
			kept = append(kept, f)
		}
	}
	s.linkFaults = kept
}

// linkHoled reports whether p is an end of a ring link that is black-holed, or was within
// linkHoleGrace.
func (s *soak) linkHoled(p *proc, now time.Time) bool {
	for _, f := range s.linkFaults {
		if f.class == "link-blackhole" && (f.from == p || f.to == p) && now.Sub(f.until) < linkHoleGrace {
			return true
		}
	}
	return false
}

// junk opens junkPerFault connections to the master from a host of their own, as a stranger or a
// broken client would: bytes without a handshake, frames that do not decode, oversized frames, a first
// message that is not a Hello, a Hello with another run token, and a handshake followed by silence.
// None may disturb the run.
func (s *soak) junk(seed uint64) {
	done := make(chan struct{})
	s.junkDone = append(s.junkDone, done)
	tr := s.cl.Net.Host("junk")
	go func() {
		defer close(done)
		rng := rand.New(rand.NewPCG(seed, 0x1c))
		for i := range junkPerFault {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			c, err := tr.Dial(ctx, MasterAddr)
			cancel()
			if err != nil {
				continue
			}
			c.SetDeadline(time.Now().Add(500 * time.Millisecond))
			hs := wire.AppendHandshake(nil, wire.Handshake{Version: wire.Version, Kind: wire.KindControl})
			var payload []byte
			switch i % 6 {
			case 0:
				payload = make([]byte, 64)
				for k := range payload {
					payload[k] = byte(rng.Uint32())
				}
			case 1:
				payload = append(hs, 0, 0, 0, 3, 1, 0xff, 0xff)
			case 2:
				payload = append(hs, 0x7f, 0xff, 0xff, 0xff, 1)
			case 3:
				payload = wire.AppendFrame(hs, &wire.VotePending{})
			case 4:
				payload = wire.AppendFrame(hs, &wire.Hello{Token: "not the run's", Addr: "junk:1"})
			case 5:
				payload = hs
			}
			c.Write(payload)
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	kept := s.junkDone[:0]
	for _, d := range s.junkDone {
		select {
		case <-d:
		default:
			kept = append(kept, d)
		}
	}
	s.junkDone = kept
}

// shutdown ends every fault, tells every peer to leave and waits for them to exit (a peer still
// running after hangLimit is a violation), then stops the master and checks that no goroutine of
// the cluster is left.
func (s *soak) shutdown() {
	s.closing = true
	now := time.Now()
	if !s.masterPausedUntil.IsZero() {
		s.masterPausedUntil = time.Time{}
		s.cl.ResumeMaster()
	}
	if s.part != nil {
		s.heal(now)
	}
	for _, f := range s.linkFaults {
		s.cl.ResetLink(f.from.name, f.to.name)
		s.cl.ResetLink(f.to.name, f.from.name)
	}
	for _, p := range s.procs {
		if p.exited {
			continue
		}
		s.cl.Net.Hold(p.name, time.Time{})
		p.stoppedUntil, p.holedUntil, p.slowUntil = time.Time{}, time.Time{}, time.Time{}
		s.cl.ResetLink(p.name, MasterHost)
		s.cl.ResetLink(MasterHost, p.name)
		if p.leaveAt.IsZero() && !p.killed {
			p.leaveAt = now
			p.leave()
		}
	}
	deadline := time.NewTimer(hangLimit + leakWait + time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(tickEvery)
	defer tick.Stop()
	for live := true; live; {
		live = false
		for _, p := range s.procs {
			select {
			case <-p.done:
			default:
				live = true
			}
		}
		if !live {
			break
		}
		select {
		case ev := <-s.events:
			s.handle(ev)
		case now := <-tick.C:
			s.tick(now)
		case <-deadline.C:
			s.tick(time.Now())
			for _, p := range s.procs {
				select {
				case <-p.done:
				default:
					s.kill(p, time.Now())
				}
			}
			for _, p := range s.procs {
				<-p.done
			}
			live = false
		}
	}
	for {
		select {
		case ev := <-s.events:
			s.handle(ev)
			continue
		default:
		}
		break
	}
	for _, d := range s.junkDone {
		<-d
	}
	if err := s.cl.StopMaster(); err != nil {
		s.check.Fail(time.Now(), invariant.Peer, 0, "master", "master: %v", err)
	}
	if left := countLabelled(labelRole, "peer") + countLabelled(labelRole, "master"); left > 0 {
		time.Sleep(leakWait)
		if left = countLabelled(labelRole, "peer") + countLabelled(labelRole, "master"); left > 0 {
			s.check.Fail(time.Now(), invariant.Leak, 0, "", "%d goroutines of the cluster left after every process ended", left)
		}
	}
}

// finish fills in the summary.
func (s *soak) finish() {
	now := time.Now()
	s.check.Finish(now)
	s.sum.VirtualS = s.elapsed(now).Seconds()
	if s.o.Wall != nil {
		s.sum.WallS = s.o.Wall().Sub(s.wall0).Seconds()
	}
	s.sum.Iterations = len(s.iterations)
	s.sum.MaxRevision = max(s.sum.MaxRevision, s.check.MaxRevision())
	s.sum.StepsLostToMaster = s.check.Excused()
	s.sum.MinFaultClass = -1
	for _, c := range FaultClasses {
		xs := s.recovery[c]
		s.sum.Recovery[c] = Stats{Samples: len(xs), P50: percentile(xs, 50), P90: percentile(xs, 90), P99: percentile(xs, 99), Max: percentile(xs, 100)}
		if n := s.sum.Faults[c]; s.sum.MinFaultClass < 0 || n < s.sum.MinFaultClass {
			s.sum.MinFaultClass = n
		}
	}
	vs := s.check.Violations()
	s.sum.Violations = len(vs)
	if len(vs) > 0 {
		s.sum.FirstViolationS = s.elapsed(vs[0].Time).Seconds()
		s.sum.ViolationList = vs[:min(len(vs), 20)]
		s.report()
	}
	if s.o.Log != nil {
		fmt.Fprintln(s.o.Log, s.status(now))
	}
}

// report prints what is needed to replay a failed run: the seed, the violations and the last events.
func (s *soak) report() {
	if s.o.Log == nil {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "sim: FAILED with seed %d (replay: go test ./stress/sim -run TestSimulatedSoak -sim.seed %d -sim.duration %v", s.o.Seed, s.o.Seed, s.o.Duration)
	if s.o.Break != "" {
		fmt.Fprintf(&b, " -sim.break %s", s.o.Break)
	}
	if s.o.Peers != 5 {
		fmt.Fprintf(&b, " -sim.peers %d", s.o.Peers)
	}
	if s.o.StallLimit != stallLimit {
		fmt.Fprintf(&b, " -sim.stall %v", s.o.StallLimit)
	}
	if len(s.o.Classes) > 0 {
		fmt.Fprintf(&b, " -sim.classes %s", strings.Join(s.o.Classes, ","))
	}
	b.WriteString(")\n")
	for _, v := range s.check.Violations() {
		fmt.Fprintf(&b, "sim: violation at %.3fs: %s\n", s.elapsed(v.Time).Seconds(), v)
	}
	ev := s.log.last(eventLogLen)
	fmt.Fprintf(&b, "sim: last %d events:\n", len(ev))
	for _, e := range ev {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	io.WriteString(s.o.Log, b.String())
}

// percentile is the nearest-rank percentile of xs, 0 for none.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	v := slices.Sorted(slices.Values(xs))
	k := int(float64(len(v))*p/100 + 0.999999)
	return v[min(max(k, 1), len(v))-1]
}
