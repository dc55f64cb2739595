package pccl

import (
	"reflect"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

func TestHierTimingsMerge(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := uint64(time.Millisecond)
	// Site reduce-scatter and all-gather to 7 (from 5), and a WAN piece to 9 (from 9), the WAN stream
	// opened 2 ms after the first; the all-gather's stream from 5 opened 3 ms after the first.
	phase := func(t0 time.Time, next, prev uint64, out, in wire.LinkTiming) phaseTiming {
		out.Peer, out.Dir, in.Peer, in.Dir = next, wire.LinkOut, prev, wire.LinkIn
		return phaseTiming{t0: t0, links: []wire.LinkTiming{out, in}}
	}
	phases := []phaseTiming{
		phase(t0, 7, 5, wire.LinkTiming{Bytes: 100, Start: 1 * ms, End: 10 * ms, Wait: 3 * ms}, wire.LinkTiming{Bytes: 100, Start: 2 * ms, End: 11 * ms, Wait: 1 * ms, Transit: 5 * ms}),
		phase(t0.Add(2*time.Millisecond), 9, 9, wire.LinkTiming{Bytes: 40, Start: 0, End: 5 * ms, Wait: 2 * ms}, wire.LinkTiming{Bytes: 40, Start: 1 * ms, End: 6 * ms, Wait: 4 * ms, Transit: 3 * ms}),
		phase(t0.Add(time.Millisecond), 7, 5, wire.LinkTiming{Bytes: 100, Start: 12 * ms, End: 20 * ms, Wait: 1 * ms}, wire.LinkTiming{}),
		phase(t0.Add(3*time.Millisecond), 0, 5, wire.LinkTiming{}, wire.LinkTiming{Bytes: 60, Start: 10 * ms, End: 15 * ms, Wait: 2 * ms, Transit: 4 * ms}),
	}
	got := hierTimings(phases)
	want := []wire.LinkTiming{
		{Peer: 7, Dir: wire.LinkOut, Bytes: 200, Start: 1 * ms, End: 21 * ms, Wait: 4 * ms},
		{Peer: 5, Dir: wire.LinkIn, Bytes: 160, Start: 2 * ms, End: 18 * ms, Wait: 3 * ms, Transit: 9 * ms},
		{Peer: 9, Dir: wire.LinkOut, Bytes: 40, Start: 2 * ms, End: 7 * ms, Wait: 2 * ms},
		{Peer: 9, Dir: wire.LinkIn, Bytes: 40, Start: 3 * ms, End: 8 * ms, Wait: 4 * ms, Transit: 3 * ms},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("timings\n got %+v\nwant %+v", got, want)
	}
	if got := hierTimings(nil); got != nil {
		t.Errorf("no streams: %+v, want none", got)
	}
}

func TestHierTimingsBound(t *testing.T) {
	t0 := time.Unix(1000, 0)
	// Twelve links, one per stream and direction (six streams), bytes 1..12: the eight largest stay,
	// in stream order.
	var phases []phaseTiming
	for i := range 6 {
		phases = append(phases, phaseTiming{t0: t0, links: []wire.LinkTiming{
			{Peer: uint64(100 + i), Dir: wire.LinkOut, Bytes: uint64(2*i + 1), End: 1},
			{Peer: uint64(200 + i), Dir: wire.LinkIn, Bytes: uint64(2*i + 2), End: 1}}})
	}
	got := hierTimings(phases)
	if len(got) != wire.MaxLinkTimings {
		t.Fatalf("%d timings, want %d", len(got), wire.MaxLinkTimings)
	}
	for i, lt := range got {
		if want := uint64(i + 5); lt.Bytes != want {
			t.Errorf("timing %d carries %d bytes, want %d (the largest, in order)", i, lt.Bytes, want)
		}
	}
}
