package main

import (
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/pccl/master"
)

// TestLeaveWhileMasterStopped tells a peer to leave while its collectives run and the master is
// stopped (SIGSTOP): a collective whose context ends waits for the master's verdict, which nobody
// sends, and the peer must still end its session by closing its communicator (leaveGrace), not after
// Config.MasterTimeout with the master lost.
func TestLeaveWhileMasterStopped(t *testing.T) {
	if testing.Short() {
		t.Skip("processes: skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	c := cluster.New(cluster.Config{Stderr: io.Discard})
	defer c.Close()
	mcfg := master.LAN()
	mcfg.MinPeers = minPeers
	mp, addr, err := c.StartMasterAt(ctx, mcfg, "127.0.0.1:0")
	if err != nil {
		t.Fatalf("master: %v", err)
	}
	// Each peer's ring links pass through a relay of this test, which slows them below.
	var (
		peers  []*cluster.Proc
		relays []*relay
	)
	for _, name := range []string{"peer-0", "peer-1"} {
		lr, err := newRelayOn(loopback, "")
		if err != nil {
			t.Fatalf("link relay: %v", err)
		}
		defer lr.close()
		js, _ := json.Marshal(peerParams{Master: addr, LinkRelay: lr.addr(), Progress: soakProgress, Lifetime: time.Minute})
		p, err := c.Spawn(cluster.Spec{Role: rolePeer, Name: name, Env: []string{envPeer + "=" + string(js)}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		peers, relays = append(peers, p), append(relays, lr)
	}
	// Both run steps: the group works before the master stops.
	for _, p := range peers {
		if _, err := p.Await(ctx, "step"); err != nil {
			t.Fatalf("%s: %v", p.Name(), err)
		}
	}
	// With every chunk of the ring delayed, the next step's collectives run for seconds: the master
	// commences them, then stops, and the leaver is told to leave while they run.
	for _, lr := range relays {
		lr.setDelay(soakProgress / 6)
	}
	if _, err := peers[0].Await(ctx, "started"); err != nil {
		t.Fatalf("%s: %v", peers[0].Name(), err)
	}
	time.Sleep(soakProgress / 6)
	if err := mp.Stop(); err != nil {
		t.Fatalf("stopping the master: %v", err)
	}
	defer mp.Continue()
	leaver := peers[0]
	if err := leaver.Send(peerCommand{Cmd: "leave"}); err != nil {
		t.Fatalf("leave: %v", err)
	}
	// The bound is well under MasterTimeout (a minute): the session must not wait for the master.
	lctx, lcancel := context.WithTimeout(ctx, 20*time.Second)
	defer lcancel()
	l, err := leaver.Await(lctx, "session_end")
	if err != nil {
		t.Fatalf("%s: no end of its session while the master is stopped: %v", leaver.Name(), err)
	}
	var end peerEvent
	if err := l.Decode(&end); err != nil {
		t.Fatalf("session_end %q: %v", l.Raw, err)
	}
	t.Logf("%s: session ended as %s: %s", leaver.Name(), end.Kind, end.Detail)
	if end.Kind != "closed" && end.Kind != "canceled" {
		t.Fatalf("session ended as %q (%s), want closed or canceled", end.Kind, end.Detail)
	}
	if end.Leak {
		t.Fatalf("goroutines left after Close: %s", end.Detail)
	}
}
