package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"testing/synctest"
	"time"
)

// memSessionPair listens for sessions on host to, dials one from host from, and returns both ends; they
// and the listener close at the end of the test.
func memSessionPair(t *testing.T, n *Network, from, to string) (client, server Session, l SessionListener) {
	t.Helper()
	l, err := n.Host(to).ListenSession(to + ":0")
	if err != nil {
		t.Fatalf("ListenSession: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	client, err = n.Host(from).DialSession(context.Background(), l.Addr().String())
	if err != nil {
		t.Fatalf("DialSession: %v", err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = l.Accept(context.Background())
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	t.Cleanup(func() { server.Close() })
	return client, server, l
}

// elapsedIs fails the test unless exactly want of fake time passed since start.
func elapsedIs(t *testing.T, what string, start time.Time, want time.Duration) {
	t.Helper()
	if got := time.Since(start); got != want {
		t.Fatalf("%s took %v of fake time, want %v", what, got, want)
	}
}

// TestSynctestLatency runs a dial/accept/echo and a session with streams and datagrams inside a
// synctest bubble over links with latency, and checks every step against the fake clock.
func TestSynctestLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lat = 25 * time.Millisecond
		n := NewNetwork()
		n.SetLink("a", "b", LinkConfig{Latency: lat})
		n.SetLink("b", "a", LinkConfig{Latency: lat})

		// A plain connection: one way takes the latency, a round trip twice it.
		c, s := memPair(t, n, "a", "b")
		start := time.Now()
		go func() {
			buf, err := readN(s, 4)
			if err == nil {
				elapsedIs(t, "one way", start, lat)
				_, err = s.Write(buf)
			}
			if err != nil {
				t.Errorf("echo: %v", err)
			}
		}()
		crosses(t, c, c, "ping", "through the echo")
		elapsedIs(t, "round trip", start, 2*lat)

		// A session: the handshake is a round trip (preamble, answer).
		l, err := n.Host("b").ListenSession("b:0")
		if err != nil {
			t.Fatalf("ListenSession: %v", err)
		}
		defer l.Close()
		start = time.Now()
		cs, err := n.Host("a").DialSession(context.Background(), l.Addr().String())
		if err != nil {
			t.Fatalf("DialSession: %v", err)
		}
		defer cs.Close()
		elapsedIs(t, "DialSession", start, 2*lat)
		ss, err := l.Accept(context.Background())
		if err != nil {
			t.Fatalf("Accept: %v", err)
		}
		defer ss.Close()
		elapsedIs(t, "Accept after DialSession", start, 2*lat)

		// A stream the dialling end opens is local at once and reaches the peer one way later.
		start = time.Now()
		st, err := cs.OpenStream(context.Background())
		if err != nil {
			t.Fatalf("OpenStream: %v", err)
		}
		defer st.Close()
		elapsedIs(t, "OpenStream on the dialling end", start, 0)
		if _, err := st.Write([]byte("data")); err != nil {
			t.Fatalf("Write: %v", err)
		}
		ps, err := ss.AcceptStream(context.Background())
		if err != nil {
			t.Fatalf("AcceptStream: %v", err)
		}
		defer ps.Close()
		if got, err := readN(ps, 4); err != nil || string(got) != "data" {
			t.Fatalf("read %q, %v", got, err)
		}
		elapsedIs(t, "stream open and first bytes", start, lat)

		// A stream the accepting end opens is dialled by the other end on request: a round trip.
		start = time.Now()
		accepted := make(chan net.Conn, 1)
		go func() {
			st, err := cs.AcceptStream(context.Background())
			if err != nil {
				t.Errorf("AcceptStream: %v", err)
			}
			elapsedIs(t, "AcceptStream on the dialling end", start, lat)
			accepted <- st
		}()
		st2, err := ss.OpenStream(context.Background())
		if err != nil {
			t.Fatalf("OpenStream on the accepting end: %v", err)
		}
		defer st2.Close()
		elapsedIs(t, "OpenStream on the accepting end", start, 2*lat)
		if ps2 := <-accepted; ps2 != nil {
			ps2.Close()
		}

		// A datagram takes the latency, both ways.
		for _, pair := range [][2]Session{{cs, ss}, {ss, cs}} {
			start = time.Now()
			if err := pair[0].SendDatagram([]byte("dgram")); err != nil {
				t.Fatalf("SendDatagram: %v", err)
			}
			if got, err := pair[1].ReceiveDatagram(context.Background()); err != nil || string(got) != "dgram" {
				t.Fatalf("ReceiveDatagram = %q, %v", got, err)
			}
			elapsedIs(t, "datagram", start, lat)
		}

		// The close reaches the peer one way later.
		start = time.Now()
		cs.Close()
		if _, err := ss.AcceptStream(context.Background()); !errors.Is(err, ErrSessionClosed) {
			t.Fatalf("AcceptStream after the peer closed: %v, want ErrSessionClosed", err)
		}
		elapsedIs(t, "session close", start, lat)
	})
}

// TestSessionHalfOpenTimeout checks that a connection that never completes its preamble is closed
// after handshakeTimeout, and that sessions go on meanwhile.
func TestSessionHalfOpenTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		cs, ss, l := memSessionPair(t, n, "a", "b")
		start := time.Now()
		c, err := n.Host("c").Dial(context.Background(), l.Addr().String())
		if err != nil {
			t.Fatalf("Dial: %v", err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("CNSS")); err != nil { // a third of a preamble
			t.Fatalf("Write: %v", err)
		}
		closed := make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 1))
			closed <- err
		}()
		checkStream(t, cs, ss)
		if err := <-closed; err != io.EOF {
			t.Fatalf("Read on a half-open connection: %v, want io.EOF", err)
		}
		elapsedIs(t, "half-open timeout", start, handshakeTimeout)
		checkStream(t, ss, cs)
	})
}

// TestSessionHandshakeSlots checks that at most maxHandshakes connections are read at once: one more
// session waits until a half-open connection times out.
func TestSessionHandshakeSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		l, err := n.Host("b").ListenSession("b:0")
		if err != nil {
			t.Fatalf("ListenSession: %v", err)
		}
		defer l.Close()
		start := time.Now()
		for range maxHandshakes {
			c, err := n.Host("x").Dial(context.Background(), l.Addr().String())
			if err != nil {
				t.Fatalf("Dial: %v", err)
			}
			defer c.Close()
		}
		time.Sleep(handshakeTimeout / 2)
		cs, err := n.Host("a").DialSession(context.Background(), l.Addr().String())
		if err != nil {
			t.Fatalf("DialSession: %v", err)
		}
		defer cs.Close()
		// The half-open connections time out, which frees the slots.
		elapsedIs(t, "DialSession behind a full handshake table", start, handshakeTimeout)
		ss, err := l.Accept(context.Background())
		if err != nil {
			t.Fatalf("Accept: %v", err)
		}
		ss.Close()
	})
}

// TestSessionQueueBounds checks that a listener refuses sessions beyond maxQueuedSessions unaccepted
// ones, and a session streams beyond maxQueuedStreams, without disturbing the ones queued.
func TestSessionQueueBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		l, err := n.Host("b").ListenSession("b:0")
		if err != nil {
			t.Fatalf("ListenSession: %v", err)
		}
		defer l.Close()
		var clients []Session
		for i := range maxQueuedSessions {
			cs, err := n.Host("a").DialSession(context.Background(), l.Addr().String())
			if err != nil {
				t.Fatalf("DialSession %d: %v", i, err)
			}
			clients = append(clients, cs)
		}
		if _, err := n.Host("a").DialSession(context.Background(), l.Addr().String()); !errors.Is(err, ErrRefused) {
			t.Fatalf("DialSession past the backlog: %v, want ErrRefused", err)
		}
		var servers []Session
		for range maxQueuedSessions {
			ss, err := l.Accept(context.Background())
			if err != nil {
				t.Fatalf("Accept: %v", err)
			}
			servers = append(servers, ss)
		}
		cs, ss := clients[0], servers[0]

		var streams []net.Conn
		for range maxQueuedStreams + 1 {
			st, err := cs.OpenStream(context.Background())
			if err != nil {
				t.Fatalf("OpenStream: %v", err)
			}
			streams = append(streams, st)
		}
		synctest.Wait()
		refused := 0
		for _, st := range streams {
			st.SetReadDeadline(time.Now().Add(time.Nanosecond))
			_, err := st.Read(make([]byte, 1))
			switch {
			case err == io.EOF:
				refused++
			case !errors.Is(err, os.ErrDeadlineExceeded):
				t.Fatalf("Read on a stream: %v", err)
			}
		}
		if refused != 1 {
			t.Fatalf("%d streams refused, want 1", refused)
		}
		for range maxQueuedStreams {
			if _, err := ss.AcceptStream(context.Background()); err != nil {
				t.Fatalf("AcceptStream: %v", err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := ss.AcceptStream(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("AcceptStream past the queued streams: %v, want context.DeadlineExceeded", err)
		}
		for _, s := range append(clients, servers...) {
			s.Close()
		}
	})
}

// TestSessionCrash checks that crashing a host fails its sessions on both ends with ErrReset, streams
// and datagrams included, and closes its session listeners.
func TestSessionCrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		n.SetLink("a", "b", LinkConfig{Latency: time.Second})
		n.SetLink("b", "a", LinkConfig{Latency: time.Second})
		cs, ss, _ := memSessionPair(t, n, "a", "b")
		la, err := n.Host("a").ListenSession("a:1")
		if err != nil {
			t.Fatalf("ListenSession: %v", err)
		}
		defer la.Close()
		st, ps := openStream(t, cs, ss, "x")
		defer st.Close()
		defer ps.Close()
		if err := cs.SendDatagram([]byte("late")); err != nil { // in flight when a crashes
			t.Fatalf("SendDatagram: %v", err)
		}

		start := time.Now()
		errs := make(chan error, 6)
		for _, s := range []Session{cs, ss} {
			go func() {
				_, err := s.AcceptStream(context.Background())
				errs <- err
			}()
			go func() {
				_, err := s.ReceiveDatagram(context.Background())
				errs <- err
			}()
		}
		for _, c := range []net.Conn{st, ps} {
			go func() {
				_, err := io.ReadAll(c)
				errs <- err
			}()
		}
		accErr := make(chan error, 1)
		go func() {
			_, err := la.Accept(context.Background())
			accErr <- err
		}()
		synctest.Wait()
		n.Crash("a")
		for range 6 {
			if err := <-errs; !errors.Is(err, ErrReset) {
				t.Fatalf("blocked call after Crash: %v, want ErrReset", err)
			}
		}
		if err := <-accErr; !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Crash: %v, want net.ErrClosed", err)
		}
		elapsedIs(t, "crash", start, 0)
		if err := ss.SendDatagram([]byte("x")); !errors.Is(err, ErrReset) {
			t.Fatalf("SendDatagram after Crash: %v, want ErrReset", err)
		}
		if _, err := ss.OpenStream(context.Background()); !errors.Is(err, ErrReset) {
			t.Fatalf("OpenStream after Crash: %v, want ErrReset", err)
		}
	})
}

// TestSessionLinkFaults checks datagrams and streams of a session against the link's faults: loss drops
// datagrams, bandwidth and latency time them, a partition drops them and stalls streams.
func TestSessionLinkFaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		cs, ss, _ := memSessionPair(t, n, "a", "b")
		receive := func(what string, want string) {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			got, err := ss.ReceiveDatagram(ctx)
			if want == "" {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("%s: ReceiveDatagram = %q, %v; want nothing", what, got, err)
				}
				return
			}
			if err != nil || string(got) != want {
				t.Fatalf("%s: ReceiveDatagram = %q, %v; want %q", what, got, err, want)
			}
		}

		n.SetLink("a", "b", LinkConfig{Loss: 1})
		cs.SendDatagram([]byte("lost"))
		receive("loss 1", "")
		n.SetLink("a", "b", LinkConfig{BlackHole: true})
		cs.SendDatagram([]byte("black-holed"))
		receive("black hole", "")

		n.SetLink("a", "b", LinkConfig{Latency: 10 * time.Millisecond, Bandwidth: 1e6})
		start := time.Now()
		cs.SendDatagram(make([]byte, 1000))
		cs.SendDatagram([]byte("second"))
		if got, err := ss.ReceiveDatagram(context.Background()); err != nil || len(got) != 1000 {
			t.Fatalf("ReceiveDatagram = %d bytes, %v", len(got), err)
		}
		elapsedIs(t, "1000 bytes at 1 MB/s + 10ms", start, 11*time.Millisecond)
		receive("second datagram", "second")
		elapsedIs(t, "a second datagram behind the first", start, 11*time.Millisecond+6*time.Microsecond)

		n.SetLink("a", "b", LinkConfig{})
		n.Partition("a", "b")
		cs.SendDatagram([]byte("partitioned"))
		receive("partition", "")
		start = time.Now() // the listener's host is partitioned: dialling a stream hangs
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if _, err := cs.OpenStream(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("OpenStream across a partition: %v, want context.DeadlineExceeded", err)
		}
		elapsedIs(t, "OpenStream across a partition", start, 3*time.Second)
		n.Heal("a", "b")
		cs.SendDatagram([]byte("healed"))
		receive("after Heal", "healed")
	})
}

// TestSessionOpenFailed checks that when the dialling end cannot dial a stream the accepting end asked
// for, the accepting end's OpenStream fails with ErrRefused and the session goes on.
func TestSessionOpenFailed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		l, err := n.Host("b").ListenSession("b:0")
		if err != nil {
			t.Fatalf("ListenSession: %v", err)
		}
		defer l.Close()
		dials := 0
		sn := n.Host("a").(*hostTransport).sessionNet()
		dial := sn.dial
		sn.dial = func(ctx context.Context, addr string) (net.Conn, error) {
			dials++ // only the control goroutine's helpers and this test dial: one at a time
			if dials == 2 {
				return nil, errors.New("no route")
			}
			return dial(ctx, addr)
		}
		cs, err := dialSession(context.Background(), sn, l.Addr().String())
		if err != nil {
			t.Fatalf("dialSession: %v", err)
		}
		defer cs.Close()
		ss, err := l.Accept(context.Background())
		if err != nil {
			t.Fatalf("Accept: %v", err)
		}
		defer ss.Close()
		if _, err := ss.OpenStream(context.Background()); !errors.Is(err, ErrRefused) {
			t.Fatalf("OpenStream whose dial failed: %v, want ErrRefused", err)
		}
		checkStream(t, ss, cs)
	})
}
