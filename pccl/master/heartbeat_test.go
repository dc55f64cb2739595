package master

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// TestSilenceHeapOrder checks that the heap pops its entries oldest first, ties broken by peer id,
// whatever the order of the pushes, against a sorted reference.
func TestSilenceHeapOrder(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 50 {
		var h silenceHeap
		var want []watched
		for i := range rng.IntN(200) {
			w := watched{seen: base.Add(time.Duration(rng.IntN(20)) * time.Millisecond), p: &peer{id: PeerID(i + 1)}}
			want = append(want, w)
			h.push(w)
			if rng.IntN(4) == 0 && len(h) > 0 {
				// Pop the oldest now and then, as ticks do.
				got := h.pop()
				slices.SortFunc(want, cmpWatched)
				if got != want[0] {
					t.Fatalf("trial %d: popped %v at %v, want %v at %v", trial, got.p.id, got.seen, want[0].p.id, want[0].seen)
				}
				want = want[1:]
			}
		}
		slices.SortFunc(want, cmpWatched)
		for i, w := range want {
			got := h.pop()
			if got != w {
				t.Fatalf("trial %d: pop %d: %v at %v, want %v at %v", trial, i, got.p.id, got.seen, w.p.id, w.seen)
			}
		}
		if len(h) != 0 {
			t.Fatalf("trial %d: %d entries left", trial, len(h))
		}
	}
}

func cmpWatched(a, b watched) int {
	if c := a.seen.Compare(b.seen); c != 0 {
		return c
	}
	return int(a.p.id) - int(b.p.id)
}

// TestTickExaminesOnlyDuePeers checks the heartbeat deadline through the machine: a peer heard from
// keeps its place, a silent one is kicked once its timeout has passed, never before, and a peer that
// rejoins under the id of a gone one is watched from its own Hello. Peers 40 and 50 keep beating, so
// that the master hears at least half of the group and kicks for silence.
func TestTickExaminesOnlyDuePeers(t *testing.T) {
	m := New(Config{HeartbeatTimeout: time.Second})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	hello := func(c ConnID, id PeerID) {
		m.Step(now, Received{Conn: c, Msg: helloMsg(id)})
	}
	alive := func() {
		m.Step(now, Received{Conn: 5, Msg: heartbeatMsg()})
		m.Step(now, Received{Conn: 6, Msg: heartbeatMsg()})
	}
	hello(1, 10)
	hello(2, 20)
	hello(3, 30)
	hello(5, 40)
	hello(6, 50)
	now = now.Add(800 * time.Millisecond)
	alive()
	m.Step(now, Received{Conn: 1, Msg: heartbeatMsg()})
	m.Step(now, Closed{Conn: 3, Err: "EOF"})
	hello(4, 30) // the same id on a new connection
	now = now.Add(300 * time.Millisecond)
	alive()
	kicked := timeouts(m.Step(now, Tick{}))
	if !slices.Equal(kicked, []PeerID{20}) {
		t.Fatalf("at 1.1s timeouts %v, want [20]", kicked)
	}
	now = now.Add(600 * time.Millisecond)
	alive()
	if kicked = timeouts(m.Step(now, Tick{})); len(kicked) != 0 {
		t.Fatalf("at 1.7s timeouts %v, want none", kicked)
	}
	now = now.Add(300 * time.Millisecond)
	alive()
	kicked = timeouts(m.Step(now, Tick{}))
	if !slices.Equal(kicked, []PeerID{10, 30}) {
		t.Fatalf("at 2.0s timeouts %v, want [10 30]", kicked)
	}
	if len(m.peers) != 2 || len(m.silence) != 2 {
		t.Fatalf("%d peers and %d heap entries left, want 2 of each", len(m.peers), len(m.silence))
	}
}

// TestSilenceRule checks the rule of the master that suspects itself on groups of every size from 1
// to 7 and every number of silent peers: below half silent, they go after HeartbeatTimeout; above
// half but not all, after PartitionTimeout; all silent, never.
func TestSilenceRule(t *testing.T) {
	for n := 1; n <= 7; n++ {
		for k := 1; k <= n; k++ {
			m := New(Config{HeartbeatTimeout: time.Second, PartitionTimeout: 5 * time.Second})
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			for i := 1; i <= n; i++ {
				m.Step(now, Received{Conn: ConnID(i), Msg: helloMsg(PeerID(i))})
			}
			kickedAt := time.Duration(-1)
			for step := 1; step <= 200 && kickedAt < 0; step++ {
				now = now.Add(100 * time.Millisecond)
				for i := k + 1; i <= n; i++ { // peers 1..k are silent
					m.Step(now, Received{Conn: ConnID(i), Msg: heartbeatMsg()})
				}
				if got := timeouts(m.Step(now, Tick{})); len(got) > 0 {
					if len(got) != k {
						t.Fatalf("n=%d k=%d: kicked %v, want all %d silent at once", n, k, got, k)
					}
					kickedAt = time.Duration(step) * 100 * time.Millisecond
				}
			}
			heard := n - k
			switch {
			case 2*heard >= n:
				if kickedAt != 1100*time.Millisecond {
					t.Errorf("n=%d k=%d: kicked at %v, want 1.1s (HeartbeatTimeout)", n, k, kickedAt)
				}
			case heard > 0:
				if kickedAt != 5100*time.Millisecond {
					t.Errorf("n=%d k=%d: kicked at %v, want 5.1s (PartitionTimeout)", n, k, kickedAt)
				}
			default:
				if kickedAt >= 0 {
					t.Errorf("n=%d k=%d: kicked at %v, want never: the master hears nobody", n, k, kickedAt)
				}
			}
		}
	}
}

func helloMsg(id PeerID) *wire.Hello { return &wire.Hello{Addr: "127.0.0.1:1", Peer: id} }

func heartbeatMsg() *wire.Heartbeat { return &wire.Heartbeat{Seq: 1} }

func timeouts(actions []Action) []PeerID {
	var ids []PeerID
	for _, a := range actions {
		if n, ok := a.(Note); ok && n.Event.Kind == "timeout" {
			ids = append(ids, n.Event.Peer)
		}
	}
	return ids
}
