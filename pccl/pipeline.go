package pccl

import (
	"context"

	"github.com/concord-ccl/concord/pccl/internal/links"
	"github.com/concord-ccl/concord/rings"
)

// pipeMinBytes is the least size of a segment of a hierarchical AllReduce's pipeline (a variable for
// the tests, which make it small so that their buffers take the pipeline).
var pipeMinBytes = 4 << 20

// segStreams are the streams of one segment of a hierarchical AllReduce: its site phases' on the site
// ring (nil on the fabric) and its WAN pieces', in the order of the segment's pieces.
type segStreams struct {
	reduce, gather rings.Stream
	wan            []rings.Stream
}

// hierPlan is what the plan of a hierarchical AllReduce of d is built from: this peer's hierarchy,
// the segments and their streams, and the intra-site fabric fab of tier when the site phases run
// there (nil: on the site ring).
type hierPlan struct {
	h         links.Hierarchy
	d         Desc
	partBytes int
	tier      *siteTier
	fab       *siteFabric
	segs      []links.Segment
	streams   []segStreams
}

// build returns the plan: one external phase, a sitePipeline over the segments, whose WAN phases
// reduce each segment's pieces of this peer's block, every piece on its stream.
func (p hierPlan) build() rings.Plan {
	h, d := p.h, p.d
	size := d.DType.Size()
	// A site phase on the site ring: one ring phase, as a Runner.
	ring := func(k rings.Kind, s rings.Stream, n int, div rings.Divisor) rings.Runner {
		return &rings.Concurrent{DType: d.DType, Op: d.Op, PartBytes: p.partBytes, Phases: []rings.Phase{
			{Kind: k, Stream: s, Rank: h.SiteRank, World: len(h.Site), Len: n * size, Divisor: div}}}
	}
	fop := d.Op
	if fop == rings.Avg {
		fop = rings.Sum // unfinalized inside the site: the WAN ring divides by the total peer count
	}
	sp := &sitePipeline{}
	for k, sg := range p.segs {
		n := sg.Span.Len
		ps := pipeSegment{lo: sg.Span.Off * size, hi: (sg.Span.Off + n) * size}
		if p.fab != nil {
			ps.reduce = &sitePhase{t: p.tier, f: p.fab, dt: d.DType, op: fop, count: n}
			ps.gather = &sitePhase{t: p.tier, f: p.fab, gather: true, dt: d.DType, op: fop, count: n}
		} else {
			ps.reduce = ring(rings.KindReduceScatter, p.streams[k].reduce, n, rings.NoFinalize)
			ps.gather = ring(rings.KindAllGather, p.streams[k].gather, n, rings.DivideByWorld)
		}
		if len(sg.Pieces) > 0 {
			// The pieces run at once: one after the other, the pieces of all peers would form a
			// chain, each waiting for the one before.
			c := &rings.Concurrent{DType: d.DType, Op: d.Op, PartBytes: p.partBytes}
			for i, pc := range sg.Pieces {
				c.Phases = append(c.Phases, p.wanPhase(p.streams[k].wan[i], pc.Span))
			}
			ps.wan = c
		}
		sp.segs = append(sp.segs, ps)
	}
	return rings.Plan{DType: d.DType, Op: d.Op, PartBytes: p.partBytes, Phases: []rings.Phase{
		{Kind: rings.KindExternal, Runner: sp, Rank: h.SiteRank, World: len(h.Site), Len: d.Count * size}}}
}

// wanPhase is the all-reduce of piece (in elements) across sites on a WAN ring, finalized once by the
// total peer count.
func (p hierPlan) wanPhase(wan rings.Stream, piece rings.Span) rings.Phase {
	size := p.d.DType.Size()
	return rings.Phase{Kind: rings.KindAllReduce, Stream: wan, Rank: p.h.MySite, World: len(p.h.Sites),
		Off: piece.Off * size, Len: piece.Len * size, Divisor: rings.Divisor(p.h.World), Quant: p.d.Quant}
}

// sitePipeline runs a hierarchical AllReduce as a pipeline over segments of the buffer. The site
// reduce-scatters the segments one after the other; a segment's WAN pieces are all-reduced across
// sites as soon as its reduce-scatter is done, while the site goes on with the next; then the site
// all-gathers the segments in order, each once its WAN pieces are done. So the WAN carries one
// segment while the site works on another, and the collective takes about the longer of the two
// tiers rather than their sum. The fabric runs one collective at a time, matched by order, so every
// peer of a site runs its site phases in the same order: every reduce-scatter, then every
// all-gather.
type sitePipeline struct {
	segs []pipeSegment
}

// pipeSegment is one segment of a sitePipeline: its bytes of the buffer, its site phases and its WAN
// phases (nil when this peer owns no piece of it).
type pipeSegment struct {
	lo, hi         int
	reduce, gather rings.Runner
	wan            rings.Runner
}

// Run runs the pipeline; nothing of it touches in or out once Run returns.
func (p *sitePipeline) Run(ctx context.Context, in, out []byte) (err error) {
	fail := func(e error) {
		if err == nil {
			err = e
			p.Abort(e)
		}
	}
	wanDone := make([]chan error, 0, len(p.segs))
	for _, sg := range p.segs {
		if e := sg.reduce.Run(ctx, in[sg.lo:sg.hi], out[sg.lo:sg.hi]); e != nil {
			fail(e)
			break
		}
		done := make(chan error, 1)
		wanDone = append(wanDone, done)
		if sg.wan == nil {
			done <- nil
			continue
		}
		go func() { done <- sg.wan.Run(ctx, out[sg.lo:sg.hi], out[sg.lo:sg.hi]) }()
	}
	for k, done := range wanDone {
		if e := <-done; e != nil {
			fail(e)
		}
		if err == nil {
			sg := p.segs[k]
			if e := sg.gather.Run(ctx, out[sg.lo:sg.hi], out[sg.lo:sg.hi]); e != nil {
				fail(e)
			}
		}
	}
	return err
}

// Abort aborts every phase (the fabric's stop with the collective: sitePhase.Abort).
func (p *sitePipeline) Abort(err error) {
	for _, sg := range p.segs {
		sg.reduce.Abort(err)
		if sg.wan != nil {
			sg.wan.Abort(err)
		}
		sg.gather.Abort(err)
	}
}
