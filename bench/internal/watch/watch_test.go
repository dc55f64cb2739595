package watch

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/pccl"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFarEndClose checks that a close by the far end is observed on both a dialled and an accepted
// connection, and that a close of one's own is not, over loopback TCP and over the TCP transport's
// local path.
func TestFarEndClose(t *testing.T) {
	t.Run("tcp", func(t *testing.T) { testFarEndClose(t, true) })
	t.Run("local", func(t *testing.T) { testFarEndClose(t, false) })
}

func testFarEndClose(t *testing.T, tcp bool) {
	tr := New(pccl.NewTCP(pccl.TCPConfig{DisableLocal: tcp}))
	d, a := pair(t, tr, tcp)

	// Our own close: the read fails with net.ErrClosed, which is no observation.
	a2 := a
	d.Close()
	if _, err := d.Read(make([]byte, 1)); err == nil {
		t.Fatal("read on a closed connection succeeded")
	}
	if g := tr.Gone(); g != 0 {
		t.Errorf("Gone after closing our own end = %d, want 0", g)
	}
	// The far end closed: the accepted side reads end of file.
	before := time.Now().UnixNano()
	if _, err := a2.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read after the far end closed: %v, want io.EOF", err)
	}
	if g := tr.Gone(); g < before {
		t.Errorf("Gone = %d, want at least %d", g, before)
	}
	a2.Close()
	tr.Reset()
	if g := tr.Gone(); g != 0 {
		t.Errorf("Gone after Reset = %d, want 0", g)
	}
}

// TestFarEndCloseBulk checks that the bulk I/O of data frames, which runs on the socket beneath the
// wrapper, is watched too: a frame arrives whole, and the far end's close is observed.
func TestFarEndCloseBulk(t *testing.T) {
	for _, tcp := range []bool{true, false} {
		tr := New(pccl.NewTCP(pccl.TCPConfig{DisableLocal: tcp}))
		d, a := pair(t, tr, tcp)
		frame := make([]byte, 3<<20)
		for i := range frame {
			frame[i] = byte(i % 251)
		}
		go func() {
			bufs := net.Buffers{frame}
			transport.WriteBuffers(d, &bufs)
			d.Close()
		}()
		got := make([]byte, len(frame))
		if _, err := transport.ReadFull(a, got); err != nil || !bytes.Equal(got, frame) {
			t.Fatalf("tcp %v: frame read with %v, equal %v", tcp, err, bytes.Equal(got, frame))
		}
		if g := tr.Gone(); g != 0 {
			t.Errorf("tcp %v: Gone after a whole frame = %d, want 0", tcp, g)
		}
		before := time.Now().UnixNano()
		if _, err := transport.ReadFull(a, got[:1]); err != io.EOF {
			t.Fatalf("tcp %v: read after the far end closed: %v, want io.EOF", tcp, err)
		}
		if g := tr.Gone(); g < before {
			t.Errorf("tcp %v: Gone = %d, want at least %d", tcp, g, before)
		}
		a.Close()
	}
}

// pair returns a dialled and an accepted connection of tr, each of the wrapper for loopback TCP or,
// with tcp false, for the local path.
func pair(t *testing.T, tr *Transport, tcp bool) (d, a net.Conn) {
	t.Helper()
	ln, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if d, err = tr.Dial(ctx, ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	a, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	if _, ok := a.(*tcpConn); tcp && !ok {
		t.Errorf("accepted connection is %T, want the TCP wrapper", a)
	}
	if _, ok := a.(*unixConn); !tcp && !ok {
		t.Errorf("accepted connection is %T, want the unix socket wrapper", a)
	}
	if _, ok := a.(transport.SocketWrapper); !ok {
		t.Errorf("accepted connection %T is no transport.SocketWrapper", a)
	}
	return d, a
}

func TestFarEnd(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{io.EOF, true}, {io.ErrUnexpectedEOF, true}, {net.ErrClosed, false}, {context.DeadlineExceeded, false},
		{&net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		{&net.OpError{Op: "write", Err: os.NewSyscallError("write", syscall.EPIPE)}, true},
		{os.ErrDeadlineExceeded, false},
	} {
		if got := FarEnd(c.err); got != c.want {
			t.Errorf("FarEnd(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
