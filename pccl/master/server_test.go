package master

import (
	"context"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/wire"
)

// dialHello opens a control connection to addr, sends h and returns the connection and the master's
// first answer.
func dialHello(t *testing.T, addr string, h *wire.Hello) (net.Conn, wire.Message) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := wire.Exchange(c, wire.KindControl); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(wire.AppendFrame(nil, h)); err != nil {
		t.Fatal(err)
	}
	return c, readSkippingSession(t, c)
}

// readSkippingSession reads c's next message that is not the session layer's (SessionStart,
// SessionAck).
func readSkippingSession(t *testing.T, c net.Conn) wire.Message {
	t.Helper()
	for {
		msg, _, err := wire.ReadFrame(c, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		switch msg.(type) {
		case *wire.SessionStart, *wire.SessionAck:
			continue
		}
		return msg
	}
}

// TestServerIdentity checks over loopback that the server welcomes a peer under the id it chose and a
// nonzero incarnation below 2^32, assigns an id to a peer that chose none, and refuses a second
// connection choosing a live peer's id.
func TestServerIdentity(t *testing.T) {
	defer goleak.VerifyNone(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(ServerConfig{})
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

	a, msg := dialHello(t, addr, &wire.Hello{Addr: "127.0.0.1:1", Peer: 77, Group: 3})
	defer a.Close()
	w, ok := msg.(*wire.Welcome)
	if !ok {
		t.Fatalf("first answer to a chosen id is %T, want Welcome", msg)
	}
	if w.Peer != 77 || w.Incarnation == 0 || w.Incarnation >= 1<<32 {
		t.Fatalf("Welcome = %+v, want peer 77 and an incarnation in [1, 2^32)", w)
	}

	b, msg := dialHello(t, addr, &wire.Hello{Addr: "127.0.0.1:2"})
	defer b.Close()
	w2, ok := msg.(*wire.Welcome)
	if !ok {
		t.Fatalf("first answer to no chosen id is %T, want Welcome", msg)
	}
	if w2.Peer == 0 || w2.Peer == 77 || w2.Incarnation != w.Incarnation {
		t.Fatalf("Welcome = %+v, want a fresh id and incarnation %d", w2, w.Incarnation)
	}

	c, msg := dialHello(t, addr, &wire.Hello{Addr: "127.0.0.1:3", Peer: 77})
	defer c.Close()
	k, ok := msg.(*wire.Kick)
	if !ok || k.Reason != "peer id 77 is held by a live peer" {
		t.Fatalf("answer to a duplicate id is %#v, want a Kick naming the id", msg)
	}

	s := srv.Snapshot()
	if len(s.Peers) != 2 || s.Peers[0].ID != w2.Peer || s.Peers[1].ID != 77 || s.Peers[1].Group != 3 ||
		s.Incarnation != w.Incarnation {
		t.Fatalf("snapshot peers %+v incarnation %d", s.Peers, s.Incarnation)
	}
	if len(s.Groups) != 2 || s.Groups[0].ID != 0 || s.Groups[1].ID != 3 ||
		s.Groups[1].Epoch>>32 != w.Incarnation || s.Epoch>>32 != w.Incarnation {
		t.Fatalf("snapshot groups %+v epoch %#x", s.Groups, s.Epoch)
	}
}

func TestConfigIncarnation(t *testing.T) {
	if err := (Config{Incarnation: 1<<32 - 1}).Validate(); err != nil {
		t.Fatalf("incarnation 2^32-1: %v", err)
	}
	if err := (Config{Incarnation: 1 << 32}).Validate(); err == nil {
		t.Fatal("incarnation 2^32 accepted")
	}
}

// TestEpochsDisjoint checks that the epochs of two incarnations never meet.
func TestEpochsDisjoint(t *testing.T) {
	seen := map[uint64]uint64{}
	for inc := uint64(0); inc < 4; inc++ {
		for _, n := range []uint32{1, 2, 1000, 1<<32 - 1} {
			e := epochOf(inc, n)
			if prev, ok := seen[e]; ok {
				t.Fatalf("epoch %#x of incarnation %d was already handed out by incarnation %d", e, inc, prev)
			}
			seen[e] = inc
		}
	}
}
