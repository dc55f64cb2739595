package master

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/concord-ccl/concord/pccl/master/diagnosis"
)

// Re-ordering the ring around a slow link, with no application call.
//
// A slow link found by the diagnosis raises its cost in the topology model, which OptimizeTopology
// uses; but an application that never calls OptimizeTopology would run on the slow link for good. So
// when a slow-link syndrome on a link of the ring in force is clear enough (ReorderPolicy), the
// master solves the ring over its measured costs itself (a Solve action, as OptimizeTopology does,
// with the link's penalty) and, when a ring that avoids the link beats the ring in force, installs it
// at the group's next safe point: once every accepted peer has voted for a collective (so none is
// inside UpdateTopology, OptimizeTopology or a sync, which a peer refuses to start while a
// collective of its is pending) and no collective of the group runs, it wires the new ring in a
// round of its own before that collective commences. Peers re-wire on the master's Connect as they do
// for any round; the collective then commences on the new ring under its epoch. While a new ring
// waits for its safe point, collectives whose votes are complete wait for the ones running to
// finish, so that a group with collectives always in flight still reaches one. At most one
// re-ordering per group runs per ReorderPolicy.Interval.

// ReorderPolicy says when the master re-orders a group's ring around a slow link on its own: the
// diagnosis holds a slow-link syndrome on a link of the ring in force with at least MinConfidence and
// MinRatio, no re-ordering of the group was installed within Interval, and the ring solve over the
// measured costs finds a ring that avoids the link and beats the ring in force by a margin worth a
// re-wire. The zero value is on, with the defaults below.
type ReorderPolicy struct {
	// Off turns the policy off: a slow link then only costs more at the next OptimizeTopology.
	// Default false: on.
	Off bool
	// MinConfidence is the least confidence of the slow-link syndrome. Zero means 0.6: a slow link
	// with normal links beside it on at least one side qualifies, one that a slow sender or receiver
	// would look the same as (its confidence at most 0.6 × 0.99) does not.
	MinConfidence float64
	// MinRatio is the least ratio of the slow link's stall (or transit) per byte to the group median.
	// Zero means 3.
	MinRatio float64
	// Interval is the least time between two re-orderings of one group: each re-wires links and
	// holds one collective of the group while it does. Zero means 1 minute.
	Interval time.Duration
}

func (p ReorderPolicy) withDefaults() ReorderPolicy {
	if p.MinConfidence == 0 {
		p.MinConfidence = 0.6
	}
	if p.MinRatio == 0 {
		p.MinRatio = 3
	}
	if p.Interval == 0 {
		p.Interval = time.Minute
	}
	return p
}

// Validate reports the first invalid field.
func (p ReorderPolicy) Validate() error {
	switch {
	case !(p.MinConfidence >= 0 && p.MinConfidence < 1):
		return fmt.Errorf("master: Config.Diagnosis.Reorder.MinConfidence is %v, must be in [0, 1)", p.MinConfidence)
	case p.MinRatio != 0 && !(p.MinRatio > 1):
		return fmt.Errorf("master: Config.Diagnosis.Reorder.MinRatio is %v, must be 0 (the default) or above 1", p.MinRatio)
	case p.Interval < 0:
		return fmt.Errorf("master: Config.Diagnosis.Reorder.Interval is %v, must be >= 0", p.Interval)
	}
	return nil
}

// reorderState is a re-ordering of a group on its way: solving, then waiting for a safe point.
type reorderState struct {
	ev      diagnosis.Event // the slow-link syndrome that set it off
	members []PeerID        // the ring in force it was solved for
	solveID uint64          // the Solve asked for
	ring    []PeerID        // the ring to install; nil while the solve runs
	before  rscore          // the ring in force under the costs of the solve
	after   rscore          // ring under the same costs
}

// reorderCheck starts a re-ordering of g when an active slow-link syndrome on a link of g's ring
// passes the policy's thresholds. It runs after every diagnosed collective.
func (m *Machine) reorderCheck(g *group, dg *groupDiag) {
	pol := m.cfg.Diagnosis.Reorder.withDefaults()
	if pol.Off || len(g.ring) < 3 {
		return
	}
	// Links are tried once per sighting: forget those whose syndrome cleared.
	active := map[edge]bool{}
	var cands []diagnosis.Event
	for _, ev := range dg.det.Active() {
		if ev.Kind != diagnosis.SlowLink {
			continue
		}
		e := edge{ev.Link.From, ev.Link.To}
		active[e] = true
		if ev.Confidence >= pol.MinConfidence && ev.Ratio >= pol.MinRatio && ringUses(g.ring, e) && !dg.reorderTried[e] {
			cands = append(cands, ev)
		}
	}
	for e := range dg.reorderTried {
		if !active[e] {
			delete(dg.reorderTried, e)
		}
	}
	for e := range dg.reorderDeferred {
		if !active[e] {
			delete(dg.reorderDeferred, e)
		}
	}
	if len(cands) == 0 || g.reorder != nil || g.opt != nil {
		return
	}
	// The clearest case first; Active sorts by key, so ties keep a deterministic order.
	slices.SortStableFunc(cands, func(a, b diagnosis.Event) int { return cmp.Compare(b.Ratio, a.Ratio) })
	ev := cands[0]
	e := edge{ev.Link.From, ev.Link.To}
	if next := dg.lastReorder.Add(pol.Interval); !dg.lastReorder.IsZero() && m.now.Before(next) {
		if !dg.reorderDeferred[e] {
			dg.reorderDeferred[e] = true
			dg.stats.ReordersDeferred++
			m.gnote(g, "reorder", e.from, "slow link %d→%d (%.1f× the group median, confidence %.2f) waits: the ring was re-ordered at %s, at most once per %v",
				e.from, e.to, ev.Ratio, ev.Confidence, dg.lastReorder.UTC().Format("15:04:05.000"), pol.Interval)
		}
		return
	}
	dg.reorderTried[e] = true
	m.solveSeq++
	r := &reorderState{ev: ev, members: slices.Clone(g.ring), solveID: m.solveSeq}
	g.reorder = r
	cost := m.reorderCosts(r.members)
	start := make([]int, len(r.members))
	for i := range start {
		start[i] = i
	}
	m.out = append(m.out, Solve{ID: r.solveID, Group: g.id, Nodes: slices.Clone(r.members), Cost: cost,
		Hop: m.hopMatrix(r.members, cost), Tol: RingTolerance, Start: start, Budget: m.cfg.SolveBudget})
}

// reorderSolved takes in the answer to the Solve of g's re-ordering: the ring is kept for the next
// safe point when it avoids the slow link and beats the ring in force, and dropped otherwise.
func (m *Machine) reorderSolved(g *group, s Solved) {
	r := g.reorder
	if !slices.Equal(r.members, g.ring) {
		g.reorder = nil // the ring changed while it solved: the next diagnosis decides again
		return
	}
	e := edge{r.ev.Link.From, r.ev.Link.To}
	cost := m.reorderCosts(g.ring)
	hop := m.hopMatrix(g.ring, cost)
	r.before = ringScore(cost, hop, g.ring, g.ring)
	if sameMembers(s.Ring, g.ring) && !ringUses(s.Ring, e) {
		r.after = ringScore(cost, hop, g.ring, s.Ring)
		if r.after.better(r.before) {
			r.ring = slices.Clone(s.Ring)
			return
		}
	}
	g.reorder = nil
	m.diag(g).stats.ReordersKept++
	m.gnote(g, "reorder", e.from, "slow link %d→%d (%.1f× the group median, confidence %.2f) stays: no ring of the measured costs avoids it and beats %v",
		e.from, e.to, r.ev.Ratio, r.ev.Confidence, g.ring)
}

// reorderHold reports whether a collective of g whose votes are complete must wait instead of
// commencing: while a re-ordering wires the ring, or while a new ring waits for the collectives
// running to finish. When the group is at a safe point it starts the re-ordering's wiring round.
func (m *Machine) reorderHold(g *group) bool {
	if g.wiring != nil && g.wiring.auto {
		return true
	}
	r := g.reorder
	if r == nil || r.ring == nil {
		return false
	}
	if g.ringDirty || !slices.Equal(r.members, g.ring) || m.holding() {
		g.reorder = nil // the ring is being repaired, or another round changed it: that one decides
		return false
	}
	if g.wiring != nil || g.opt != nil || g.sync != nil || g.topoVotes > 0 || g.syncVotes > 0 {
		return false // a major operation is under way: not a safe point
	}
	for _, id := range g.acc {
		if m.peers[id].voteOpt {
			return false
		}
	}
	for _, o := range g.ops {
		if o.seq != 0 {
			return true // drain: the collectives running finish first
		}
	}
	m.startReorder(g)
	return true
}

// reorderHeld commences the collectives of g whose votes are complete and that waited for a
// re-ordering (or starts it, when the last collective running just finished).
func (m *Machine) reorderHeld(g *group) {
	for _, tag := range g.tags() {
		if o := g.ops[tag]; o != nil && o.seq == 0 {
			m.checkOp(g, o)
		}
	}
}

// startReorder wires g's new ring in a round of the master's own.
func (m *Machine) startReorder(g *group) {
	r := g.reorder
	g.reorder = nil
	dg := m.diag(g)
	dg.lastReorder = m.now
	dg.stats.Reorders++
	dg.stats.LastReorder = m.now
	ev := r.ev
	m.gnote(g, "reorder", ev.Link.From, "ring %v replaces %v around slow link %s (%.1f× the group median, confidence %.2f): slowest link as priced %s → %s per MiB",
		r.ring, g.ring, ev.Link, ev.Ratio, ev.Confidence, perMiB(r.before.bottleneck), perMiB(r.after.bottleneck))
	g.wiring = &round{ring: m.avoidCuts(g, r.ring), auto: true}
	m.restartRound(g)
}

// perMiB formats a cost in seconds per byte as the time one MiB takes.
func perMiB(secPerByte float64) string {
	if math.IsInf(secPerByte, 0) || math.IsNaN(secPerByte) {
		return "∞"
	}
	return time.Duration(secPerByte * (1 << 20) * 1e9).Round(time.Microsecond).String()
}

// reorderCosts is the cost matrix of a re-ordering: costMatrix's, but a link never measured costs
// what a typical measured link of nodes does (twice that between two named sites), not more than
// any. OptimizeTopology measures every link before it solves, so its pricing of unknown links only
// has to keep a ring possible; a re-ordering measures nothing, and with costMatrix's pricing a ring
// around the slow link would always look worse than the slow link itself.
func (m *Machine) reorderCosts(nodes []PeerID) [][]float64 {
	cost := m.costMatrix(nodes)
	var known []float64
	for i, a := range nodes {
		for j, b := range nodes {
			if i != j && m.bw[edge{a, b}] > 0 && !m.isCut(a, b) && m.linkPenalty(a, b) == 1 {
				known = append(known, cost[i][j]/m.reachPenalty(a, b))
			}
		}
	}
	if len(known) == 0 {
		return cost
	}
	slices.Sort(known)
	typical := known[len(known)/2]
	for i, a := range nodes {
		for j, b := range nodes {
			if i == j || m.bw[edge{a, b}] > 0 || m.isCut(a, b) {
				continue
			}
			c := typical
			if sa, sb := m.siteOf(a), m.siteOf(b); sa != sb && sa != "" && sb != "" {
				c *= 2
			}
			cost[i][j] = c * m.reachPenalty(a, b)
		}
	}
	return cost
}

// ringUses reports whether ring sends over link e.
func ringUses(ring []PeerID, e edge) bool {
	i := slices.Index(ring, e.from)
	return i >= 0 && len(ring) > 1 && ring[(i+1)%len(ring)] == e.to
}
