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
	// opened 2 ms after the first.
	streams := []*stream{
		{t0: t0, out: linkSpan{bytes: 100, start: 1 * ms, end: 10 * ms, wait: 3 * ms}, in: linkSpan{bytes: 100, start: 2 * ms, end: 11 * ms, wait: 1 * ms}},
		{t0: t0.Add(2 * time.Millisecond), out: linkSpan{bytes: 40, start: 0, end: 5 * ms, wait: 2 * ms}, in: linkSpan{bytes: 40, start: 1 * ms, end: 6 * ms, wait: 4 * ms}},
		{t0: t0.Add(time.Millisecond), out: linkSpan{bytes: 100, start: 12 * ms, end: 20 * ms, wait: 1 * ms}, in: linkSpan{}},
	}
	ends := [][2]uint64{{7, 5}, {9, 9}, {7, 5}}
	got := hierTimings(streams, func(i int) (uint64, uint64) { return ends[i][0], ends[i][1] })
	want := []wire.LinkTiming{
		{Peer: 7, Dir: wire.LinkOut, Bytes: 200, Start: 1 * ms, End: 21 * ms, Wait: 4 * ms},
		{Peer: 5, Dir: wire.LinkIn, Bytes: 100, Start: 2 * ms, End: 11 * ms, Wait: 1 * ms},
		{Peer: 9, Dir: wire.LinkOut, Bytes: 40, Start: 2 * ms, End: 7 * ms, Wait: 2 * ms},
		{Peer: 9, Dir: wire.LinkIn, Bytes: 40, Start: 3 * ms, End: 8 * ms, Wait: 4 * ms},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("timings\n got %+v\nwant %+v", got, want)
	}
	if got := hierTimings(nil, nil); got != nil {
		t.Errorf("no streams: %+v, want none", got)
	}
}

func TestHierTimingsBound(t *testing.T) {
	t0 := time.Unix(1000, 0)
	// Twelve links, one per stream and direction (six streams), bytes 1..12: the eight largest stay,
	// in stream order.
	var streams []*stream
	for i := range 6 {
		streams = append(streams, &stream{t0: t0,
			out: linkSpan{bytes: uint64(2*i + 1), end: 1}, in: linkSpan{bytes: uint64(2*i + 2), end: 1}})
	}
	got := hierTimings(streams, func(i int) (uint64, uint64) { return uint64(100 + i), uint64(200 + i) })
	if len(got) != wire.MaxLinkTimings {
		t.Fatalf("%d timings, want %d", len(got), wire.MaxLinkTimings)
	}
	for i, lt := range got {
		if want := uint64(i + 5); lt.Bytes != want {
			t.Errorf("timing %d carries %d bytes, want %d (the largest, in order)", i, lt.Bytes, want)
		}
	}
}
