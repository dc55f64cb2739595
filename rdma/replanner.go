package rdma

import (
	"context"
	"fmt"
	"math"

	"github.com/concord-ccl/concord/rdma/plan"
	"github.com/concord-ccl/concord/rings"
)

// Replanner picks the plan of each AllReduce call on a Node and runs it. It owns a [plan.Planner]
// (which prices strategies on its topology), keeps that topology's NIC health in step with what the
// Node has seen ([Replanner.Sync]), prices OptCC and the weighted rings on the Node's own NICs, and
// hands the chosen [plan.Plan] to [Node.StartAllReduceWithPlan], the executor. Node index i of the
// planner's topology is the node at position i of the Node's ring, and the topology has one rank per
// node (GPUsPerNode 1): the Node's ring is a ring of nodes, each channel of it on one NIC.
//
// A Replanner belongs to its Node's event context, as the Node's Start methods do: call its methods
// there (from another goroutine through [Node.Do]), except AllReduce, which is for any goroutine.
// Every node of the ring needs its own Replanner, fed the same health before the same call, so that
// all of them pick the same plan.
type Replanner struct {
	n      *Node
	p      *plan.Planner
	cfg    plan.Config
	priced map[pricedKey]plan.Plan // priced OptCC and weighted plans (pricedPlan)
}

// NewReplanner returns a Replanner of n's AllReduce for topology t (health included) with planner
// configuration cfg. The model is set to cost schedules the way the Node runs them
// ([plan.Model].GatherFirst). It keeps a copy of t; call it in n's event context or before n handles
// events.
func NewReplanner(n *Node, t plan.Topology, cfg plan.Config) (*Replanner, error) {
	if len(t.Nodes) != len(n.ring) {
		return nil, fmt.Errorf("%w: topology of %d nodes, ring of %d", ErrInvalid, len(t.Nodes), len(n.ring))
	}
	for i, nd := range t.Nodes {
		if len(nd.NICs) != len(n.nics) {
			return nil, fmt.Errorf("%w: topology node %d has %d NICs, want %d", ErrInvalid, i, len(nd.NICs), len(n.nics))
		}
	}
	cfg.Model.GatherFirst = true
	t = t.Clone()
	t.GPUsPerNode = 1
	p, err := plan.NewPlanner(t, cfg)
	if err != nil {
		return nil, err
	}
	return &Replanner{n: n, p: p, cfg: cfg, priced: map[pricedKey]plan.Plan{}}, nil
}

// Planner returns the planner, for inspection in the event context; the caller must not change it.
func (s *Replanner) Planner() *plan.Planner { return s.p }

// SetNICDown tells the planner that NIC nic of the node at ring position node failed or healed; the
// next call re-plans. Every node of the ring must be told the same, before the same call. Call it in
// the event context.
func (s *Replanner) SetNICDown(node, nic int, down bool) error {
	_, err := s.p.SetNICDown(node, nic, down)
	return err
}

// Sync brings the planner's NIC health to the runtime's view: the hot-repair verdicts and port
// events this node has seen for every node of the ring. It reports whether anything changed (the
// next call then re-plans). Verdicts go around the whole group, so after a failure or heal has been
// localized every node's view, hence its plan, is the same. Call it in the event context.
func (s *Replanner) Sync() bool {
	changed := false
	for u, id := range s.n.ring {
		for j := range s.n.nics {
			down := s.n.m.Health(NICRef{id, NICID(j)}) == Down
			if id == s.n.ep.Node() {
				down = down || s.n.ep.Health(NICID(j)) == Down
			}
			c, _ := s.p.SetNICDown(u, j, down)
			changed = changed || c
		}
	}
	return changed
}

// Plan returns the plan the next AllReduce of bytes bytes (elements of esz bytes) runs: the cheapest
// strategy for the current health (the first within the planner's Config.Margin of it), OptCC and
// the weighted rings priced as the Node runs them on its NICs (the seconds of the busiest NIC), with
// the Node's routes: the standard ring's channels (a failed NIC's moved whole to its backup) for the
// standard ring and hot repair, [plan.BalanceRoutes] over one channel per NIC otherwise. Call it in
// the event context.
func (s *Replanner) Plan(bytes int64, esz int) (plan.Plan, error) {
	es, err := s.p.Estimates(bytes)
	if err != nil {
		return plan.Plan{}, err
	}
	priced := map[plan.Strategy]plan.Plan{} // OptCC's and the weighted rings' plans, priced here
	secs := make([]float64, len(es))
	for i, e := range es {
		sec := e.Seconds
		if !runnable(e) {
			sec = math.Inf(1)
		}
		if (e.Strategy == plan.OptCC || e.Strategy == plan.Weighted) && !math.IsInf(sec, 1) {
			pl, err := s.pricedPlan(e, bytes, esz)
			if err != nil {
				return plan.Plan{}, err
			}
			priced[e.Strategy], sec = pl, pl.Seconds
		}
		secs[i] = sec
	}
	best := plan.Pick(secs, s.cfg.Margin)
	if best < 0 {
		return plan.Plan{}, fmt.Errorf("rdma: no configured strategy applies: %w", plan.ErrNoPath)
	}
	if pl, ok := priced[es[best].Strategy]; ok {
		return pl, nil
	}
	return s.build(es[best], bytes, esz)
}

// PlanStrategy returns the plan an AllReduce of bytes bytes runs with strategy st for the current
// health, priced and split as Plan would if it chose st. Call it in the event context.
func (s *Replanner) PlanStrategy(st plan.Strategy, bytes int64, esz int) (plan.Plan, error) {
	e, err := plan.Cost(s.p.Topology(), st, float64(bytes), s.cfg.Model)
	if err != nil {
		return plan.Plan{}, err
	}
	if math.IsInf(e.Seconds, 1) {
		return plan.Plan{}, fmt.Errorf("rdma: strategy %v does not apply: %w", st, plan.ErrNoPath)
	}
	if !runnable(e) {
		return plan.Plan{}, fmt.Errorf("%w: strategy %v: its leaves' ring has a single node, which the runtime does not run", ErrInvalid, st)
	}
	if st == plan.OptCC || st == plan.Weighted {
		return s.pricedPlan(e, bytes, esz)
	}
	return s.build(e, bytes, esz)
}

// runnable reports whether the runtime runs e's schedule: a part with leaves (OptCC's) needs a ring
// of at least two nodes (StartAllReduceWithPlan). The model prices OptCC with a single core node too,
// a node that gathers the leaves' inputs and returns the sums, which on two nodes is the schedule;
// on measured figures a healthy fabric can also have one node a little faster than every other.
func runnable(e plan.Estimate) bool {
	return len(e.Leaves) == 0 || len(e.Rings) < 2 || len(e.Rings[len(e.Rings)-1]) >= 2
}

// build makes the plan of estimate e with the Node's routes, every share a multiple of the planner's
// alignment, or of esz where that one does not divide the parts.
func (s *Replanner) build(e plan.Estimate, bytes int64, esz int) (plan.Plan, error) {
	t := s.p.Topology()
	pl, err := plan.Build(t, e, bytes, s.cfg.Align, s.cfg.Model)
	if err != nil {
		return plan.Plan{}, err
	}
	if pl.Bytes != bytes || len(pl.Parts) == 0 {
		return plan.Plan{}, fmt.Errorf("%w: plan for %d bytes", ErrInvalid, pl.Bytes)
	}
	for _, pt := range pl.Parts {
		if pt.Offset%int64(esz) != 0 {
			// The planner's alignment differs from the element size: rebuild at this one.
			if pl, err = plan.Build(t, e, bytes, int64(esz), s.cfg.Model); err != nil {
				return plan.Plan{}, err
			}
			break
		}
	}
	pl.Routes = RoutesFor(t, pl.Strategy, s.n.nics)
	pl.Version = s.p.Version()
	return pl, nil
}

// OptCC on this runtime's NICs. The cost model pools each node's NICs. On a rail-matched fabric a
// degraded leaf cannot use the rails of its failed NICs, which crowds its neighbours' other rails
// and, with them, the ring the leaf is part of: the model's share Y for the leaves is then not the
// best one to run, nor is its time the one to expect. pricedPlan prices a grid of shares as the Node
// runs them, each at the model's latency plus the seconds of its busiest NIC after the channel
// weights are levelled (railLoads), and returns the cheapest plan with that price as its Seconds.
// The weighted rings' plan is priced the same way: one plan, at its latency plus the seconds of its
// busiest NIC with levelled channel weights.

// leafRunFactor scales the NIC seconds of a plan with leaves, which does not run at the pace of its
// busiest NIC alone: the ring's last reduce-scatter step waits for the leaves' inputs, and the last
// slices' all-gather and return trail them (like NCCL's tuning model, which scales each algorithm's
// bandwidth by a measured efficiency). It is set a little below the ratio OptCC's schedule ran at
// on the simulator (TestPricedPlansFollowRuns) and on bench/schedules, so that OptCC is still
// chosen where it wins by more; docs/results/schedules.md has the figures.
const leafRunFactor = 1.12

// optccShares is the number of steps of the grid of leaf shares, from 1/optccShares to 1.
const optccShares = 10

func (s *Replanner) pricedPlan(e plan.Estimate, bytes int64, esz int) (plan.Plan, error) {
	key := pricedKey{e.Strategy, s.p.Version(), bytes, esz}
	if pl, ok := s.priced[key]; ok {
		return pl, nil
	}
	t := s.p.Topology()
	type option struct {
		e   plan.Estimate
		lat float64
	}
	var opts []option
	if e.Strategy == plan.OptCC {
		ys := []float64{e.Y}
		for i := 1; i <= optccShares; i++ {
			ys = append(ys, float64(i)/optccShares)
		}
		for _, y := range ys {
			ey, lat := plan.OptCCAt(t, e.Rings[0], float64(bytes), y, s.cfg.Model)
			opts = append(opts, option{ey, lat})
		}
	} else {
		opts = append(opts, option{e, t.RingLatency(e.Rings[0])})
	}
	var best plan.Plan
	bestSec := math.Inf(1)
	for _, o := range opts {
		pl, err := s.build(o.e, bytes, esz)
		if err != nil {
			return plan.Plan{}, err
		}
		x := &planExecutor{n: s.n, p: pl, topo: t, esz: esz, me: s.n.rank}
		busy := busiest(x.railLoads(x.partWeights()))
		if len(o.e.Leaves) > 0 {
			busy *= leafRunFactor
		}
		if o.lat+busy < bestSec {
			best, bestSec = pl, o.lat+busy
		}
	}
	best.Seconds = bestSec
	if len(s.priced) >= 16 {
		clear(s.priced)
	}
	s.priced[key] = best
	return best, nil
}

// pricedKey names a priced plan: its strategy, the planner's topology version, the size and the
// element size.
type pricedKey struct {
	strategy plan.Strategy
	version  uint64
	bytes    int64
	esz      int
}

// StartAllReduce plans an AllReduce of send into recv for its size and the current health, and runs
// it (see [Node.StartAllReduceWithPlan]). It returns the plan it runs. Call it in the event context.
func (s *Replanner) StartAllReduce(send, recv []byte, dt rings.DType, op rings.Op, done func(error)) (plan.Plan, error) {
	if !dt.Valid() {
		return plan.Plan{}, fmt.Errorf("%w: dtype %v", ErrInvalid, dt)
	}
	pl, err := s.Plan(int64(len(send)), dt.Size())
	if err != nil {
		return plan.Plan{}, err
	}
	return pl, s.n.StartAllReduceWithPlan(s.p.Topology(), pl, send, recv, dt, op, done)
}

// AllReduce is the blocking form of StartAllReduce (see [Node.AllReduce] for the rules). It returns
// the plan it ran.
func (s *Replanner) AllReduce(ctx context.Context, send, recv []byte, dt rings.DType, op rings.Op) (plan.Plan, error) {
	var pl plan.Plan
	err := s.n.run(ctx, func(done func(error)) error {
		var err error
		pl, err = s.StartAllReduce(send, recv, dt, op, done)
		return err
	})
	return pl, err
}
