package master

import (
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// acceptedMachine returns a Machine whose default group has n accepted peers, ids 1..n on connections
// 1..n, and the time it reached.
func acceptedMachine(t *testing.T, n int) (*Machine, time.Time) {
	t.Helper()
	m := New(Config{})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	answer := func(actions []Action) {
		// Answer every Connect at once.
		for _, a := range actions {
			if s, ok := a.(Send); ok {
				if c, ok := s.Msg.(*wire.Connect); ok {
					m.Step(now, Received{Conn: s.To, Msg: &wire.LinksReady{Epoch: c.Epoch, OK: true}})
				}
			}
		}
	}
	for c := ConnID(1); c <= ConnID(n); c++ {
		answer(m.Step(now, Received{Conn: c, Msg: &wire.Hello{Addr: "10.0.0.1:1"}}))
	}
	answer(m.Step(now, Received{Conn: 1, Msg: &wire.VoteTopology{}}))
	if g := m.groups[0]; len(g.acc) != n || len(g.ring) != n {
		t.Fatalf("%d accepted, ring of %d; want %d", len(g.acc), len(g.ring), n)
	}
	return m, now
}

// TestVoteCostDoesNotGrow checks that counting a vote, a Done and a heartbeat allocates as much in a
// group of 2,000 peers as in one of 50: none of them scans the group.
func TestVoteCostDoesNotGrow(t *testing.T) {
	allocs := func(n int) map[string]float64 {
		m, now := acceptedMachine(t, n)
		out := map[string]float64{}
		// Votes from the first 20 peers only, so that no round completes.
		next := ConnID(0)
		vote := func(msg func() wire.Message) func() {
			next = 0
			return func() {
				next++
				m.Step(now, Received{Conn: next, Msg: msg()})
			}
		}
		out["pending"] = testing.AllocsPerRun(19, vote(func() wire.Message { return &wire.VotePending{} }))
		out["topology"] = testing.AllocsPerRun(19, vote(func() wire.Message { return &wire.VoteTopology{} }))
		out["initiate"] = testing.AllocsPerRun(19, vote(func() wire.Message { return &wire.Initiate{Tag: 1, Desc: wire.Desc{Count: 4}} }))
		out["heartbeat"] = testing.AllocsPerRun(19, vote(func() wire.Message { return &wire.Heartbeat{Seq: 1} }))
		// Complete the collective, then time the Dones of the first 20 members of the next one.
		for c := ConnID(21); c <= ConnID(n); c++ {
			m.Step(now, Received{Conn: c, Msg: &wire.Initiate{Tag: 1, Desc: wire.Desc{Count: 4}}})
		}
		seq := m.groups[0].ops[1].seq
		if seq == 0 {
			t.Fatalf("n=%d: the collective did not commence", n)
		}
		out["done"] = testing.AllocsPerRun(19, vote(func() wire.Message {
			return &wire.Done{Tag: 1, Seq: seq, Code: wire.CodeOK, LinkBytes: 4 << 20, LinkNanos: 1e6}
		}))
		return out
	}
	small, large := allocs(50), allocs(2000)
	for kind, a := range small {
		if large[kind] != a {
			t.Errorf("%s: %v allocations per input with 2000 peers, %v with 50", kind, large[kind], a)
		}
	}
}
