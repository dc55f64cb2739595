package master

import (
	"math"
	"slices"
	"time"

	"github.com/concord-ccl/concord/atsp"
	"github.com/concord-ccl/concord/internal/wire"
)

// Solved returns the result of a Solve action: the best ring found for the request ID (nil if none).
type Solved struct {
	ID   uint64
	Ring []PeerID
}

// Improved proposes a ring for Group found by the background search; it is applied at the next
// OptimizeTopology of the group if it is better than the ring then in force.
type Improved struct {
	Group GroupID
	Ring  []PeerID
}

// ForceRing makes the next OptimizeTopology of Group install Ring (a permutation of the group's ring in
// force) without measuring or solving. It is an operator's and a benchmark's tool.
type ForceRing struct {
	Group GroupID
	Ring  []PeerID
}

func (Solved) isInput()    {}
func (Improved) isInput()  {}
func (ForceRing) isInput() {}

// Solve asks the server to solve the ring order over Nodes within Budget, starting from Start
// (indexes into Nodes), answer with Solved{ID}, and then keep improving in the background for at most
// ImproveBudget, sending Improved for each better ring.
//
// The objective has two levels, as a ring runs at the pace of its slowest link: first the bottleneck
// of Cost (Cost[i][j]: seconds per byte from Nodes[i] to Nodes[j]), where rings within a factor 1+Tol
// of the best count as equal (measurements are noisy); then the sum of Hop (Hop[i][j]: seconds for one
// pipelined part to cross the link, transfer plus latency), which is the pipeline's fill time.
type Solve struct {
	ID            uint64
	Group         GroupID // the group whose ring is solved; Improved carries it back
	Nodes         []PeerID
	Cost          [][]float64
	Hop           [][]float64
	Tol           float64
	Start         []int
	Budget        time.Duration
	ImproveBudget time.Duration
}

// RingTolerance is the relative bottleneck difference below which two rings count as equally fast.
const RingTolerance = 0.15

// hopPartBytes is the part size used to price a hop of the pipeline.
const hopPartBytes = 1 << 20

// Restrict returns Hop with +Inf wherever Cost exceeds the bottleneck bound (1+Tol)*best.
func Restrict(cost, hop [][]float64, best, tol float64) [][]float64 {
	out := make([][]float64, len(hop))
	for i := range hop {
		out[i] = make([]float64, len(hop[i]))
		for j := range hop[i] {
			if i != j && cost[i][j] > best*(1+tol) {
				out[i][j] = math.Inf(1)
			} else {
				out[i][j] = hop[i][j]
			}
		}
	}
	return out
}

func (Solve) isAction() {}

// optRound is an OptimizeTopology in progress: bandwidth rounds, then a solve.
type optRound struct {
	members  []PeerID // the ring at the vote, in order
	round    int      // current measurement round, 1..n-1
	reported map[PeerID]bool
	solveID  uint64 // non-zero while waiting for Solved
}

type edge struct{ from, to PeerID }

// cutCost is the cost of a cut link (cuts.go) in the ring solve, in units of the slowest known link:
// beyond any ring without it, so the solver uses it only when no other ring exists.
const cutCost = 1e6

// ewmaWeight is the weight of a new bandwidth sample from a real collective.
const ewmaWeight = 0.3

func (m *Machine) voteOptimize(p *peer) {
	g := p.group
	switch {
	case p.state != Accepted:
		m.kick(p.id, "OptimizeTopology vote from a peer that is not accepted")
		return
	case p.voteOpt:
		m.kick(p.id, "second OptimizeTopology vote in one round")
		return
	case g.opt != nil && slices.Contains(g.opt.members, p.id):
		m.kick(p.id, "OptimizeTopology vote while the previous one is running")
		return
	case m.busy(p):
		m.kick(p.id, "OptimizeTopology vote while a collective of this peer is running")
		return
	}
	p.voteOpt = true
	m.checkOptimize(g)
}

// checkOptimize starts g's measurement once every accepted peer of g voted.
func (m *Machine) checkOptimize(g *group) {
	if g.opt != nil || g.wiring != nil {
		return
	}
	acc := m.accepted(g)
	if len(acc) == 0 {
		return
	}
	for _, id := range acc {
		if !m.peers[id].voteOpt {
			return
		}
	}
	for _, id := range acc {
		m.peers[id].voteOpt = false
	}
	if g.ringDirty {
		// Re-wire first: the ring lost a peer. Newcomers wait for UpdateTopology, as in PCCL, where
		// only that call admits.
		m.startRound(g, false)
		return
	}
	if forced := g.forced; forced != nil {
		g.forced = nil
		if sameMembers(forced, g.ring) {
			m.applyRing(g, forced, "forced")
			return
		}
	}
	if len(g.ring) < 2 {
		m.applyRing(g, g.ring, "")
		return
	}
	g.opt = &optRound{members: slices.Clone(g.ring)}
	m.nextMeasureRound(g)
}

// nextMeasureRound sends round k: member i measures its link to member i+k, so every peer sends one
// test and receives one, and n-1 rounds cover every directed link.
func (m *Machine) nextMeasureRound(g *group) {
	o := g.opt
	o.round++
	o.reported = map[PeerID]bool{}
	n := len(o.members)
	if o.round >= n {
		m.solve(g)
		return
	}
	for i, id := range o.members {
		t := m.peers[o.members[(i+o.round)%n]]
		m.send(id, &wire.MeasureRound{Round: uint32(o.round), Target: m.info(t),
			Nanos: uint64(m.cfg.MeasureDuration), Streams: uint16(m.cfg.MeasureStreams)})
	}
}

func (m *Machine) measureReport(p *peer, r *wire.MeasureReport) {
	if r.Round == 0 {
		m.probeReport(p, r) // a test the diagnosis asked for, outside OptimizeTopology
		return
	}
	g := p.group
	o := g.opt
	if o == nil {
		return // the measurement was abandoned (a peer left) while this report was in flight
	}
	if int(r.Round) != o.round || !slices.Contains(o.members, p.id) || o.reported[p.id] {
		m.kick(p.id, "MeasureReport outside a measurement round")
		return
	}
	o.reported[p.id] = true
	m.diagProbe(g, p.id, r.To, r.BytesPerSec)
	if r.BytesPerSec > 0 && !math.IsInf(r.BytesPerSec, 0) && !math.IsNaN(r.BytesPerSec) {
		m.bw[edge{p.id, r.To}] = r.BytesPerSec
		m.lat[edge{p.id, r.To}] = time.Duration(r.LatencyNanos)
	} else {
		delete(m.bw, edge{p.id, r.To})
		delete(m.lat, edge{p.id, r.To})
	}
	for _, id := range o.members {
		if !o.reported[id] {
			return
		}
	}
	m.nextMeasureRound(g)
}

// costMatrix returns seconds per byte between nodes from the bandwidth estimates; unknown links cost
// more than any known one but stay usable, so that a ring always exists.
func (m *Machine) costMatrix(nodes []PeerID) [][]float64 {
	worst := 0.0
	for _, bw := range m.bw {
		worst = max(worst, 1/bw)
	}
	if worst == 0 {
		worst = 1
	}
	cost := make([][]float64, len(nodes))
	for i, a := range nodes {
		cost[i] = make([]float64, len(nodes))
		for j, b := range nodes {
			switch bw := m.bw[edge{a, b}]; {
			case i == j:
			case m.isCut(a, b):
				cost[i][j] = cutCost * worst
			case bw > 0:
				cost[i][j] = m.linkPenalty(a, b) * m.reachPenalty(a, b) / bw
			default:
				cost[i][j] = 10 * worst
				if m.peers[a] != nil && m.peers[b] != nil && m.peers[a].hello.Site != "" &&
					m.peers[a].hello.Site == m.peers[b].hello.Site {
					cost[i][j] = 5 * worst
				}
				cost[i][j] *= m.reachPenalty(a, b)
			}
		}
	}
	return cost
}

// hopMatrix returns the time for one pipelined part to cross each link: part/bandwidth + latency.
func (m *Machine) hopMatrix(nodes []PeerID, cost [][]float64) [][]float64 {
	hop := make([][]float64, len(nodes))
	for i, a := range nodes {
		hop[i] = make([]float64, len(nodes))
		for j, b := range nodes {
			if i != j {
				hop[i][j] = cost[i][j]*hopPartBytes + m.lat[edge{a, b}].Seconds()
			}
		}
	}
	return hop
}

func (m *Machine) solve(g *group) {
	o := g.opt
	m.solveSeq++
	o.solveID = m.solveSeq
	start := make([]int, len(o.members))
	for i := range start {
		start[i] = i
	}
	cost := m.costMatrix(o.members)
	m.out = append(m.out, Solve{ID: o.solveID, Group: g.id, Nodes: slices.Clone(o.members), Cost: cost, Hop: m.hopMatrix(o.members, cost),
		Tol: RingTolerance, Start: start, Budget: m.cfg.SolveBudget, ImproveBudget: m.cfg.ImproveBudget})
}

func (m *Machine) solved(s Solved) {
	var g *group
	for _, gid := range m.gids {
		if o := m.groups[gid].opt; o != nil && o.solveID == s.ID {
			g = m.groups[gid]
		}
	}
	if g == nil {
		for _, gid := range m.gids {
			if r := m.groups[gid].reorder; r != nil && r.ring == nil && r.solveID == s.ID {
				m.reorderSolved(m.groups[gid], s)
			}
		}
		return // or the optimization was abandoned (a peer left) while the solve ran
	}
	o := g.opt
	g.opt = nil
	cost := m.costMatrix(o.members)
	hop := m.hopMatrix(o.members, cost)
	best, bestScore := o.members, ringScore(cost, hop, o.members, o.members)
	for _, cand := range [][]PeerID{s.Ring, g.proposal} {
		if !sameMembers(cand, o.members) {
			continue
		}
		if sc := ringScore(cost, hop, o.members, cand); sc.better(bestScore) {
			best, bestScore = cand, sc
		}
	}
	g.proposal = nil
	m.applyRing(g, best, "optimized")
}

// rscore is a ring's bottleneck (seconds per byte of its slowest link) and fill time (sum of hops).
type rscore struct{ bottleneck, fill float64 }

// ringScore evaluates ring (peer ids) over nodes.
func ringScore(cost, hop [][]float64, nodes, ring []PeerID) rscore {
	t := make(atsp.Tour, len(ring))
	for i, id := range ring {
		t[i] = slices.Index(nodes, id)
	}
	return rscore{bottleneck: atsp.Evaluate(cost, t).Bottleneck, fill: atsp.Evaluate(hop, t).Total}
}

// better reports whether a beats b by a margin worth a re-wire: a bottleneck smaller beyond the
// tolerance, or one within it and a fill time at least 1% smaller.
func (a rscore) better(b rscore) bool {
	switch {
	case a.bottleneck < b.bottleneck/(1+RingTolerance):
		return true
	case a.bottleneck > b.bottleneck*(1+RingTolerance):
		return false
	}
	return a.fill < b.fill*(1-0.01)
}

func sameMembers(a, b []PeerID) bool {
	if len(a) != len(b) {
		return false
	}
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

// rotate returns ring rotated so that it starts with its smallest id (rings are cyclic).
func rotate(ring []PeerID) []PeerID {
	if len(ring) == 0 {
		return ring
	}
	i := slices.Index(ring, slices.Min(ring))
	return append(slices.Clone(ring[i:]), ring[:i]...)
}

// applyRing installs ring in g: unchanged rings are answered at once, others go through a wiring
// round in which only the links that changed are re-opened.
func (m *Machine) applyRing(g *group, ring []PeerID, why string) {
	if slices.Equal(rotate(ring), rotate(g.ring)) {
		run := m.runSize()
		for _, id := range g.ring {
			m.send(id, &wire.Topology{Epoch: g.epoch, Changed: false, Ring: slices.Clone(g.ring), Run: run})
		}
		return
	}
	m.gnote(g, "ring", 0, "%s ring %v replaces %v", why, ring, g.ring)
	g.wiring = &round{ring: slices.Clone(m.avoidCuts(g, ring))}
	m.restartRound(g)
}

func (m *Machine) improved(r Improved) {
	if g := m.groups[r.Group]; g != nil && sameMembers(r.Ring, g.ring) {
		g.proposal = slices.Clone(r.Ring)
	}
}

// observeLink folds a collective's timing of the link from p to its successor next (0: none) into the
// estimates.
func (m *Machine) observeLink(p, next PeerID, bytes, nanos uint64) {
	if bytes < 1<<20 || nanos == 0 || next == 0 {
		return
	}
	e := edge{p, next}
	rate := float64(bytes) / (float64(nanos) / 1e9)
	if old := m.bw[e]; old > 0 {
		rate = (1-ewmaWeight)*old + ewmaWeight*rate
	}
	m.bw[e] = rate
}

// placeNewcomer inserts id into ring at its cheapest position under the current estimates (sites
// stand in for links never measured), so joins do not reshuffle the ring.
func (m *Machine) placeNewcomer(ring []PeerID, id PeerID) []PeerID {
	if len(ring) < 2 {
		return append(ring, id)
	}
	nodes := append(slices.Clone(ring), id)
	cost := m.costMatrix(nodes)
	t := make(atsp.Tour, len(ring))
	for i := range ring {
		t[i] = i
	}
	t = atsp.InsertCheapest(cost, t, len(ring), atsp.Bottleneck)
	out := make([]PeerID, len(t))
	for i, k := range t {
		out[i] = nodes[k]
	}
	// Without a clear gain, append: the order of joins is as good as any and keeps the ring stable.
	hop := m.hopMatrix(nodes, cost)
	if !ringScore(cost, hop, nodes, out).better(ringScore(cost, hop, nodes, nodes)) {
		return nodes
	}
	return out
}

// leaveOptimize handles a departure during g's OptimizeTopology: the measurement is abandoned and the
// spliced ring re-wired.
func (m *Machine) leaveOptimize(g *group, id PeerID) {
	if o := g.opt; o != nil && slices.Contains(o.members, id) {
		g.opt = nil
		for _, q := range m.accepted(g) {
			m.peers[q].voteOpt = false
		}
		m.gnote(g, "ring", 0, "topology optimization abandoned: peer %d left", id)
		if g.wiring == nil {
			m.startRound(g, false)
		}
		return
	}
	m.checkOptimize(g)
}

// bandwidthMatrix returns the estimates in the order of ring for the status page.
func (m *Machine) bandwidthMatrix(ring []PeerID) [][]float64 {
	if len(m.bw) == 0 {
		return nil
	}
	out := make([][]float64, len(ring))
	for i, a := range ring {
		out[i] = make([]float64, len(ring))
		for j, b := range ring {
			out[i][j] = m.bw[edge{a, b}]
		}
	}
	return out
}
