package diagnosis

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// fault is a slowdown injected into synthetic telemetry. Extra is the time it adds to every
// operation, as a multiple of the clean operation's span.
type fault struct {
	kind  Kind
	peer  uint64 // the slow sender, receiver or computer
	link  Link   // the slow link
	extra float64
	// beforeVote makes a slow computer late before it votes rather than after the operation began:
	// the others wait for it at the vote and the ring runs as if nothing happened.
	beforeVote bool
}

// synth produces the reports of a pipelined ring all-reduce from a simple model of where time goes.
// A clean peer is busy 60% of an operation, held back by its links out 15% and idle 5%; it waits on
// its links in for the rest. A slowdown stretches every peer's span, as a ring runs at the pace of
// its slowest part: the culprit spends the extra time stalled on its slow link out (a slow link or
// sender), its senders spend it stalled on their links into it (a slow receiver), or it spends it
// busy before it starts (a peer slow outside communication, whose predecessor fills the link into
// it and then stalls on it for half that time); everyone else spends it waiting. Votes reach the
// master with a jitter of half an operation (the training steps of the peers do not end at once); a
// peer late before it votes adds its delay to its vote only.
type synth struct {
	ring  []uint64
	bidir bool // every peer also sends to its predecessor (a bidirectional ring)
	rng   *rand.Rand
	noise float64 // log-normal sigma of every figure
	spike float64 // probability per operation of one random link stalling 5× for that operation
	bytes uint64
	base  time.Duration
}

func newSynth(ring []uint64, bidir bool, seed uint64) *synth {
	return &synth{ring: ring, bidir: bidir, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), noise: 0.15,
		bytes: 64 << 20, base: 40 * time.Millisecond}
}

func (s *synth) jitter(v float64) float64 { return v * math.Exp(s.noise*s.rng.NormFloat64()) }

func (s *synth) op(f *fault) Op {
	n := len(s.ring)
	d0 := s.base.Seconds()
	extra := 0.0
	if f != nil {
		extra = f.extra * d0
	}
	votes := make([]float64, n)
	for i, id := range s.ring {
		votes[i] = math.Abs(s.rng.NormFloat64()) * 0.5 * d0
		if f != nil && f.beforeVote && f.peer == id {
			votes[i] += extra
		}
	}
	first := slices.Min(votes)
	if f != nil && f.beforeVote {
		f = nil // the ring itself runs clean
		extra = 0
	}
	span := d0 + extra
	succ := func(i int) uint64 { return s.ring[(i+1)%n] }
	pred := func(i int) uint64 { return s.ring[(i+n-1)%n] }
	spikeAt := -1
	if s.rng.Float64() < s.spike {
		spikeAt = s.rng.IntN(n)
	}
	var op Op
	op.Ring = s.ring
	for i, id := range s.ring {
		outs := []uint64{succ(i)}
		ins := []uint64{pred(i)}
		if s.bidir && n > 2 {
			outs = append(outs, pred(i))
			ins = append(ins, succ(i))
		}
		busy := s.jitter(0.6 * d0)
		late := s.jitter(0.01 * d0)
		stall := map[uint64]float64{}
		for _, o := range outs {
			stall[o] = s.jitter(0.15 * d0 / float64(len(outs)))
		}
		if i == spikeAt {
			stall[outs[0]] *= 5
		}
		if f != nil {
			switch f.kind {
			case SlowLink:
				if _, ok := stall[f.link.To]; ok && f.link.From == id {
					stall[f.link.To] += extra
				}
			case SlowSender:
				if f.peer == id {
					for _, o := range outs {
						stall[o] += extra / float64(len(outs))
					}
				}
			case SlowReceiver:
				if _, ok := stall[f.peer]; ok {
					stall[f.peer] += extra
				}
			case SlowCompute:
				if f.peer == id {
					busy += extra
					late += extra
				} else if _, ok := stall[f.peer]; ok {
					stall[f.peer] += extra / 2
				}
			}
		}
		sp := span * math.Exp(0.02*s.rng.NormFloat64())
		var stalled float64
		for _, v := range stall {
			stalled += v
		}
		sp = max(sp, busy+stalled+0.05*d0)
		wait := max(sp-busy-stalled-0.05*d0, 0)
		dur := func(v float64) time.Duration { return time.Duration(v * 1e9) }
		r := Report{Peer: id, Vote: dur(votes[i] - first)}
		per := s.bytes / uint64(len(outs))
		for _, o := range outs {
			r.Links = append(r.Links, Timing{Peer: o, Out: true, Bytes: per, Start: dur(late), End: dur(sp * 0.98), Wait: dur(stall[o])})
		}
		for _, in := range ins {
			r.Links = append(r.Links, Timing{Peer: in, Bytes: per, Start: dur(0.001 * d0), End: dur(sp), Wait: dur(wait / float64(len(ins)))})
		}
		op.Reports = append(op.Reports, r)
	}
	return op
}

var ring8 = []uint64{3, 7, 1, 8, 2, 6, 4, 5}

// run feeds warm clean operations, then faulty ones, and returns the events of each faulty one.
func run(t *testing.T, d *Detector, s *synth, warm, faulty int, f *fault) [][]Event {
	t.Helper()
	for i := range warm {
		if evs := d.Observe(s.op(nil)); len(evs) > 0 {
			t.Fatalf("clean operation %d raised %+v", i+1, evs)
		}
	}
	var out [][]Event
	for range faulty {
		out = append(out, d.Observe(s.op(f)))
	}
	return out
}

func TestSyndromes(t *testing.T) {
	cases := []struct {
		name  string
		bidir bool
		f     fault
		want  Event // Kind, Peer, Link and Chain are compared
		conf  [2]float64
	}{
		{"slow link, ring", false, fault{kind: SlowLink, link: Link{1, 8}, extra: 3},
			Event{Kind: SlowLink, Peer: 1, Link: Link{1, 8}, Chain: []uint64{8, 2, 6, 4, 5, 3, 7}}, [2]float64{0.5, 0.65}},
		{"slow link, bidirectional ring", true, fault{kind: SlowLink, link: Link{2, 8}, extra: 3},
			Event{Kind: SlowLink, Peer: 2, Link: Link{2, 8}}, [2]float64{0.8, 0.99}},
		{"slow sender", true, fault{kind: SlowSender, peer: 6, extra: 3},
			Event{Kind: SlowSender, Peer: 6}, [2]float64{0.8, 0.99}},
		{"slow receiver", true, fault{kind: SlowReceiver, peer: 4, extra: 3},
			Event{Kind: SlowReceiver, Peer: 4}, [2]float64{0.8, 0.99}},
		{"slow outside communication, ring", false, fault{kind: SlowCompute, peer: 2, extra: 2},
			Event{Kind: SlowCompute, Peer: 2, Chain: []uint64{6, 4, 5, 3, 7, 1, 8}}, [2]float64{0.6, 0.99}},
		{"slow outside communication, bidirectional ring", true, fault{kind: SlowCompute, peer: 5, extra: 2},
			Event{Kind: SlowCompute, Peer: 5}, [2]float64{0.6, 0.99}},
		{"slow before its vote", false, fault{kind: SlowCompute, peer: 8, extra: 4, beforeVote: true},
			Event{Kind: SlowCompute, Peer: 8, Chain: []uint64{2, 6, 4, 5, 3, 7, 1}}, [2]float64{0.6, 0.99}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 5; seed++ {
				d := New(Config{})
				evs := run(t, d, newSynth(ring8, c.bidir, seed), 10, 3, &c.f)
				var raised []Event
				at := 0
				for i, e := range evs {
					if len(e) > 0 && at == 0 {
						at = i + 1
					}
					raised = append(raised, e...)
				}
				if len(raised) != 1 {
					t.Fatalf("seed %d: %d events in 3 operations, want 1: %+v", seed, len(raised), raised)
				}
				got := raised[0]
				if got.Kind != c.want.Kind || got.Peer != c.want.Peer || got.Link != c.want.Link || got.Cleared {
					t.Fatalf("seed %d: raised %s (%s), want %s", seed, got.Key(), got.Evidence, c.want.Key())
				}
				// The chain may stop short of the culprit's predecessor, which is partly stalled
				// rather than waiting.
				if c.want.Chain != nil && (len(got.Chain) < len(c.want.Chain)-1 || !slices.Equal(got.Chain, c.want.Chain[:len(got.Chain)])) {
					t.Errorf("seed %d: chain %v, want %v or it without its last peer", seed, got.Chain, c.want.Chain)
				}
				if got.Confidence < c.conf[0] || got.Confidence > c.conf[1] {
					t.Errorf("seed %d: confidence %.2f, want in [%.2f, %.2f] (%s)", seed, got.Confidence, c.conf[0], c.conf[1], got.Evidence)
				}
				if got.Ratio < 2 || got.Evidence == "" || got.Ops != 1 || at != 3 {
					t.Errorf("seed %d: event %+v at operation %d", seed, got, at)
				}
				if act := d.Active(); len(act) != 1 || act[0].Key() != got.Key() || act[0].Ops != 1 {
					t.Errorf("seed %d: active %+v", seed, act)
				}
			}
		})
	}
}

func TestCellEvidence(t *testing.T) {
	d := New(Config{})
	evs := run(t, d, newSynth(ring8, true, 9), 10, 3, &fault{kind: SlowSender, peer: 6, extra: 3})
	e := slices.Concat(evs...)[0]
	if want := []Link{{6, 2}, {6, 4}}; !slices.Equal(e.Cells, want) {
		t.Errorf("cells %v, want %v", e.Cells, want)
	}
	if !strings.Contains(e.Evidence, "2 of peer 6's 2 recent links out are slow (6→2, 6→4)") {
		t.Errorf("evidence %q", e.Evidence)
	}
	d = New(Config{})
	evs = run(t, d, newSynth(ring8, false, 9), 10, 3, &fault{kind: SlowLink, link: Link{1, 8}, extra: 3})
	if e := slices.Concat(evs...)[0]; !strings.Contains(e.Evidence, "a slow sender or receiver would look the same") {
		t.Errorf("ring-only evidence %q does not say the cell is ambiguous", e.Evidence)
	}
}

// TestSenderFoundAfterRewire checks the single-ring ambiguity: a slow sender first shows as its one
// slow link; once the ring gives it another successor, its row has two hot cells, the sender is
// raised and the link is cleared as explained by it.
func TestSenderFoundAfterRewire(t *testing.T) {
	d := New(Config{})
	s := newSynth(ring8, false, 4)
	f := &fault{kind: SlowSender, peer: 1, extra: 3}
	got := slices.Concat(run(t, d, s, 10, 3, f)...)
	if len(got) != 1 || got[0].Kind != SlowLink || got[0].Link != (Link{1, 8}) {
		t.Fatalf("on the first ring: %+v", got)
	}
	s.ring = []uint64{3, 7, 1, 2, 8, 6, 4, 5} // 1 now sends to 2
	var all []Event
	for range 3 {
		all = append(all, d.Observe(s.op(f))...)
	}
	var keys []string
	for _, e := range all {
		k := e.Key()
		if e.Cleared {
			k = "cleared " + k + ": " + e.Evidence
		}
		keys = append(keys, k)
	}
	want := []string{"slow-sender 1", "cleared slow-link 1→8: cleared: explained by slow-sender 1"}
	if !slices.Equal(keys, want) {
		t.Fatalf("after the re-wiring: %q, want %q", keys, want)
	}
}

// probeAll feeds bandwidth tests of every link of ring: 1 GB/s with noise, a quarter of it out of
// slowFrom or into slowTo (0: none).
func probeAll(d *Detector, s *synth, slowFrom, slowTo uint64) {
	for _, a := range s.ring {
		for _, b := range s.ring {
			if a == b {
				continue
			}
			bw := s.jitter(1e9)
			if a == slowFrom || b == slowTo {
				bw /= 4
			}
			d.ObserveProbe(a, b, bw)
		}
	}
}

// TestProbesResolveRing checks that the bandwidth tests of OptimizeTopology tell a slow sender or
// receiver from a slow link on a plain ring: the ring's one hot cell is first a slow link, and the
// next operation after the tests names the peer (or confirms the link).
func TestProbesResolveRing(t *testing.T) {
	for _, c := range []struct {
		name             string
		f                fault
		slowFrom, slowTo uint64
		want             []string
	}{
		{"slow sender", fault{kind: SlowSender, peer: 1, extra: 3}, 1, 0,
			[]string{"slow-sender 1", "cleared slow-link 1→8: cleared: explained by slow-sender 1"}},
		{"slow receiver", fault{kind: SlowReceiver, peer: 8, extra: 3}, 0, 8,
			[]string{"slow-receiver 8", "cleared slow-link 1→8: cleared: explained by slow-receiver 8"}},
		{"slow link", fault{kind: SlowLink, link: Link{1, 8}, extra: 3}, 0, 0, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := New(Config{})
			s := newSynth(ring8, false, 12)
			got := slices.Concat(run(t, d, s, 10, 3, &c.f)...)
			if len(got) != 1 || got[0].Key() != "slow-link 1→8" {
				t.Fatalf("before the tests: %+v", got)
			}
			probeAll(d, s, c.slowFrom, c.slowTo)
			if c.slowFrom == 0 && c.slowTo == 0 {
				d.ObserveProbe(1, 8, 2.5e8) // the slow link tests slow too
			}
			var keys []string
			for _, e := range d.Observe(s.op(&c.f)) {
				k := e.Key()
				if e.Cleared {
					k = "cleared " + k + ": " + e.Evidence
				}
				keys = append(keys, k)
			}
			if !slices.Equal(keys, c.want) {
				t.Fatalf("after the tests: %q, want %q", keys, c.want)
			}
			act := d.Active()
			if len(act) != 1 {
				t.Fatalf("active %+v", act)
			}
			if c.want == nil {
				if !strings.Contains(act[0].Evidence, "bandwidth tests of the other links of both peers are normal") || act[0].Confidence < 0.9 {
					t.Errorf("slow link after the tests: %+v", act[0])
				}
				return
			}
			if !strings.Contains(act[0].Evidence, "bandwidth tests found 7 of peer") || act[0].Cells[0] != (Link{1, 8}) {
				t.Errorf("evidence %+v", act[0])
			}
		})
	}
}

func TestCleanRunsRaiseNothing(t *testing.T) {
	for seed := uint64(1); seed <= 10; seed++ {
		for _, bidir := range []bool{false, true} {
			s := newSynth(ring8, bidir, seed)
			s.spike = 0.05
			d := New(Config{})
			for i := range 200 {
				if evs := d.Observe(s.op(nil)); len(evs) != 0 {
					t.Fatalf("seed %d bidir %v: operation %d raised %+v", seed, bidir, i+1, evs)
				}
			}
			if d.Ops() != 200 || len(d.Active()) != 0 {
				t.Fatalf("seed %d: ops %d active %+v", seed, d.Ops(), d.Active())
			}
		}
	}
}

func TestClearedWhenHealed(t *testing.T) {
	d := New(Config{})
	s := newSynth(ring8, false, 2)
	f := &fault{kind: SlowCompute, peer: 8, extra: 2}
	if got := slices.Concat(run(t, d, s, 5, 3, f)...); len(got) != 1 {
		t.Fatalf("raised %+v", got)
	}
	var cleared []Event
	for i := range 6 {
		for _, e := range d.Observe(s.op(nil)) {
			if !e.Cleared || e.Key() != "slow-compute 8" {
				t.Fatalf("healing operation %d: %+v", i+1, e)
			}
			cleared = append(cleared, e)
		}
	}
	// The median of three needs two clean samples, then three absences clear it.
	if len(cleared) != 1 || !strings.Contains(cleared[0].Evidence, "absent for 3 operations") {
		t.Fatalf("cleared %+v", cleared)
	}
	if len(d.Active()) != 0 {
		t.Fatalf("still active: %+v", d.Active())
	}
}

// TestWaitingChainWalk checks the walk on a peer that sleeps before each operation: from every peer
// that waits, walking back against the ring reaches the sleeper, and the chain lists the peers that
// wait on it, nearest first.
func TestWaitingChainWalk(t *testing.T) {
	d := New(Config{})
	s := newSynth(ring8, false, 3)
	f := &fault{kind: SlowCompute, peer: 6, extra: 1.5}
	run(t, d, s, 5, 3, f)
	fig := d.figures(ring8)
	for _, id := range ring8 {
		if id == 6 {
			if d.waiting(fig, id) {
				t.Fatalf("the sleeper waits (%.2f)", fig.wait[id])
			}
			continue
		}
		if !d.waiting(fig, id) {
			t.Fatalf("peer %d does not wait (%.2f)", id, fig.wait[id])
		}
		o, chain, ok := d.walkBack(fig, id)
		if !ok || o != 6 {
			t.Fatalf("walk from %d ends at %d (ok %v), want 6", id, o, ok)
		}
		want := []uint64{4, 5, 3, 7, 1, 8, 2}
		want = want[:slices.Index(want, id)+1]
		if !slices.Equal(chain, want) {
			t.Errorf("walk from %d: chain %v, want %v", id, chain, want)
		}
	}
	// When every peer waits there is no origin.
	for _, id := range ring8 {
		fig.wait[id] = 0.9
	}
	fig.maxWait = 0.9
	if _, _, ok := d.walkBack(fig, 3); ok {
		t.Fatal("a ring where everyone waits has an origin")
	}
}

func TestSlowLinkLeavesRing(t *testing.T) {
	d := New(Config{Stale: 4})
	s := newSynth(ring8, false, 5)
	f := &fault{kind: SlowLink, link: Link{1, 8}, extra: 3}
	run(t, d, s, 5, 3, f)
	s.ring = []uint64{3, 7, 1, 2, 8, 6, 4, 5} // the ring no longer uses 1→8
	var got []Event
	for range 6 {
		got = append(got, d.Observe(s.op(f))...)
	}
	if len(got) != 1 || !got[0].Cleared || got[0].Evidence != "cleared: its links are no longer observed" {
		t.Fatalf("events %+v", got)
	}
}

func TestDelayAndCells(t *testing.T) {
	d := New(Config{})
	if d.Delay(ring8) != nil {
		t.Fatal("delay matrix before any operation")
	}
	s := newSynth(ring8, false, 6)
	run(t, d, s, 4, 3, &fault{kind: SlowLink, link: Link{2, 6}, extra: 3})
	m := d.Delay(ring8)
	hot := 0.0
	for i, row := range m {
		for j, v := range row {
			succ := j == (i+1)%len(ring8)
			if succ != (v > 0) {
				t.Errorf("delay[%d][%d] = %v", i, j, v)
			}
			if ring8[i] == 2 && ring8[j] == 6 {
				hot = v
			} else if v > hot && hot > 0 {
				t.Errorf("delay[%d][%d] = %v exceeds the slow link's %v", i, j, v, hot)
			}
		}
	}
	// 3 extra operation spans of 40ms over 64 MiB: about 1.9ms per MiB.
	if hot < 1.5e-3 || hot > 2.5e-3 {
		t.Errorf("slow link delay %v s/MiB", hot)
	}
	cells := d.Cells()
	if len(cells) != len(ring8) {
		t.Fatalf("%d cells", len(cells))
	}
	for _, c := range cells {
		if c.Age != 0 || !(c.Transfer > 0) || !(c.Wait >= 0) || !(c.Stall > 0) {
			t.Errorf("cell %+v", c)
		}
	}
	d.Forget(6)
	for _, c := range d.Cells() {
		if c.Link.From == 6 || c.Link.To == 6 {
			t.Errorf("cell %v of a forgotten peer", c.Link)
		}
	}
	if len(d.Active()) != 0 {
		t.Errorf("syndrome of a forgotten peer: %+v", d.Active())
	}
}

// TestLargeRing checks the classifier on a ring of 512 peers: a clean run stays quiet and a sleeper
// is found within three operations, with everyone else in its waiting chain.
func TestLargeRing(t *testing.T) {
	ring := make([]uint64, 512)
	for i := range ring {
		ring[i] = uint64(1000 + i)
	}
	d := New(Config{})
	evs := slices.Concat(run(t, d, newSynth(ring, false, 8), 20, 3, &fault{kind: SlowCompute, peer: 1100, extra: 2})...)
	if len(evs) != 1 || evs[0].Key() != "slow-compute 1100" || len(evs[0].Chain) < len(ring)-2 {
		t.Fatalf("events %+v", evs)
	}
	if !strings.Contains(evs[0].Evidence, "(chain [1101 1102 1103 1104 1105 1106 1107 1108 …])") {
		t.Errorf("evidence %q", evs[0].Evidence)
	}
}

func TestChainText(t *testing.T) {
	if got := chainText([]uint64{4, 5}); got != "[4 5]" {
		t.Errorf("short chain %q", got)
	}
	if got := chainText([]uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}); got != "[1 2 3 4 5 6 7 8 …]" {
		t.Errorf("long chain %q", got)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []Config{{Recent: 9}, {Raise: 0.5}, {Floor: -1}, {Confirm: -1}, {WaitFraction: 1}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func TestKindNames(t *testing.T) {
	var names []string
	for _, k := range Kinds {
		names = append(names, k.String())
	}
	if want := []string{"slow-link", "slow-sender", "slow-receiver", "slow-compute"}; !slices.Equal(names, want) {
		t.Fatalf("%v", names)
	}
	if Kind(9).String() != "kind(9)" {
		t.Fatal(Kind(9).String())
	}
}
