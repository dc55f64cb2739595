package pccl

// The hierarchical AllReduce. When the peers of a ring share sites, AllReduce runs as one plan on a
// staging buffer under one commit, in three steps:
//
//	reduce-scatter among the peers of this peer's site (the site ring), unfinalized;
//	all-reduce of this peer's block across sites, finalized once by the total peer count: with sites
//	        of one size on the WAN ring of the peers with the same site rank, one per site; otherwise
//	        piece by piece, each on the ring of its owners (links.Hierarchy.Pieces), all at once;
//	all-gather among the peers of the site.
//
// A large buffer goes through them as a pipeline of segments (sitePipeline, links.Hierarchy.Segments):
// while the WAN rings carry one segment, the site reduce-scatters the next, so the WAN link and the
// site's links are busy at once.
//
// Each site ring and each WAN partner has its own connections, opened by the links next to the flat
// ring's when the master wires an epoch. The hierarchy is derived from the master's Connect (the ring
// of the epoch and the site each peer announced), so every peer of an epoch computes the same one, and
// a peer's death leaves its site ring and its WAN rings in the one membership change that removes it
// from the ring. When the peers of every site run the intra-site tier (Config.NICs) and the master
// commenced the collective alone, the two site phases run on the rdma fabric instead of the site
// rings' links (sitetier.go), and the WAN phase reduces the fabric's block of this peer.

import (
	"context"
	"errors"
	"fmt"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl/internal/links"
	"github.com/concord-ccl/concord/rings"
)

// The data frames of a hierarchical collective carry the collective's tag with marker bits flipped,
// one marker per phase, so that each phase has its own inbox under the collective's sequence number
// (which alone makes an operation unique).
const (
	markSiteReduce = uint64(1) << 63
	markWAN        = uint64(1) << 62
	markSiteGather = uint64(3) << 62
	// A WAN piece's index (links.Piece.Index) is flipped in from this bit up, under the markers.
	pieceShift = 40
)

// fabricWanted reports whether the site phases of collective st run on the intra-site fabric: the
// master commenced it alone, the epoch has not aborted too many on the fabric, and the peers of every
// site announced NICs the fabric can run on. Every peer of the epoch decides alike.
func fabricWanted(st *opStart, hv links.Hierarchy) bool {
	return st.alone && !st.siteOff && hv.EverySite
}

// siteFabricFor returns the intra-site fabric the site phases of collective st run on, with the tier
// locked for it, or nil when they run on the site ring's links (fabricWanted, sitetier.go).
func (c *Communicator) siteFabricFor(st *opStart, hv links.Hierarchy) (*siteFabric, error) {
	if !fabricWanted(st, hv) {
		return nil, nil
	}
	nics := c.links.SiteNICs(hv.Site)
	if c.site == nil || !c.site.usable(hv.Site, nics) {
		// Cannot be: this peer announced its tier's NICs, and the site's peers as many.
		return nil, fmt.Errorf("%w: the NICs the master lists for site %v do not match this peer's intra-site tier", ErrInvalid, hv.Site)
	}
	return c.site.acquire(fabricGen{st.epoch, st.siteGen}, hv.Site, nics, c.id)
}

// phaseLink is the stream of one phase of a hierarchical collective on the links: its tag (the
// collective's with marker bits flipped), its sub-ring and its neighbours there.
type phaseLink struct {
	tag        uint64
	ring       links.SubRing
	next, prev uint64
}

// phaseLinks returns the streams a hierarchical collective opens, in plan order: per segment, its site
// reduce-scatter (unless on the fabric), its WAN pieces, its site all-gather (likewise). A site phase's
// segment index is flipped into its tag as a piece's index is.
func phaseLinks(tag uint64, hv links.Hierarchy, segs []links.Segment, onFabric bool) []phaseLink {
	var out []phaseLink
	for k, sg := range segs {
		if !onFabric {
			out = append(out, phaseLink{tag ^ markSiteReduce ^ uint64(k)<<pieceShift, links.SiteRing, hv.SiteNext(), hv.SitePrev()})
		}
		for _, p := range sg.Pieces {
			out = append(out, phaseLink{tag ^ markWAN ^ uint64(p.Index)<<pieceShift, links.WANRing, hv.Next(p), hv.Prev(p)})
		}
		if !onFabric {
			out = append(out, phaseLink{tag ^ markSiteGather ^ uint64(k)<<pieceShift, links.SiteRing, hv.SiteNext(), hv.SitePrev()})
		}
	}
	return out
}

// runHierarchical moves the data of commenced collective op over hierarchy hv and reports it to the
// master, as runOp does for the flat ring. segs are the collective's segments with this peer's WAN
// pieces of each (links.Hierarchy.Segments).
func (c *Communicator) runHierarchical(ctx context.Context, op *collective, hv links.Hierarchy, segs []links.Segment) error {
	st, d, h := op.st, op.d, op.h
	fab, err := c.siteFabricFor(st, hv)
	if err != nil {
		return c.report(op, &wire.Done{Code: codeOf(err), Detail: err.Error()})
	}
	if fab != nil {
		defer c.site.release()
	}
	plinks := phaseLinks(d.Tag, hv, segs, fab != nil)
	streams := make([]*links.Stream, 0, len(plinks))
	defer func() {
		for _, s := range streams {
			c.links.Release(s)
		}
	}()
	for _, l := range plinks {
		s, err := c.links.SubStream(links.Op{Tag: l.tag, Seq: st.seq, Epoch: st.epoch, Handle: h}, l.ring, l.next, l.prev)
		if err != nil {
			return c.report(op, &wire.Done{Code: wire.CodePeerLeft, Detail: err.Error()})
		}
		streams = append(streams, s)
	}
	stop := context.AfterFunc(ctx, func() { h.Abort(ctx.Err()) })
	defer stop()
	// The fabric's phases stop when the collective is aborted, by the caller, by the master or by a
	// failed stream of another phase; the abort's error is the context's cause.
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-h.Done():
			cancel(h.Err())
		case <-rctx.Done():
		}
	}()

	var mark nicMark
	if fab != nil {
		mark = fab.mark()
	}
	reported := false
	var verdict error
	commit := func() error {
		reported = true
		// Link telemetry of the sub-rings' links (hiertiming.go); none for the flat ring's bandwidth
		// estimates (LinkBytes), whose edges carried nothing of this collective. With the site phases
		// on the fabric, what each NIC carried.
		done := &wire.Done{Code: wire.CodeOK, Links: hierTimings(streamTimings(streams, func(i int) (uint64, uint64) { return plinks[i].next, plinks[i].prev }))}
		if fab != nil {
			done.SiteNICBytes, done.SiteNanos = fab.figures(mark)
		}
		verdict = c.report(op, done)
		return verdict
	}
	// The streams, in the order of plinks.
	ps, next := make([]segStreams, len(segs)), 0
	take := func() rings.Stream { next++; return streams[next-1] }
	for k, sg := range segs {
		if fab == nil {
			ps[k].reduce = take()
		}
		for range sg.Pieces {
			ps[k].wan = append(ps[k].wan, take())
		}
		if fab == nil {
			ps[k].gather = take()
		}
	}
	p := hierPlan{h: hv, d: d, partBytes: c.cfg.PartBytes, tier: c.site, fab: fab, segs: segs, streams: ps}.build()
	err = p.Execute(rctx, op.send, op.recv, commit)
	if fab != nil {
		c.site.account(fab)
	}
	if err == nil {
		return nil
	}
	if fab != nil {
		// Every peer of the site retires this generation: the master aborts the collective on all.
		c.site.retire()
	}
	if reported {
		if verdict != nil {
			return verdict
		}
		return fmt.Errorf("%s: %w", op.what, err)
	}
	code := codeOf(err)
	if cause := context.Cause(rctx); rctx.Err() != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		// A phase stopped through the collective's abort switch by another phase's failure (or by
		// the master) reports that failure, not the bare cancellation it saw.
		err = fmt.Errorf("%w: %w", err, cause)
		code = codeOf(cause)
	}
	if ctx.Err() != nil {
		code = wire.CodeAborted
	}
	done := &wire.Done{Code: code, Detail: err.Error()}
	for i, s := range streams {
		if l := s.SilentLink(plinks[i].prev, plinks[i].next); l.Peer != 0 {
			done.Silent = l
			break
		}
	}
	if verr := c.report(op, done); verr != nil {
		if ctx.Err() != nil {
			return errors.Join(verr, ctx.Err())
		}
		return verr
	}
	return fmt.Errorf("%s: %w", op.what, err)
}
