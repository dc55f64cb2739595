package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// memPair listens on host to, dials it from host from, and returns both ends, closed at the end of
// the test.
func memPair(t *testing.T, n *Network, from, to string) (client, server net.Conn) {
	t.Helper()
	l, err := n.Host(to).Listen(to + ":0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	defer l.Close()
	client, err = n.Host(from).Dial(context.Background(), l.Addr().String())
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	server, err = l.Accept()
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return client, server
}

// inFlightOf returns the bytes written on c and not yet read by its peer.
func inFlightOf(c net.Conn) int {
	p := c.(*conn).out
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inFlight
}

func equalBytes(t *testing.T, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d bytes, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("byte %d = %d, want %d", i, got[i], want[i])
		}
	}
}

func TestNetworkEchoAndAddrs(t *testing.T) {
	n := NewNetwork()
	if got := n.Host("a").Name(); got != "mem" {
		t.Fatalf("Name = %q, want mem", got)
	}
	l, err := n.Host("b").Listen("b:7000")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	defer l.Close()
	if got := l.Addr().String(); got != "b:7000" {
		t.Fatalf("listener Addr = %q, want b:7000", got)
	}
	c, err := n.Host("a").Dial(context.Background(), "b:7000")
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	defer s.Close()
	if c.RemoteAddr().String() != "b:7000" || s.LocalAddr().String() != "b:7000" ||
		s.RemoteAddr().String() != c.LocalAddr().String() || !strings.HasPrefix(c.LocalAddr().String(), "a:") {
		t.Fatalf("addresses: client %v->%v, server %v->%v", c.LocalAddr(), c.RemoteAddr(), s.LocalAddr(), s.RemoteAddr())
	}
	buf := []byte("ping")
	if _, err := c.Write(buf); err != nil {
		t.Fatalf("Write: %v", err)
	}
	copy(buf, "XXXX") // Write copied the data: reusing the buffer must not change what arrives
	got, err := readN(s, 4)
	if err != nil || string(got) != "ping" {
		t.Fatalf("server read %q, %v; want ping", got, err)
	}
	if _, err := s.Write([]byte("pong")); err != nil {
		t.Fatalf("Write: %v", err)
	}
	got, err = readN(c, 4)
	if err != nil || string(got) != "pong" {
		t.Fatalf("client read %q, %v; want pong", got, err)
	}
	if got := n.Stats("a", "b"); got != 4 {
		t.Fatalf("Stats(a, b) = %d, want 4", got)
	}
}

func TestNetworkListenErrors(t *testing.T) {
	n := NewNetwork()
	l, err := n.Host("a").Listen(":5000")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	defer l.Close()
	if _, err := n.Host("a").Listen("a:5000"); !errors.Is(err, ErrAddrInUse) {
		t.Fatalf("Listen on a used port: %v, want ErrAddrInUse", err)
	}
	if _, err := n.Host("a").Listen("b:5001"); !errors.Is(err, ErrAddrNotAvail) {
		t.Fatalf("Listen on another host's address: %v, want ErrAddrNotAvail", err)
	}
	for _, bad := range []string{"a", "a:port", "a:70000", "a:-1"} {
		if _, err := n.Host("a").Listen(bad); err == nil {
			t.Errorf("Listen(%q) succeeded", bad)
		}
	}
	_, err = n.Host("a").Dial(context.Background(), "b:9")
	if !errors.Is(err, ErrRefused) || !strings.HasPrefix(err.Error(), "mem dial b:9: ") {
		t.Fatalf("Dial to a port nobody listens on: %v, want ErrRefused with context", err)
	}
}

// TestNetworkRandomStreamInOrder sends large random streams both ways at once over lossy, slow links
// with writes and reads of random sizes, and checks every byte.
func TestNetworkRandomStreamInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		n.SetLink("a", "b", LinkConfig{Latency: 3 * time.Millisecond, Bandwidth: 200e6, Loss: 0.3, Retransmit: 7 * time.Millisecond})
		n.SetLink("b", "a", LinkConfig{Latency: 5 * time.Millisecond, Loss: 0.1})
		c, s := memPair(t, n, "a", "b")
		up, down := randomBytes(10, 9<<20+123), randomBytes(11, 3<<20+7)
		var wg sync.WaitGroup
		var gotUp, gotDown []byte
		wg.Add(4)
		go func() { defer wg.Done(); writeRandomly(t, c, up, 1) }()
		go func() { defer wg.Done(); writeRandomly(t, s, down, 2) }()
		go func() { defer wg.Done(); gotUp = readRandomly(t, s, len(up), 3) }()
		go func() { defer wg.Done(); gotDown = readRandomly(t, c, len(down), 4) }()
		wg.Wait()
		equalBytes(t, gotUp, up)
		equalBytes(t, gotDown, down)
		if got := n.Stats("a", "b"); got != int64(len(up)) {
			t.Fatalf("Stats(a, b) = %d, want %d", got, len(up))
		}
		if got := n.Stats("b", "a"); got != int64(len(down)) {
			t.Fatalf("Stats(b, a) = %d, want %d", got, len(down))
		}
	})
}

func writeRandomly(t *testing.T, w io.Writer, data []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 99))
	for len(data) > 0 {
		k := min(len(data), 1+r.IntN(300<<10))
		if _, err := w.Write(data[:k]); err != nil {
			t.Errorf("Write: %v", err)
			return
		}
		data = data[k:]
	}
}

func readRandomly(t *testing.T, rd io.Reader, size int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 77))
	out := make([]byte, 0, size)
	for len(out) < size {
		buf := make([]byte, 1+r.IntN(200<<10))
		k, err := rd.Read(buf)
		out = append(out, buf[:k]...)
		if err != nil {
			t.Errorf("Read after %d bytes: %v", len(out), err)
			return out
		}
	}
	return out
}

// TestNetworkBandwidthLatency transfers 1 MB over a 10 MB/s link with 50 ms latency: 100 ms of
// serialisation plus 50 ms of flight, measured on the bubble's fake clock.
func TestNetworkBandwidthLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		n.SetLink("a", "b", LinkConfig{Latency: 50 * time.Millisecond, Bandwidth: 10e6})
		c, s := memPair(t, n, "a", "b")
		data := randomBytes(5, 1_000_000)
		start := time.Now()
		go func() {
			if _, err := c.Write(data); err != nil {
				t.Errorf("Write: %v", err)
			}
		}()
		got, err := readN(s, len(data))
		elapsed := time.Since(start)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		equalBytes(t, got, data)
		if d := elapsed - 150*time.Millisecond; d < -2*time.Millisecond || d > 2*time.Millisecond {
			t.Fatalf("1 MB over 10 MB/s + 50 ms took %v of fake time, want 150ms ± 2ms", elapsed)
		}
		if got := n.Stats("a", "b"); got != 1_000_000 {
			t.Fatalf("Stats = %d, want 1000000", got)
		}
	})
}

// TestNetworkSharedBandwidth checks that connections between the same two hosts share the link: two
// concurrent 500 kB transfers at 10 MB/s finish together after 100 ms plus latency.
func TestNetworkSharedBandwidth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		n.SetLink("a", "b", LinkConfig{Latency: 20 * time.Millisecond, Bandwidth: 10e6})
		start := time.Now()
		var wg sync.WaitGroup
		var last atomic.Int64
		for i := range 2 {
			c, s := memPair(t, n, "a", "b")
			data := randomBytes(uint64(20+i), 500_000)
			wg.Add(2)
			go func() {
				defer wg.Done()
				for off := 0; off < len(data); off += 10_000 {
					if _, err := c.Write(data[off : off+10_000]); err != nil {
						t.Errorf("Write: %v", err)
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				got, err := readN(s, len(data))
				if err != nil {
					t.Errorf("read: %v", err)
					return
				}
				if !bytes.Equal(got, data) {
					t.Errorf("conn %d: bytes differ", i)
				}
				last.Store(int64(time.Since(start)))
			}()
		}
		wg.Wait()
		if got := time.Duration(last.Load()); got < 118*time.Millisecond || got > 122*time.Millisecond {
			t.Fatalf("two 500 kB transfers sharing 10 MB/s + 20 ms ended after %v, want 120ms ± 2ms", got)
		}
	})
}

// TestNetworkBackPressure checks that a writer whose reader does not read blocks once the in-flight
// limit is reached, and goes on exactly as far as the reader frees room.
func TestNetworkBackPressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		c, s := memPair(t, n, "a", "b")
		const chunk = 64 << 10
		var written atomic.Int64
		done := make(chan error, 1)
		data := randomBytes(6, 6<<20)
		go func() {
			for off := 0; off < len(data); off += chunk {
				if _, err := c.Write(data[off : off+chunk]); err != nil {
					done <- err
					return
				}
				written.Add(chunk)
			}
			done <- nil
		}()
		synctest.Wait()
		if got := written.Load(); got != inFlightLimit {
			t.Fatalf("writer got %d bytes in flight with no reader, want %d", got, inFlightLimit)
		}
		first, err := readN(s, 1<<20)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		synctest.Wait()
		if got := written.Load(); got != inFlightLimit+1<<20 {
			t.Fatalf("after reading 1 MiB the writer got %d bytes in flight, want %d", got, inFlightLimit+1<<20)
		}
		rest, err := readN(s, len(data)-1<<20)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if err := <-done; err != nil {
			t.Fatalf("writer: %v", err)
		}
		equalBytes(t, append(first, rest...), data)
	})
}

// TestNetworkBlackHole checks that a black-holed link delivers nothing, that the writer blocks at the
// in-flight limit, and that Heal does not resurrect the stalled connection but lets new ones work.
func TestNetworkBlackHole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		n.SetLink("a", "b", LinkConfig{Latency: 10 * time.Millisecond})
		c, s := memPair(t, n, "a", "b")
		if _, err := c.Write([]byte("before")); err != nil {
			t.Fatalf("Write: %v", err)
		}
		n.SetLink("a", "b", LinkConfig{Latency: 10 * time.Millisecond, BlackHole: true})
		const chunk = 32 << 10
		// The writer blocks inside the Write that would pass the limit; the ones before it returned.
		const wantWritten = (inFlightLimit - int64(len("before"))) / chunk * chunk
		var written atomic.Int64
		done := make(chan error, 1)
		go func() {
			buf := make([]byte, chunk)
			for {
				k, err := c.Write(buf)
				written.Add(int64(k))
				if err != nil {
					done <- err
					return
				}
			}
		}()
		synctest.Wait()
		if got := written.Load(); got != wantWritten {
			t.Fatalf("writer into a black hole wrote %d bytes, want %d", got, wantWritten)
		}
		if got := inFlightOf(c); got != inFlightLimit {
			t.Fatalf("in flight into a black hole: %d bytes, want %d", got, inFlightLimit)
		}
		// Bytes already in flight before the black hole still arrive; nothing after them does.
		got, err := readN(s, len("before"))
		if err != nil || string(got) != "before" {
			t.Fatalf("read %q, %v; want before", got, err)
		}
		s.SetReadDeadline(time.Now().Add(time.Second))
		if k, err := s.Read(make([]byte, 1)); k != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read from black hole = %d, %v; want 0, os.ErrDeadlineExceeded", k, err)
		}
		n.Heal("a", "b")
		s.SetReadDeadline(time.Now().Add(time.Second))
		if k, err := s.Read(make([]byte, 1)); k != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read after Heal = %d, %v; want 0, os.ErrDeadlineExceeded (lost bytes stay lost)", k, err)
		}
		// Reading "before" freed room for 6 more bytes, which completed the blocked Write; the
		// black hole itself never frees any.
		synctest.Wait()
		if got := written.Load(); got != wantWritten+chunk {
			t.Fatalf("writer moved on to %d bytes after Heal, want %d", got, wantWritten+chunk)
		}
		if got := inFlightOf(c); got != inFlightLimit {
			t.Fatalf("in flight after Heal: %d bytes, want %d", got, inFlightLimit)
		}
		c.SetWriteDeadline(time.Now().Add(-time.Second))
		if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("blocked Write: %v, want os.ErrDeadlineExceeded", err)
		}
		// The other direction lost nothing and still works.
		crosses(t, s, c, "back", "b->a")
		// A new connection after Heal works.
		c2, s2 := memPair(t, n, "a", "b")
		start := time.Now()
		crosses(t, c2, s2, "after", "a->b")
		if d := time.Since(start); d != 10*time.Millisecond {
			t.Fatalf("delivery after Heal took %v, want the link's 10ms latency", d)
		}
	})
}

// TestNetworkPartition checks that dials between partitioned hosts hang until the context ends, that
// Heal lets a hanging dial through, and that other hosts are unaffected.
func TestNetworkPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		l, err := n.Host("b").Listen("b:80")
		if err != nil {
			t.Fatalf("Listen: %v", err)
		}
		defer l.Close()
		n.Partition("a", "b")

		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err = n.Host("a").Dial(ctx, "b:80")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Dial across a partition: %v, want context.DeadlineExceeded", err)
		}
		if d := time.Since(start); d != 3*time.Second {
			t.Fatalf("Dial across a partition returned after %v, want the ctx timeout of 3s", d)
		}

		ctx, cancel = context.WithCancel(context.Background())
		time.AfterFunc(time.Second, cancel)
		start = time.Now()
		if _, err := n.Host("b").Dial(ctx, "a:80"); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Dial across a partition: %v, want context.Canceled", err)
		}
		if d := time.Since(start); d != time.Second {
			t.Fatalf("cancelled Dial returned after %v, want 1s", d)
		}

		c, err := n.Host("c").Dial(context.Background(), "b:80")
		if err != nil {
			t.Fatalf("Dial from an unpartitioned host: %v", err)
		}
		c.Close()
		if s, err := l.Accept(); err != nil {
			t.Fatalf("Accept: %v", err)
		} else {
			s.Close()
		}

		dialed := make(chan error, 1)
		go func() {
			c, err := n.Host("b").Dial(context.Background(), "b:80") // b to itself is not partitioned
			if err == nil {
				c.Close()
			}
			dialed <- err
		}()
		if err := <-dialed; err != nil {
			t.Fatalf("Dial b->b: %v", err)
		}
		if s, err := l.Accept(); err == nil {
			s.Close()
		}

		go func() {
			c, err := n.Host("a").Dial(context.Background(), "b:80")
			if err == nil {
				c.Close()
			}
			dialed <- err
		}()
		time.Sleep(time.Minute)
		synctest.Wait()
		select {
		case err := <-dialed:
			t.Fatalf("Dial across a partition returned early: %v", err)
		default:
		}
		n.Heal("a", "b")
		if err := <-dialed; err != nil {
			t.Fatalf("Dial after Heal: %v", err)
		}
		if s, err := l.Accept(); err == nil {
			s.Close()
		}
	})
}

// TestNetworkPartitionLosesBytes checks that an existing connection across a new partition stalls in
// both directions.
func TestNetworkPartitionLosesBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		c, s := memPair(t, n, "a", "b")
		n.Partition("a", "b")
		for _, w := range []net.Conn{c, s} {
			if _, err := w.Write([]byte("lost")); err != nil {
				t.Fatalf("Write: %v", err)
			}
		}
		n.Heal("a", "b")
		for _, r := range []net.Conn{c, s} {
			r.SetReadDeadline(time.Now().Add(time.Second))
			if k, err := r.Read(make([]byte, 4)); k != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("Read = %d, %v; want 0, os.ErrDeadlineExceeded", k, err)
			}
		}
		if got := n.Stats("a", "b") + n.Stats("b", "a"); got != 0 {
			t.Fatalf("Stats = %d bytes across a partition, want 0", got)
		}
	})
}

// TestNetworkCrash checks that crashing a host fails every connection of it on both ends at once and
// closes its listeners, and that the host can come back.
func TestNetworkCrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		n.SetLink("a", "b", LinkConfig{Latency: time.Second})
		n.SetLink("b", "a", LinkConfig{Latency: time.Second})
		c, s := memPair(t, n, "a", "b")   // a dialled b
		c2, s2 := memPair(t, n, "b", "a") // b dialled a
		la, err := n.Host("a").Listen("a:1")
		if err != nil {
			t.Fatalf("Listen: %v", err)
		}
		defer la.Close()
		if _, err := c.Write([]byte("in flight")); err != nil {
			t.Fatalf("Write: %v", err)
		}

		start := time.Now()
		errs := make(chan error, 4)
		for _, r := range []net.Conn{c, s, c2, s2} {
			go func() {
				_, err := r.Read(make([]byte, 16))
				errs <- err
			}()
		}
		accErr := make(chan error, 1)
		go func() {
			_, err := la.Accept()
			accErr <- err
		}()
		synctest.Wait()
		n.Crash("a")
		for range 4 {
			if err := <-errs; !errors.Is(err, ErrReset) {
				t.Fatalf("blocked Read after Crash: %v, want ErrReset", err)
			}
		}
		if err := <-accErr; !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Crash: %v, want net.ErrClosed", err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("errors took %v of fake time, want 0", d)
		}
		for _, w := range []net.Conn{c, s, c2, s2} {
			if _, err := w.Write([]byte("x")); !errors.Is(err, ErrReset) {
				t.Fatalf("Write after Crash: %v, want ErrReset", err)
			}
		}
		if _, err := n.Host("b").Dial(context.Background(), "a:1"); !errors.Is(err, ErrRefused) {
			t.Fatalf("Dial to crashed host: %v, want ErrRefused", err)
		}
		// The host restarts: it can listen on the same port again.
		l2, err := n.Host("a").Listen("a:1")
		if err != nil {
			t.Fatalf("Listen after Crash: %v", err)
		}
		defer l2.Close()
		c3, err := n.Host("b").Dial(context.Background(), "a:1")
		if err != nil {
			t.Fatalf("Dial after restart: %v", err)
		}
		c3.Close()
	})
}

// TestNetworkDeadlines checks read and write deadlines: a past deadline unblocks at once, a future
// one fires at its time, and clearing it makes the conn usable again.
func TestNetworkDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		c, s := memPair(t, n, "a", "b")

		readErr := make(chan error, 1)
		go func() {
			_, err := s.Read(make([]byte, 1))
			readErr <- err
		}()
		synctest.Wait()
		s.SetReadDeadline(time.Now().Add(-time.Nanosecond))
		if err := <-readErr; !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("blocked Read: %v, want os.ErrDeadlineExceeded", err)
		}

		big := make([]byte, inFlightLimit+1)
		writeErr := make(chan error, 1)
		var wrote atomic.Int64
		go func() {
			k, err := c.Write(big)
			wrote.Store(int64(k))
			writeErr <- err
		}()
		synctest.Wait()
		c.SetDeadline(time.Unix(0, 0))
		if err := <-writeErr; !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("blocked Write: %v, want os.ErrDeadlineExceeded", err)
		}
		if got := wrote.Load(); got != inFlightLimit {
			t.Fatalf("blocked Write reported %d bytes, want %d", got, inFlightLimit)
		}

		s.SetReadDeadline(time.Time{})
		got, err := readN(s, 10)
		if err != nil || !bytes.Equal(got, big[:10]) {
			t.Fatalf("Read after clearing the deadline = %v, %v", got, err)
		}

		start := time.Now()
		s.SetReadDeadline(start.Add(5 * time.Second))
		s.SetReadDeadline(start.Add(2 * time.Second)) // moving it replaces the first timer
		if _, err := io.ReadAll(s); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("ReadAll: %v, want os.ErrDeadlineExceeded", err)
		}
		if d := time.Since(start); d != 2*time.Second {
			t.Fatalf("deadline fired after %v, want 2s", d)
		}
		s.SetReadDeadline(time.Time{})
		c.SetWriteDeadline(time.Time{})
		if _, err := c.Write([]byte("z")); err != nil {
			t.Fatalf("Write after clearing the deadline: %v", err)
		}
	})
}

// TestNetworkClose checks close semantics on both ends.
func TestNetworkClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		n.SetLink("a", "b", LinkConfig{Latency: 30 * time.Millisecond})
		c, s := memPair(t, n, "a", "b")
		start := time.Now()
		if _, err := c.Write([]byte("last words")); err != nil {
			t.Fatalf("Write: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("second Close: %v, want nil", err)
		}
		got, err := io.ReadAll(s)
		if err != nil || string(got) != "last words" {
			t.Fatalf("ReadAll = %q, %v; want \"last words\", nil", got, err)
		}
		if d := time.Since(start); d != 30*time.Millisecond {
			t.Fatalf("EOF arrived after %v, want the 30ms latency", d)
		}
		if _, err := s.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("Read after EOF: %v, want io.EOF", err)
		}
		if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Write on closed conn: %v, want net.ErrClosed", err)
		}
		if err := c.SetDeadline(time.Now()); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("SetDeadline on closed conn: %v, want net.ErrClosed", err)
		}
		if _, err := s.Write([]byte("x")); !errors.Is(err, ErrBrokenPipe) {
			t.Fatalf("Write to a conn whose peer closed: %v, want ErrBrokenPipe", err)
		}

		// A local Close unblocks the conn's own blocked Read and Write.
		c2, s2 := memPair(t, n, "a", "b")
		errs := make(chan error, 2)
		go func() {
			_, err := c2.Read(make([]byte, 1))
			errs <- err
		}()
		go func() {
			_, err := c2.Write(make([]byte, inFlightLimit+1))
			errs <- err
		}()
		synctest.Wait()
		c2.Close()
		for range 2 {
			if err := <-errs; !errors.Is(err, net.ErrClosed) {
				t.Fatalf("blocked call after local Close: %v, want net.ErrClosed", err)
			}
		}
		// The peer got everything but the bytes after the limit, then EOF.
		got, err = io.ReadAll(s2)
		if err != nil || len(got) != inFlightLimit {
			t.Fatalf("peer ReadAll = %d bytes, %v; want %d, nil", len(got), err, inFlightLimit)
		}
	})
}

func TestNetworkCloseWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		c, s := memPair(t, n, "a", "b")
		c.Write([]byte("req"))
		if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
			t.Fatalf("CloseWrite: %v", err)
		}
		if got, err := io.ReadAll(s); err != nil || string(got) != "req" {
			t.Fatalf("ReadAll = %q, %v", got, err)
		}
		if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Write after CloseWrite: %v, want net.ErrClosed", err)
		}
		s.Write([]byte("resp"))
		s.Close()
		if got, err := io.ReadAll(c); err != nil || string(got) != "resp" {
			t.Fatalf("half-closed end ReadAll = %q, %v", got, err)
		}
	})
}

// TestNetworkLoss checks that loss delays segments by the retransmit time without losing or
// reordering anything.
func TestNetworkLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		n.SetLink("a", "b", LinkConfig{Latency: 10 * time.Millisecond, Loss: 1})
		c, s := memPair(t, n, "a", "b")
		start := time.Now()
		c.Write([]byte("slow"))
		if got, err := readN(s, 4); err != nil || string(got) != "slow" {
			t.Fatalf("read %q, %v", got, err)
		}
		if d := time.Since(start); d != 210*time.Millisecond {
			t.Fatalf("lost segment arrived after %v, want 10ms latency + 200ms retransmit", d)
		}

		// With some segments lost, later ones wait behind them: order is kept.
		n.SetLink("a", "b", LinkConfig{Latency: time.Millisecond, Loss: 0.5, Retransmit: 50 * time.Millisecond})
		data := randomBytes(8, 2<<20)
		go func() {
			for off := 0; off < len(data); off += 1000 {
				if _, err := c.Write(data[off:min(off+1000, len(data))]); err != nil {
					t.Errorf("Write: %v", err)
					return
				}
				time.Sleep(100 * time.Microsecond)
			}
		}()
		got := readRandomly(t, s, len(data), 9)
		equalBytes(t, got, data)
	})
}

func TestLinkConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg   LinkConfig
		field string
	}{
		{LinkConfig{Latency: -1}, "Latency"},
		{LinkConfig{Bandwidth: -1}, "Bandwidth"},
		{LinkConfig{Loss: 1.5}, "Loss"},
		{LinkConfig{Loss: -0.1}, "Loss"},
		{LinkConfig{Retransmit: -1}, "Retransmit"},
	} {
		if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", tc.cfg, err, tc.field)
		}
	}
	if err := (LinkConfig{}).Validate(); err != nil {
		t.Errorf("zero LinkConfig: %v", err)
	}
}

// TestNetworkConcurrentUse runs many connections between several hosts at once, for the race
// detector.
func TestNetworkConcurrentUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		hosts := []string{"h0", "h1", "h2"}
		for _, a := range hosts {
			for _, b := range hosts {
				n.SetLink(a, b, LinkConfig{Latency: time.Millisecond, Bandwidth: 50e6, Loss: 0.05})
			}
		}
		var ls []net.Listener
		var servers sync.WaitGroup
		for _, h := range hosts {
			l, err := n.Host(h).Listen(h + ":9")
			if err != nil {
				t.Fatalf("Listen: %v", err)
			}
			ls = append(ls, l)
			servers.Add(1)
			go func() {
				defer servers.Done()
				for {
					s, err := l.Accept()
					if err != nil {
						return
					}
					servers.Add(1)
					go func() {
						defer servers.Done()
						defer s.Close()
						io.Copy(s, s)
					}()
				}
			}()
		}
		var wg sync.WaitGroup
		for i := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				from, to := hosts[i%3], hosts[(i+1+i/3)%3]
				c, err := n.Host(from).Dial(context.Background(), to+":9")
				if err != nil {
					t.Errorf("Dial: %v", err)
					return
				}
				defer c.Close()
				data := randomBytes(uint64(100+i), 200<<10)
				go writeRandomly(t, c, data, uint64(i))
				got := readRandomly(t, c, len(data), uint64(i+50))
				if !bytes.Equal(got, data) {
					t.Errorf("conn %d: echo differs", i)
				}
			}()
		}
		wg.Wait()
		for _, l := range ls {
			l.Close()
		}
		servers.Wait()
	})
}
