package master

import (
	"fmt"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl/master/diagnosis"
)

// DiagnosisConfig configures how the master finds slow links and slow peers from the link timings
// peers send in Done, and what it does about them. The zero value works: syndromes are raised as
// events, slow links cost ten times more in the ring solve for ten minutes, the ring is re-ordered
// around a clearly slow link at most once a minute (Reorder), and nobody is evicted.
type DiagnosisConfig struct {
	// Detector tunes the syndromes: thresholds, hysteresis, window (see diagnosis.Config).
	Detector diagnosis.Config
	// Penalty multiplies the cost (seconds per byte) of a link found slow in the topology model, so
	// that the next OptimizeTopology routes the ring around it when another ring exists. Zero means
	// 10.
	Penalty float64
	// PenaltyHold is how long a slow link keeps its penalty after its syndrome was last seen. The
	// ring no longer uses the link once it routed around it, so nothing would clear it otherwise.
	// Zero means 10 minutes.
	PenaltyHold time.Duration
	// Reorder is the policy that re-orders a group's ring around a slow link on its own, with no
	// application call (reorder.go). On by default.
	Reorder ReorderPolicy
	// EvictAfter kicks a peer whose slow-sender, slow-receiver or slow-compute syndrome has held for
	// this many operations of its group: a chronic straggler costs every peer of the ring its pace.
	// Zero, the default, never evicts.
	EvictAfter int
	// NoProbes turns off the bandwidth tests the master asks for on its own when a ring link looks
	// slow in one operation and the matrix holds nothing else about its sender's links out or its
	// receiver's links in (see probeSuspects). Default false: they run, so a slow sender or receiver
	// is told from a slow link by the time the syndrome can be raised.
	NoProbes bool
	// ProbeDuration is the time budget of one of those tests. They run beside the group's
	// collectives, on the links and cores the collectives use, and need only tell a slow link from
	// its neighbours, not rank every link as OptimizeTopology's tests do. Zero means a fifth of
	// Config.MeasureDuration, and at least minProbeDuration: 100 ms by default.
	ProbeDuration time.Duration
}

// minProbeDuration is the least default ProbeDuration: below it the test's handshake and the
// receiver's settling third take most of the budget.
const minProbeDuration = 50 * time.Millisecond

// maxProbeDuration bounds ProbeDuration: peers refuse a bandwidth test longer than a minute.
const maxProbeDuration = time.Minute

// probeDuration returns the time budget of one bandwidth test that probeSuspects asks for.
func (c Config) probeDuration() time.Duration {
	if d := c.Diagnosis.ProbeDuration; d > 0 {
		return d
	}
	return max(c.MeasureDuration/5, minProbeDuration)
}

func (c DiagnosisConfig) withDefaults() DiagnosisConfig {
	if c.Penalty == 0 {
		c.Penalty = 10
	}
	if c.PenaltyHold == 0 {
		c.PenaltyHold = 10 * time.Minute
	}
	return c
}

// Validate reports the first invalid field.
func (c DiagnosisConfig) Validate() error {
	switch {
	case c.Penalty != 0 && !(c.Penalty >= 1):
		return fmt.Errorf("master: Config.Diagnosis.Penalty is %v, must be 0 or >= 1", c.Penalty)
	case c.PenaltyHold < 0:
		return fmt.Errorf("master: Config.Diagnosis.PenaltyHold is %v, must be >= 0", c.PenaltyHold)
	case c.EvictAfter < 0:
		return fmt.Errorf("master: Config.Diagnosis.EvictAfter is %d, must be >= 0", c.EvictAfter)
	case c.ProbeDuration < 0 || c.ProbeDuration > maxProbeDuration:
		return fmt.Errorf("master: Config.Diagnosis.ProbeDuration is %v, must be 0 (the default) or at most %v", c.ProbeDuration, maxProbeDuration)
	}
	if err := c.Reorder.Validate(); err != nil {
		return err
	}
	return c.Detector.Validate()
}

// groupDiag is a group's diagnosis: its delay matrix and syndromes, the penalties of its slow links,
// and its recovery bookkeeping.
type groupDiag struct {
	det       *diagnosis.Detector
	penalty   map[edge]penalty
	abortedAt time.Time // first abort since the last completed collective; zero when none
	stats     DiagnosisStats

	ops     uint64          // collectives diagnosed
	probed  map[edge]uint64 // suspect links whose neighbours were tested, and when (ops)
	probing map[edge]bool   // bandwidth tests asked for and not reported yet

	// The re-ordering policy (reorder.go): slow links it solved for, or noted as held back by the
	// rate limit, while their syndrome lasts; and when it last installed a ring.
	reorderTried, reorderDeferred map[edge]bool
	lastReorder                   time.Time
}

// probeEvery is how many collectives pass before the neighbours of the same suspect link are tested
// again: as long as the tests stay fresh in the matrix.
const probeEvery = 20

// penalty raises a slow link's cost in the topology model until a time.
type penalty struct {
	factor float64
	until  time.Time
}

// diag returns g's diagnosis, creating it.
func (m *Machine) diag(g *group) *groupDiag {
	if g.diag == nil {
		g.diag = &groupDiag{det: diagnosis.New(m.cfg.Diagnosis.Detector), penalty: map[edge]penalty{},
			stats: DiagnosisStats{Raised: map[string]uint64{}}, probed: map[edge]uint64{}, probing: map[edge]bool{},
			reorderTried: map[edge]bool{}, reorderDeferred: map[edge]bool{}}
	}
	return g.diag
}

// diagReport keeps the link timings of p's Done of o until o completes.
func (m *Machine) diagReport(o *op, p PeerID, d *wire.Done) {
	if len(d.Links) == 0 {
		return
	}
	if o.links == nil {
		o.links = map[PeerID][]wire.LinkTiming{}
	}
	o.links[p] = d.Links
}

// diagVote notes when p's vote for o was counted. A vote queued behind the previous operation on
// the tag counts when that one retires, which can only make its peer look earlier, never later.
func (m *Machine) diagVote(o *op, p PeerID) {
	if o.voted == nil {
		o.voted = map[PeerID]time.Time{}
	}
	o.voted[p] = m.now
}

// diagAborted notes that a commenced collective of g was aborted: g is recovering until one
// completes.
func (m *Machine) diagAborted(g *group) {
	if dg := m.diag(g); dg.abortedAt.IsZero() {
		dg.abortedAt = m.now
	}
}

// diagnose feeds a completed collective's timings into g's delay matrix, notes the syndromes raised
// and cleared, raises the cost of slow links, and evicts chronic stragglers when the policy says so.
func (m *Machine) diagnose(g *group, o *op) {
	dg := m.diag(g)
	if !dg.abortedAt.IsZero() {
		d := m.now.Sub(dg.abortedAt)
		dg.abortedAt = time.Time{}
		dg.stats.Recoveries++
		dg.stats.RecoverySeconds += d.Seconds()
		dg.stats.LastRecovery = d
	}
	if len(o.links) == 0 {
		return
	}
	op := diagnosis.Op{Ring: slices.Clone(o.members), Sites: map[PeerID]string{}}
	for _, id := range o.members {
		if site := m.siteOf(id); site != "" {
			op.Sites[id] = site
		}
	}
	var first time.Time
	for _, id := range o.members {
		if t, ok := o.voted[id]; ok && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	for _, id := range o.members {
		ls := o.links[id]
		if len(ls) == 0 {
			continue
		}
		r := diagnosis.Report{Peer: id}
		if t, ok := o.voted[id]; ok {
			r.Vote = t.Sub(first)
		}
		for _, l := range ls {
			r.Links = append(r.Links, diagnosis.Timing{Peer: l.Peer, Out: l.Dir == wire.LinkOut, Bytes: l.Bytes,
				Start: time.Duration(l.Start), End: time.Duration(l.End), Wait: time.Duration(l.Wait), Transit: time.Duration(l.Transit)})
		}
		op.Reports = append(op.Reports, r)
	}
	cfg := m.cfg.Diagnosis.withDefaults()
	dg.ops++
	evs := dg.det.Observe(op)
	if !cfg.NoProbes {
		m.probeSuspects(g, dg, op.Ring)
	}
	for _, ev := range evs {
		kind := ev.Kind.String()
		if ev.Cleared {
			kind = "cleared"
			dg.stats.Cleared++
		} else {
			dg.stats.Raised[ev.Kind.String()]++
		}
		m.gnote(g, kind, ev.Peer, "%s (confidence %.2f, %.1f× the group median): %s", ev.Key(), ev.Confidence, ev.Ratio, ev.Evidence)
	}
	// Every slow link still active keeps its penalty fresh; the hold runs from the last sighting.
	for _, ev := range dg.det.Active() {
		if ev.Kind == diagnosis.SlowLink {
			dg.penalty[edge{ev.Link.From, ev.Link.To}] = penalty{factor: cfg.Penalty, until: m.now.Add(cfg.PenaltyHold)}
		}
	}
	m.reorderCheck(g, dg)
	if cfg.EvictAfter == 0 {
		return
	}
	for _, ev := range dg.det.Active() {
		if ev.Kind == diagnosis.SlowLink || ev.Ops < cfg.EvictAfter || m.peers[ev.Peer] == nil {
			continue
		}
		dg.stats.Evicted++
		m.kick(ev.Peer, fmt.Sprintf("evicted as a chronic straggler: %s for %d operations: %s", ev.Key(), ev.Ops, ev.Evidence))
	}
}

// diagProbe feeds a bandwidth test of OptimizeTopology into g's diagnosis: tests cover every link,
// so they tell a slow sender or receiver from a slow link of the ring.
func (m *Machine) diagProbe(g *group, from, to PeerID, bytesPerSec float64) {
	if to != 0 && m.peers[to] != nil && m.peers[to].group == g {
		m.diag(g).det.ObserveProbe(from, to, bytesPerSec)
	}
}

// probeSuspects asks for bandwidth tests around each link that looked slow in the collective just
// diagnosed while the matrix cannot tell it from a slow sender or receiver (diagnosis.Suspects): two
// links out of its sender, two links into its receiver, and two links between other peers for the
// group's normal. They run beside the collectives (MeasureRound with Round 0), each for
// ProbeDuration, and their results reach the detector as probes by the time the syndrome can be
// raised. None are asked for while OptimizeTopology measures the group: they would skew its tests,
// which cover every link anyway.
func (m *Machine) probeSuspects(g *group, dg *groupDiag, ring []PeerID) {
	if g.opt != nil {
		return
	}
	for _, l := range dg.det.Suspects(ring) {
		e := edge{l.From, l.To}
		if last, ok := dg.probed[e]; ok && dg.ops-last < probeEvery {
			continue
		}
		var others []PeerID
		i := slices.Index(ring, l.To)
		for k := 1; k < len(ring); k++ {
			if id := ring[(i+k)%len(ring)]; id != l.From && id != l.To {
				others = append(others, id)
			}
		}
		if len(others) < 2 {
			continue // a ring of three has no other link out of the sender that is not its ring link
		}
		dg.probed[e] = dg.ops
		k := len(others)
		tests := []edge{{l.From, others[0]}, {l.From, others[1]}, {others[k-1], l.To}, {others[k-2], l.To},
			{others[0], others[k-1]}, {others[k-1], others[0]}}
		var asked []string
		for _, t := range tests {
			if dg.probing[t] || m.peers[t.from] == nil || m.peers[t.to] == nil {
				continue
			}
			dg.probing[t] = true
			q := m.peers[t.to]
			m.send(t.from, &wire.MeasureRound{Round: 0, Target: m.info(q),
				Nanos: uint64(m.cfg.probeDuration()), Streams: uint16(m.cfg.MeasureStreams)})
			asked = append(asked, fmt.Sprintf("%d→%d", t.from, t.to))
		}
		if len(asked) > 0 {
			m.gnote(g, "probe", l.From, "link %d→%d looked slow: bandwidth tests of %v tell a slow link from a slow sender or receiver",
				l.From, l.To, asked)
		}
	}
}

// probeReport takes in the result of a bandwidth test probeSuspects asked for; a report nobody asked
// for is ignored.
func (m *Machine) probeReport(p *peer, r *wire.MeasureReport) {
	g := p.group
	if g.diag == nil || !g.diag.probing[edge{p.id, r.To}] {
		return
	}
	delete(g.diag.probing, edge{p.id, r.To})
	m.diagProbe(g, p.id, r.To, r.BytesPerSec)
}

// diagForget drops a departed peer from g's delay matrix and penalties.
func (m *Machine) diagForget(g *group, id PeerID) {
	if g.diag == nil {
		return
	}
	g.diag.det.Forget(id)
	for e := range g.diag.probing {
		if e.from == id || e.to == id {
			delete(g.diag.probing, e)
		}
	}
	for e := range g.diag.probed {
		if e.from == id || e.to == id {
			delete(g.diag.probed, e)
		}
	}
	for e := range g.diag.penalty {
		if e.from == id || e.to == id {
			delete(g.diag.penalty, e)
		}
	}
}

// linkPenalty returns the factor by which the topology model raises the cost of the link from a to b:
// 1 unless the link was found slow recently.
func (m *Machine) linkPenalty(a, b PeerID) float64 {
	p := m.peers[a]
	if p == nil || p.group == nil || p.group.diag == nil {
		return 1
	}
	pen, ok := p.group.diag.penalty[edge{a, b}]
	if !ok {
		return 1
	}
	if !m.now.Before(pen.until) {
		delete(p.group.diag.penalty, edge{a, b})
		return 1
	}
	return pen.factor
}

// DiagnosisStats are a group's diagnosis totals since the master started.
type DiagnosisStats struct {
	Raised          map[string]uint64 // syndromes raised, by kind ("slow-link", ...)
	Cleared         uint64            // syndromes cleared
	Evicted         uint64            // peers evicted as chronic stragglers
	Recoveries      uint64            // aborts followed by a completed collective
	RecoverySeconds float64           // sum of the times from the first abort to the next completion
	LastRecovery    time.Duration     // the latest of those times

	Reorders         uint64    // rings re-ordered around a slow link with no application call (ReorderPolicy)
	ReordersDeferred uint64    // slow links that qualified while the policy's rate limit held it back
	ReordersKept     uint64    // slow links that qualified but no better ring avoided them
	LastReorder      time.Time // when the latest re-ordering started; zero if none
}

// LinkDelay is one directed link of a group's delay matrix in a Snapshot: the recent (median)
// estimates from the link timings of the group's collectives.
type LinkDelay struct {
	From, To PeerID
	Transfer float64 // seconds per byte from the first to the last byte, at the sender
	Stall    float64 // seconds per byte the link held its sender back
	Wait     float64 // seconds per collective the receiver starved on it
	Transit  float64 // seconds per byte its frames spent arriving, at the receiver (0: not timed)
	Age      uint64  // collectives since it was last observed
}

// Syndrome is an active syndrome in a Snapshot.
type Syndrome struct {
	Kind       string // "slow-link", "slow-sender", "slow-receiver" or "slow-compute"
	Peer       PeerID // the slow peer, or the sender of the slow link
	From, To   PeerID // the slow link (slow-link only)
	Confidence float64
	Ratio      float64 // the culprit's figure over the group median
	Ops        int     // operations it has held
	Evidence   string
}

// diagSnapshot fills gi's diagnosis fields from g.
func (m *Machine) diagSnapshot(g *group, gi *GroupInfo) {
	if g.diag == nil {
		return
	}
	gi.Delay = g.diag.det.Delay(g.ring)
	for _, c := range g.diag.det.Cells() {
		gi.Links = append(gi.Links, LinkDelay{From: c.Link.From, To: c.Link.To, Transfer: c.Transfer, Stall: c.Stall,
			Wait: c.Wait, Transit: c.Transit, Age: c.Age})
	}
	for _, ev := range g.diag.det.Active() {
		gi.Syndromes = append(gi.Syndromes, Syndrome{Kind: ev.Kind.String(), Peer: ev.Peer, From: ev.Link.From, To: ev.Link.To,
			Confidence: ev.Confidence, Ratio: ev.Ratio, Ops: ev.Ops, Evidence: ev.Evidence})
	}
	st := g.diag.stats
	st.Raised = make(map[string]uint64, len(g.diag.stats.Raised))
	for k, v := range g.diag.stats.Raised {
		st.Raised[k] = v
	}
	gi.Diagnosis = st
}
