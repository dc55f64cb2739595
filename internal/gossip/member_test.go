package gossip

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// memberlist's Shutdown does not wait for a probe in flight: it ends on its own within a probe
// interval (stretched by awareness), after the member's sockets are closed, and starts nothing.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

// group starts n members on loopback, joined to the first; events of member 0 go to its channel.
func startGroup(t *testing.T, cfg Config, n int) ([]*Member, chan Event) {
	t.Helper()
	events := make(chan Event, 1024) // never full: a blocked notify would hold up Close
	var ms []*Member
	for i := range n {
		var notify func(Event)
		if i == 0 {
			notify = func(e Event) { events <- e }
		}
		m, err := Start(cfg, PeerName(uint64(i+1), 7), notify, nil)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
		if i > 0 {
			if err := m.Join(ms[0].Addr()); err != nil {
				t.Fatal(err)
			}
		}
	}
	return ms, events
}

// TestHungMemberIsDeclaredDead pauses one of three members, as a SIGSTOPped process: the others
// declare it dead, and never declare a healthy one dead.
func TestHungMemberIsDeclaredDead(t *testing.T) {
	cfg := LAN()
	ms, events := startGroup(t, cfg, 3)
	defer func() {
		for _, m := range ms {
			m.Close()
		}
	}()
	victim := PeerName(3, 7)
	joined := map[string]bool{}
	for len(joined) < 3 {
		e := next(t, events)
		if e.Kind != Joined {
			t.Fatalf("event %+v before everyone joined", e)
		}
		joined[e.Name] = true
	}
	ms[2].Pause(true)
	deadline := time.After(cfg.Bound(3) + 2*time.Second) // the stated bound, plus scheduling slack under -race
	for {
		select {
		case e := <-events:
			if e.Kind == Gone && e.Name == victim {
				return
			}
			t.Fatalf("unexpected event %+v", e)
		case <-deadline:
			t.Fatalf("%s not declared dead within the LAN bound %v", victim, cfg.Bound(3))
		}
	}
}

func TestCloseIsReported(t *testing.T) {
	ms, events := startGroup(t, LAN(), 2)
	defer ms[0].Close()
	for range 2 {
		if e := next(t, events); e.Kind != Joined {
			t.Fatalf("event %+v, want Joined", e)
		}
	}
	ms[1].Close()
	e := next(t, events)
	if e.Kind != Gone || e.Name != PeerName(2, 7) {
		t.Fatalf("event %+v, want %s Gone", e, PeerName(2, 7))
	}
}

// next returns the next event, failing the test instead of hanging when none comes within a minute
// (far beyond any bound of the LAN preset, even on a loaded machine).
func next(t *testing.T, events chan Event) Event {
	t.Helper()
	select {
	case e := <-events:
		return e
	case <-time.After(time.Minute):
		t.Fatal("no gossip event within a minute")
		return Event{}
	}
}

func TestPeerName(t *testing.T) {
	for _, id := range []uint64{1, 77, 1<<48 - 1} {
		got, ok := ParsePeer(PeerName(id, 0xabc))
		if !ok || got != id {
			t.Fatalf("ParsePeer(PeerName(%d)) = %d, %v", id, got, ok)
		}
	}
	for _, bad := range []string{"master-1", "peer-x-1", "peer-12", ""} {
		if _, ok := ParsePeer(bad); ok {
			t.Fatalf("ParsePeer(%q) ok, want not", bad)
		}
	}
}

func TestPresetsBound(t *testing.T) {
	lan, wan := LAN(), WAN()
	if err := errors.Join(lan.Validate(), wan.Validate(), Config{}.Validate()); err != nil {
		t.Fatal(err)
	}
	if lo, hi := lan.SuspicionTimeout(3); lo != 2*time.Second || hi != 2*time.Second {
		t.Fatalf("LAN suspicion for 3 = %v..%v, want 2s..2s", lo, hi)
	}
	if lo, hi := lan.SuspicionTimeout(8); lo != 2*time.Second || hi != 8*time.Second {
		t.Fatalf("LAN suspicion for 8 = %v..%v, want 2s..8s", lo, hi)
	}
	if b := lan.Bound(3); b != 5500*time.Millisecond {
		t.Fatalf("LAN bound for 3 = %v, want 5.5s", b)
	}
	if lo, _ := wan.SuspicionTimeout(3); lo != 8*time.Second {
		t.Fatalf("WAN suspicion = %v, want 8s", lo)
	}
	if err := (Config{ProbeInterval: time.Second, ProbeTimeout: time.Second}).Validate(); err == nil {
		t.Fatal("ProbeTimeout == ProbeInterval validated")
	}
}

// FuzzParsePeer checks that ParsePeer never panics and that every name it accepts names the id it
// returns.
func FuzzParsePeer(f *testing.F) {
	f.Add("peer-12-ab")
	f.Add("master-1")
	f.Add("peer--")
	f.Fuzz(func(t *testing.T, name string) {
		id, ok := ParsePeer(name)
		if !ok {
			return
		}
		if again, ok2 := ParsePeer(PeerName(id, 1)); !ok2 || again != id {
			t.Fatalf("ParsePeer(%q) = %d, but the name of %d parses as %d, %v", name, id, id, again, ok2)
		}
	})
}
