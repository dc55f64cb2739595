package master

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// threePeers returns a machine with peers 1, 2 and 3 accepted in one ring.
func threePeers(t *testing.T, cfg Config) (*Machine, time.Time) {
	t.Helper()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := New(cfg)
	m.Step(now, Received{1, &wire.Hello{Addr: "10.0.0.1:1"}})
	m.Step(now, Received{1, &wire.LinksReady{Epoch: 1, OK: true}})
	m.Step(now, Received{2, &wire.Hello{Addr: "10.0.0.2:1"}})
	m.Step(now, Received{3, &wire.Hello{Addr: "10.0.0.3:1"}})
	m.Step(now, Received{1, &wire.VoteTopology{}})
	for c := ConnID(1); c <= 3; c++ {
		m.Step(now, Received{c, &wire.LinksReady{Epoch: 2, OK: true}})
	}
	if s := m.Snapshot(now); len(s.Ring) != 3 {
		t.Fatalf("ring %v, want 3 peers", s.Ring)
	}
	return m, now
}

// vote has peers 1, 2 and 3 vote for tag 1 with the given stats and returns every action of the last
// vote, by connection.
func vote(m *Machine, now time.Time, stats [3]*wire.Contribution) map[ConnID][]wire.Message {
	var acts []Action
	for i, st := range stats {
		acts = m.Step(now, Received{ConnID(i + 1), &wire.Initiate{Tag: 1, Desc: wire.Desc{Count: 4, DType: 10, Op: 0}, Stats: st}})
	}
	out := map[ConnID][]wire.Message{}
	for _, a := range acts {
		if s, ok := a.(Send); ok {
			out[s.To] = append(out[s.To], s.Msg)
		}
	}
	return out
}

func ok(norm float64) *wire.Contribution { return &wire.Contribution{Finite: true, Norm: norm} }

// TestGuardFailsNonFinite checks the failing policy: a NaN contribution fails the collective for every
// peer with a local failure that names the offender, and nothing commences.
func TestGuardFailsNonFinite(t *testing.T) {
	m, now := threePeers(t, Config{Guard: GuardPolicy{RejectNonFinite: true}})
	sent := vote(m, now, [3]*wire.Contribution{ok(1), ok(1), {Finite: false, Norm: math.NaN()}})
	for c := ConnID(1); c <= 3; c++ {
		if len(sent[c]) != 1 {
			t.Fatalf("peer %d got %v, want one Outcome", c, sent[c])
		}
		o, isOutcome := sent[c][0].(*wire.Outcome)
		if !isOutcome || o.Code != wire.CodeLocalFailure || !strings.Contains(o.Detail, "peer 3") || !strings.Contains(o.Detail, "NaN") {
			t.Fatalf("peer %d got %+v, want a local failure naming peer 3 and NaN", c, sent[c][0])
		}
	}
	if s := m.Snapshot(now); len(s.Peers) != 3 {
		t.Fatalf("%d peers, want all 3 kept", len(s.Peers))
	}
}

// TestGuardExcludesOutlier checks the excluding policy: a contribution whose norm is far above the
// others' gets its peer kicked with the reason; the others' collective fails retryably (peer left).
func TestGuardExcludesOutlier(t *testing.T) {
	m, now := threePeers(t, Config{Guard: GuardPolicy{NormFactor: 10, Exclude: true}})
	sent := vote(m, now, [3]*wire.Contribution{ok(1), ok(1.5), ok(1000)})
	k, kicked := sent[3][0].(*wire.Kick)
	if !kicked || !strings.Contains(k.Reason, "norm") || !strings.Contains(k.Reason, "peer 3") {
		t.Fatalf("peer 3 got %v, want a Kick naming its norm", sent[3])
	}
	for c := ConnID(1); c <= 2; c++ {
		o, isOutcome := sent[c][0].(*wire.Outcome)
		if !isOutcome || o.Code != wire.CodePeerLeft {
			t.Fatalf("peer %d got %v, want a peer-left Outcome", c, sent[c])
		}
	}
	if s := m.Snapshot(now); len(s.Peers) != 2 {
		t.Fatalf("%d peers, want 2", len(s.Peers))
	}
}

// TestGuardPassesNormal checks that contributions within the factor, and votes without stats,
// commence.
func TestGuardPassesNormal(t *testing.T) {
	m, now := threePeers(t, Config{Guard: GuardPolicy{RejectNonFinite: true, NormFactor: 10}})
	sent := vote(m, now, [3]*wire.Contribution{ok(1), ok(5), nil})
	for c := ConnID(1); c <= 3; c++ {
		if _, commenced := sent[c][0].(*wire.Commence); !commenced {
			t.Fatalf("peer %d got %v, want Commence", c, sent[c])
		}
	}
}

// TestGuardValidate checks that a NormFactor in (0, 1] is refused with the field's name.
func TestGuardValidate(t *testing.T) {
	for _, f := range []float64{-1, 0.5, 1, math.NaN()} {
		if err := (Config{Guard: GuardPolicy{NormFactor: f}}).Validate(); err == nil || !strings.Contains(err.Error(), "NormFactor") {
			t.Errorf("NormFactor %v: %v", f, err)
		}
	}
}
