package master

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/wire"
)

// kickOf returns the reason of the Kick sent to connection c among acts, and whether there is one.
func kickOf(acts []Action, c ConnID) (string, bool) {
	for _, a := range acts {
		if s, ok := a.(Send); ok && s.To == c {
			if k, ok := s.Msg.(*wire.Kick); ok {
				return k.Reason, true
			}
		}
	}
	return "", false
}

// TestMaxPeers checks that a Hello beyond Config.MaxPeers is refused with a reason naming the limit,
// and that a place freed by a departure can be taken again.
func TestMaxPeers(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := New(Config{MaxPeers: 2})
	for c := ConnID(1); c <= 2; c++ {
		if r, kicked := kickOf(m.Step(now, Received{c, &wire.Hello{Addr: "10.0.0.1:1"}}), c); kicked {
			t.Fatalf("peer %d refused: %s", c, r)
		}
	}
	r, kicked := kickOf(m.Step(now, Received{3, &wire.Hello{Addr: "10.0.0.3:1"}}), 3)
	if !kicked || !strings.Contains(r, "MaxPeers is 2") {
		t.Fatalf("third peer: kicked %v, reason %q; want a refusal naming MaxPeers", kicked, r)
	}
	m.Step(now, Closed{1, "EOF"})
	if r, kicked := kickOf(m.Step(now, Received{4, &wire.Hello{Addr: "10.0.0.4:1"}}), 4); kicked {
		t.Fatalf("peer after a departure refused: %s", r)
	}
	if n := len(m.Snapshot(now).Peers); n != 2 {
		t.Fatalf("%d peers, want 2", n)
	}
}

// TestMaxOpsPerPeer checks that a peer voting for more collectives at once than Config.MaxOpsPerPeer
// is kicked with a reason, and that votes within the limit are not.
func TestMaxOpsPerPeer(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := New(Config{MaxOpsPerPeer: 2, MinPeers: 1})
	m.Step(now, Received{1, &wire.Hello{Addr: "10.0.0.1:1"}})
	m.Step(now, Received{1, &wire.LinksReady{Epoch: 1, OK: true}})
	m.Step(now, Received{2, &wire.Hello{Addr: "10.0.0.2:1"}}) // registered: the votes of 1 wait for it
	for tag := uint64(1); tag <= 2; tag++ {
		if r, kicked := kickOf(m.Step(now, Received{1, &wire.Initiate{Tag: tag, Desc: wire.Desc{Count: 1, DType: 3, Op: 1}}}), 1); kicked {
			t.Fatalf("vote on tag %d kicked: %s", tag, r)
		}
	}
	r, kicked := kickOf(m.Step(now, Received{1, &wire.Initiate{Tag: 3, Desc: wire.Desc{Count: 1, DType: 3, Op: 1}}}), 1)
	if !kicked || !strings.Contains(r, "MaxOpsPerPeer") {
		t.Fatalf("third collective: kicked %v, reason %q; want a kick naming MaxOpsPerPeer", kicked, r)
	}
}

// TestRateLimiter checks the token bucket per source address with an injected clock.
func TestRateLimiter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := newRateLimiter(10, 3)
	for i := range 3 {
		if !r.allow("a", now) {
			t.Fatalf("burst connection %d refused", i)
		}
	}
	if r.allow("a", now) {
		t.Fatal("connection beyond the burst allowed")
	}
	if !r.allow("b", now) {
		t.Fatal("another address refused")
	}
	if !r.allow("a", now.Add(100*time.Millisecond)) {
		t.Fatal("no token after 1/rate")
	}
	if r.allow("a", now.Add(100*time.Millisecond)) {
		t.Fatal("second token after 1/rate")
	}
}

// TestConfigLimitsValidate checks that every limit names itself when invalid.
func TestConfigLimitsValidate(t *testing.T) {
	for _, c := range []struct {
		cfg  ServerConfig
		name string
	}{
		{ServerConfig{Config: Config{MaxPeers: -1}}, "MaxPeers"},
		{ServerConfig{Config: Config{MaxOpsPerPeer: -1}}, "MaxOpsPerPeer"},
		{ServerConfig{Config: Config{ResumeGrace: -1}}, "ResumeGrace"},
		{ServerConfig{MaxFrame: -1}, "MaxFrame"},
		{ServerConfig{MaxFrame: maxFrameLimit + 1}, "MaxFrame"},
		{ServerConfig{HandshakeRate: -1}, "HandshakeRate"},
		{ServerConfig{HandshakeBurst: -1}, "HandshakeBurst"},
		{ServerConfig{SendQueue: -1}, "SendQueue"},
	} {
		err := c.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.name) {
			t.Errorf("%+v: error %v, want one naming %s", c.cfg, err, c.name)
		}
	}
	if err := (ServerConfig{}).Validate(); err != nil {
		t.Errorf("zero config: %v", err)
	}
}

// TestJunkIsKickedOthersUnaffected connects two well-behaved peers, then junk: a connection that
// sends no handshake, one that sends a frame that does not decode, one with an oversized frame, one
// whose first message is not a Hello, and one with the wrong run token. Each junk connection that
// completed the handshake is told why it is closed; the peers keep being answered, and the master
// still counts both of them.
func TestJunkIsKickedOthersUnaffected(t *testing.T) {
	defer goleak.VerifyNone(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(ServerConfig{Config: Config{Token: "tok"}, MaxFrame: 1 << 16})
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
	a, _ := dialHello(t, addr, &wire.Hello{Token: "tok", Addr: "127.0.0.1:1", Peer: 1})
	defer a.Close()
	b, _ := dialHello(t, addr, &wire.Hello{Token: "tok", Addr: "127.0.0.1:2", Peer: 2})
	defer b.Close()

	junk := func(payload []byte, handshake bool) (string, bool) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if handshake {
			if err := wire.Exchange(c, wire.KindControl); err != nil {
				t.Fatal(err)
			}
		}
		c.Write(payload)
		msg, _, err := wire.ReadFrame(c, 0, nil)
		if _, ok := msg.(*wire.SessionStart); ok {
			msg, _, err = wire.ReadFrame(c, 0, nil)
		}
		if err != nil {
			return err.Error(), false
		}
		k, ok := msg.(*wire.Kick)
		if !ok {
			t.Fatalf("junk answered with %T", msg)
		}
		return k.Reason, true
	}
	if r, kicked := junk([]byte("GET / HTTP/1.1\r\n\r\n"), false); kicked {
		t.Errorf("a connection without a handshake got a Kick: %s", r)
	}
	garbage := []byte{0, 0, 0, 3, 1, 0xff, 0xff} // a Hello whose token length runs past the frame
	if r, kicked := junk(garbage, true); !kicked || !strings.Contains(r, "malformed") {
		t.Errorf("garbage: kicked %v, %q", kicked, r)
	}
	huge := binary.BigEndian.AppendUint32(nil, 1<<20)
	if r, kicked := junk(append(huge, 1), true); !kicked || !strings.Contains(r, "malformed") {
		t.Errorf("oversized frame: kicked %v, %q", kicked, r)
	}
	if r, kicked := junk(wire.AppendFrame(nil, &wire.VotePending{}), true); !kicked || !strings.Contains(r, "want Hello") {
		t.Errorf("no hello: kicked %v, %q", kicked, r)
	}
	if r, kicked := junk(wire.AppendFrame(nil, &wire.Hello{Token: "nope", Addr: "127.0.0.1:3"}), true); !kicked || !strings.Contains(r, "token") {
		t.Errorf("wrong token: kicked %v, %q", kicked, r)
	}
	for i, c := range []net.Conn{a, b} {
		if _, err := c.Write(wire.AppendFrame(nil, &wire.Heartbeat{Seq: 9})); err != nil {
			t.Fatalf("peer %d: %v", i+1, err)
		}
		for {
			msg, _, err := wire.ReadFrame(c, 0, nil)
			if err != nil {
				t.Fatalf("peer %d after the junk: %v", i+1, err)
			}
			if ack, ok := msg.(*wire.HeartbeatAck); ok && ack.Seq == 9 {
				break
			}
			if k, ok := msg.(*wire.Kick); ok {
				t.Fatalf("peer %d kicked: %s", i+1, k.Reason)
			}
		}
	}
	if n := len(srv.Snapshot().Peers); n != 2 {
		t.Fatalf("%d peers after the junk, want 2", n)
	}
}
