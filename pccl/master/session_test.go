package master

import (
	"context"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/wire"
)

// TestSessionResumes opens a peer's session over loopback, sends heartbeats on it, then resumes it on a
// second connection twice: first reporting fewer of the master's frames than arrived (the master sends
// the missing ones again, from the number it names), then with an unknown id (refused: the peer must
// say Hello). The master's Machine never hears of the moves: the peer stays, answered on the new
// connection, and its old connection is closed.
func TestSessionResumes(t *testing.T) {
	defer goleak.VerifyNone(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	srv := NewServer(ServerConfig{OnEvent: func(e Event) { events = append(events, e.Kind) }})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	addr := ln.Addr().String()
	read := func(c net.Conn) wire.Message {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		for {
			msg, _, err := wire.ReadFrame(c, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := msg.(*wire.SessionAck); !ok {
				return msg
			}
		}
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if err := wire.Exchange(c, wire.KindControl); err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := dial()
	defer a.Close()
	a.Write(wire.AppendFrame(nil, &wire.Hello{Addr: "127.0.0.1:1", Peer: 5}))
	start, ok := read(a).(*wire.SessionStart)
	if !ok {
		t.Fatal("no SessionStart first")
	}
	if _, ok := read(a).(*wire.Welcome); !ok { // frame 1
		t.Fatal("no Welcome")
	}
	// Frames 2..: the wiring of a ring of one (Connect), then, after LinksReady, its Topology.
	conn, ok := read(a).(*wire.Connect)
	if !ok {
		t.Fatal("no Connect")
	}
	a.Write(wire.AppendFrame(nil, &wire.LinksReady{Epoch: conn.Epoch, OK: true})) // peer frame 1
	if _, ok := read(a).(*wire.Topology); !ok {                                   // frame 3
		t.Fatal("no Topology")
	}
	for seq := uint64(1); seq <= 3; seq++ { // peer frames 2..4, master frames 4..6
		a.Write(wire.AppendFrame(nil, &wire.Heartbeat{Seq: seq}))
		if ack, ok := read(a).(*wire.HeartbeatAck); !ok || ack.Seq != seq {
			t.Fatalf("heartbeat %d answered with %+v", seq, ack)
		}
	}

	// Resume claiming only 4 of the master's 6 frames: 5 and 6 come again.
	b := dial()
	defer b.Close()
	b.Write(wire.AppendFrame(nil, &wire.SessionResume{Peer: 5, ID: start.ID, Recv: 4}))
	r, ok := read(b).(*wire.SessionResumed)
	if !ok || !r.OK || r.Recv != 4 || r.Next > 5 {
		t.Fatalf("resumption answered %+v, want OK, 4 of ours received, frames again from 5 or before", r)
	}
	for n := r.Next; n <= 6; n++ {
		msg := read(b)
		if n >= 5 {
			if ack, ok := msg.(*wire.HeartbeatAck); !ok || ack.Seq != n-3 {
				t.Fatalf("frame %d sent again as %+v, want HeartbeatAck %d", n, msg, n-3)
			}
		}
	}
	// The session goes on on the new connection; the old one is closed.
	b.Write(wire.AppendFrame(nil, &wire.Heartbeat{Seq: 9}))
	if ack, ok := read(b).(*wire.HeartbeatAck); !ok || ack.Seq != 9 {
		t.Fatalf("heartbeat on the resumed connection answered with %+v", ack)
	}
	a.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		if _, _, err := wire.ReadFrame(a, 0, nil); err != nil {
			break
		}
	}

	// An unknown session is refused, and the connection takes a Hello next.
	c := dial()
	defer c.Close()
	c.Write(wire.AppendFrame(nil, &wire.SessionResume{Peer: 6, ID: wire.SessionID{1}, Recv: 0}))
	if r, ok := read(c).(*wire.SessionResumed); !ok || r.OK {
		t.Fatalf("unknown session answered %+v, want not OK", r)
	}
	c.Write(wire.AppendFrame(nil, &wire.Hello{Addr: "127.0.0.1:2", Peer: 6}))
	if _, ok := read(c).(*wire.SessionStart); !ok {
		t.Fatal("no SessionStart after the refused resumption")
	}
	if w, ok := read(c).(*wire.Welcome); !ok || w.Peer != 6 {
		t.Fatalf("Hello after a refused resumption answered %+v", w)
	}
	snap := srv.Snapshot()
	if len(snap.Peers) != 2 || snap.Counters.Left != 0 {
		t.Fatalf("%d peers, counters %+v: want 2 peers and nobody gone", len(snap.Peers), snap.Counters)
	}
}
