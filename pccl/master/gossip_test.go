package master

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// TestDeadKicksOnlyTheCurrentRegistration feeds gossip verdicts to a machine: one about an earlier
// registration of the peer id is ignored, one about the current registration kicks the peer at once
// although its connection is open and its heartbeats are fresh.
func TestDeadKicksOnlyTheCurrentRegistration(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m := New(Config{})
	acts := m.Step(t0, Received{Conn: 1, Msg: &wire.Hello{Addr: "a:1", Peer: 5}})
	if len(acts) == 0 {
		t.Fatal("no answer to Hello")
	}
	if acts := m.Step(t0.Add(time.Second), Dead{Peer: 5, Since: t0.Add(-time.Second), Reason: "old"}); len(acts) != 0 {
		t.Fatalf("a verdict about an older registration acted: %v", acts)
	}
	if acts := m.Step(t0.Add(time.Second), Dead{Peer: 6, Since: t0, Reason: "unknown"}); len(acts) != 0 {
		t.Fatalf("a verdict about an unknown peer acted: %v", acts)
	}
	acts = m.Step(t0.Add(2*time.Second), Dead{Peer: 5, Since: t0.Add(time.Second), Reason: "peer-5-1 unreachable"})
	var kicked, dropped, noted bool
	for _, a := range acts {
		switch a := a.(type) {
		case Send:
			k, ok := a.Msg.(*wire.Kick)
			kicked = kicked || (ok && a.To == 1 && k.Reason == "declared dead by gossip: peer-5-1 unreachable")
		case Drop:
			dropped = dropped || a.Conn == 1
		case Note:
			noted = noted || (a.Event.Kind == "kicked" && a.Event.Peer == 5)
		}
	}
	if !kicked || !dropped || !noted {
		t.Fatalf("actions %v: kicked %v, dropped %v, noted %v; want all", acts, kicked, dropped, noted)
	}
	if s := m.Snapshot(t0.Add(2 * time.Second)); len(s.Peers) != 0 {
		t.Fatalf("peers after the verdict: %v, want none", s.Peers)
	}
}

// TestGossipAddr checks that a server without gossip reports no gossip address, and one with gossip
// reports the loopback address its member listens on.
func TestGossipAddr(t *testing.T) {
	for _, withGossip := range []bool{false, true} {
		var cfg *GossipConfig
		if withGossip {
			g := GossipLAN()
			cfg = &g
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := NewServer(ServerConfig{Gossip: cfg})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx, ln) }()
		addr, err := srv.GossipAddr(ctx)
		cancel()
		if serr := <-done; serr != nil {
			t.Fatal(serr)
		}
		if err != nil {
			t.Fatal(err)
		}
		if withGossip != strings.HasPrefix(addr, "127.0.0.1:") || (!withGossip && addr != "") {
			t.Fatalf("gossip %v: GossipAddr = %q", withGossip, addr)
		}
	}
}
