package master

import (
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// reorderRig is a diagRig whose master has a re-ordering ready: six peers, five clean collectives,
// then three with ring link 2→3 slow, the bandwidth tests the master asks for answered. It returns
// the ring in force, which the new ring replaces at the next safe point.
func reorderRig(t *testing.T) (*diagRig, []PeerID) {
	t.Helper()
	r := newDiagRig(t, Config{MinPeers: 2}, 6)
	ring := r.m.Snapshot(r.now).Ring
	for range 5 {
		r.collective(timing{})
	}
	slow := timing{slow: [2]PeerID{ring[2], ring[3]}, extra: 60 * time.Millisecond}
	for range 3 {
		r.collective(slow)
		r.answerProbes(slow)
	}
	g := r.m.groups[0]
	if g.reorder == nil || g.reorder.ring == nil {
		t.Fatalf("no re-ordering ready after three slow collectives; events %+v", r.take())
	}
	if ringUses(g.reorder.ring, edge{ring[2], ring[3]}) {
		t.Fatalf("new ring %v still uses the slow link", g.reorder.ring)
	}
	r.take()
	return r, ring
}

// answerProbes answers the bandwidth tests the master asked for under fault f.
func (r *diagRig) answerProbes(f timing) {
	asked := r.asked
	r.asked = nil
	for _, s := range asked {
		mr := s.Msg.(*wire.MeasureRound)
		bw := 1e9
		if f.slows(s.To, mr.Target.ID) {
			bw /= 8
		}
		r.step(Received{s.To, &wire.MeasureReport{To: mr.Target.ID, BytesPerSec: bw}})
	}
}

// vote sends every peer of ids' vote for a collective on tag and returns what the master sent.
func (r *diagRig) vote(tag uint64, ids []PeerID) []Send {
	var sent []Send
	for _, id := range ids {
		sent = append(sent, r.step(Received{id, &wire.Initiate{Tag: tag, Desc: wire.Desc{Count: 1 << 20, DType: 3, Op: 1}}})...)
	}
	return sent
}

// commenced returns the Commence messages in sent, by recipient.
func commenced(sent []Send) map[PeerID]*wire.Commence {
	out := map[PeerID]*wire.Commence{}
	for _, s := range sent {
		if c, ok := s.Msg.(*wire.Commence); ok {
			out[s.To] = c
		}
	}
	return out
}

// TestReorderHoldsCollective: the collective whose votes complete at the safe point waits while the
// new ring is wired, then commences on it under the new epoch; the peers' messages come in the order
// that lets them follow: Connect, then Topology, then Commence.
func TestReorderHoldsCollective(t *testing.T) {
	r, before := reorderRig(t)
	want := slices.Clone(r.m.groups[0].reorder.ring)
	sent := r.vote(100, before)
	var order []string
	for _, s := range sent {
		if s.To == before[0] {
			order = append(order, reflect.TypeOf(s.Msg).Elem().Name())
		}
	}
	if !slices.Equal(order, []string{"Connect", "Topology", "Commence"}) {
		t.Fatalf("peer %d got %v, want Connect, Topology, Commence", before[0], order)
	}
	s := r.m.Snapshot(r.now)
	if !slices.Equal(rotate(s.Ring), rotate(want)) {
		t.Fatalf("ring %v, want %v", s.Ring, want)
	}
	c := commenced(sent)
	if len(c) != 6 {
		t.Fatalf("%d Commence, want 6", len(c))
	}
	for id, m := range c {
		if m.Epoch != s.Epoch {
			t.Errorf("peer %d commenced on epoch %d, ring in force has %d", id, m.Epoch, s.Epoch)
		}
	}
	st := s.Groups[0].Diagnosis
	if st.Reorders != 1 || !st.LastReorder.Equal(r.now) || s.Counters.OpsAborted != 0 || s.Counters.Kicked != 0 {
		t.Errorf("stats %+v counters %+v", st, s.Counters)
	}
	var kinds []string
	for _, e := range r.take() {
		kinds = append(kinds, e.Kind)
	}
	if !slices.Equal(kinds, []string{"reorder", "ring"}) {
		t.Errorf("events %q, want reorder then ring", kinds)
	}
}

// TestReorderDrains: a collective on another tag runs when the new ring is ready; the collective
// whose votes complete meanwhile waits for it to finish rather than commence on the old ring, and
// the re-ordering runs between the two.
func TestReorderDrains(t *testing.T) {
	r := newDiagRig(t, Config{MinPeers: 2}, 6)
	ring := r.m.Snapshot(r.now).Ring
	for range 5 {
		r.collective(timing{})
	}
	slow := timing{slow: [2]PeerID{ring[2], ring[3]}, extra: 60 * time.Millisecond}
	for range 2 {
		r.collective(slow)
		r.answerProbes(slow)
	}
	// Tag 7 commences before the third slow collective completes, and runs on.
	c7 := commenced(r.vote(7, ring))
	if len(c7) != 6 {
		t.Fatal("tag 7 did not commence")
	}
	r.collective(slow)
	if g := r.m.groups[0]; g.reorder == nil || g.reorder.ring == nil {
		t.Fatal("no re-ordering ready")
	}
	if c := commenced(r.vote(8, ring)); len(c) != 0 {
		t.Fatalf("tag 8 commenced while a re-ordering waits for tag 7: %v", c)
	}
	epoch := r.m.Snapshot(r.now).Epoch
	var sent []Send
	for _, id := range ring {
		sent = append(sent, r.step(Received{id, &wire.Done{Tag: 7, Seq: c7[id].Seq, Code: wire.CodeOK}})...)
	}
	c8 := commenced(sent)
	s := r.m.Snapshot(r.now)
	if len(c8) != 6 || s.Epoch == epoch || c8[ring[0]].Epoch != s.Epoch || slices.Equal(rotate(s.Ring), rotate(ring)) {
		t.Fatalf("after tag 7: %d Commence of tag 8, epoch %d (was %d), ring %v (was %v)", len(c8), s.Epoch, epoch, s.Ring, ring)
	}
}

// TestReorderPeerLeavesMidRound: a peer leaves while the new ring is wired. The held collective fails
// with peer-left (its ring is gone), the round goes on without the peer, and the UpdateTopology votes
// the survivors cast meanwhile are counted, not kicked: they complete once the round is over.
func TestReorderPeerLeavesMidRound(t *testing.T) {
	r, before := reorderRig(t)
	r.manual = true
	r.vote(100, before)
	if r.m.groups[0].wiring == nil || !r.m.groups[0].wiring.auto {
		t.Fatal("no re-ordering round")
	}
	gone := before[4]
	sent := r.step(Received{gone, &wire.Bye{}})
	var failed int
	for _, s := range sent {
		if o, ok := s.Msg.(*wire.Outcome); ok && o.Tag == 100 && o.Code == wire.CodePeerLeft {
			failed++
		}
	}
	if failed != 5 {
		t.Fatalf("%d survivors told the held collective failed, want 5", failed)
	}
	survivors := slices.DeleteFunc(slices.Clone(before), func(id PeerID) bool { return id == gone })
	for _, id := range survivors[:2] {
		r.step(Received{id, &wire.VoteTopology{}})
	}
	if k := r.m.Snapshot(r.now).Counters.Kicked; k != 0 {
		t.Fatalf("%d kicked for voting during the re-ordering", k)
	}
	sent = r.connectAll()
	s := r.m.Snapshot(r.now)
	if len(s.Ring) != 5 || slices.Contains(s.Ring, gone) || r.m.groups[0].wiring != nil {
		t.Fatalf("after the round: ring %v", s.Ring)
	}
	// The votes cast during the round wait for the others', then complete as an UpdateTopology.
	for _, id := range survivors[2:] {
		sent = append(sent, r.step(Received{id, &wire.VoteTopology{}})...)
	}
	answered := map[PeerID]bool{}
	for _, m := range sent {
		if tp, ok := m.Msg.(*wire.Topology); ok && tp.Epoch == s.Epoch {
			answered[m.To] = true
		}
	}
	if len(answered) != 5 || r.m.groups[0].topoVotes != 0 {
		t.Fatalf("%d survivors got the ring, want 5; %d votes left", len(answered), r.m.groups[0].topoVotes)
	}
	r.manual = false
	r.collective(timing{})
	if k := r.m.Snapshot(r.now).Counters.Kicked; k != 0 {
		t.Fatalf("%d kicked", k)
	}
}

// connectAll answers the Connect messages held back in manual mode.
func (r *diagRig) connectAll() []Send {
	held := r.connects
	r.connects = nil
	var sent []Send
	for _, s := range held {
		sent = append(sent, r.step(Received{s.To, &wire.LinksReady{Epoch: s.Msg.(*wire.Connect).Epoch, OK: true}})...)
	}
	return sent
}

// TestReorderNotWhileMajorVote: with an UpdateTopology vote of a peer pending, the group is not at a
// safe point: the collective commences on the ring in force, and the new ring waits for the next one.
func TestReorderNotWhileMajorVote(t *testing.T) {
	r, before := reorderRig(t)
	r.step(Received{before[0], &wire.VoteTopology{}})
	c := commenced(r.vote(100, before))
	if len(c) != 6 || !slices.Equal(r.m.Snapshot(r.now).Ring, before) {
		t.Fatalf("%d Commence, ring %v; want the collective on the old ring %v", len(c), r.m.Snapshot(r.now).Ring, before)
	}
	if r.m.groups[0].reorder == nil {
		t.Fatal("the re-ordering was dropped; it should wait for a safe point")
	}
}

// TestReorderCosts: a link never measured costs a typical measured one, twice that between two named
// sites, and the slow link keeps its penalty.
func TestReorderCosts(t *testing.T) {
	m := New(Config{})
	for id := PeerID(1); id <= 4; id++ {
		site := "a"
		if id > 2 {
			site = "b"
		}
		m.peers[id] = &peer{id: id, inbound: true, hello: wire.Hello{Site: site}}
	}
	nodes := []PeerID{1, 2, 3, 4}
	for i, a := range nodes {
		m.bw[edge{a, nodes[(i+1)%4]}] = 1e9
	}
	m.bw[edge{2, 3}] = 1e8
	cost := m.reorderCosts(nodes)
	typical := 1e-9
	for _, c := range []struct {
		i, j int
		want float64
	}{{0, 1, 1e-9}, {1, 2, 1e-8}, {1, 0, typical}, {0, 2, 2 * typical}, {2, 0, 2 * typical}, {3, 2, typical}} {
		if got := cost[c.i][c.j]; math.Abs(got-c.want) > 1e-15 {
			t.Errorf("cost %d→%d = %v, want %v", nodes[c.i], nodes[c.j], got, c.want)
		}
	}
}

func TestReorderPolicyValidate(t *testing.T) {
	for _, p := range []ReorderPolicy{{MinConfidence: -0.1}, {MinConfidence: 1}, {MinConfidence: math.NaN()},
		{MinRatio: 1}, {MinRatio: 0.5}, {MinRatio: math.NaN()}, {Interval: -time.Second}} {
		err := (Config{Diagnosis: DiagnosisConfig{Reorder: p}}).Validate()
		if err == nil || !strings.Contains(err.Error(), "Config.Diagnosis.Reorder.") {
			t.Errorf("%+v: %v", p, err)
		}
	}
	for _, p := range []ReorderPolicy{{}, {Off: true}, {MinConfidence: 0.9, MinRatio: 5, Interval: time.Hour}} {
		if err := (Config{Diagnosis: DiagnosisConfig{Reorder: p}}).Validate(); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
}
