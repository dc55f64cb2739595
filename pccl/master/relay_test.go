package master

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/wire"
)

// dialRelay opens a relay connection to addr and sends its CallHello.
func dialRelay(t *testing.T, addr, token string, key wire.RendezvousKey) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := wire.Exchange(c, wire.KindRelay); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(wire.AppendFrame(nil, &wire.CallHello{Token: token, Key: key})); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRelay checks over loopback that the master joins the two ends of a relayed link byte for byte,
// both ways, passes on a half-close, counts the bytes, and refuses an end with the wrong run token
// without disturbing the others.
func TestRelay(t *testing.T) {
	defer goleak.VerifyNone(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(ServerConfig{Config: Config{Token: "run"}})
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

	bad := dialRelay(t, addr, "other run", wire.RendezvousKey{1})
	defer bad.Close()
	if n, err := bad.Read(make([]byte, 1)); err == nil {
		t.Fatalf("an end with the wrong token read %d bytes, want the connection closed", n)
	}

	a := dialRelay(t, addr, "run", wire.RendezvousKey{1})
	defer a.Close()
	b := dialRelay(t, addr, "run", wire.RendezvousKey{1})
	defer b.Close()
	up := bytes.Repeat([]byte("a->b "), 100000)
	down := bytes.Repeat([]byte("b->a "), 1000)
	go func() {
		a.Write(up)
		a.(*net.TCPConn).CloseWrite()
	}()
	if _, err := b.Write(down); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(b)
	if err != nil || !bytes.Equal(got, up) {
		t.Fatalf("b read %d bytes (%v), want the %d a wrote, then EOF", len(got), err, len(up))
	}
	back := make([]byte, len(down))
	if _, err := io.ReadFull(a, back); err != nil || !bytes.Equal(back, down) {
		t.Fatalf("a read %q (%v)", back[:min(len(back), 20)], err)
	}
	b.Close()
	if _, err := a.Read(make([]byte, 1)); err == nil {
		t.Fatal("a is still open after b closed")
	}
	s := srv.Snapshot().Relay
	if s.Links != 1 || s.Bytes != uint64(len(up)+len(down)) || s.Refused != 1 {
		t.Fatalf("relay stats %+v, want 1 link, %d bytes, 1 refused", s, len(up)+len(down))
	}
}
