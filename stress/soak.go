package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/internal/hosts"
	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/stress/invariant"
)

// Fault classes, in the order of the summary.
var faultClasses = []string{"kill", "stop", "spawn", "join", "blackhole", "slow", "leave", "master-stall", "master-restart", "junk",
	"link-blackhole", "link-slow", "partition"}

// Ring-link faults. A peer's data path gives up a link silent for soakProgress; a black hole on a ring
// link outlasts it, so the collective fails on that link, the master cuts it and the next ring avoids
// it. A peer may still be evicted as unreachable when no ring without the link exists (the group
// shrank meanwhile): that is expected within linkHoleGrace of the hole, not a violation.
const (
	soakProgress  = 3 * time.Second
	linkHoleMin   = 4 * time.Second
	linkHoleGrace = 10 * time.Second
)

// Bounds of the soak's waits.
const (
	minPeers      = 2
	stallLimit    = 10 * time.Second
	hangLimit     = 10 * time.Second // a peer told to leave must have exited by then
	tickEvery     = 50 * time.Millisecond
	windowLen     = 10 * time.Second
	eventLogLen   = 100
	maxExtraPeers = 2 // spawn and join faults grow the pool at most this far above --peers

	masterStallEvery   = 20 * time.Second // master-stall faults are at least this far apart
	masterRestartEvery = 60 * time.Second // master-restart faults are at least this far apart
	restartSettle      = 5 * time.Second  // no peer frozen, removed or added this soon after a master restart
	junkPerFault       = 40               // connections one junk fault opens to the master
)

// options configures a soak run.
type options struct {
	Duration      time.Duration
	Seed          uint64
	Peers         int
	FaultMin      time.Duration
	FaultMax      time.Duration
	OptimizeEvery uint64
	Verbose       bool
	Break         string // passed to every peer as envBreak
	// Transport is what the master and the peers talk: "tcp", or "quic" (with a run secret drawn
	// for the run). Over QUIC the ring-link faults are not dealt: they need the TCP link relays.
	Transport string
	// Hosts runs the master and every peer on a host of its own (network namespaces; root), and
	// deals the partition class (hosts.go).
	Hosts bool
	// Gossip runs the master's gossip failure detector (LAN preset), which every peer joins: a peer
	// it declares dead is kicked even while its connection to the master is open. A healthy peer it
	// kicks is a violation.
	Gossip bool
}

func defaultOptions() options {
	return options{Duration: 3 * time.Minute, Peers: 4, FaultMin: 500 * time.Millisecond, FaultMax: time.Second, OptimizeEvery: 64,
		Transport: "tcp"}
}

func (o options) validate() error {
	switch {
	case o.Duration <= 0:
		return fmt.Errorf("--duration %v must be positive", o.Duration)
	case o.Peers < 3:
		return fmt.Errorf("--peers %d: need at least 3 (faults keep two peers that hold the state)", o.Peers)
	case o.FaultMin <= 0 || o.FaultMax < o.FaultMin:
		return fmt.Errorf("--fault-min %v and --fault-max %v: need 0 < min <= max", o.FaultMin, o.FaultMax)
	case o.Break != "" && o.Break != "stale-update":
		return fmt.Errorf("--break %q: the only mode is stale-update", o.Break)
	case o.Transport != "tcp" && o.Transport != "quic":
		return fmt.Errorf("--transport %q: want tcp or quic", o.Transport)
	case o.Hosts && o.Transport != "tcp":
		return fmt.Errorf("--hosts runs over tcp: its relays stage the black holes and slow links")
	}
	return nil
}

// Stats are the percentiles of one fault class's recovery times, in milliseconds.
type Stats struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P90     float64 `json:"p90_ms"`
	P99     float64 `json:"p99_ms"`
	Max     float64 `json:"max_ms"`
}

// Summary is the JSON line the soak prints last.
type Summary struct {
	Seed      uint64 `json:"seed"`
	Transport string `json:"transport"`
	Hosts     bool   `json:"hosts"`
	Gossip    bool   `json:"gossip"`
	// JunkPeerConns counts the junk connections opened to peers' own ports.
	JunkPeerConns  int64   `json:"junk_peer_conns"`
	DurationS      float64 `json:"duration_s"`
	Peers          int     `json:"peers"`
	Iterations     int     `json:"iterations"`
	OpsCompleted   int64   `json:"ops_completed"`
	Aborts         int     `json:"aborts"`
	SyncFailures   int     `json:"sync_failures"`
	Sessions       int     `json:"sessions"`
	UnfaultedKicks int     `json:"unfaulted_kicks"`
	// KickedRejoined counts the peers that the master removed (kicked, or lost the master) and that
	// came back by themselves as newcomers.
	KickedRejoined int `json:"kicked_rejoined"`
	// LinkHoleEvictions counts peers evicted as unreachable from a ring neighbour whose link was
	// black-holed (no ring without that link existed then).
	LinkHoleEvictions int `json:"link_hole_evictions"`
	// SilentLinkAborts counts aborted steps that failed on a link given up as silent past its
	// progress deadline (a black-holed ring link, or its far end stopped), as seen by any peer.
	SilentLinkAborts int                   `json:"silent_link_aborts"`
	MaxRevision      uint64                `json:"max_revision"`
	LongestGapMs     float64               `json:"longest_gap_ms"`   // longest time without a completed collective
	LongestGapAtS    float64               `json:"longest_gap_at_s"` // when it ended, from the start
	Faults           map[string]int        `json:"faults"`
	FaultsTotal      int                   `json:"faults_total"`
	OpsPerWindow     []int64               `json:"ops_per_10s"`
	MinOpsPerWindow  int64                 `json:"min_ops_per_10s"`
	Recovery         map[string]Stats      `json:"recovery_ms"`
	Violations       int                   `json:"violations"`
	ViolationList    []invariant.Violation `json:"violation_list,omitempty"`
}

// percentile is the nearest-rank percentile of xs, 0 for none.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	k := int(float64(len(s))*p/100 + 0.999999)
	return s[min(max(k, 1), len(s))-1]
}

// peerProc is the supervisor's view of one peer process. The supervisor's goroutine owns it.
type peerProc struct {
	name   string
	proc   *cluster.Proc
	relay  route         // its connections to the master
	links  *relay        // its connections to other peers; nil over QUIC
	addr   string        // where its session's neighbours dial it
	output chan struct{} // closed once every stdout line of the process is on the merged feed

	sess        uint64    // the session in the group, 0 if none or doomed by a fault
	removed     bool      // its last session ended with a kick or a lost master
	doomedAt    time.Time // the last fault that doomed the session; a session that connected before is doomed too
	established bool      // the session holds the state (it synced)

	stoppedUntil time.Time // SIGSTOPped until then
	holedUntil   time.Time // master connection black-holed until then
	slowUntil    time.Time // master connection slowed until then
	leaveAt      time.Time // told to leave at
	killed       bool
	exited       bool
}

// gone reports whether the process is dead or on its way out.
func (p *peerProc) gone() bool { return p.exited || p.killed || !p.leaveAt.IsZero() }

// healthy reports whether the process is in the group and neither frozen nor cut off.
func (p *peerProc) healthy() bool {
	return !p.gone() && p.sess != 0 && p.stoppedUntil.IsZero() && p.holedUntil.IsZero()
}

// route is a peer's relay to the master: TCP (relay) or UDP for QUIC (udpRelay).
type route interface {
	addr() string
	blackhole(until time.Time)
	setDelay(d time.Duration)
	close()
}

// linkFault is a black hole or slow-down on one ring link, from a peer to its successor.
type linkFault struct {
	class    string // "link-blackhole" or "link-slow"
	from, to *peerProc
	dest     string // to's address, as from's link relay knows it
	until    time.Time
	over     bool // ended; kept until linkHoleGrace after, to excuse an eviction it caused
}

// fault is one fault whose recovery is being timed.
type fault struct {
	class  string
	at     time.Time
	victim *peerProc
}

// stderrWatch receives every child's stderr: it keeps the last lines and notices crashes.
type stderrWatch struct {
	verbose io.Writer // nil unless -v

	mu      sync.Mutex
	recent  []string
	crashes []string
	race    []string // the race report being read, by line, while inRace
	inRace  bool
	races   []string // every race report, condensed (condenseRace)
}

func (w *stderrWatch) Write(b []byte) (int, error) {
	line := strings.TrimRight(string(b), "\n")
	w.mu.Lock()
	defer w.mu.Unlock()
	w.recent = append(w.recent, line)
	if len(w.recent) > 200 {
		w.recent = w.recent[1:]
	}
	for _, s := range []string{"panic:", "fatal error:", "DATA RACE"} {
		if strings.Contains(line, s) {
			w.crashes = append(w.crashes, line)
		}
	}
	switch {
	case strings.Contains(line, "WARNING: DATA RACE"):
		w.inRace, w.race = true, nil
	case w.inRace && strings.HasSuffix(line, "=================="):
		w.inRace = false
		w.races = append(w.races, condenseRace(w.race)...)
	case w.inRace:
		w.race = append(w.race, line)
	}
	if w.verbose != nil {
		w.verbose.Write(b)
	}
	return len(b), nil
}

// takeCrashes returns the crash lines seen since the last call.
func (w *stderrWatch) takeCrashes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.crashes
	w.crashes = nil
	return c
}

// condenseRace keeps of a race report (its lines after "WARNING: DATA RACE") the accesses and goroutine
// headers and the project's own frames under them: the part that says where the race is, short
// enough to survive a log cut to its last lines.
func condenseRace(report []string) []string {
	out := []string{"DATA RACE:"}
	for i, l := range report {
		t := unprefixed(l)
		switch {
		case strings.Contains(t, " at 0x") || strings.HasPrefix(t, "Goroutine "):
			out = append(out, "  "+t)
		case strings.Contains(t, "concord-ccl/concord") && i+1 < len(report):
			out = append(out, "    "+t+" "+unprefixed(report[i+1]))
		}
	}
	return out
}

// unprefixed returns a child's stderr line without the "name: " its copy was given, trimmed.
func unprefixed(line string) string { return strings.TrimSpace(line[strings.Index(line, ":")+1:]) }

func (w *stderrWatch) lines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.recent)
}

// raceLines returns the condensed race reports seen so far.
func (w *stderrWatch) raceLines() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.races)
}

// soak is one run. Its goroutine (run) owns every field.
type soak struct {
	o      options
	log    io.Writer
	c      *cluster.Cluster
	watch  *stderrWatch
	rng    *rand.Rand
	master string // the master's address
	gossip string // the master's gossip address (options.Gossip), kept across master restarts
	mcfg   master.Config
	mproc  *cluster.Proc // the master process

	masterStoppedUntil time.Time // the master is SIGSTOPped until then
	lastMasterStall    time.Time
	lastMasterRestart  time.Time
	junkWG             sync.WaitGroup // junk connections in flight
	junkPeerConns      atomic.Int64   // junk connections to peers' ports that were opened
	closing            bool           // shutting down: no more faults or replacements
	start              time.Time
	check              *invariant.Checker
	procs              map[*cluster.Proc]*peerProc
	order              []*peerProc // spawn order
	spawned            int
	begun              bool // a revision was accepted: the peers were told (peerCommand "begun")

	nextFault  time.Time
	joinArmed  bool
	pending    []fault
	recovery   map[string][]float64
	sum        Summary
	iterations map[uint64]bool
	lastWorld  int
	lastStep   time.Time
	freezeOver time.Time // when the last stop or black hole ended
	ring       []uint64  // the ring (session ids) of the latest completed step
	linkFaults []linkFault
	events     []string // the last events, for the report of a violation
	reported   int      // violations already printed
	lastStatus time.Time
	isTerm     bool
	secret     []byte // the run secret over QUIC

	bed           *bedHosts       // the test bed with --hosts, else nil
	partition     *partitionFault // the partition in force, nil if none
	lastPartition time.Time
}

// run runs the soak for o.Duration (or until ctx ends or an invariant breaks) and returns the summary.
// Progress and reports go to log.
func run(ctx context.Context, o options, log io.Writer) (Summary, error) {
	watch := &stderrWatch{}
	if o.Verbose {
		watch.verbose = log
	}
	s := &soak{
		o: o, log: log, watch: watch,
		secret:     newSecret(),
		rng:        rand.New(rand.NewPCG(o.Seed, 0x57e55)),
		check:      invariant.New(stallLimit, minPeers),
		procs:      map[*cluster.Proc]*peerProc{},
		recovery:   map[string][]float64{},
		iterations: map[uint64]bool{},
		sum:        Summary{Seed: o.Seed, Transport: o.Transport, Hosts: o.Hosts, Gossip: o.Gossip, Peers: o.Peers, Faults: map[string]int{}, Recovery: map[string]Stats{}},
	}
	s.c = cluster.New(cluster.Config{Stderr: watch, Env: transportEnv(o.Transport, s.secret)})
	if f, ok := log.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			s.isTerm = true
		}
	}
	for _, c := range faultClasses {
		s.sum.Faults[c] = 0
	}
	err := s.run(ctx)
	s.shutdown()
	if cerr := s.c.Close(); cerr != nil && err == nil {
		err = cerr
	}
	for _, p := range s.order {
		p.relay.close()
		p.links.close()
	}
	if s.bed != nil {
		if cerr := s.bed.bed.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}
	s.finish()
	if s.sum.Violations > 0 {
		s.report()
	}
	return s.sum, err
}

// event records one line of the event log.
func (s *soak) event(format string, args ...any) {
	line := fmt.Sprintf("%8.3fs ", time.Since(s.start).Seconds()) + fmt.Sprintf(format, args...)
	s.events = append(s.events, line)
	if len(s.events) > 2*eventLogLen {
		s.events = slices.Clone(s.events[len(s.events)-eventLogLen:])
	}
	if s.o.Verbose {
		fmt.Fprintln(s.log, "event:", line)
	}
}

func (s *soak) spawn(why string) (*peerProc, error) {
	name := fmt.Sprintf("peer-%d", s.spawned)
	s.spawned++
	var (
		r        route
		lr       *relay
		linkAddr string
		err      error
	)
	masterNet, ownNet, start := loopback, loopback, (func(*exec.Cmd) error)(nil)
	var host *hosts.Host
	if s.bed != nil {
		if host, err = s.bed.free(); err != nil {
			return nil, err
		}
		masterNet, ownNet, start = netOf(s.bed.master), netOf(host), startOn(host)
	}
	if s.o.Transport == "quic" {
		r, err = newUDPRelay(s.master)
	} else {
		r, err = newRelayOn(masterNet, s.master)
	}
	if err != nil {
		return nil, fmt.Errorf("relay for %s: %w", name, err)
	}
	if s.o.Transport != "quic" {
		if lr, err = newRelayOn(ownNet, ""); err != nil {
			r.close()
			return nil, fmt.Errorf("link relay for %s: %w", name, err)
		}
		linkAddr = lr.addr()
	}
	js, _ := json.Marshal(peerParams{Master: r.addr(), LinkRelay: linkAddr, Progress: soakProgress,
		Lifetime: s.o.Duration + 5*time.Minute, OptimizeEvery: s.o.OptimizeEvery, Gossip: s.gossip, Begun: s.begun})
	env := []string{envPeer + "=" + string(js)}
	if s.o.Break != "" {
		env = append(env, envBreak+"="+s.o.Break)
	}
	cp, err := s.c.Spawn(cluster.Spec{Role: rolePeer, Name: name, Env: env, Start: start})
	if err != nil {
		r.close()
		lr.close()
		return nil, err
	}
	p := &peerProc{name: name, proc: cp, relay: r, links: lr, output: make(chan struct{})}
	if host != nil {
		s.bed.busy[host] = p
	}
	go func() { // drain the per-process feed; the merged feed is the one read
		for range cp.Lines() {
		}
		close(p.output)
	}()
	s.procs[cp] = p
	s.order = append(s.order, p)
	s.event("spawn %s (%s)", name, why)
	return p, nil
}

func (s *soak) run(ctx context.Context) error {
	s.start = time.Now()
	mcfg := master.LAN()
	mcfg.MinPeers = minPeers
	mcfg.MeasureDuration = 100 * time.Millisecond
	mcfg.ImproveBudget = 500 * time.Millisecond
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	var err error
	if s.o.Hosts {
		if s.bed, err = newBedHosts(s.o.Peers); err != nil {
			cancel()
			return fmt.Errorf("hosts: %w", err)
		}
	}
	host, start := "127.0.0.1", (func(*exec.Cmd) error)(nil)
	if s.bed != nil {
		host, start = s.bed.master.Addr().String(), startOn(s.bed.master)
	}
	if s.o.Gossip {
		s.gossip = net.JoinHostPort(host, "0")
	}
	mp, ev, err := s.c.StartMasterEnv(sctx, mcfg, net.JoinHostPort(host, "0"), start, s.masterEnv())
	cancel()
	if err != nil {
		return fmt.Errorf("master: %w", err)
	}
	s.master, s.mcfg, s.mproc, s.gossip = ev.Addr, mcfg, mp, ev.Gossip
	for range s.o.Peers {
		if _, err := s.spawn("pool"); err != nil {
			return err
		}
	}
	s.start = time.Now()
	s.nextFault = s.start.Add(2*time.Second + s.faultGap())
	end := s.start.Add(s.o.Duration)
	tick := time.NewTicker(tickEvery)
	defer tick.Stop()
	for {
		select {
		case l, ok := <-s.c.Lines():
			if !ok {
				return errors.New("cluster closed")
			}
			s.handle(l)
		case now := <-tick.C:
			if now.After(end) {
				return nil
			}
			if err := s.tick(now); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
		if len(s.check.Violations()) > 0 {
			return nil
		}
	}
}

func (s *soak) faultGap() time.Duration {
	return s.o.FaultMin + time.Duration(s.rng.Int64N(int64(s.o.FaultMax-s.o.FaultMin)+1))
}

// handle takes in one line of a child.
func (s *soak) handle(l cluster.Line) {
	p := s.procs[l.Proc]
	if p == nil {
		return // the master
	}
	var ev peerEvent
	if l.Fields == nil || l.Decode(&ev) != nil {
		return
	}
	now := l.Time
	key := p.name + "/" + strconv.FormatUint(ev.Sess, 10)
	switch ev.Event {
	case "connected":
		if p.removed {
			p.removed = false
			s.sum.KickedRejoined++
		}
		if time.Unix(0, ev.T).After(p.doomedAt) {
			p.sess, p.established, p.addr = ev.Sess, false, ev.Addr
		}
		s.sum.Sessions++
		s.event("%s connected as %d (world %d)", p.name, ev.Sess, ev.World)
	case "synced":
		h, _ := strconv.ParseUint(ev.Hash, 16, 64)
		s.check.Synced(now, key, ev.Rev, h, ev.Fetched, ev.Fresh)
		if !s.begun {
			// A session that connects from now on holds none of the run's state, even the first to
			// reach a restarted master, alone in its group: it must adopt the run's at its first sync.
			s.begun = true
			for _, q := range s.order {
				_ = q.proc.Send(peerCommand{Cmd: "begun"})
			}
		}
		if ev.Sess == p.sess && p.sess != 0 {
			p.established = true
		}
		if ev.Fresh || ev.Fetched > 0 {
			s.event("%s synced revision %d hash %s (fresh %v, fetched %d)", key, ev.Rev, ev.Hash, ev.Fresh, ev.Fetched)
		}
	case "started":
		if s.joinArmed && p.established && now.Sub(s.lastMasterRestart) >= restartSettle {
			s.joinArmed = false
			if np, err := s.spawn("join while " + p.name + " runs revision " + strconv.FormatUint(ev.Rev, 10)); err == nil {
				s.faulted("join", now, np)
			}
		}
	case "step":
		if gap := float64(now.Sub(s.lastStep)) / 1e6; !s.lastStep.IsZero() && gap > s.sum.LongestGapMs {
			s.sum.LongestGapMs, s.sum.LongestGapAtS = gap, now.Sub(s.start).Seconds()
		}
		s.lastStep = now
		if len(ev.Ring) > 0 {
			s.ring = ev.Ring
		}
		if s.o.Verbose && !s.iterations[ev.Rev] {
			s.event("revision %d done by %s (world %d)", ev.Rev, key, ev.World)
		}
		s.check.Completed(now)
		s.sum.OpsCompleted += int64(ev.Ops)
		s.iterations[ev.Rev] = true
		s.lastWorld = ev.World
		s.sum.MaxRevision = max(s.sum.MaxRevision, ev.Rev)
		w := int(time.Unix(0, ev.T).Sub(s.start) / windowLen)
		for w >= 0 && len(s.sum.OpsPerWindow) <= w {
			s.sum.OpsPerWindow = append(s.sum.OpsPerWindow, 0)
		}
		if w >= 0 {
			s.sum.OpsPerWindow[w] += int64(ev.Ops)
		}
		started := time.Unix(0, ev.Started)
		kept := s.pending[:0]
		for _, f := range s.pending {
			if f.victim != p && !started.Before(f.at) {
				s.recovery[f.class] = append(s.recovery[f.class], float64(time.Unix(0, ev.T).Sub(f.at))/1e6)
				continue
			}
			kept = append(kept, f)
		}
		s.pending = kept
	case "aborted":
		s.sum.Aborts++
		s.check.Aborted(now, key, ev.Rev, ev.Restored, ev.Detail)
		silent := strings.Contains(ev.Detail, "silent past its progress deadline")
		if silent {
			s.sum.SilentLinkAborts++
		}
		s.event("%s aborted at revision %d (%d ops done): %s (silent link: %v)", key, ev.Rev, ev.Ops, ev.Kind, silent)
	case "wrong":
		s.check.WrongElement(now, key, ev.Rev, ev.Detail)
	case "sync_failed":
		s.sum.SyncFailures++
		s.event("%s sync failed: %s", key, ev.Detail)
	case "session_end":
		s.check.SessionEnded(key)
		s.event("%s session ended: %s: %s", key, ev.Kind, ev.Detail)
		if ev.Leak {
			s.check.Fail(now, invariant.Leak, 0, key, "%s", ev.Detail)
		}
		switch ev.Kind {
		case "canceled", "deadline":
		case "closed":
			// A peer told to leave closes its communicator when its calls do not end in time (leaveGrace).
			if p.leaveAt.IsZero() {
				s.check.Fail(now, invariant.Peer, 0, key, "session closed although the peer was not told to leave: %s", ev.Detail)
			}
		case "kicked", "master_lost":
			p.removed = true
			if ev.Sess == p.sess && p.sess != 0 {
				// Kicked although no fault hit it (a fault clears sess): e.g. heartbeats starved.
				s.sum.UnfaultedKicks++
				fmt.Fprintf(s.log, "stress: %s left the group although no fault hit it: %s\n", key, ev.Detail)
				excused := invariant.LinkKick(ev.Detail) && s.linkHoled(p, now)
				if excused {
					s.sum.LinkHoleEvictions++
				}
				if !excused && strings.Contains(ev.Detail, "kicked by the master") && !strings.Contains(ev.Detail, "no heartbeat") {
					s.check.Fail(now, invariant.Peer, 0, key, "a healthy peer was kicked: %s", ev.Detail)
				}
			}
		default:
			s.check.Fail(now, invariant.Peer, 0, key, "session ended by an unexpected error: %s", ev.Detail)
		}
		if ev.Sess == p.sess {
			p.sess, p.established = 0, false
		}
	case "error":
		s.check.Fail(now, invariant.Peer, ev.Rev, key, "%s", ev.Detail)
	}
}

// faulted counts a fault and starts timing its recovery.
func (s *soak) faulted(class string, now time.Time, victim *peerProc) {
	s.sum.Faults[class]++
	s.sum.FaultsTotal++
	s.pending = append(s.pending, fault{class: class, at: now, victim: victim})
	name := "master"
	if victim != nil {
		name = victim.name
	}
	s.event("FAULT %s %s", class, name)
}

// tick runs the timers: ends of stops, holes and slow links, exits, replacements, the next fault,
// the stall check and the status line.
func (s *soak) tick(now time.Time) error {
	for _, line := range s.watch.takeCrashes() {
		s.check.Fail(now, invariant.Panic, 0, "", "%s", line)
	}
	if !s.masterStoppedUntil.IsZero() && now.After(s.masterStoppedUntil) {
		s.masterStoppedUntil = time.Time{}
		s.mproc.Continue()
		s.freezeOver = now
		// Recovery counts from the master's return: its pause itself is the fault's cost.
		s.faulted("master-stall", now, nil)
	}
	running, healthy := 0, 0
	for _, p := range s.order {
		if p.exited {
			continue
		}
		if !p.stoppedUntil.IsZero() && now.After(p.stoppedUntil) {
			p.stoppedUntil = time.Time{}
			p.proc.Continue()
			// A Connect that the stop froze may return just now: that session is doomed too.
			p.doomedAt = now.Add(100 * time.Millisecond)
			s.freezeOver = now
			s.event("SIGCONT %s", p.name)
		}
		if !p.holedUntil.IsZero() && now.After(p.holedUntil) {
			p.holedUntil = time.Time{}
			s.freezeOver = now
			s.event("hole of %s over", p.name)
		}
		if !p.slowUntil.IsZero() && now.After(p.slowUntil) {
			p.slowUntil = time.Time{}
			p.relay.setDelay(0)
			s.event("slow link of %s over", p.name)
		}
		select {
		case <-p.proc.Done():
			p.exited = true
			p.relay.close()
			p.links.close()
			if s.bed != nil {
				delete(s.bed.busy, s.bed.hostOf(p))
			}
			code := p.proc.ExitCode()
			s.event("%s exited with status %d", p.name, code)
			switch {
			case p.killed:
			case p.leaveAt.IsZero():
				s.check.Fail(now, invariant.Exit, 0, p.name, "exited (status %d) without being told to", code)
			case code != 0:
				s.check.Fail(now, invariant.Exit, 0, p.name, "left with status %d", code)
			}
			continue
		default:
		}
		if !p.leaveAt.IsZero() && now.Sub(p.leaveAt) > hangLimit {
			s.check.Fail(now, invariant.Hang, 0, p.name, "still running %v after being told to leave", now.Sub(p.leaveAt).Round(time.Millisecond))
			p.proc.Continue()
			p.proc.Kill()
			p.killed = true
		}
		if !p.gone() {
			running++
		}
		if p.healthy() {
			healthy++
		}
	}
	s.endLinkFaults(now)
	s.endPartition(now)
	for ; running < s.o.Peers && !s.closing; running++ {
		if _, err := s.spawn("replacement"); err != nil {
			return err
		}
	}
	if !now.Before(s.nextFault) && !s.closing {
		s.inject(now)
		s.nextFault = now.Add(s.faultGap())
	}
	if !s.masterStoppedUntil.IsZero() || (s.partition != nil && s.partition.kind == "master") {
		healthy = 0 // nobody can make progress while the master is paused or cut off
	}
	s.check.Tick(now, healthy)
	// Recovery that never came (the run ended it, or a stall is reported) is not a sample; a fault
	// pending this long is dropped so the list stays bounded.
	for len(s.pending) > 0 && now.Sub(s.pending[0].at) > 2*stallLimit {
		s.pending = s.pending[1:]
	}
	s.status(now, false)
	return nil
}

// candidates returns the processes a fault may hit: not gone, not already frozen or cut off, and,
// for one that holds the state, only while at least three healthy ones do.
func (s *soak) candidates(needSession bool) []*peerProc {
	holders := 0
	for _, p := range s.order {
		if p.healthy() && p.established {
			holders++
		}
	}
	var out []*peerProc
	for _, p := range s.order {
		if p.gone() || !p.stoppedUntil.IsZero() || !p.holedUntil.IsZero() {
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

// restartMaster kills the master and starts a new one on its address. It blocks until the new one
// listens.
func (s *soak) restartMaster() error {
	s.mproc.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.mproc.Wait(ctx); err != nil {
		return fmt.Errorf("the killed master did not exit: %w", err)
	}
	var start func(*exec.Cmd) error
	if s.bed != nil {
		start = startOn(s.bed.master)
	}
	p, _, err := s.c.StartMasterEnv(ctx, s.mcfg, s.master, start, s.masterEnv())
	if err != nil {
		return err
	}
	s.mproc = p
	s.check.MasterRestarted()
	s.event("master restarted on %s", s.master)
	return nil
}

// masterEnv is the master's environment: its gossip address when the run has gossip.
func (s *soak) masterEnv() []string {
	if s.gossip == "" {
		return nil
	}
	return []string{"CONCORD_GOSSIP=" + s.gossip}
}

// junk opens junkPerFault connections to the master that a stranger or a broken client would: bytes
// without a handshake, frames that do not decode, oversized frames, a first message that is not a
// Hello, a Hello with another run token, and a handshake followed by silence. Each is closed after
// the master answered or after a short wait; none may disturb the run.
func (s *soak) junk(seed uint64) {
	addr := s.master
	if s.o.Transport == "quic" {
		s.junkQUIC(seed)
		return
	}
	dialTo := func(a string) (net.Conn, error) { return net.DialTimeout("tcp", a, time.Second) }
	if s.bed != nil {
		dialTo = netOf(s.bed.stranger).dial
	}
	dial := func() (net.Conn, error) { return dialTo(addr) }
	s.junkPeers(seed^0x5eed, dialTo)
	s.junkWG.Add(1)
	go func() {
		defer s.junkWG.Done()
		rng := rand.New(rand.NewPCG(seed, 0x1c))
		for i := range junkPerFault {
			c, err := dial()
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
				payload = wire.AppendFrame(hs, &wire.Hello{Token: "not the run's", Addr: "127.0.0.1:1"})
			case 5:
				payload = hs
			}
			c.Write(payload)
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
}

// doom marks a victim's session as lost: it no longer counts as healthy or as holding the state.
func (s *soak) doom(p *peerProc) {
	p.sess, p.established, p.doomedAt = 0, false, time.Now()
}

// status prints the live status line (always when final).
func (s *soak) status(now time.Time, final bool) {
	every := 5 * time.Second
	if s.isTerm {
		every = 500 * time.Millisecond
	}
	if !final && now.Sub(s.lastStatus) < every {
		return
	}
	s.lastStatus = now
	var b strings.Builder
	fmt.Fprintf(&b, "stress: %6.1fs world %d revision %d ops %d aborts %d faults", now.Sub(s.start).Seconds(), s.lastWorld,
		s.sum.MaxRevision, s.sum.OpsCompleted, s.sum.Aborts)
	for _, c := range faultClasses {
		fmt.Fprintf(&b, " %s=%d", c, s.sum.Faults[c])
	}
	if s.isTerm && !final {
		fmt.Fprintf(s.log, "\r%s\x1b[K", b.String())
		return
	}
	if s.isTerm {
		b.WriteString("\n")
		fmt.Fprintf(s.log, "\r%s", b.String())
		return
	}
	fmt.Fprintln(s.log, b.String())
}

// shutdown resumes every frozen peer, heals every link, tells every peer to leave and waits for them
// to exit (a peer still running after hangLimit is a violation), reading their last lines.
func (s *soak) shutdown() {
	if s.start.IsZero() {
		return
	}
	s.closing = true
	now := time.Now()
	for _, p := range s.order {
		if p.exited {
			continue
		}
		if !p.stoppedUntil.IsZero() {
			p.proc.Continue()
			p.stoppedUntil = time.Time{}
		}
		p.relay.blackhole(time.Time{})
		p.relay.setDelay(0)
		p.holedUntil, p.slowUntil = time.Time{}, time.Time{}
		for _, f := range s.linkFaults {
			f.from.links.holeLink(f.dest, time.Time{})
			f.from.links.slowLink(f.dest, 0)
		}
		if p.leaveAt.IsZero() && !p.killed {
			if p.proc.Send(peerCommand{Cmd: "leave"}) == nil {
				p.leaveAt = now
			}
		}
	}
	if !s.masterStoppedUntil.IsZero() {
		s.mproc.Continue()
		s.masterStoppedUntil = time.Time{}
	}
	if s.partition != nil {
		s.partition.until = now
		s.endPartition(now)
	}
	s.junkWG.Wait()
	deadline := time.NewTimer(hangLimit + time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(tickEvery)
	defer tick.Stop()
	for {
		live := 0
		for _, p := range s.order {
			select {
			case <-p.output:
			default:
				live++
			}
		}
		if live == 0 {
			break
		}
		select {
		case l, ok := <-s.c.Lines():
			if ok {
				s.handle(l)
			}
		case now := <-tick.C:
			s.tick(now)
		case <-deadline.C:
			s.tick(time.Now())
			live = 0
		}
		if live == 0 {
			break
		}
	}
	// The last lines of the processes that ended are on the merged feed already.
	quiet := time.NewTimer(200 * time.Millisecond)
	defer quiet.Stop()
	for {
		select {
		case l, ok := <-s.c.Lines():
			if !ok {
				return
			}
			s.handle(l)
			continue
		case <-quiet.C:
		}
		break
	}
	s.tick(time.Now())
}

// finish fills in the summary.
func (s *soak) finish() {
	now := time.Now()
	if !s.start.IsZero() {
		s.check.Finish(now)
		s.sum.DurationS = now.Sub(s.start).Seconds()
	}
	s.sum.Iterations = len(s.iterations)
	s.sum.JunkPeerConns = s.junkPeerConns.Load()
	if len(s.sum.OpsPerWindow) > 0 {
		// The last window is cut short by the end of the run; judge only full ones.
		full := s.sum.OpsPerWindow
		if len(full) > 1 && time.Duration(s.sum.DurationS*float64(time.Second)) < time.Duration(len(full))*windowLen {
			full = full[:len(full)-1]
		}
		s.sum.MinOpsPerWindow = slices.Min(full)
	}
	for _, c := range faultClasses {
		xs := s.recovery[c]
		s.sum.Recovery[c] = Stats{Samples: len(xs), P50: percentile(xs, 50), P90: percentile(xs, 90), P99: percentile(xs, 99), Max: percentile(xs, 100)}
	}
	s.sum.Violations = len(s.check.Violations())
	s.sum.ViolationList = s.check.Violations()[:min(len(s.check.Violations()), 20)]
	s.status(now, true)
}

// report prints what is needed to replay a failed run: the seed, the violations with their
// revisions, the last events and the last stderr lines of the peers.
func (s *soak) report() {
	var b bytes.Buffer
	fmt.Fprintf(&b, "stress: FAILED with seed %d (replay: go run ./stress --seed %d --duration %v --peers %d)\n", s.o.Seed, s.o.Seed, s.o.Duration, s.o.Peers)
	for _, v := range s.check.Violations() {
		fmt.Fprintf(&b, "stress: violation: %s\n", v)
	}
	ev := s.events[max(0, len(s.events)-eventLogLen):]
	fmt.Fprintf(&b, "stress: last %d events:\n", len(ev))
	for _, e := range ev {
		fmt.Fprintf(&b, "  %s\n", e)
	}
	lines := s.watch.lines()
	fmt.Fprintf(&b, "stress: last %d stderr lines of the children:\n", len(lines))
	for _, l := range lines {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	// The races last, condensed: a cut log keeps its end.
	for _, l := range s.watch.raceLines() {
		fmt.Fprintf(&b, "stress: %s\n", l)
	}
	s.log.Write(b.Bytes())
}

// ringLinks returns the links of the latest ring between two healthy peers whose link addresses are
// known, untouched by another link fault, and how many healthy peers that ring holds.
func (s *soak) ringLinks() ([]linkFault, int) {
	bySess := map[uint64]*peerProc{}
	for _, p := range s.order {
		if p.healthy() && p.addr != "" {
			bySess[p.sess] = p
		}
	}
	busy := map[*peerProc]bool{}
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
			out = append(out, linkFault{from: from, to: to, dest: to.addr})
		}
	}
	return out, inRing
}

// endLinkFaults ends the link faults that are due and forgets those over for linkHoleGrace.
func (s *soak) endLinkFaults(now time.Time) {
	kept := s.linkFaults[:0]
	for _, f := range s.linkFaults {
		if !f.over && now.After(f.until) {
			f.over = true
			if f.class == "link-blackhole" {
				f.from.links.holeLink(f.dest, time.Time{})
				s.freezeOver = now
			} else {
				f.from.links.slowLink(f.dest, 0)
			}
			s.event("%s %s→%s over", f.class, f.from.name, f.to.name)
		}
		if !f.over || now.Sub(f.until) < linkHoleGrace {
			kept = append(kept, f)
		}
	}
	s.linkFaults = kept
}

// linkHoled reports whether p is an end of a ring link that is black-holed, or was within
// linkHoleGrace.
func (s *soak) linkHoled(p *peerProc, now time.Time) bool {
	for _, f := range s.linkFaults {
		if f.class == "link-blackhole" && (f.from == p || f.to == p) && now.Sub(f.until) < linkHoleGrace {
			return true
		}
	}
	return false
}
