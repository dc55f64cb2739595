package rdma

import (
	"context"
	"fmt"
	"math"
	"slices"

	"github.com/concord-ccl/concord/rdma/plan"
	"github.com/concord-ccl/concord/rings"
)

// Planned reduce-scatter and all-gather. The planner prices whole AllReduces; a plan whose schedule is
// one ring over every node (the standard ring, hot repair, Balance, each possibly on a re-ranked
// ring) is also a reduce-scatter and an all-gather with the same routes, since its AllReduce is the
// two halves on the same channels and pieces. The other schedules reduce parts on smaller rings
// (R²CCL-AllReduce, recursive), hand leaves' inputs to owners (OptCC) or size blocks by bandwidth
// (weighted rings), so no node of them ends holding a fixed block of the sum: they have no halves a
// caller that needs node r to own block r (a hierarchical AllReduce's WAN phase) could use.

// PhaseStrategies are the strategies whose plans run as a reduce-scatter and an all-gather
// ([Node.StartReduceScatterWithPlan]), in the planner's tie-break order.
var PhaseStrategies = []plan.Strategy{plan.Ring, plan.Balance, plan.HotRepair}

// phaseRing checks that p is a plan of PhaseStrategies for topology t on the node's ring and returns
// its ring of node indices (a permutation of the ring positions).
func (n *Node) phaseRing(t plan.Topology, p plan.Plan, bytes int) ([]int, error) {
	if !slices.Contains(PhaseStrategies, p.Strategy) {
		return nil, fmt.Errorf("%w: a %v plan has no reduce-scatter and all-gather halves", ErrInvalid, p.Strategy)
	}
	if len(t.Nodes) != len(n.ring) || len(p.Routes) != len(n.ring) {
		return nil, fmt.Errorf("%w: plan for %d nodes, ring has %d", ErrInvalid, len(t.Nodes), len(n.ring))
	}
	if len(p.Parts) != 1 || p.Bytes != int64(bytes) || p.Parts[0].Offset != 0 || p.Parts[0].Bytes != p.Bytes ||
		len(p.Parts[0].Leaves) > 0 || len(p.Parts[0].BroadcastTo) > 0 {
		return nil, fmt.Errorf("%w: plan of %d parts for %d bytes, want one ring part of %d", ErrInvalid, len(p.Parts), p.Bytes, bytes)
	}
	ring := p.Parts[0].Ring
	sorted := slices.Sorted(slices.Values(ring))
	for i, u := range sorted {
		if u != i {
			sorted = nil
			break
		}
	}
	if len(sorted) != len(n.ring) {
		return nil, fmt.Errorf("%w: plan ring %v is not an order of the %d nodes", ErrInvalid, ring, len(n.ring))
	}
	return ring, nil
}

// phasePlans builds this node's channel plans of a reduce-scatter (gather false) or an all-gather
// of world blocks of count elements each, by plan p on ring (node indices in ring order). Block b of
// the buffer belongs to the node at position b of the Node's ring, whatever the plan's ring order:
// ring position q of the reduce-scatter ends owning block ring[q], and of the all-gather starts with
// it. Every channel of every block is cut at the plan's route boundaries, as the planned AllReduce
// cuts them (routes.go).
func (x *planExecutor) phasePlans(ring []int, count int, gather bool) []channelPlan {
	world := len(ring)
	q := slices.Index(ring, x.me)
	succ, pred := ring[(q+1)%world], ring[(q+world-1)%world]
	var plans []channelPlan
	for c, sp := range splitChannels(count, x.n.weights()) {
		for _, pc := range x.partPieces()[0][c] {
			id := uint16(x.ch)
			x.ch++
			lo, hi := pc.cut(sp.Len)
			boff := func(b int) int { return (ring[mod(b, world)]*count + sp.Off + lo) * x.esz }
			blen := func(int) int { return (hi - lo) * x.esz }
			var out []sendFrame
			var in []recvFrame
			if gather {
				out, in = ringPlan(world-1,
					func(s int) int { return q - s },
					func(s int) int { return q - s - 1 },
					func(int) recvMode { return recvCopy }, boff, blen, x.n.cfg.ChunkBytes, x.esz)
			} else {
				out, in = ringPlan(world-1,
					func(s int) int { return q - s - 1 },
					func(s int) int { return q - s - 2 },
					func(s int) recvMode {
						if s == world-2 {
							return recvReduceLast
						}
						return recvReduce
					}, boff, blen, x.n.cfg.ChunkBytes, x.esz)
			}
			plans = append(plans, channelPlan{channel: id, routed: true,
				out:    &outPlan{to: x.n.ring[succ], frames: out},
				in:     &inPlan{from: x.n.ring[pred], frames: in},
				outNIC: x.pathNIC(pc, c, x.me, succ), inNIC: x.pathNIC(pc, c, pred, x.me)})
		}
	}
	return plans
}

// StartReduceScatterWithPlan is StartReduceScatter by plan p, a plan of [PhaseStrategies] for
// topology t (node index i is the node at ring position i) made for an AllReduce of len(send) bytes:
// its ring order and its routes carry the reduce-scatter, and this node's recv holds the reduction of
// block rank, as with StartReduceScatter. Every node of the ring must start the same plan. Floating-
// point sums on a re-ranked ring may round differently from the standard ring's; all nodes still
// agree bit for bit. Call it in the event context.
func (n *Node) StartReduceScatterWithPlan(t plan.Topology, p plan.Plan, send, recv []byte, dt rings.DType, op rings.Op, done func(error)) error {
	if err := checkBuffers(dt, op, send, recv); err != nil {
		return err
	}
	world := len(n.ring)
	if len(send) != world*len(recv) {
		return fmt.Errorf("%w: send has %d bytes, want %d × %d", ErrInvalid, len(send), world, len(recv))
	}
	ring, err := n.phaseRing(t, p, len(send))
	if err != nil {
		return err
	}
	if n.op != nil {
		return ErrBusy
	}
	work := n.scratchBuffer(len(send))
	var plans []channelPlan
	if world == 1 {
		copy(work, send)
		rings.Finalize(dt, op, work, 1)
		send = nil
	} else {
		x := &planExecutor{n: n, p: p, topo: t, esz: dt.Size(), me: n.rank}
		plans = x.phasePlans(ring, len(recv)/dt.Size(), false)
	}
	own := n.rank * len(recv)
	return n.startScratch(work, send, dt, op, plans, nil, func() { copy(recv, work[own:own+len(recv)]) }, done)
}

// StartAllGatherWithPlan is StartAllGather by plan p, a plan of [PhaseStrategies] for topology t made
// for an AllReduce of len(recv) bytes: recv gets block r from the node at ring position r, as with
// StartAllGather. Every node of the ring must start the same plan. Call it in the event context.
func (n *Node) StartAllGatherWithPlan(t plan.Topology, p plan.Plan, send, recv []byte, dt rings.DType, done func(error)) error {
	if err := checkBuffers(dt, rings.Sum, send, recv); err != nil {
		return err
	}
	world := len(n.ring)
	if len(recv) != world*len(send) {
		return fmt.Errorf("%w: recv has %d bytes, want %d × %d", ErrInvalid, len(recv), world, len(send))
	}
	ring, err := n.phaseRing(t, p, len(recv))
	if err != nil {
		return err
	}
	if n.cfg.Direct {
		if err := checkDirect(send, recv); err != nil {
			return err
		}
	}
	work, commit := recv, func() {}
	if !n.cfg.Direct {
		work = make([]byte, len(recv))
		commit = func() { copy(recv, work) }
	}
	copy(work[n.rank*len(send):], send)
	var plans []channelPlan
	if world > 1 {
		x := &planExecutor{n: n, p: p, topo: t, esz: dt.Size(), me: n.rank}
		plans = x.phasePlans(ring, len(send)/dt.Size(), true)
	}
	return n.start(work, dt, rings.Sum, plans, commit, done)
}

// ReduceScatterWithPlan is the blocking form of StartReduceScatterWithPlan (see [Node.AllReduce] for
// the rules).
func (n *Node) ReduceScatterWithPlan(ctx context.Context, t plan.Topology, p plan.Plan, send, recv []byte, dt rings.DType, op rings.Op) error {
	return n.run(ctx, func(done func(error)) error { return n.StartReduceScatterWithPlan(t, p, send, recv, dt, op, done) })
}

// AllGatherWithPlan is the blocking form of StartAllGatherWithPlan (see [Node.AllReduce] for the
// rules).
func (n *Node) AllGatherWithPlan(ctx context.Context, t plan.Topology, p plan.Plan, send, recv []byte, dt rings.DType) error {
	return n.run(ctx, func(done func(error)) error { return n.StartAllGatherWithPlan(t, p, send, recv, dt, done) })
}

// PhasePlan returns the plan the reduce-scatter and the all-gather of an AllReduce of bytes bytes
// (elements of esz bytes) run by: the cheapest of [PhaseStrategies] on the planner's estimates for
// the current health (the first within its Config.Margin of it), with the Node's routes. The halves of
// an AllReduce cost half its bandwidth term each on the same ring and routes, so the AllReduce's
// ranking of these strategies is theirs. Strategies the planner is not configured with are left out.
// Call it in the event context.
func (s *Replanner) PhasePlan(bytes int64, esz int) (plan.Plan, error) {
	es, err := s.p.Estimates(bytes)
	if err != nil {
		return plan.Plan{}, err
	}
	secs := make([]float64, len(es))
	for i, e := range es {
		secs[i] = e.Seconds
		if !slices.Contains(PhaseStrategies, e.Strategy) {
			secs[i] = math.Inf(1)
		}
	}
	best := plan.Pick(secs, s.cfg.Margin)
	if best < 0 {
		return plan.Plan{}, fmt.Errorf("rdma: no reduce-scatter strategy applies: %w", plan.ErrNoPath)
	}
	return s.build(es[best], bytes, esz)
}

// Degraded reports whether the planner's topology has a NIC down. Call it in the event context.
func (s *Replanner) Degraded() bool { return s.p.Topology().Degraded() }
