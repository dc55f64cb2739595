package pccl

// Failure-aware schedules on the intra-site fabric. Hot repair keeps a collective alive when a NIC
// fails, but moves the failed NIC's channel whole onto one backup NIC, which then carries twice its
// share: the site runs at about half speed. When a site's fabric is degraded (a NIC some node of it has
// seen down, by its port state or by hot repair's verdicts, or one the calibration measured slower
// than the others), its collectives run by rdma's planner instead:
//
//   - The site phases of a hierarchical AllReduce (a reduce-scatter, then an all-gather) run by the
//     cheapest of the planner's ring schedules (rdma.PhaseStrategies: the standard ring, hot repair,
//     Balance, each possibly on a bridge re-ranked ring), as planned reduce-scatters and all-gathers
//     with the plan's routes. The other schedules (R²CCL-AllReduce, recursive, OptCC, weighted rings)
//     have no reduce-scatter half: no node of them ends with a fixed block of the sum, which the WAN
//     phase needs, since it reduces each peer's block across sites.
//   - An AllReduce whose group is one site with NICs runs whole on the fabric, by the planner's choice
//     among every schedule (rdma.Replanner).
//
// Every node of the site must run the same plan. Each node's view of the fabric's health is its own
// until hot repair's verdicts have gone around, so at the first call of each collective on the fabric
// the nodes agree on it: a Max all-reduce of every node's view of every NIC (one byte each) on the
// fabric, with the standard ring and hot repair, after which every node feeds its planner the same
// health, and plans alike; the collective's later calls keep that view. A healthy agreed view on a
// fabric whose NICs all measured alike runs the standard ring as before, and so does every node when
// one of them keeps to hot repair (Config.SiteHotRepairOnly).
//
// The planner's topology is the fabric as measured: at the first collective that checks the health,
// before the planners are made, every node of the site calibrates the fabric (rdma.Node.Calibrate:
// each NIC's α and β, gathered so that every node holds the same table bit for bit), and the
// planners start from the site's NICs at their measured figures. A NIC the calibration could not
// measure (down at the time) keeps the nominal figures until it is measured. Measured NICs of one
// rate differ by up to a tenth: NICs within siteLevelling of the median rate take the median's
// figures (levelled), the planners count nodes within siteLevelTolerance of each other as one
// level, and they take a schedule over an earlier one only for a modelled gain above siteMargin.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync/atomic"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/plan"
	"github.com/concord-ccl/concord/rings"
)

// sitePlans is the tier's use of the planner.
type sitePlans struct {
	hotRepairOnly bool          // Config.SiteHotRepairOnly: never plan, hot repair only
	calibrations  atomic.Uint64 // of the fabric, by calibrate
	planned       atomic.Uint64
	last          atomic.Int64 // the strategy of the last planned call, plus one (0 if none); +rerankedBit
}

// rerankedBit marks, in sitePlans.last, a plan whose ring bridge re-ranking reordered.
const rerankedBit = 1 << 32

// stats returns the number of planned calls and the strategy of the last one ("" if none), with
// " re-ranked" when bridge re-ranking reordered its ring.
func (p *sitePlans) stats() (uint64, string) {
	n, last := p.planned.Load(), ""
	if s := p.last.Load(); s > 0 {
		last = plan.Strategy(s&(rerankedBit-1) - 1).String()
		if s&rerankedBit != 0 {
			last += " re-ranked"
		}
	}
	return n, last
}

// sitePlanner is one fabric generation's planners, made at its first call that checks the health.
type sitePlanner struct {
	phases  *rdma.Replanner // PhaseStrategies only
	whole   *rdma.Replanner // every strategy, for a whole AllReduce on the fabric
	nodes   int
	nics    int
	agreed  bool // the current collective has agreed on the fabric's health
	planned bool // and found a NIC down or slow, with no node on hot repair only
	// slow is true when the calibration measured a NIC below the median rate by more than the noise
	// (levelled): the same on every node, as the table is.
	slow bool
}

// startCollective marks the start of a collective on f (the tier is locked for it): its first call
// that checks the health agrees on it anew, and its later calls (the other site phases of the same
// hierarchical AllReduce) keep that view, so that a collective costs one agreement. A NIC that fails
// later in the collective is hot repair's until the next one.
func (f *siteFabric) startCollective() {
	if f.planner != nil {
		f.planner.agreed = false
	}
}

// nominalAlpha and nominalBandwidth are the planner's figures for a NIC the calibration did not
// measure.
const (
	nominalAlpha     = 20e-6
	nominalBandwidth = 1.25e9
)

// The fabric's calibration and the planners' tolerance of its noise (see the top of this file).
var siteCalibration = rdma.CalibrateConfig{Bytes: 1 << 20, Reps: 2}

const (
	// siteLevelling bounds the measured spread taken for noise: a calibration's repeated sends over
	// one NIC of one rate differ by up to about a tenth.
	siteLevelling      = 0.15
	siteLevelTolerance = 0.05
	siteMargin         = 0.05
)

// inEvents runs f in f's fabric's event context and waits for it or ctx.
func (f *siteFabric) inEvents(ctx context.Context, fn func()) error {
	ch := make(chan struct{})
	f.ep.Post(func() { fn(); close(ch) })
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ensurePlanner returns the fabric's planners, making them at the first call.
func (t *siteTier) ensurePlanner(ctx context.Context, f *siteFabric) (*sitePlanner, error) {
	if f.planner != nil {
		return f.planner, nil
	}
	p := &sitePlanner{nodes: len(f.site), nics: t.nnics}
	cal, err := t.calibrate(ctx, f)
	if err != nil {
		return nil, err
	}
	p.slow = hasSlowNIC(cal)
	model := plan.Model{LevelTolerance: siteLevelTolerance}
	if e := f.inEvents(ctx, func() {
		topo := plan.Uniform(len(f.site), t.nnics, 1, nominalAlpha, nominalBandwidth)
		topo.GPUsPerNode = 1
		topo = cal.Apply(topo)
		if p.phases, err = rdma.NewReplanner(f.node, topo, plan.Config{Strategies: rdma.PhaseStrategies, Model: model, Margin: siteMargin}); err != nil {
			return
		}
		p.whole, err = rdma.NewReplanner(f.node, topo, plan.Config{Model: model, Margin: siteMargin})
	}); e != nil {
		return nil, e
	}
	if err != nil {
		return nil, fmt.Errorf("pccl: intra-site planner: %w", err)
	}
	f.planner = p
	return p, nil
}

// calibrate returns the calibration of f's fabric. A new generation over the same site ring as the
// last calibration's keeps its table when every node of the site still holds it (a one-byte Max
// all-reduce on the fabric says whether one lacks it); otherwise every node calibrates anew. A node
// forgets its table before it calibrates, so that two nodes never keep different tables for one ring.
func (t *siteTier) calibrate(ctx context.Context, f *siteFabric) (rdma.Calibration, error) {
	lack := []byte{1}
	if slices.Equal(t.cal.site, f.site) {
		lack[0] = 0
	}
	lacking := make([]byte, 1)
	if err := f.node.AllReduce(ctx, lack, lacking, rings.U8, rings.Max); err != nil {
		return rdma.Calibration{}, fmt.Errorf("pccl: agree on the fabric's calibration: %w", err)
	}
	if lacking[0] == 0 {
		return t.cal.table, nil
	}
	t.cal.site, t.cal.table = nil, rdma.Calibration{}
	cal, err := f.node.Calibrate(ctx, siteCalibration)
	if err != nil {
		return rdma.Calibration{}, fmt.Errorf("pccl: calibrating the intra-site fabric: %w", err)
	}
	cal = levelled(cal)
	t.cal.site, t.cal.table = slices.Clone(f.site), cal
	t.plans.calibrations.Add(1)
	return cal, nil
}

// hasSlowNIC reports whether a levelled calibration holds a NIC slower than the level of the others:
// its β above the median's by more than siteLevelling.
func hasSlowNIC(cal rdma.Calibration) bool {
	_, beta, slowest, ok := medians(cal)
	return ok && slowest > beta*(1+siteLevelling)
}

// medians returns the median α and the median β of cal's measured NICs (β > 0), and the largest β;
// ok is false when no NIC was measured.
func medians(cal rdma.Calibration) (alpha, beta, slowest float64, ok bool) {
	var alphas, betas []float64
	for i, row := range cal.Beta {
		for j, b := range row {
			if b > 0 {
				betas, alphas = append(betas, b), append(alphas, cal.Alpha[i][j])
			}
		}
	}
	if len(betas) == 0 {
		return 0, 0, 0, false
	}
	slices.Sort(betas)
	slices.Sort(alphas)
	return alphas[len(alphas)/2], betas[len(betas)/2], betas[len(betas)-1], true
}

// levelled returns cal with every measured NIC whose rate is within siteLevelling of the median
// measured rate set to the median's α and β: NICs of one rate measure a few percent apart, and a
// planner that took those differences for real would cut the weighted rings' shares to noise. A NIC
// measured slower or faster than that keeps its own figures. The table is the same on every node,
// and so is its levelling.
func levelled(cal rdma.Calibration) rdma.Calibration {
	alpha, beta, _, ok := medians(cal)
	if !ok {
		return cal
	}
	out := rdma.Calibration{Alpha: make([][]float64, len(cal.Beta)), Beta: make([][]float64, len(cal.Beta))}
	for i, row := range cal.Beta {
		out.Alpha[i], out.Beta[i] = slices.Clone(cal.Alpha[i]), slices.Clone(row)
		for j, b := range row {
			// Rates compare as the inverse of β.
			if b > 0 && math.Abs(beta/b-1) <= siteLevelling {
				out.Alpha[i][j], out.Beta[i][j] = alpha, beta
			}
		}
	}
	return out
}

// agree brings every node of the site to the same view of the fabric's health (see the top of this
// file) and feeds it to the planners; it reports whether the collective runs by the planner: a NIC
// is down in that view, and no node of the site keeps to hot repair (Config.SiteHotRepairOnly, which
// every node passes in the same agreement, so that one node's setting cannot leave it running other
// collectives than the others).
func (f *siteFabric) agree(ctx context.Context, p *sitePlanner, hotRepairOnly bool) (bool, error) {
	if p.agreed {
		return p.planned, nil
	}
	// One byte per NIC, node by node, 1 for down; then 1 for a node on hot repair only.
	mine := make([]byte, p.nodes*p.nics+1)
	if hotRepairOnly {
		mine[len(mine)-1] = 1
	}
	if err := f.inEvents(ctx, func() {
		p.phases.Sync()
		for u, n := range p.phases.Planner().Topology().Nodes {
			for j, nic := range n.NICs {
				if nic.Down {
					mine[u*p.nics+j] = 1
				}
			}
		}
	}); err != nil {
		return false, err
	}
	agreed := make([]byte, len(mine))
	if err := f.node.AllReduce(ctx, mine, agreed, rings.U8, rings.Max); err != nil {
		return false, fmt.Errorf("agree on the fabric's health: %w", err)
	}
	degraded := false
	var err error
	if e := f.inEvents(ctx, func() {
		for i, d := range agreed[:len(agreed)-1] {
			degraded = degraded || d != 0
			for _, rp := range []*rdma.Replanner{p.phases, p.whole} {
				if err == nil {
					err = rp.SetNICDown(i/p.nics, i%p.nics, d != 0)
				}
			}
		}
	}); e != nil {
		return false, e
	}
	if err != nil {
		return false, err
	}
	p.agreed, p.planned = true, (degraded || p.slow) && agreed[len(agreed)-1] == 0
	return p.planned, nil
}

// phasePlan returns the plan of a site phase over bytes bytes of esz-byte elements when the fabric is
// degraded, or ok false for the standard ring's hot-repaired reduce-scatter and all-gather.
func (t *siteTier) phasePlan(ctx context.Context, f *siteFabric, bytes int64, esz int) (plan.Topology, plan.Plan, bool, error) {
	if len(f.site) < 2 {
		return plan.Topology{}, plan.Plan{}, false, nil
	}
	p, err := t.ensurePlanner(ctx, f)
	if err != nil {
		return plan.Topology{}, plan.Plan{}, false, err
	}
	planned, err := f.agree(ctx, p, t.plans.hotRepairOnly)
	if err != nil || !planned {
		return plan.Topology{}, plan.Plan{}, false, err
	}
	var topo plan.Topology
	var pl plan.Plan
	if e := f.inEvents(ctx, func() {
		topo = p.phases.Planner().Topology()
		pl, err = p.phases.PhasePlan(bytes, esz)
	}); e != nil {
		return plan.Topology{}, plan.Plan{}, false, e
	}
	if err != nil {
		return plan.Topology{}, plan.Plan{}, false, err
	}
	t.note(f, pl)
	return topo, pl, true, nil
}

// note counts a planned call and logs a plan that differs from the previous one.
func (t *siteTier) note(f *siteFabric, pl plan.Plan) {
	t.plans.planned.Add(1)
	v := int64(pl.Strategy) + 1
	if pl.Reranked {
		v |= rerankedBit
	}
	if prev := t.plans.last.Swap(v); prev != v {
		t.log.Info("intra-site fabric degraded: collectives run by the planner", "epoch", f.gen.epoch,
			"strategy", pl.Strategy.String(), "reranked", pl.Reranked, "ring", pl.Parts[0].Ring)
	}
}

// reduceScatter is the reduce-scatter of a site phase: planned when the fabric is degraded, the
// node's hot-repaired ring otherwise.
func (t *siteTier) reduceScatter(ctx context.Context, f *siteFabric, send, recv []byte, dt rings.DType, op rings.Op) error {
	topo, pl, ok, err := t.phasePlan(ctx, f, int64(len(send)), dt.Size())
	if err != nil {
		return err
	}
	if !ok {
		return f.node.ReduceScatter(ctx, send, recv, dt, op)
	}
	return f.node.ReduceScatterWithPlan(ctx, topo, pl, send, recv, dt, op)
}

// allGather is the all-gather of a site phase, planned like reduceScatter.
func (t *siteTier) allGather(ctx context.Context, f *siteFabric, send, recv []byte, dt rings.DType) error {
	topo, pl, ok, err := t.phasePlan(ctx, f, int64(len(recv)), dt.Size())
	if err != nil {
		return err
	}
	if !ok {
		return f.node.AllGather(ctx, send, recv, dt)
	}
	return f.node.AllGatherWithPlan(ctx, topo, pl, send, recv, dt)
}

// allReduce runs a whole AllReduce on the fabric: by the planner's choice among every schedule when
// the fabric is degraded, the node's hot-repaired ring otherwise.
func (t *siteTier) allReduce(ctx context.Context, f *siteFabric, send, recv []byte, dt rings.DType, op rings.Op) error {
	if len(f.site) < 2 {
		return f.node.AllReduce(ctx, send, recv, dt, op)
	}
	p, err := t.ensurePlanner(ctx, f)
	if err != nil {
		return err
	}
	planned, err := f.agree(ctx, p, t.plans.hotRepairOnly)
	if err != nil {
		return err
	}
	if !planned {
		return f.node.AllReduce(ctx, send, recv, dt, op)
	}
	pl, err := p.whole.AllReduce(ctx, send, recv, dt, op)
	if err == nil || len(pl.Parts) > 0 {
		t.note(f, pl)
	}
	return err
}

// wholeSiteFabric returns the fabric that collective st runs on whole, with the tier locked for it,
// or nil when it does not: its group is one site of two or more peers with NICs, and, as for the site
// phases of a hierarchical AllReduce (fabricWanted), the master commenced it alone and the epoch has
// not aborted too many on the fabric. Every peer of the epoch decides alike.
func (c *Communicator) wholeSiteFabric(st *opStart) (*siteFabric, error) {
	if c.site == nil || !st.alone || st.siteOff || !c.links.OneSite(st.ring) {
		return nil, nil
	}
	nics := c.links.SiteNICs(st.ring)
	if !c.site.usable(st.ring, nics) {
		return nil, fmt.Errorf("%w: the NICs the master lists for site %v do not match this peer's intra-site tier", ErrInvalid, st.ring)
	}
	return c.site.acquire(fabricGen{st.epoch, st.siteGen}, st.ring, nics, c.id)
}

// runOnSiteFabric moves the data of a commenced collective whose group is one site on that site's
// fabric (wholeSiteFabric, which locked the tier) and reports it to the master, as runOp does for the
// flat ring. The fabric writes a scratch buffer, copied into recv once the master's verdict is that
// every peer succeeded: an aborted collective leaves recv as it was.
func (c *Communicator) runOnSiteFabric(ctx context.Context, op *collective, fab *siteFabric) error {
	h, send, recv, d, what := op.h, op.send, op.recv, op.d, op.what
	defer c.site.release()
	stop := context.AfterFunc(ctx, func() { h.Abort(ctx.Err()) })
	defer stop()
	// The fabric's collective stops when the collective is aborted, by the caller or by the master.
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-h.Done():
			cancel(h.Err())
		case <-rctx.Done():
		}
	}()
	fab.padOut = grow(fab.padOut, len(recv))
	mark := fab.mark()
	err := c.site.allReduce(rctx, fab, send, fab.padOut, d.DType, d.Op)
	c.site.account(fab)
	if err == nil {
		done := &wire.Done{Code: wire.CodeOK}
		done.SiteNICBytes, done.SiteNanos = fab.figures(mark)
		if verdict := c.report(op, done); verdict != nil {
			return verdict
		}
		copy(recv, fab.padOut)
		return nil
	}
	// Nothing of the collective may touch the caller's buffers once this returns; every peer of the
	// site retires this generation, since the master aborts the collective on all.
	c.site.retire()
	code := wire.CodePeerLeft
	if ctx.Err() != nil {
		code = wire.CodeAborted
	} else if rctx.Err() != nil {
		err = fmt.Errorf("%w: %w", err, context.Cause(rctx)) // how the collective was stopped
		code = codeOf(context.Cause(rctx))
	}
	if verr := c.report(op, &wire.Done{Code: code, Detail: err.Error()}); verr != nil {
		if ctx.Err() != nil {
			return errors.Join(verr, ctx.Err())
		}
		return verr
	}
	return fmt.Errorf("%s: %w: on the intra-site fabric: %w", what, ErrPeerLeft, err)
}
