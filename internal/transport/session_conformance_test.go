package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

// sessionSetup is what the session conformance tests need of a transport.
type sessionSetup struct {
	conformanceSetup
	// datagrams tells whether sessions carry datagrams.
	datagrams bool
	// native tells that sessions are not built on byte streams with preambles (QUIC), so the tests
	// of preambles do not apply.
	native bool
}

// testSessionConformance checks the session behaviour every Transport must share. wrap runs each test
// body: directly, or inside a synctest bubble.
func testSessionConformance(t *testing.T, wrap func(t *testing.T, body func(t *testing.T)), setup func() sessionSetup) {
	run := func(name string, body func(t *testing.T, s sessionSetup)) {
		t.Run(name, func(t *testing.T) {
			wrap(t, func(t *testing.T) { body(t, setup()) })
		})
	}

	run("ManyStreamsBothWays", func(t *testing.T, s sessionSetup) {
		cs, ss := sessionPair(t, s)
		const perSide = 12
		var wg sync.WaitGroup
		// Each side opens perSide streams and sends a distinct payload on each; the other side accepts
		// them and echoes every byte back.
		for side, pair := range [][2]Session{{cs, ss}, {ss, cs}} {
			opener, acceptor := pair[0], pair[1]
			wg.Add(2)
			go func() {
				defer wg.Done()
				var echoes sync.WaitGroup
				for range perSide {
					st, err := acceptor.AcceptStream(context.Background())
					if err != nil {
						t.Errorf("side %d: AcceptStream: %v", side, err)
						break
					}
					echoes.Add(1)
					go func() {
						defer echoes.Done()
						defer st.Close()
						if _, err := io.Copy(st, st); err != nil {
							t.Errorf("side %d: echo: %v", side, err)
						}
					}()
				}
				echoes.Wait()
			}()
			go func() {
				defer wg.Done()
				var streams sync.WaitGroup
				for i := range perSide {
					streams.Add(1)
					go func() {
						defer streams.Done()
						st, err := opener.OpenStream(context.Background())
						if err != nil {
							t.Errorf("side %d stream %d: OpenStream: %v", side, i, err)
							return
						}
						defer st.Close()
						msg := randomBytes(uint64(100*side+i), 20_000+i*1000)
						go func() {
							st.Write(msg)
							st.(interface{ CloseWrite() error }).CloseWrite()
						}()
						got, err := io.ReadAll(st)
						if err != nil {
							t.Errorf("side %d stream %d: ReadAll: %v", side, i, err)
							return
						}
						if !bytes.Equal(got, msg) {
							t.Errorf("side %d stream %d: echo of %d bytes differs (got %d)", side, i, len(msg), len(got))
						}
					}()
				}
				streams.Wait()
			}()
		}
		wg.Wait()
	})

	run("Addrs", func(t *testing.T, s sessionSetup) {
		cs, ss := sessionPair(t, s)
		if cs.RemoteAddr().String() != ss.LocalAddr().String() || ss.RemoteAddr().String() != cs.LocalAddr().String() {
			t.Fatalf("client %v->%v, server %v->%v", cs.LocalAddr(), cs.RemoteAddr(), ss.LocalAddr(), ss.RemoteAddr())
		}
	})

	run("CloseSemantics", func(t *testing.T, s sessionSetup) {
		cs, ss := sessionPair(t, s)
		st, peer := openStream(t, cs, ss, "last")
		if err := cs.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := cs.Close(); err != nil {
			t.Fatalf("second Close: %v, want nil", err)
		}
		// Data written before the close still arrives, then EOF: Close closed the stream.
		if got, err := io.ReadAll(peer); err != nil || string(got) != "last" {
			t.Fatalf("peer ReadAll = %q, %v; want \"last\", nil", got, err)
		}
		if _, err := st.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read on a stream of a closed session: %v, want net.ErrClosed", err)
		}
		if _, err := cs.OpenStream(context.Background()); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("OpenStream after Close: %v, want net.ErrClosed", err)
		}
		if _, err := cs.AcceptStream(context.Background()); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("AcceptStream after Close: %v, want net.ErrClosed", err)
		}
		// The peer learns of the close.
		if _, err := ss.AcceptStream(context.Background()); !errors.Is(err, ErrSessionClosed) {
			t.Fatalf("peer AcceptStream: %v, want ErrSessionClosed", err)
		}
		if _, err := ss.OpenStream(context.Background()); !errors.Is(err, ErrSessionClosed) {
			t.Fatalf("peer OpenStream: %v, want ErrSessionClosed", err)
		}
		if err := ss.SendDatagram([]byte("x")); !errors.Is(err, ErrSessionClosed) && !errors.Is(err, ErrNoDatagrams) {
			t.Fatalf("peer SendDatagram: %v, want ErrSessionClosed or ErrNoDatagrams", err)
		}
	})

	run("BlockedCallsEndOnClose", func(t *testing.T, s sessionSetup) {
		cs, _ := sessionPair(t, s)
		errs := make(chan error, 2)
		go func() {
			_, err := cs.AcceptStream(context.Background())
			errs <- err
		}()
		go func() {
			_, err := cs.ReceiveDatagram(context.Background())
			if errors.Is(err, ErrNoDatagrams) {
				err = net.ErrClosed
			}
			errs <- err
		}()
		waitABit()
		cs.Close()
		for range 2 {
			if err := <-errs; !errors.Is(err, net.ErrClosed) {
				t.Fatalf("blocked call after Close: %v, want net.ErrClosed", err)
			}
		}
	})

	run("ContextEndsWaits", func(t *testing.T, s sessionSetup) {
		cs, ss := sessionPair(t, s)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := cs.AcceptStream(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("AcceptStream: %v, want context.Canceled", err)
		}
		if _, err := ss.OpenStream(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("accepting side OpenStream: %v, want context.Canceled", err)
		}
		if _, err := cs.OpenStream(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("dialling side OpenStream: %v, want context.Canceled", err)
		}
		// The session is still fine.
		st, err := ss.OpenStream(context.Background())
		if err != nil {
			t.Fatalf("OpenStream after a cancelled one: %v", err)
		}
		st.Close()
	})

	run("Datagrams", func(t *testing.T, s sessionSetup) {
		cs, ss := sessionPair(t, s)
		if !s.datagrams {
			if err := cs.SendDatagram([]byte("x")); !errors.Is(err, ErrNoDatagrams) {
				t.Fatalf("SendDatagram: %v, want ErrNoDatagrams", err)
			}
			if _, err := ss.ReceiveDatagram(context.Background()); !errors.Is(err, ErrNoDatagrams) {
				t.Fatalf("ReceiveDatagram: %v, want ErrNoDatagrams", err)
			}
			return
		}
		for i := range 5 {
			msg := []byte(fmt.Sprintf("datagram %d", i))
			if err := cs.SendDatagram(msg); err != nil {
				t.Fatalf("SendDatagram: %v", err)
			}
			copy(msg, "XXXX") // SendDatagram copied it
		}
		for i := range 5 {
			got, err := ss.ReceiveDatagram(context.Background())
			if want := fmt.Sprintf("datagram %d", i); err != nil || string(got) != want {
				t.Fatalf("ReceiveDatagram = %q, %v; want %q", got, err, want)
			}
		}
		if err := ss.SendDatagram(make([]byte, MaxDatagramSize)); err != nil {
			t.Fatalf("SendDatagram of MaxDatagramSize: %v", err)
		}
		if got, err := cs.ReceiveDatagram(context.Background()); err != nil || len(got) != MaxDatagramSize {
			t.Fatalf("ReceiveDatagram = %d bytes, %v; want %d", len(got), err, MaxDatagramSize)
		}
		if err := ss.SendDatagram(make([]byte, MaxDatagramSize+1)); !errors.Is(err, ErrDatagramTooLarge) {
			t.Fatalf("SendDatagram too large: %v, want ErrDatagramTooLarge", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := cs.ReceiveDatagram(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("ReceiveDatagram with a cancelled ctx: %v, want context.Canceled", err)
		}
	})

	run("ListenerClose", func(t *testing.T, s sessionSetup) {
		l, err := s.server.ListenSession(s.listenAddr)
		if err != nil {
			t.Fatalf("ListenSession: %v", err)
		}
		addr := l.Addr().String()
		cs, err := s.client.DialSession(context.Background(), addr)
		if err != nil {
			t.Fatalf("DialSession: %v", err)
		}
		defer cs.Close()
		ss, err := l.Accept(context.Background())
		if err != nil {
			t.Fatalf("Accept: %v", err)
		}
		accepted := make(chan error, 1)
		go func() {
			_, err := l.Accept(context.Background())
			accepted <- err
		}()
		waitABit()
		if err := l.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := <-accepted; !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
		if err := l.Close(); err != nil {
			t.Fatalf("second Close: %v, want nil", err)
		}
		// The accepted session was closed with the listener.
		if _, err := ss.AcceptStream(context.Background()); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("AcceptStream on a session of a closed listener: %v, want net.ErrClosed", err)
		}
		if _, err := cs.AcceptStream(context.Background()); !errors.Is(err, ErrSessionClosed) {
			t.Fatalf("peer AcceptStream: %v, want ErrSessionClosed", err)
		}
		if _, err := s.client.DialSession(context.Background(), addr); !errors.Is(err, ErrRefused) {
			t.Fatalf("DialSession to a closed listener: %v, want ErrRefused", err)
		}
	})

	run("DialCancelled", func(t *testing.T, s sessionSetup) {
		l, err := s.server.ListenSession(s.listenAddr)
		if err != nil {
			t.Fatalf("ListenSession: %v", err)
		}
		defer l.Close()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := s.client.DialSession(ctx, l.Addr().String()); !errors.Is(err, context.Canceled) {
			t.Fatalf("DialSession with a cancelled ctx: %v, want context.Canceled", err)
		}
		ctx, cancel = context.WithCancel(context.Background())
		cancel()
		if _, err := l.Accept(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Accept with a cancelled ctx: %v, want context.Canceled", err)
		}
	})

	run("NotASessionListener", func(t *testing.T, s sessionSetup) {
		if s.native {
			t.Skip("no preambles")
		}
		// A plain listener that reads the preamble and hangs up: the dial is refused.
		l, err := s.server.Listen(s.listenAddr)
		if err != nil {
			t.Fatalf("Listen: %v", err)
		}
		defer l.Close()
		done := make(chan struct{})
		go func() {
			defer close(done)
			c, err := l.Accept()
			if err != nil {
				return
			}
			readN(c, preambleSize)
			c.Close()
		}()
		if _, err := s.client.DialSession(context.Background(), l.Addr().String()); !errors.Is(err, ErrRefused) {
			t.Fatalf("DialSession to a plain listener: %v, want ErrRefused", err)
		}
		<-done
	})

	run("BadPreamblesDisturbNothing", func(t *testing.T, s sessionSetup) {
		if s.native {
			t.Skip("no preambles")
		}
		l, err := s.server.ListenSession(s.listenAddr)
		if err != nil {
			t.Fatalf("ListenSession: %v", err)
		}
		defer l.Close()
		addr := l.Addr().String()
		cs, err := s.client.DialSession(context.Background(), addr)
		if err != nil {
			t.Fatalf("DialSession: %v", err)
		}
		defer cs.Close()
		ss, err := l.Accept(context.Background())
		if err != nil {
			t.Fatalf("Accept: %v", err)
		}
		defer ss.Close()

		good := appendPreamble(nil, preamble{id: newSessionID(), index: 2}) // a session nobody knows
		bad := [][]byte{
			[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
			append([]byte("CNSS\x02\x14"), make([]byte, 20)...), // version 2
			append([]byte("CNSS\x01\x15"), make([]byte, 20)...), // wrong body length
			good,
		}
		for i, b := range bad {
			c, err := s.client.Dial(context.Background(), addr)
			if err != nil {
				t.Fatalf("Dial: %v", err)
			}
			if _, err := c.Write(b); err != nil {
				t.Fatalf("Write: %v", err)
			}
			// The listener hangs up without answering.
			if got, err := io.ReadAll(c); len(got) != 0 || err != nil && !errors.Is(err, ErrReset) {
				t.Fatalf("bad preamble %d: read %q, %v; want a hang-up", i, got, err)
			}
			c.Close()
		}
		// The existing session and new ones are unaffected.
		checkStream(t, cs, ss)
		cs2, err := s.client.DialSession(context.Background(), addr)
		if err != nil {
			t.Fatalf("DialSession after bad preambles: %v", err)
		}
		defer cs2.Close()
		ss2, err := l.Accept(context.Background())
		if err != nil {
			t.Fatalf("Accept: %v", err)
		}
		defer ss2.Close()
		checkStream(t, ss2, cs2)
	})
}

// sessionPair dials a session to a fresh listener and returns both ends. The listener and sessions
// close at the end of the test.
func sessionPair(t *testing.T, s sessionSetup) (client, server Session) {
	t.Helper()
	l, err := s.server.ListenSession(s.listenAddr)
	if err != nil {
		t.Fatalf("ListenSession: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	client, err = s.client.DialSession(context.Background(), l.Addr().String())
	if err != nil {
		t.Fatalf("DialSession: %v", err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = l.Accept(context.Background())
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	t.Cleanup(func() { server.Close() })
	return client, server
}

// checkStream opens a stream from a to b and checks that a message crosses it.
func checkStream(t *testing.T, a, b Session) {
	t.Helper()
	st, peer := openStream(t, a, b, "still here")
	defer st.Close()
	defer peer.Close()
	if got, err := readN(peer, len("still here")); err != nil || string(got) != "still here" {
		t.Fatalf("read %q, %v", got, err)
	}
}

// openStream opens a stream from a, writes msg on it and accepts it at b. The caller closes both
// ends.
func openStream(t *testing.T, a, b Session, msg string) (st, peer net.Conn) {
	t.Helper()
	st, err := a.OpenStream(context.Background())
	if err != nil {
		t.Fatalf("OpenStream: %v", err)
	}
	if _, err := st.Write([]byte(msg)); err != nil {
		st.Close()
		t.Fatalf("Write: %v", err)
	}
	peer, err = b.AcceptStream(context.Background())
	if err != nil {
		st.Close()
		t.Fatalf("AcceptStream: %v", err)
	}
	return st, peer
}

// waitABit gives goroutines time to block; the tests that call it are correct either way. Inside a
// synctest bubble it returns once every goroutine is blocked.
func waitABit() {
	time.Sleep(time.Millisecond)
}

// direct runs body as it is, and checks afterwards, once the test's cleanups have closed everything,
// that no goroutine is left.
func direct(t *testing.T, body func(t *testing.T)) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // registered first, so it runs last
	body(t)
}

func inBubble(t *testing.T, body func(t *testing.T)) {
	synctest.Test(t, body)
}

func TestSessionConformanceTCP(t *testing.T) {
	testSessionConformance(t, direct, func() sessionSetup {
		tr := NewTCP(TCPConfig{})
		return sessionSetup{conformanceSetup: conformanceSetup{server: tr, listenAddr: "127.0.0.1:0", client: tr}}
	})
}

func TestSessionConformanceTCPNoLocal(t *testing.T) {
	testSessionConformance(t, direct, func() sessionSetup {
		tr := NewTCP(TCPConfig{DisableLocal: true})
		return sessionSetup{conformanceSetup: conformanceSetup{server: tr, listenAddr: "127.0.0.1:0", client: tr}}
	})
}

func memSessionSetup() sessionSetup {
	n := NewNetwork()
	return sessionSetup{
		conformanceSetup: conformanceSetup{server: n.Host("b"), listenAddr: "b:0", client: n.Host("a")},
		datagrams:        true,
	}
}

func TestSessionConformanceMem(t *testing.T) {
	testSessionConformance(t, direct, memSessionSetup)
}

// TestSessionConformanceMemSynctest runs the same tests inside synctest bubbles, where every goroutine
// of the session machinery must block durably and exit by the end.
func TestSessionConformanceMemSynctest(t *testing.T) {
	testSessionConformance(t, inBubble, memSessionSetup)
}
