package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// conformanceSetup gives a server transport, the address to listen on, and a client transport.
type conformanceSetup struct {
	server     Transport
	listenAddr string
	client     Transport
}

// testConformance checks the behaviour every Transport must share.
func testConformance(t *testing.T, setup func(t *testing.T) conformanceSetup) {
	t.Run("Echo", func(t *testing.T) {
		s := setup(t)
		c, p := dialAccept(t, s)
		msg := []byte("hello, ring")
		go func() {
			buf := make([]byte, len(msg))
			if _, err := io.ReadFull(p, buf); err == nil {
				p.Write(buf)
			}
		}()
		if _, err := c.Write(msg); err != nil {
			t.Fatalf("Write: %v", err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatalf("ReadFull: %v", err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("echo = %q, want %q", got, msg)
		}
	})

	t.Run("FullDuplex", func(t *testing.T) {
		s := setup(t)
		c, p := dialAccept(t, s)
		up, down := randomBytes(1, 1<<20), randomBytes(2, 1<<20)
		var wg sync.WaitGroup
		var gotUp, gotDown []byte
		var errs [4]error
		wg.Add(4)
		go func() { defer wg.Done(); _, errs[0] = c.Write(up) }()
		go func() { defer wg.Done(); _, errs[1] = p.Write(down) }()
		go func() { defer wg.Done(); gotUp, errs[2] = readN(p, len(up)) }()
		go func() { defer wg.Done(); gotDown, errs[3] = readN(c, len(down)) }()
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("goroutine %d: %v", i, err)
			}
		}
		if !bytes.Equal(gotUp, up) || !bytes.Equal(gotDown, down) {
			t.Fatal("bytes differ after a full-duplex transfer")
		}
	})

	t.Run("CloseGivesEOFAfterData", func(t *testing.T) {
		s := setup(t)
		c, p := dialAccept(t, s)
		if _, err := c.Write([]byte("tail")); err != nil {
			t.Fatalf("Write: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		got, err := io.ReadAll(p)
		if err != nil || string(got) != "tail" {
			t.Fatalf("ReadAll = %q, %v; want \"tail\", nil", got, err)
		}
		if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Write after Close: %v, want net.ErrClosed", err)
		}
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read after Close: %v, want net.ErrClosed", err)
		}
	})

	t.Run("PastDeadlineUnblocksRead", func(t *testing.T) {
		s := setup(t)
		c, _ := dialAccept(t, s)
		done := make(chan error)
		go func() {
			_, err := c.Read(make([]byte, 1))
			done <- err
		}()
		time.Sleep(time.Millisecond) // let the Read block; the test is correct either way
		c.SetReadDeadline(time.Now().Add(-time.Second))
		err := <-done
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read: %v, want os.ErrDeadlineExceeded", err)
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("Read error %v is not a net.Error with Timeout", err)
		}
	})

	t.Run("ListenerClose", func(t *testing.T) {
		s := setup(t)
		l, err := s.server.Listen(s.listenAddr)
		if err != nil {
			t.Fatalf("Listen: %v", err)
		}
		addr := l.Addr().String()
		accepted := make(chan error)
		go func() {
			_, err := l.Accept()
			accepted <- err
		}()
		time.Sleep(time.Millisecond) // let Accept block; the test is correct either way
		if err := l.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := <-accepted; !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
		if err := l.Close(); err != nil {
			t.Fatalf("second Close: %v, want nil", err)
		}
		if _, err := s.client.Dial(context.Background(), addr); !errors.Is(err, ErrRefused) {
			t.Fatalf("Dial to closed listener: %v, want ErrRefused", err)
		}
	})

	t.Run("DialCancelled", func(t *testing.T) {
		s := setup(t)
		l, err := s.server.Listen(s.listenAddr)
		if err != nil {
			t.Fatalf("Listen: %v", err)
		}
		defer l.Close()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := s.client.Dial(ctx, l.Addr().String()); !errors.Is(err, context.Canceled) {
			t.Fatalf("Dial with cancelled ctx: %v, want context.Canceled", err)
		}
	})
}

// dialAccept connects the setup's client to a fresh listener and returns both ends, closed at the
// end of the test.
func dialAccept(t *testing.T, s conformanceSetup) (client, server net.Conn) {
	return dialAcceptB(t, s)
}

// dialAcceptB is dialAccept for tests and benchmarks alike.
func dialAcceptB(t testing.TB, s conformanceSetup) (client, server net.Conn) {
	t.Helper()
	l, err := s.server.Listen(s.listenAddr)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	defer l.Close()
	type result struct {
		c   net.Conn
		err error
	}
	acc := make(chan result, 1)
	go func() {
		c, err := l.Accept()
		acc <- result{c, err}
	}()
	client, err = s.client.Dial(context.Background(), l.Addr().String())
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	r := <-acc
	if r.err != nil {
		client.Close()
		t.Fatalf("Accept: %v", r.err)
	}
	t.Cleanup(func() {
		client.Close()
		r.c.Close()
	})
	return client, r.c
}

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func readN(r io.Reader, n int) ([]byte, error) {
	b := make([]byte, n)
	_, err := io.ReadFull(r, b)
	return b, err
}

// crosses writes msg to w and checks that r reads it back whole; what says which way it goes.
func crosses(t *testing.T, w io.Writer, r io.Reader, msg, what string) {
	t.Helper()
	if _, err := w.Write([]byte(msg)); err != nil {
		t.Fatalf("Write %s: %v", what, err)
	}
	if got, err := readN(r, len(msg)); err != nil || string(got) != msg {
		t.Fatalf("read %s %q, %v; want %q", what, got, err, msg)
	}
}

func TestConformanceTCP(t *testing.T) {
	testConformance(t, func(t *testing.T) conformanceSetup {
		tr := NewTCP(TCPConfig{})
		return conformanceSetup{server: tr, listenAddr: "127.0.0.1:0", client: tr}
	})
}

// TestConformanceTCPNoLocal runs the same tests on loopback TCP itself: TestConformanceTCP's
// connections take the local path (a unix socket).
func TestConformanceTCPNoLocal(t *testing.T) {
	testConformance(t, func(t *testing.T) conformanceSetup {
		tr := NewTCP(TCPConfig{DisableLocal: true})
		return conformanceSetup{server: tr, listenAddr: "127.0.0.1:0", client: tr}
	})
}

func TestConformanceMem(t *testing.T) {
	testConformance(t, func(t *testing.T) conformanceSetup {
		n := NewNetwork()
		return conformanceSetup{server: n.Host("b"), listenAddr: "b:0", client: n.Host("a")}
	})
}
