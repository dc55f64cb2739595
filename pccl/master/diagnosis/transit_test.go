package diagnosis

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// transitOp returns one operation of ring in which nobody is held back sending (every stall alike)
// and the frames of the link from→to take slow times longer to cross than the others of its kind;
// links between sites take wan times longer than links within one.
func transitOp(rng *rand.Rand, ring []uint64, sites map[uint64]string, slow Link, factor, wan float64) Op {
	return heldOp(rng, ring, sites, slow, factor, wan, Link{})
}

// heldOp is transitOp in which the sender of link held is held back on it twenty times longer than
// the others on theirs, while its frames cross as fast as the others'.
func heldOp(rng *rand.Rand, ring []uint64, sites map[uint64]string, slow Link, factor, wan float64, held Link) Op {
	n := len(ring)
	j := func(d time.Duration) time.Duration {
		return time.Duration(float64(d) * math.Exp(0.15*rng.NormFloat64()))
	}
	const bytes = 16 << 20
	op := Op{Ring: ring, Sites: sites}
	for i, id := range ring {
		succ, pred := ring[(i+1)%n], ring[(i+n-1)%n]
		transit := j(10 * time.Millisecond)
		if sites[pred] != sites[id] {
			transit = time.Duration(float64(transit) * wan)
		}
		if (Link{pred, id}) == slow {
			transit = time.Duration(float64(transit) * factor)
		}
		stall := j(2 * time.Millisecond)
		if (Link{id, succ}) == held {
			stall *= 20
		}
		op.Reports = append(op.Reports, Report{Peer: id, Links: []Timing{
			{Peer: succ, Out: true, Bytes: bytes, Start: j(time.Millisecond), End: 95 * time.Millisecond, Wait: stall},
			{Peer: pred, Bytes: bytes, Start: time.Millisecond, End: 100 * time.Millisecond, Wait: j(40 * time.Millisecond), Transit: transit},
		}})
	}
	return op
}

// TestTransitFindsLinkThatHoldsNobodyBack: a link whose frames cross eight times slower than the
// others', while no sender is held back, is a slow link by the third operation, said so by its
// transit; a clean run raises nothing.
func TestTransitFindsLinkThatHoldsNobodyBack(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	ring := []uint64{1, 2, 3, 4, 5, 6}
	d := New(Config{})
	for k := range 20 {
		if evs := d.Observe(transitOp(rng, ring, nil, Link{}, 1, 1)); len(evs) != 0 {
			t.Fatalf("clean operation %d raised %+v", k, evs)
		}
	}
	slow := Link{3, 4}
	var got []Event
	for range 3 {
		got = append(got, d.Observe(transitOp(rng, ring, nil, slow, 8, 1))...)
	}
	if len(got) != 1 || got[0].Kind != SlowLink || got[0].Link != slow || got[0].Cleared {
		t.Fatalf("after three slow operations: %+v, want one slow-link %v", got, slow)
	}
	if !strings.Contains(got[0].Evidence, "moves its frames") || got[0].Ratio < 4 {
		t.Errorf("evidence %q, ratio %.1f: want the transit named, about 8×", got[0].Evidence, got[0].Ratio)
	}
	var cell Cell
	for _, c := range d.Cells() {
		if c.Link == slow {
			cell = c
		}
	}
	if cell.Transit <= 0 {
		t.Errorf("the slow link's cell shows no transit: %+v", cell)
	}
}

// TestTransitJudgedByKind: links between sites that cross ten times slower than links within a site
// (a WAN by design) are judged against each other and raise nothing, though they are a minority of
// the ring's links; a slow link between sites is still found against them.
func TestTransitJudgedByKind(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 1))
	ring := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9}
	sites := map[uint64]string{1: "a", 2: "a", 3: "a", 4: "b", 5: "b", 6: "b", 7: "c", 8: "c", 9: "c"} // 3→4, 6→7 and 9→1 join sites
	d := New(Config{})
	for k := range 20 {
		if evs := d.Observe(transitOp(rng, ring, sites, Link{}, 1, 10)); len(evs) != 0 {
			t.Fatalf("clean operation %d raised %+v", k, evs)
		}
	}
	var got []Event
	for range 3 {
		got = append(got, d.Observe(transitOp(rng, ring, sites, Link{6, 7}, 8, 10))...)
	}
	if len(got) != 1 || got[0].Kind != SlowLink || got[0].Link != (Link{6, 7}) {
		t.Fatalf("after three slow operations: %+v, want one slow-link 6→7", got)
	}
	if !strings.Contains(got[0].Evidence, "between sites") {
		t.Errorf("evidence %q: want it judged against the links between sites", got[0].Evidence)
	}
}

// TestHeldBackIsNotSlow: a link that holds its sender back while its frames cross as fast as the
// others' (its receiver did not take them in time) is no slow link; one whose frames also cross
// slowly is.
func TestHeldBackIsNotSlow(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	ring := []uint64{1, 2, 3, 4, 5, 6}
	d := New(Config{})
	held := Link{2, 3}
	for k := range 20 {
		if evs := d.Observe(heldOp(rng, ring, nil, Link{}, 1, 1, held)); len(evs) != 0 {
			t.Fatalf("operation %d with %v held back raised %+v", k, held, evs)
		}
	}
	var got []Event
	for range 3 {
		got = append(got, d.Observe(heldOp(rng, ring, nil, held, 8, 1, held))...)
	}
	if len(got) != 1 || got[0].Kind != SlowLink || got[0].Link != held || !strings.Contains(got[0].Evidence, "holds its sender back") {
		t.Fatalf("after three operations in which %v also crossed slowly: %+v, want one slow-link by its stall", held, got)
	}
}
