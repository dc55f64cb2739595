package diagnosis

import (
	"math"
	"slices"
	"testing"
)

// The classifier's steps on estimates set by hand: each step alone, on the figures of a detector
// that observed nothing, with the fields the step reads filled in.

func TestMarkHotCells(t *testing.T) {
	d := New(Config{}) // Raise 2, Floor 0.1
	f := d.figures([]uint64{1, 2, 3, 4})
	f.medStall, f.medSpan = 1, 1
	f.stallLeast = map[Link]float64{
		{1, 4}: 5,   // hot
		{1, 2}: 2.5, // hot
		{2, 3}: 1.9, // below Raise times the median
		{3, 4}: math.NaN(),
	}
	d.markHotCells(f)
	if len(f.hotCells) != 2 || !f.hotCells[Link{1, 4}] || !f.hotCells[Link{1, 2}] {
		t.Fatalf("hot cells %v, want 1→2 and 1→4", f.hotCells)
	}
	if got := f.hotOut[1]; !slices.Equal(got, []uint64{2, 4}) {
		t.Fatalf("hot cells out of 1 lead to %v, want [2 4] (sorted)", got)
	}
	// The floor: an excess below Floor times the median span is noise, however large the ratio.
	f = d.figures([]uint64{1, 2})
	f.medStall, f.medSpan = 0.01, 1
	f.stallLeast = map[Link]float64{{1, 2}: 0.05}
	d.markHotCells(f)
	if len(f.hotCells) != 0 {
		t.Fatalf("a stall 0.04 above the median of a span of 1 is hot: %v", f.hotCells)
	}
}

// waitRing returns figures of ring 1..4 where peers 2, 3 and 4 wait half their span and 1 does not.
func waitRing(d *Detector) *figures {
	f := d.figures([]uint64{1, 2, 3, 4})
	for _, id := range []uint64{2, 3, 4} {
		f.wait[id] = 0.5
	}
	f.wait[1] = 0
	f.maxWait = 0.5
	return f
}

func TestWaitingChains(t *testing.T) {
	d := New(Config{})
	chains := d.waitingChains(waitRing(d))
	if len(chains) != 1 || !slices.Equal(chains[1], []uint64{2, 3, 4}) {
		t.Fatalf("chains %v, want 1: [2 3 4]", chains)
	}
	// Nobody waits: no chain.
	f := d.figures([]uint64{1, 2, 3, 4})
	if chains := d.waitingChains(f); len(chains) != 0 {
		t.Fatalf("chains %v in a ring where nobody waits", chains)
	}
}

func TestSlowOrigins(t *testing.T) {
	d := New(Config{})
	f := waitRing(d)
	f.medBusy, f.medSpan = 1, 1
	f.busy[1], f.busyLeast[1] = 4, 4
	f.hotCells[Link{4, 1}] = true // the link into the origin looks slow: it is explained
	out := map[string]Event{}
	d.slowOrigins(f, map[uint64][]uint64{1: {2, 3, 4}}, out)
	ev, ok := out["slow-compute 1"]
	if len(out) != 1 || !ok {
		t.Fatalf("syndromes %v, want slow-compute 1", out)
	}
	if ev.Ratio != 4 || !slices.Equal(ev.Chain, []uint64{2, 3, 4}) || ev.Confidence != confidence(4) {
		t.Errorf("event %+v: want ratio 4, chain [2 3 4], confidence %v", ev, confidence(4))
	}
	if !f.explains[Link{4, 1}] {
		t.Error("the hot cell into the origin is not explained")
	}
	// An origin whose own link out is hot is not slow outside communication.
	f.hotOut[1] = []uint64{2}
	out = map[string]Event{}
	d.slowOrigins(f, map[uint64][]uint64{1: {2, 3, 4}}, out)
	if len(out) != 0 {
		t.Fatalf("syndromes %v for an origin with a hot link out", out)
	}
}

func TestLateVoters(t *testing.T) {
	d := New(Config{}) // Floor 0.1
	f := d.figures([]uint64{1, 2, 3, 4})
	f.medSecs, f.jitter = 1, 0.001
	f.vote[3] = 0.5  // half an operation late, 500 spreads
	f.vote[2] = 0.05 // below Floor times the operation
	out := map[string]Event{}
	d.lateVoters(f, out)
	ev, ok := out["slow-compute 3"]
	if len(out) != 1 || !ok {
		t.Fatalf("syndromes %v, want slow-compute 3", out)
	}
	if ev.Ratio != 1.5 || !slices.Equal(ev.Chain, []uint64{4, 1, 2}) {
		t.Errorf("event %+v: want ratio 1.5 and chain [4 1 2]", ev)
	}
	// A peer already found as a chain's origin keeps that evidence.
	origin := Event{Kind: SlowCompute, Peer: 3, Evidence: "origin"}
	out = map[string]Event{origin.Key(): origin}
	d.lateVoters(f, out)
	if out[origin.Key()].Evidence != "origin" {
		t.Errorf("the chain's origin was replaced: %+v", out[origin.Key()])
	}
	// Jitter: a vote within voteSpreads deviations is quiet.
	f.jitter = 0.1
	out = map[string]Event{}
	d.lateVoters(f, out)
	if len(out) != 0 {
		t.Fatalf("syndromes %v with votes within their usual spread", out)
	}
}

func TestHotLines(t *testing.T) {
	d := New(Config{})
	f := d.figures([]uint64{1, 2, 3, 4})
	f.medStall = 1
	f.stall = map[Link]float64{{1, 3}: 4, {1, 2}: 6, {1, 4}: 1}
	f.hotCells = map[Link]bool{{1, 3}: true, {1, 2}: true}
	f.outKnown[1] = 3
	f.inKnown[2], f.inKnown[3] = 1, 1
	out := map[string]Event{}
	d.hotLines(f, out)
	ev, ok := out["slow-sender 1"]
	if len(out) != 1 || !ok {
		t.Fatalf("syndromes %v, want slow-sender 1", out)
	}
	if !slices.Equal(ev.Cells, []Link{{1, 2}, {1, 3}}) || ev.Ratio != 5 {
		t.Errorf("event %+v: want cells 1→2, 1→3 (sorted) and ratio 5 (their median stall)", ev)
	}
	if !f.explains[Link{1, 2}] || !f.explains[Link{1, 3}] {
		t.Error("the row's cells are not explained")
	}
	// Two hot cells of five known are not most of the row.
	f.outKnown[1] = 5
	f.explains = map[Link]bool{}
	out = map[string]Event{}
	d.hotLines(f, out)
	if len(out) != 0 {
		t.Fatalf("syndromes %v for 2 hot cells of 5", out)
	}
}

func TestTestedEnds(t *testing.T) {
	d := New(Config{})
	f := d.figures([]uint64{1, 2, 3, 4})
	f.medStall = 1
	f.stall[Link{1, 2}] = 3
	f.hotCells[Link{1, 2}] = true
	d.probes = map[Link]probe{{1, 3}: {cost: 10}, {1, 4}: {cost: 10}, {2, 3}: {cost: 1}, {3, 2}: {cost: 1}}
	tests := testLines{row: map[uint64][]Link{1: {{1, 3}, {1, 4}}}, col: map[uint64][]Link{2: {{3, 2}}}, med: 1}
	out := map[string]Event{}
	d.testedEnds(f, tests, out)
	ev, ok := out["slow-sender 1"]
	if len(out) != 1 || !ok {
		t.Fatalf("syndromes %v, want slow-sender 1", out)
	}
	if !slices.Equal(ev.Cells, []Link{{1, 2}}) || ev.Ratio != 3 {
		t.Errorf("event %+v: want cell 1→2 and ratio 3", ev)
	}
	if !f.explains[Link{1, 2}] {
		t.Error("the cell is not explained")
	}
}

func TestSlowLinks(t *testing.T) {
	d := New(Config{})
	f := d.figures([]uint64{1, 2, 3, 4})
	f.medStall = 1
	f.stall = map[Link]float64{{1, 2}: 4, {2, 3}: 9}
	f.hotCells = map[Link]bool{{1, 2}: true, {2, 3}: true}
	f.explains[Link{2, 3}] = true
	f.outKnown[1], f.inKnown[2] = 1, 1
	out := map[string]Event{}
	d.slowLinks(f, nil, testLines{}, out)
	ev, ok := out["slow-link 1→2"]
	if len(out) != 1 || !ok {
		t.Fatalf("syndromes %v, want slow-link 1→2 only (2→3 is explained)", out)
	}
	// Nothing else is known of either end: it could be a slow sender or receiver.
	if ev.Ratio != 4 || ev.Confidence != confidence(4)*0.6 {
		t.Errorf("event %+v: want ratio 4 and confidence %v", ev, confidence(4)*0.6)
	}
	// Other normal links at both ends, and peers waiting downstream of it.
	f.outKnown[1], f.inKnown[2] = 3, 2
	out = map[string]Event{}
	d.slowLinks(f, map[uint64][]uint64{1: {2, 3}}, testLines{}, out)
	ev = out["slow-link 1→2"]
	if want := min(confidence(4)+0.05, 0.99); ev.Confidence != want || !slices.Equal(ev.Chain, []uint64{2, 3}) {
		t.Errorf("event %+v: want confidence %v and chain [2 3]", ev, want)
	}
}
