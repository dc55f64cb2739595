package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestQUICDialFrom dials from one listener's socket to another: the accepting end sees the
// connection come from the dialling listener's own address, bytes flow both ways, the dialled
// connection outlives its listener's Close, and punch datagrams are dropped without harm.
func TestQUICDialFrom(t *testing.T) {
	tr := NewQUIC(QUICConfig{Auth: AuthConfig{Secret: testSecret}})
	a, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	p, ok := a.(Puncher)
	if !ok {
		t.Fatalf("%T is no Puncher", a)
	}
	for range 3 {
		if err := p.Punch(b.Addr().String()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type accepted struct {
		c   net.Conn
		err error
	}
	got := make(chan accepted, 1)
	go func() {
		c, err := b.Accept()
		got <- accepted{c, err}
	}()
	c, err := p.DialFrom(ctx, b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.c.Close()
	if r.c.RemoteAddr().String() != a.Addr().String() {
		t.Fatalf("accepted from %v, want the dialling listener's %v", r.c.RemoteAddr(), a.Addr())
	}
	// The dialled connection keeps the socket after its listener closes.
	a.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(r.c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read %q, %v", buf, err)
	}
	if _, err := r.c.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("read %q, %v", buf, err)
	}
	c.Close()
	if _, err := p.DialFrom(ctx, b.Addr().String()); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("DialFrom on a closed listener: %v, want net.ErrClosed", err)
	}
}
