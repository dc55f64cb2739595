package master

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/concord-ccl/concord/atsp"
	"github.com/concord-ccl/concord/internal/wire"
)

// diagRig drives a Machine with peers 1..n of the default group, answering its wiring rounds, and
// runs collectives whose Done carry synthetic link timings.
type diagRig struct {
	t      *testing.T
	m      *Machine
	now    time.Time
	rng    *rand.Rand
	events []Event
	tag    uint64
	asked  []Send // bandwidth tests the diagnosis asked for (MeasureRound 0), not answered yet

	manual   bool   // Connect is not answered at once but kept in connects
	connects []Send // Connect messages kept in manual mode
}

func newDiagRig(t *testing.T, cfg Config, n int) *diagRig {
	r := &diagRig{t: t, m: New(cfg), now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), rng: rand.New(rand.NewPCG(7, 11))}
	for id := range uint64(n) {
		r.step(Received{id + 1, &wire.Hello{Addr: "10.0.0.1:7000", Peer: id + 1}})
	}
	r.step(Received{1, &wire.VoteTopology{}})
	if got := len(r.m.Snapshot(r.now).Ring); got != n {
		t.Fatalf("ring of %d peers after joining, want %d", got, n)
	}
	return r
}

// step applies in, answers every Connect with LinksReady and every Solve with the exact solver's
// ring, and returns the messages sent.
func (r *diagRig) step(in Input) []Send {
	r.t.Helper()
	var sent []Send
	queue := []Input{in}
	for len(queue) > 0 {
		acts := r.m.Step(r.now, queue[0])
		queue = queue[1:]
		for _, a := range acts {
			switch a := a.(type) {
			case Send:
				sent = append(sent, a)
				if mr, ok := a.Msg.(*wire.MeasureRound); ok && mr.Round == 0 {
					r.asked = append(r.asked, a)
				}
				if c, ok := a.Msg.(*wire.Connect); ok {
					if r.manual {
						r.connects = append(r.connects, a)
						continue
					}
					queue = append(queue, Received{a.To, &wire.LinksReady{Epoch: c.Epoch, OK: true}})
				}
			case Note:
				r.events = append(r.events, a.Event)
			case Solve:
				tour, sc, err := atsp.Solve(a.Cost, atsp.Options{Objective: atsp.Bottleneck, ExactMax: 17})
				if err != nil {
					r.t.Fatal(err)
				}
				if tour, _, err = atsp.Solve(Restrict(a.Cost, a.Hop, sc.Bottleneck, a.Tol), atsp.Options{Objective: atsp.Total, ExactMax: 17}); err != nil {
					r.t.Fatal(err)
				}
				ring := make([]PeerID, len(tour))
				for i, k := range tour {
					ring[i] = a.Nodes[k]
				}
				queue = append(queue, Solved{ID: a.ID, Ring: ring})
			}
		}
	}
	return sent
}

// timing is the fault of one synthetic operation: extra time on the link slow (a slow link), spent
// by sleeper before it starts (a peer slow outside communication), or by voter before it votes.
type timing struct {
	slow     [2]PeerID
	sender   PeerID // every link out of it is slow
	receiver PeerID // every link into it is slow
	sleeper  PeerID
	voter    PeerID
	extra    time.Duration
	hier     bool // a hierarchical AllReduce over the peers' sites (synthHierLinks)
}

// links returns peer i's link timings in ring for one operation under f (synthLinks).
func (r *diagRig) links(ring []PeerID, i int, f timing) []wire.LinkTiming {
	return synthLinks(r.rng, ring, i, f)
}

// synthLinks returns peer i's link timings in ring for one operation under f, from the model of the
// diagnosis package's tests: busy 60%, stalled on the link out 15%, idle 5%, waiting the rest; the
// extra time of a slowdown is stalled by the slow link's sender, spent by the sleeper before it
// starts (its predecessor stalling on the link into it half that time), and waited by the others.
func synthLinks(rng *rand.Rand, ring []PeerID, i int, f timing) []wire.LinkTiming {
	n := len(ring)
	d0 := 20 * time.Millisecond
	j := func(d time.Duration) time.Duration {
		return time.Duration(float64(d) * math.Exp(0.15*rng.NormFloat64()))
	}
	id, succ, pred := ring[i], ring[(i+1)%n], ring[(i+n-1)%n]
	busy, stall, late := j(d0*60/100), j(d0*15/100), j(d0/100)
	switch {
	case f.slow == [2]PeerID{id, succ}, f.sender == id, f.receiver == succ:
		stall += f.extra
	case f.sleeper == id:
		busy += f.extra
		late += f.extra
	case f.sleeper == succ:
		stall += f.extra / 2
	}
	span := max(d0+f.extra, busy+stall+d0/20)
	wait := span - busy - stall - d0/20
	const bytes = 32 << 20
	return []wire.LinkTiming{
		{Peer: succ, Dir: wire.LinkOut, Bytes: bytes, Start: uint64(late), End: uint64(span * 98 / 100), Wait: uint64(stall)},
		{Peer: pred, Dir: wire.LinkIn, Bytes: bytes, Start: uint64(d0 / 1000), End: uint64(span), Wait: uint64(wait)},
	}
}

// synthHierLinks returns peer i's link timings in ring for one hierarchical AllReduce under f, as
// pccl reports them: its bytes move on its site's ring (the members of its site in ring order) and on
// the WAN ring of the peers of its rank in each site (the sites in ring order). WAN links move their
// bytes four times slower than site links by design. A slowed link, sender or receiver moves its
// frames eight times slower and paces the whole operation: every peer waits longer on its links in,
// and nobody is held back sending, as on a site ring that never fills a link's in-flight window; the
// fault shows only in the transit of the slowed links' frames.
func synthHierLinks(rng *rand.Rand, ring []PeerID, siteOf func(PeerID) string, i int, f timing) []wire.LinkTiming {
	var sites []string
	members := map[string][]PeerID{}
	for _, id := range ring {
		s := siteOf(id)
		if _, ok := members[s]; !ok {
			sites = append(sites, s)
		}
		members[s] = append(members[s], id)
	}
	id := ring[i]
	mine := members[siteOf(id)]
	r, k, ns := slices.Index(mine, id), slices.Index(sites, siteOf(id)), len(sites)
	next, prev := mine[(r+1)%len(mine)], mine[(r+len(mine)-1)%len(mine)]
	wnext, wprev := members[sites[(k+1)%ns]][r], members[sites[(k+ns-1)%ns]][r]
	j := func(d time.Duration) time.Duration {
		return time.Duration(float64(d) * math.Exp(0.15*rng.NormFloat64()))
	}
	slowed := func(from, to PeerID) bool {
		return f.slow == [2]PeerID{from, to} || f.sender == from || f.receiver == to
	}
	transit := func(from PeerID, d time.Duration) uint64 {
		d = j(d)
		if slowed(from, id) {
			d *= 8
		}
		return uint64(d)
	}
	span := 100 * time.Millisecond
	if f.slow != [2]PeerID{} || f.sender != 0 || f.receiver != 0 {
		span += f.extra
	}
	busy, stall := j(10*time.Millisecond), [2]time.Duration{j(2 * time.Millisecond), j(2 * time.Millisecond)}
	wait := (span - busy - stall[0] - stall[1] - time.Millisecond) / 2
	const siteBytes, wanBytes = 24 << 20, 8 << 20
	late := uint64(j(time.Millisecond))
	return []wire.LinkTiming{
		{Peer: next, Dir: wire.LinkOut, Bytes: siteBytes, Start: late, End: uint64(span * 98 / 100), Wait: uint64(stall[0])},
		{Peer: prev, Dir: wire.LinkIn, Bytes: siteBytes, Start: uint64(span / 100), End: uint64(span), Wait: uint64(wait),
			Transit: transit(prev, 24*time.Millisecond)},
		{Peer: wnext, Dir: wire.LinkOut, Bytes: wanBytes, Start: uint64(span / 3), End: uint64(span * 2 / 3), Wait: uint64(stall[1])},
		{Peer: wprev, Dir: wire.LinkIn, Bytes: wanBytes, Start: uint64(span / 3), End: uint64(span * 2 / 3), Wait: uint64(wait),
			Transit: transit(wprev, 32*time.Millisecond)},
	}
}

// collective runs one all-reduce on the ring in force; every Done carries link timings under f.
func (r *diagRig) collective(f timing) {
	r.t.Helper()
	r.tag++
	ring := r.m.Snapshot(r.now).Ring
	var seq uint64
	voters := slices.DeleteFunc(slices.Clone(ring), func(id PeerID) bool { return id == f.voter })
	if f.voter != 0 {
		voters = append(voters, f.voter) // the late voter votes last
	}
	for _, id := range voters {
		if id == f.voter {
			r.now = r.now.Add(f.extra)
		}
		for _, s := range r.step(Received{id, &wire.Initiate{Tag: r.tag, Desc: wire.Desc{Count: 1 << 20, DType: 3, Op: 1}}}) {
			if c, ok := s.Msg.(*wire.Commence); ok {
				seq = c.Seq
			}
		}
	}
	if seq == 0 {
		r.t.Fatalf("tag %d did not commence", r.tag)
	}
	for i, id := range ring {
		r.now = r.now.Add(time.Millisecond)
		r.step(Received{id, &wire.Done{Tag: r.tag, Seq: seq, Code: wire.CodeOK, LinkBytes: 32 << 20, LinkNanos: uint64(20 * time.Millisecond),
			Links: r.links(ring, i, f)}})
	}
}

// take returns the events noted since the last call.
func (r *diagRig) take() []Event {
	out := r.events
	r.events = nil
	return out
}

func diagEvents(evs []Event) []Event {
	var out []Event
	for _, e := range evs {
		if strings.HasPrefix(e.Kind, "slow-") || e.Kind == "cleared" {
			out = append(out, e)
		}
	}
	return out
}

// TestDiagnoseSlowLinkReroutes injects a slow link: the master notes it within three collectives,
// shows it in the snapshot, raises its cost, and the next OptimizeTopology wires a ring without it.
func TestDiagnoseSlowLinkReroutes(t *testing.T) {
	r := newDiagRig(t, Config{MinPeers: 2}, 8)
	ring := r.m.Snapshot(r.now).Ring
	for range 10 {
		r.collective(timing{})
	}
	if evs := diagEvents(r.take()); len(evs) != 0 {
		t.Fatalf("clean collectives noted %+v", evs)
	}
	slow := [2]PeerID{ring[2], ring[3]}
	var got []Event
	for range 3 {
		r.collective(timing{slow: slow, extra: 60 * time.Millisecond})
		got = append(got, diagEvents(r.take())...)
	}
	if len(got) != 1 || got[0].Kind != "slow-link" || got[0].Peer != slow[0] {
		t.Fatalf("events %+v, want one slow-link of peer %d", got, slow[0])
	}
	if want := "slow-link " + linkName(slow); !strings.HasPrefix(got[0].Detail, want+" (confidence ") {
		t.Errorf("detail %q, want it to start with %q", got[0].Detail, want)
	}

	s := r.m.Snapshot(r.now)
	if len(s.Groups) != 1 || len(s.Groups[0].Syndromes) != 1 {
		t.Fatalf("snapshot syndromes %+v", s.Groups)
	}
	sy := s.Groups[0].Syndromes[0]
	if sy.Kind != "slow-link" || sy.From != slow[0] || sy.To != slow[1] || sy.Ops != 1 || !(sy.Confidence > 0.5) {
		t.Errorf("syndrome %+v", sy)
	}
	if s.Groups[0].Diagnosis.Raised["slow-link"] != 1 {
		t.Errorf("stats %+v", s.Groups[0].Diagnosis)
	}
	if links := s.Groups[0].Links; len(links) != 8 {
		t.Errorf("%d link estimates, want 8", len(links))
	} else {
		for _, l := range links {
			i := slices.Index(ring, l.From)
			if ring[(i+1)%8] != l.To || l.Age != 0 || !(l.Transfer > 0) || !(l.Stall > 0) || l.Wait < 0 {
				t.Errorf("link estimate %+v", l)
			}
			if hot := [2]PeerID{l.From, l.To} == slow; hot != (l.Stall*(1<<20) == s.Delay[2][3]) {
				t.Errorf("link %+v against delay %v", l, s.Delay[2][3])
			}
		}
	}
	if len(s.Delay) != 8 || s.Delay[2][3] <= 0 || s.Delay[3][2] != 0 {
		t.Fatalf("delay matrix %v", s.Delay)
	}
	for i := range 8 {
		if k := (i + 1) % 8; i != 2 && !(s.Delay[i][k] > 0 && s.Delay[i][k] < s.Delay[2][3]/3) {
			t.Errorf("delay[%d][%d] = %v, slow link %v", i, k, s.Delay[i][k], s.Delay[2][3])
		}
	}

	// The topology model charges the slow link ten times its measured cost.
	for _, id := range ring {
		r.step(Received{id, &wire.VoteOptimize{}})
	}
	for round := uint32(1); round < 8; round++ {
		for i, id := range ring {
			r.step(Received{id, &wire.MeasureReport{Round: round, To: ring[(i+int(round))%8], BytesPerSec: 1e9}})
		}
	}
	if pen := r.m.linkPenalty(slow[0], slow[1]); pen != 10 {
		t.Fatalf("penalty %v, want 10", pen)
	}
	if cost := r.m.costMatrix(ring); cost[2][3] != 10*cost[3][4] {
		t.Fatalf("cost of the slow link %v, of a normal one %v", cost[2][3], cost[3][4])
	}
	after := r.m.Snapshot(r.now).Ring
	if slices.Equal(rotate(after), rotate(ring)) {
		t.Fatalf("ring %v unchanged", after)
	}
	for i, id := range after {
		if [2]PeerID{id, after[(i+1)%len(after)]} == slow {
			t.Fatalf("new ring %v still uses the slow link %v", after, slow)
		}
	}

	// The penalty lapses after its hold.
	r.now = r.now.Add(11 * time.Minute)
	r.step(Received{slow[0], &wire.Heartbeat{Seq: 1}}) // moves the machine's clock, kicks nobody
	if r.m.peers[slow[0]] == nil {
		t.Fatal("the slow link's sender is gone")
	}
	if pen := r.m.linkPenalty(slow[0], slow[1]); pen != 1 {
		t.Errorf("penalty after the hold %v", pen)
	}
}

func linkName(l [2]PeerID) string { return fmt.Sprintf("%d→%d", l[0], l[1]) }

// TestDiagnoseSenderFromBandwidthTests checks a slow sender on a plain ring: the ring shows it as
// its one slow link; the bandwidth tests of the next OptimizeTopology find all its links out slow,
// and the next collective names the sender and clears the link.
func TestDiagnoseSenderFromBandwidthTests(t *testing.T) {
	r := newDiagRig(t, Config{MinPeers: 2}, 6)
	ring := r.m.Snapshot(r.now).Ring
	sender := ring[1]
	for range 5 {
		r.collective(timing{})
	}
	r.take()
	for range 3 {
		r.collective(timing{sender: sender, extra: 60 * time.Millisecond})
	}
	if evs := diagEvents(r.take()); len(evs) != 1 || evs[0].Kind != "slow-link" || evs[0].Peer != sender {
		t.Fatalf("on the ring: %+v", evs)
	}
	for _, id := range ring {
		r.step(Received{id, &wire.VoteOptimize{}})
	}
	for round := uint32(1); round < 6; round++ {
		for i, id := range ring {
			bw := 1e9
			if id == sender {
				bw = 2e8
			}
			r.step(Received{id, &wire.MeasureReport{Round: round, To: ring[(i+int(round))%6], BytesPerSec: bw}})
		}
	}
	r.collective(timing{sender: sender, extra: 60 * time.Millisecond})
	var got []string
	for _, e := range diagEvents(r.take()) {
		got = append(got, e.Kind+" "+e.Detail[:strings.Index(e.Detail, " (")])
	}
	want := []string{fmt.Sprintf("slow-sender slow-sender %d", sender), fmt.Sprintf("cleared slow-link %d→%d", sender, ring[2])}
	if !slices.Equal(got, want) {
		t.Fatalf("after the bandwidth tests: %q, want %q", got, want)
	}
}

// TestDiagnoseEviction checks the eviction policy: off by default, a peer that sleeps before every
// operation is only noted; with EvictAfter 4 it is kicked once its syndrome held four operations
// (raised at the third slow operation, kicked at the sixth).
func TestDiagnoseEviction(t *testing.T) {
	for _, evict := range []int{0, 4} {
		r := newDiagRig(t, Config{MinPeers: 2, Diagnosis: DiagnosisConfig{EvictAfter: evict}}, 8)
		ring := r.m.Snapshot(r.now).Ring
		sleeper := ring[5]
		for range 5 {
			r.collective(timing{})
		}
		r.take()
		var evs []Event
		for range 7 {
			if r.m.peers[sleeper] == nil {
				break
			}
			r.collective(timing{sleeper: sleeper, extra: 40 * time.Millisecond})
			for _, e := range r.take() {
				if e.Kind != "probe" { // the link into the sleeper looks slow at first: its neighbours are tested
					evs = append(evs, e)
				}
			}
		}
		if evict == 0 {
			if !strings.Contains(evs[0].Detail, "busy outside communication") {
				t.Errorf("detail %q", evs[0].Detail)
			}
		}
		var kinds []string
		for _, e := range evs {
			if e.Peer == sleeper {
				kinds = append(kinds, e.Kind)
			}
		}
		want := []string{"slow-compute"}
		if evict != 0 {
			want = append(want, "kicked")
		}
		if !slices.Equal(kinds, want) {
			t.Fatalf("evict %d: events of the sleeper %q, want %q (all: %+v)", evict, kinds, want, evs)
		}
		s := r.m.Snapshot(r.now)
		if evict == 0 {
			if len(s.Ring) != 8 || s.Groups[0].Diagnosis.Evicted != 0 {
				t.Errorf("evict off: ring %v stats %+v", s.Ring, s.Groups[0].Diagnosis)
			}
			continue
		}
		if slices.Contains(s.Ring, sleeper) || s.Groups[0].Diagnosis.Evicted != 1 {
			t.Errorf("evict on: ring %v stats %+v", s.Ring, s.Groups[0].Diagnosis)
		}
		for _, e := range evs {
			if e.Kind == "kicked" && !strings.HasPrefix(e.Detail, fmt.Sprintf("evicted as a chronic straggler: slow-compute %d for 4 operations", sleeper)) {
				t.Errorf("kick detail %q", e.Detail)
			}
		}
	}
}

// TestDiagnoseLateVoter checks a peer that is late before it votes: the ring runs clean, the others
// wait for it at the vote, and the master names it from the vote times it counted.
func TestDiagnoseLateVoter(t *testing.T) {
	r := newDiagRig(t, Config{MinPeers: 2}, 8)
	ring := r.m.Snapshot(r.now).Ring
	for range 5 {
		r.collective(timing{})
	}
	r.take()
	var evs []Event
	for range 3 {
		r.collective(timing{voter: ring[4], extra: 100 * time.Millisecond})
		evs = append(evs, diagEvents(r.take())...)
	}
	if len(evs) != 1 || evs[0].Kind != "slow-compute" || evs[0].Peer != ring[4] ||
		!strings.Contains(evs[0].Detail, "votes 100ms after the median peer") {
		t.Fatalf("events %+v", evs)
	}
}

// TestDiagnoseRecoveryAndSteps checks the recovery time (first abort to the next completed
// collective) and the training steps in the snapshot.
func TestDiagnoseRecoveryAndSteps(t *testing.T) {
	r := newDiagRig(t, Config{MinPeers: 2}, 3)
	ring := r.m.Snapshot(r.now).Ring
	r.tag++
	var seq uint64
	for _, id := range ring {
		for _, s := range r.step(Received{id, &wire.Initiate{Tag: r.tag, Desc: wire.Desc{Count: 8}}}) {
			if c, ok := s.Msg.(*wire.Commence); ok {
				seq = c.Seq
			}
		}
	}
	r.step(Received{ring[0], &wire.Done{Tag: r.tag, Seq: seq, Code: wire.CodeAborted, Detail: "cancelled"}})
	for _, id := range ring[1:] {
		r.step(Received{id, &wire.Done{Tag: r.tag, Seq: seq, Code: wire.CodeAborted}})
	}
	r.now = r.now.Add(1500 * time.Millisecond)
	r.collective(timing{}) // adds 1ms per Done
	st := r.m.Snapshot(r.now).Groups[0].Diagnosis
	if st.Recoveries != 1 || st.LastRecovery != 1503*time.Millisecond || math.Abs(st.RecoverySeconds-1.503) > 1e-9 {
		t.Errorf("recovery stats %+v", st)
	}
	r.step(Received{ring[1], &wire.StepReport{Step: 41, InOptimizer: true}})
	for _, p := range r.m.Snapshot(r.now).Peers {
		want := PeerInfo{ID: p.ID, Step: 41, InOptimizer: true, HasStep: true}
		if p.ID != ring[1] {
			want = PeerInfo{ID: p.ID}
		}
		if p.Step != want.Step || p.InOptimizer != want.InOptimizer || p.HasStep != want.HasStep {
			t.Errorf("peer %d step %d %v %v", p.ID, p.Step, p.InOptimizer, p.HasStep)
		}
	}
}

func TestDiagnosisConfigValidate(t *testing.T) {
	for _, c := range []DiagnosisConfig{{Penalty: 0.5}, {PenaltyHold: -1}, {EvictAfter: -1}, {ProbeDuration: -1},
		{ProbeDuration: time.Minute + 1}} {
		if err := (Config{Diagnosis: c}).Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	if err := (Config{Diagnosis: DiagnosisConfig{Penalty: 3, EvictAfter: 5}}).Validate(); err != nil {
		t.Error(err)
	}
}

// TestDiagnoseProbesWithinThreeOps checks the bandwidth tests the master asks for on its own: a ring
// link slow in one collective makes it test two links out of the sender, two into the receiver and
// two others; with the answers in, the third slow collective raises the right syndrome at once,
// slow sender, slow receiver or slow link, with no OptimizeTopology.
func TestDiagnoseProbesWithinThreeOps(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind string
	}{{"slow sender", "slow-sender"}, {"slow receiver", "slow-receiver"}, {"slow link", "slow-link"}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newDiagRig(t, Config{MinPeers: 2}, 6)
			ring := r.m.Snapshot(r.now).Ring
			x, y := ring[1], ring[2]
			for range 5 {
				r.collective(timing{})
			}
			r.take()
			if len(r.asked) != 0 {
				t.Fatalf("clean collectives asked for %d bandwidth tests", len(r.asked))
			}
			f := timing{extra: 60 * time.Millisecond}
			culprit := x
			switch tc.kind {
			case "slow-sender":
				f.sender = x
			case "slow-receiver":
				f.receiver, culprit = y, y
			default:
				f.slow = [2]PeerID{x, y}
			}
			var evs []Event
			for op := 1; op <= 3; op++ {
				r.collective(f)
				evs = append(evs, diagEvents(r.take())...)
				if op == 1 && len(r.asked) != 6 {
					t.Fatalf("after the first slow collective: %d bandwidth tests asked for, want 6", len(r.asked))
				}
				for _, s := range r.asked {
					// A fifth of OptimizeTopology's tests, with as many connections.
					if mr := s.Msg.(*wire.MeasureRound); mr.Nanos != uint64(100*time.Millisecond) || mr.Streams != 2 {
						t.Fatalf("test asked of %d for %v over %d connections, want 100ms over 2", s.To, time.Duration(mr.Nanos), mr.Streams)
					}
				}
				asked := r.asked
				r.asked = nil
				for _, s := range asked {
					to := s.Msg.(*wire.MeasureRound).Target.ID
					bw := 1e9
					if (f.sender != 0 && s.To == f.sender) || (f.receiver != 0 && to == f.receiver) {
						bw = 2e8
					}
					r.step(Received{s.To, &wire.MeasureReport{Round: 0, To: to, BytesPerSec: bw}})
				}
			}
			if len(evs) != 1 || evs[0].Kind != tc.kind || evs[0].Peer != culprit {
				t.Fatalf("after three slow collectives: %+v, want one %s of %d", evs, tc.kind, culprit)
			}
			if strings.Contains(evs[0].Detail, "would look the same") {
				t.Fatalf("the tests did not reach the evidence: %s", evs[0].Detail)
			}
			r.collective(f)
			if len(r.asked) != 0 {
				t.Fatalf("the same suspect was tested again at once: %d tests", len(r.asked))
			}
		})
	}
}

// TestProbeDuration checks the time budget of the master's own bandwidth tests: a fifth of
// OptimizeTopology's, at least 50 ms, or what the configuration says.
func TestProbeDuration(t *testing.T) {
	for _, tc := range []struct {
		measure, probe, want time.Duration
	}{
		{0, 0, 100 * time.Millisecond},
		{time.Second, 0, 200 * time.Millisecond},
		{100 * time.Millisecond, 0, 50 * time.Millisecond},
		{time.Second, 30 * time.Millisecond, 30 * time.Millisecond},
	} {
		cfg := Config{MeasureDuration: tc.measure, Diagnosis: DiagnosisConfig{ProbeDuration: tc.probe}}.withDefaults()
		if got := cfg.probeDuration(); got != tc.want {
			t.Errorf("MeasureDuration %v, ProbeDuration %v: tests of %v, want %v", tc.measure, tc.probe, got, tc.want)
		}
	}
}

// TestDiagnoseProbeReportUnasked checks that a Round 0 report nobody asked for changes nothing and
// kicks nobody.
func TestDiagnoseProbeReportUnasked(t *testing.T) {
	r := newDiagRig(t, Config{MinPeers: 2}, 4)
	ring := r.m.Snapshot(r.now).Ring
	r.step(Received{ring[0], &wire.MeasureReport{Round: 0, To: ring[2], BytesPerSec: 1}})
	if s := r.m.Snapshot(r.now); len(s.Peers) != 4 || s.Counters.Kicked != 0 {
		t.Fatalf("%d peers, %d kicked after an unasked test report", len(s.Peers), s.Counters.Kicked)
	}
}
