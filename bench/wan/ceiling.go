package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/concord-ccl/concord/internal/transport"
)

// The stream ceiling. Throughput against the link's capacity says how far the AllReduce is from the
// wire, but not whether the gap is Concord's: the emulator forwards every packet in user space, and
// on a small machine moving four links' worth of packets through TUN devices can itself be the limit.
// So, for a transport and a pool size K, the command also moves the bytes of one ring link with no
// collective at all: K plain connections of the transport from every site to the next, all links at
// once, each connection carrying 1/K of the 2(N-1)/N · size bytes a ring link carries in the
// AllReduce. Like the AllReduce, the transfer runs on the same connections once untimed (congestion
// windows open) and then --reps times, each timed until the last byte of the slowest link has been
// read. The ceiling is that link's rate (the median), in the same units as the AllReduce's
// throughput; the AllReduce's throughput over it is the share of what the test bed's path allowed.

// ceiling measures the stream ceiling of transport name with k connections per ring link, in Mbit/s,
// --reps times on the same connections, and returns each timed transfer's rate in order.
func (b *bench) ceiling(name string, secret []byte, port, k int) ([]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), b.o.timeout)
	defer cancel()
	base, err := transport.Select(name, transport.AuthConfig{Secret: secret})
	if err != nil {
		return nil, err
	}
	n := b.o.peers
	perLink := int64(2 * (n - 1) * b.o.size / n)
	share := func(c int) int64 { // bytes of connection c of a link: the link's bytes split k ways
		if int64(c) < perLink%int64(k) {
			return perLink/int64(k) + 1
		}
		return perLink / int64(k)
	}

	// One listener per site; site i's connections come from site i-1.
	lns := make([]net.Listener, n)
	defer func() {
		for _, ln := range lns {
			if ln != nil {
				ln.Close()
			}
		}
	}()
	for i := range n {
		tr := &siteTransport{Transport: base, ns: b.tb.Netns(i)}
		if lns[i], err = tr.Listen(net.JoinHostPort(b.tb.Addr(i).String(), strconv.Itoa(port))); err != nil {
			return nil, err
		}
	}

	go func() { // an Accept waiting for a connection that failed to dial ends with the context
		<-ctx.Done()
		for _, ln := range lns {
			ln.Close()
		}
	}()

	// Every site dials k connections to the next, all at once; a connection's first byte names its
	// index in the link, so the receiver knows its share.
	type link struct{ out, in []net.Conn }
	links := make([]link, n)
	var mu sync.Mutex
	var firstErr error
	setErr := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if firstErr == nil {
			firstErr = err
			cancel()
		}
	}
	var wg sync.WaitGroup
	for i := range n {
		links[i].out = make([]net.Conn, k)
		links[(i+1)%n].in = make([]net.Conn, k)
		tr := &siteTransport{Transport: base, ns: b.tb.Netns(i)}
		to := net.JoinHostPort(b.tb.Addr((i+1)%n).String(), strconv.Itoa(port))
		for c := range k {
			wg.Go(func() {
				conn, err := tr.Dial(ctx, to)
				if err == nil {
					_, err = conn.Write([]byte{byte(c)})
				}
				if err != nil {
					setErr(fmt.Errorf("site %d connection %d: %w", i, c, err))
					return
				}
				links[i].out[c] = conn
			})
		}
		wg.Go(func() {
			for range k {
				conn, err := lns[(i+1)%n].Accept()
				var idx [1]byte
				if err == nil {
					_, err = io.ReadFull(conn, idx[:])
				}
				if err == nil && (int(idx[0]) >= k || links[(i+1)%n].in[idx[0]] != nil) {
					err = fmt.Errorf("connection index %d twice or out of range", idx[0])
				}
				if err != nil {
					setErr(fmt.Errorf("site %d accept: %w", (i+1)%n, err))
					return
				}
				links[(i+1)%n].in[idx[0]] = conn
			}
		})
	}
	wg.Wait()
	defer func() {
		for _, l := range links {
			for _, c := range append(l.out, l.in...) {
				if c != nil {
					c.Close()
				}
			}
		}
	}()
	if firstErr != nil {
		return nil, firstErr
	}
	go func() { // a connection blocked in Write or Read ends with the context
		<-ctx.Done()
		for _, l := range links {
			for _, c := range append(l.out, l.in...) {
				c.SetDeadline(time.Now())
			}
		}
	}()

	// transfer moves every connection's share once and returns when every byte has been read.
	transfer := func() error {
		var wg sync.WaitGroup
		for _, l := range links {
			for c := range k {
				wg.Go(func() {
					if err := send(l.out[c], share(c)); err != nil {
						setErr(fmt.Errorf("send: %w", err))
					}
				})
				wg.Go(func() {
					if _, err := io.CopyN(io.Discard, l.in[c], share(c)); err != nil {
						setErr(fmt.Errorf("receive: %w", err))
					}
				})
			}
		}
		wg.Wait()
		return firstErr
	}
	if err := transfer(); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	var rates []float64
	for range b.o.reps {
		t0 := time.Now()
		if err := transfer(); err != nil {
			return nil, err
		}
		rates = append(rates, float64(perLink)*8/time.Since(t0).Seconds()/1e6)
	}
	return rates, nil
}

// send writes n bytes to c in 1 MiB writes, as the AllReduce's frames are.
func send(c net.Conn, n int64) error {
	buf := make([]byte, 1<<20)
	for n > 0 {
		m := min(n, int64(len(buf)))
		if _, err := c.Write(buf[:m]); err != nil {
			return err
		}
		n -= m
	}
	return nil
}
