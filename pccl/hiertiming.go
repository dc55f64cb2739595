package pccl

import (
	"cmp"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// Link telemetry of a hierarchical AllReduce. Its data moves on sub-rings, not on the flat ring's
// links: the site ring's link to this peer's successor in its site and the one from its
// predecessor, and the WAN rings' links to and from its partners in the neighbouring sites, one
// stream per phase and segment. The master's diagnosis takes one timing per link and direction
// (wire.Done.Links), so the streams of one link are merged: their bytes and their stalls add up, its
// first byte is the earliest of theirs and its last the latest, as offsets from the start of the
// collective's first stream. Every peer of a site runs the same phases, so the stall per byte of a
// link compares with the group's as it does on the flat ring.

// hierTimings returns the Done telemetry of a hierarchical collective from its streams; ends(i)
// names stream i's successor and predecessor. Links that carried nothing are left out; beyond
// wire.MaxLinkTimings links (sites of different sizes, many WAN partners), those that carried the
// most bytes are kept.
func hierTimings(streams []*stream, ends func(i int) (next, prev uint64)) []wire.LinkTiming {
	if len(streams) == 0 {
		return nil
	}
	type key struct {
		peer uint64
		dir  wire.LinkDir
	}
	base := streams[0].t0
	for _, s := range streams[1:] {
		if s.t0.Before(base) {
			base = s.t0
		}
	}
	var order []key
	merged := map[key]*wire.LinkTiming{}
	add := func(k key, sp linkSpan, shift time.Duration) {
		if sp.bytes == 0 || k.peer == 0 {
			return
		}
		start, end := sp.start+uint64(shift), sp.end+uint64(shift)
		lt := merged[k]
		if lt == nil {
			merged[k] = &wire.LinkTiming{Peer: k.peer, Dir: k.dir, Bytes: sp.bytes, Start: start, End: end, Wait: sp.wait}
			order = append(order, k)
			return
		}
		lt.Bytes += sp.bytes
		lt.Start, lt.End = min(lt.Start, start), max(lt.End, end)
		lt.Wait += sp.wait
	}
	for i, s := range streams {
		next, prev := ends(i)
		shift := s.t0.Sub(base)
		add(key{next, wire.LinkOut}, s.out, shift)
		add(key{prev, wire.LinkIn}, s.in, shift)
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
