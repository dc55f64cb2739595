package plan

import (
	"fmt"
	"math"
	"slices"
)

// Config configures a [Planner]. The zero value plans with every strategy, the paper's cost model,
// re-ranking on, and byte shares aligned to 1 byte.
type Config struct {
	// Strategies lists the strategies the planner may choose, in tie-break order. Nil means
	// [AllStrategies].
	Strategies []Strategy
	// Model holds the cost model's modelling choices.
	Model Model
	// Align is the granularity in bytes of every share (the element size). Zero means 1.
	Align int64
	// Margin is the modelled gain a strategy needs over an earlier one of Strategies to be chosen
	// instead: the planner takes the first strategy within (1+Margin) of the cheapest. Zero takes
	// the argmin. On a topology whose α and β were measured, a gain within the measurement's noise
	// (a few percent) is no gain, and the earlier strategies are the simpler ones: set Margin to
	// about that noise, so that, for one, a healthy fabric keeps the standard ring rather than
	// Balance for the little by which its slowest NIC measured below the others.
	Margin float64
}

// maxCached bounds the plans a Planner keeps per topology version.
const maxCached = 256

// Planner picks the cheapest AllReduce schedule for each call from the α–β model of its topology and
// re-plans when a NIC fails or heals: it returns a [Plan] and runs nothing (package rdma's Replanner
// asks it for plans and its Node executes them). It is a pure state machine: no I/O, no clocks. A
// Planner is not safe for concurrent use; its owner serializes calls.
type Planner struct {
	cfg     Config
	topo    Topology
	version uint64
	cache   map[int64]Plan
	costs   map[int64][]Estimate // Estimates of the current version, by size
}

// NewPlanner returns a planner for a copy of t.
func NewPlanner(t Topology, cfg Config) (*Planner, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if cfg.Strategies == nil {
		cfg.Strategies = AllStrategies
	}
	if len(cfg.Strategies) == 0 {
		return nil, fmt.Errorf("plan: Config.Strategies: empty")
	}
	if cfg.Align < 1 {
		cfg.Align = 1
	}
	if !(cfg.Margin >= 0 && cfg.Margin < 1) {
		return nil, fmt.Errorf("plan: Config.Margin is %g, must be in [0, 1)", cfg.Margin)
	}
	return &Planner{cfg: cfg, topo: t.Clone(), cache: map[int64]Plan{}, costs: map[int64][]Estimate{}}, nil
}

// Topology returns a copy of the planner's current topology.
func (p *Planner) Topology() Topology { return p.topo.Clone() }

// Version counts the topology changes the planner has seen; every plan carries the version it was
// made for.
func (p *Planner) Version() uint64 { return p.version }

// SetNICDown marks NIC nic of node node failed (down) or healed. It reports whether the health
// changed; a change bumps the version and drops every cached plan, so the next call re-plans.
func (p *Planner) SetNICDown(node, nic int, down bool) (bool, error) {
	if node < 0 || node >= len(p.topo.Nodes) || nic < 0 || nic >= len(p.topo.Nodes[node].NICs) {
		return false, fmt.Errorf("plan: node %d nic %d: %w", node, nic, ErrInvalidTopology)
	}
	if p.topo.Nodes[node].NICs[nic].Down == down {
		return false, nil
	}
	p.topo.Nodes[node].NICs[nic].Down = down
	p.version++
	clear(p.cache)
	clear(p.costs)
	return true, nil
}

// Estimates returns the model's estimate for every configured strategy, in configuration order;
// strategies that do not apply have Seconds = +Inf. They are kept until the topology changes (the
// weighted rings' linear program is not free); the caller must not modify them.
func (p *Planner) Estimates(bytes int64) ([]Estimate, error) {
	if es, ok := p.costs[bytes]; ok {
		return slices.Clone(es), nil
	}
	es, err := Estimates(p.topo, bytes, p.cfg)
	if err != nil {
		return nil, err
	}
	if len(p.costs) >= maxCached {
		clear(p.costs)
	}
	p.costs[bytes] = es
	return slices.Clone(es), nil
}

// Plan returns the cheapest schedule for an AllReduce of bytes bytes on the current topology (the
// first in configuration order on a tie), with its data split. The plan is cached until the topology
// changes and shares its slices with the cache: the caller must not modify it.
func (p *Planner) Plan(bytes int64) (Plan, error) {
	if pl, ok := p.cache[bytes]; ok {
		return pl, nil
	}
	es, err := p.Estimates(bytes)
	if err != nil {
		return Plan{}, err
	}
	pl, err := choose(p.topo, es, bytes, p.cfg)
	if err != nil {
		return Plan{}, err
	}
	pl.Version = p.version
	if len(p.cache) >= maxCached {
		clear(p.cache)
	}
	p.cache[bytes] = pl
	return pl, nil
}

// Estimates returns the estimate of every strategy of cfg (all when nil) for bytes on t.
func Estimates(t Topology, bytes int64, cfg Config) ([]Estimate, error) {
	ss := cfg.Strategies
	if ss == nil {
		ss = AllStrategies
	}
	out := make([]Estimate, 0, len(ss))
	for _, s := range ss {
		e, err := Cost(t, s, float64(bytes), cfg.Model)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, nil
}

// Choose returns the plan of the cheapest strategy of cfg for bytes on t: the argmin of the model, or
// with cfg.Margin the first strategy within that margin of it.
func Choose(t Topology, bytes int64, cfg Config) (Plan, error) {
	es, err := Estimates(t, bytes, cfg)
	if err != nil {
		return Plan{}, err
	}
	return choose(t, es, bytes, cfg)
}

// choose returns the plan of the cheapest of estimates es for bytes on t (the first within
// cfg.Margin of it).
func choose(t Topology, es []Estimate, bytes int64, cfg Config) (Plan, error) {
	secs := make([]float64, len(es))
	for i, e := range es {
		secs[i] = e.Seconds
	}
	best := Pick(secs, cfg.Margin)
	if best < 0 {
		return Plan{}, fmt.Errorf("plan: no configured strategy applies: %w", ErrNoPath)
	}
	return Build(t, es[best], bytes, cfg.Align, cfg.Model)
}

// Pick returns the index of the strategy a planner with Config.Margin margin chooses among the
// modelled times secs (in Config.Strategies order): the first cheapest, or with a margin the first
// within (1+margin) of the cheapest; -1 when no time is finite.
func Pick(secs []float64, margin float64) int {
	best := -1
	for i, sec := range secs {
		if !math.IsInf(sec, 1) && (best < 0 || sec < secs[best]) {
			best = i
		}
	}
	if best >= 0 && margin > 0 {
		within := secs[best] * (1 + margin)
		best = slices.IndexFunc(secs, func(sec float64) bool { return sec <= within })
	}
	return best
}
