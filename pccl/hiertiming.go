package pccl

import (
	"cmp"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl/internal/links"
)

// Link telemetry of a hierarchical AllReduce. Its data moves on sub-rings, not on the flat ring's
// links: the site ring's link to this peer's successor in its site and the one from its
// predecessor, and the WAN rings' links to and from its partners in the neighbouring sites, one
// stream per phase and segment. The master's diagnosis takes one timing per link and direction
// (wire.Done.Links), so the streams of one link are merged: their bytes, their stalls and their
// frames' transit times add up, its first byte is the earliest of theirs and its last the latest, as
// offsets from the start of the collective's first stream. Every peer of a site runs the same phases, so the stall per byte of a
// link compares with the group's as it does on the flat ring.

// phaseTiming is one stream's telemetry: the time it opened and its two links' timings, as offsets
// from then (links.Stream's Start and Timings).
type phaseTiming struct {
	t0    time.Time
	links []wire.LinkTiming
}

// streamTimings returns the telemetry of streams; ends(i) names stream i's successor and predecessor.
func streamTimings(streams []*links.Stream, ends func(i int) (next, prev uint64)) []phaseTiming {
	out := make([]phaseTiming, len(streams))
	for i, s := range streams {
		out[i] = phaseTiming{t0: s.Start(), links: s.Timings(ends(i))}
	}
	return out
}

// hierTimings returns the Done telemetry of a hierarchical collective from its streams' telemetry.
// Links that carried nothing are left out; beyond wire.MaxLinkTimings links (sites of different
// sizes, many WAN partners), those that carried the most bytes are kept.
func hierTimings(phases []phaseTiming) []wire.LinkTiming {
	if len(phases) == 0 {
		return nil
	}
	type key struct {
		peer uint64
		dir  wire.LinkDir
	}
	base := phases[0].t0
	for _, p := range phases[1:] {
		if p.t0.Before(base) {
			base = p.t0
		}
	}
	var order []key
	merged := map[key]*wire.LinkTiming{}
	for _, p := range phases {
		shift := uint64(p.t0.Sub(base))
		for _, lt := range p.links {
			k := key{lt.Peer, lt.Dir}
			if lt.Bytes == 0 || k.peer == 0 {
				continue
			}
			start, end := lt.Start+shift, lt.End+shift
			m := merged[k]
			if m == nil {
				merged[k] = &wire.LinkTiming{Peer: k.peer, Dir: k.dir, Bytes: lt.Bytes, Start: start, End: end, Wait: lt.Wait,
					Transit: lt.Transit}
				order = append(order, k)
				continue
			}
			m.Bytes += lt.Bytes
			m.Start, m.End = min(m.Start, start), max(m.End, end)
			m.Wait += lt.Wait
			m.Transit += lt.Transit
		}
	}
	out := make([]wire.LinkTiming, len(order))
	for i, k := range order {
		out[i] = *merged[k]
	}
	if len(out) > wire.MaxLinkTimings {
		rank := slices.Clone(order)
		slices.SortStableFunc(rank, func(a, b key) int { return cmp.Compare(merged[b].Bytes, merged[a].Bytes) })
		keep := map[key]bool{}
		for _, k := range rank[:wire.MaxLinkTimings] {
			keep[k] = true
		}
		out = out[:0]
		for _, k := range order {
			if keep[k] {
				out = append(out, *merged[k])
			}
		}
	}
	return out
}
