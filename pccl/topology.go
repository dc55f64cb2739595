package pccl

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// OptimizeTopology re-orders the ring for speed. Every accepted peer calls it; together they measure
// every directed link with short multi-stream tests (n-1 rounds in which every peer sends one test and
// receives one), the master solves the ring order as an asymmetric TSP that minimises the slowest link
// first and the total second, and only the links that change are re-wired. A better ring found later
// by the master's background search is applied at the next call. It needs no collective of this peer
// in flight (else ErrBusy); ErrKicked, ErrMasterLost, ErrClosed as usual.
func (c *Communicator) OptimizeTopology(ctx context.Context) error {
	// The bandwidth rounds run in the background (see measureAct); if ctx ends first, later rounds
	// are answered without measuring, so that nobody waits for us.
	call, ch := c.newCall()
	_, err := c.ask(ctx, "optimize topology", call, ch, optimizeCall{call: call})
	return cleanError(err)
}

// OptimizeStats describes this peer's part in the last OptimizeTopology.
type OptimizeStats struct {
	Rounds  int           // bandwidth rounds it took part in
	Measure time.Duration // from the first round's start to the last round's report
}

// LastOptimize returns the stats of the last OptimizeTopology.
func (c *Communicator) LastOptimize() OptimizeStats { return c.view.Load().optimize }

// measure runs one bandwidth test to r.Target and returns bytes per second (0 if it failed) and the
// one-way latency (half the smallest round trip).
func (c *Communicator) measure(ctx context.Context, r *wire.MeasureRound) (float64, time.Duration) {
	if r.Target.ID == 0 || r.Target.ID == c.id {
		return 0, 0
	}
	d := time.Duration(r.Nanos)
	streams := max(int(r.Streams), 1)
	results := make([]*wire.BenchResult, streams)
	rtts := make([]time.Duration, streams)
	var wg sync.WaitGroup
	for k := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, rtt, err := c.benchStream(ctx, r.Target, d)
			if err != nil {
				c.log.Warn("bandwidth test failed", "to", r.Target.ID, "err", err)
			}
			results[k], rtts[k] = res, rtt
		}()
	}
	wg.Wait()
	return aggregate(results), minRTT(rtts) / 2
}

// aggregate combines the counts of parallel streams: all their bytes over the union of their windows.
// (Summing per-stream rates would count the link twice when the windows do not overlap.)
func aggregate(results []*wire.BenchResult) float64 {
	var bytes, from, to uint64
	for _, r := range results {
		if r == nil || r.Nanos == 0 {
			continue
		}
		bytes += r.Bytes
		if from == 0 || r.Start < from {
			from = r.Start
		}
		to = max(to, r.Start+r.Nanos)
	}
	if to <= from {
		return 0
	}
	return float64(bytes) / (float64(to-from) / 1e9)
}

func minRTT(rtts []time.Duration) time.Duration {
	var m time.Duration
	for _, r := range rtts {
		if r > 0 && (m == 0 || r < m) {
			m = r
		}
	}
	return m
}

// benchBlock is the write size of a bandwidth test.
const benchBlock = 1 << 20

var benchData = make([]byte, benchBlock)

// benchStream times a round trip to peer to, then sends as fast as it can until the receiver, which
// counts the bytes that arrive during d from the first one, reports its count.
func (c *Communicator) benchStream(ctx context.Context, to wire.PeerInfo, d time.Duration) (*wire.BenchResult, time.Duration, error) {
	cfg := c.cfg
	dctx, cancel := context.WithTimeout(ctx, c.reachTimeout(to))
	conn, err := c.dialPeer(dctx, to)
	cancel()
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close()
	limit := time.Now().Add(3*d + cfg.DialTimeout)
	conn.SetDeadline(limit)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if err := wire.Exchange(conn, wire.KindBench); err != nil {
		return nil, 0, err
	}
	t0 := time.Now()
	if _, err := conn.Write(wire.AppendFrame(nil, &wire.BenchHello{Token: cfg.Token, Nanos: uint64(d)})); err != nil {
		return nil, 0, err
	}
	// The receiver acknowledges the hello at once (that times the round trip); data flows only then,
	// so that the receiver is already waiting for it and counts no backlog.
	if msg, _, err := wire.ReadFrame(conn, 1<<10, nil); err != nil {
		return nil, 0, err
	} else if _, ok := msg.(*wire.BenchResult); !ok {
		return nil, 0, fmt.Errorf("bandwidth test to %s: answer %T", to.Addr, msg)
	}
	rtt := time.Since(t0)
	result := make(chan *wire.BenchResult, 1)
	go func() {
		defer close(result)
		msg, _, err := wire.ReadFrame(conn, 1<<10, nil)
		if r, ok := msg.(*wire.BenchResult); ok && err == nil {
			result <- r
		}
	}()
	for {
		select {
		case r := <-result:
			if r == nil || r.Nanos == 0 {
				return nil, rtt, fmt.Errorf("bandwidth test to %s: no result", to.Addr)
			}
			return r, rtt, nil
		default:
		}
		if _, err := conn.Write(benchData); err != nil {
			// The receiver may close right after its result: prefer the result.
			if r := <-result; r != nil && r.Nanos > 0 {
				return r, rtt, nil
			}
			return nil, rtt, err
		}
	}
}

// serveBench counts what a bandwidth test sends during the requested time from the first byte, and
// answers with the count.
func (c *Communicator) serveBench(conn net.Conn) {
	defer conn.Close()
	msg, _, err := wire.ReadFrame(conn, 1<<10, nil)
	h, ok := msg.(*wire.BenchHello)
	if err != nil || !ok || h.Token != c.cfg.Token || h.Nanos == 0 || h.Nanos > uint64(time.Minute) {
		return
	}
	// The test's whole budget is h.Nanos; a fifth of it is left for the handshake and the latencies
	// around the counting window, so that a round of tests takes about the configured time.
	d := time.Duration(h.Nanos) * 4 / 5
	if _, err := conn.Write(wire.AppendFrame(nil, &wire.BenchResult{})); err != nil {
		return
	}
	buf := make([]byte, benchBlock)
	conn.SetReadDeadline(time.Now().Add(c.cfg.DialTimeout + d))
	n, err := io.ReadFull(conn, buf[:1])
	if err != nil {
		return
	}
	// Count from a third of the window on: by then any backlog of the first moments has been read,
	// and what arrives is the link's pace.
	start := time.Now()
	total := uint64(n)
	from := start.Add(d / 3)
	var base uint64
	var baseAt time.Time
	conn.SetReadDeadline(start.Add(d))
	for {
		n, err := conn.Read(buf)
		total += uint64(n)
		if baseAt.IsZero() && time.Now().After(from) {
			base, baseAt = total, time.Now()
		}
		if err != nil {
			break
		}
	}
	if baseAt.IsZero() {
		base, baseAt = uint64(n), start
	}
	elapsed := time.Since(baseAt)
	total -= base
	conn.SetDeadline(time.Now().Add(c.cfg.DialTimeout))
	conn.Write(wire.AppendFrame(nil, &wire.BenchResult{Bytes: total, Nanos: uint64(elapsed), Start: uint64(c.unixNano(baseAt))}))
	// Drain until the sender notices and closes.
	conn.SetReadDeadline(time.Now().Add(c.cfg.DialTimeout))
	io.Copy(io.Discard, conn)
}
