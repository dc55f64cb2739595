package pccl

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/concord-ccl/concord/pccl/internal/wire"
)

// OptimizeTopology re-orders the ring for speed. Every accepted peer calls it; together they measure
// every directed link with short multi-stream tests (n-1 rounds in which every peer sends one test and
// receives one), the master solves the ring order as an asymmetric TSP that minimises the slowest link
// first and the total second, and only the links that change are re-wired. A better ring found later
// by the master's background search is applied at the next call. It needs no collective of this peer
// in flight (else ErrBusy); ErrKicked, ErrMasterLost, ErrClosed as usual.
func (c *Communicator) OptimizeTopology(ctx context.Context) error {
	c.majorMu.Lock()
	defer c.majorMu.Unlock()
	c.mu.Lock()
	if c.fatal != nil {
		c.mu.Unlock()
		return c.fatal
	}
	if n := len(c.ops); n > 0 {
		c.mu.Unlock()
		return fmt.Errorf("pccl: optimize topology: %w: %d", ErrBusy, n)
	}
	c.topoOutstanding = true
	select {
	case <-c.topoCh:
	default:
	}
	c.mu.Unlock()
	if err := c.send(&wire.VoteOptimize{}); err != nil {
		return err
	}
	for {
		select {
		case r := <-c.measureCh:
			rate := c.measure(ctx, r)
			if err := c.send(&wire.MeasureReport{Round: r.Round, To: r.Target.ID, BytesPerSec: rate}); err != nil {
				return err
			}
		case <-c.topoCh:
			return nil
		case <-c.done:
			return c.err()
		case <-ctx.Done():
			// The master still expects our reports: keep answering them in the background.
			c.wg.Add(1)
			go c.finishOptimize()
			return fmt.Errorf("pccl: optimize topology: %w", ctx.Err())
		}
	}
}

// finishOptimize answers the rounds of an OptimizeTopology whose caller gave up, without measuring.
func (c *Communicator) finishOptimize() {
	defer c.wg.Done()
	for {
		select {
		case r := <-c.measureCh:
			if c.send(&wire.MeasureReport{Round: r.Round, To: r.Target.ID}) != nil {
				return
			}
		case <-c.topoCh:
			return
		case <-c.done:
			return
		}
	}
}

// measure runs one bandwidth test to r.Target and returns bytes per second (0 if it failed).
func (c *Communicator) measure(ctx context.Context, r *wire.MeasureRound) float64 {
	if r.Target.ID == 0 || r.Target.ID == c.id {
		return 0
	}
	d := time.Duration(r.Nanos)
	streams := max(int(r.Streams), 1)
	rates := make([]float64, streams)
	var wg sync.WaitGroup
	for k := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rate, err := c.benchStream(ctx, r.Target.Addr, d)
			if err != nil {
				c.log.Warn("bandwidth test failed", "to", r.Target.ID, "err", err)
			}
			rates[k] = rate
		}()
	}
	wg.Wait()
	total := 0.0
	for _, v := range rates {
		total += v
	}
	return total
}

// benchBlock is the write size of a bandwidth test.
const benchBlock = 1 << 20

var benchData = make([]byte, benchBlock)

// benchStream sends as fast as it can to addr until the receiver, which counts the bytes that arrive
// during d from the first one, reports its count.
func (c *Communicator) benchStream(ctx context.Context, addr string, d time.Duration) (float64, error) {
	cfg := c.cfg
	dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	conn, err := cfg.Transport.Dial(dctx, addr)
	cancel()
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	limit := time.Now().Add(3*d + cfg.DialTimeout)
	conn.SetDeadline(limit)
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	if err := wire.Exchange(conn, wire.KindBench); err != nil {
		return 0, err
	}
	if _, err := conn.Write(wire.AppendFrame(nil, &wire.BenchHello{Token: cfg.Token, Nanos: uint64(d)})); err != nil {
		return 0, err
	}
	result := make(chan *wire.BenchResult, 1)
	go func() {
		msg, _, err := wire.ReadFrame(conn, 1<<10, nil)
		if r, ok := msg.(*wire.BenchResult); ok && err == nil {
			result <- r
		}
		close(result)
	}()
	for {
		select {
		case r := <-result:
			if r == nil || r.Nanos == 0 {
				return 0, fmt.Errorf("bandwidth test to %s: no result", addr)
			}
			return float64(r.Bytes) / (float64(r.Nanos) / 1e9), nil
		default:
		}
		if _, err := conn.Write(benchData); err != nil {
			// The receiver may close right after its result: prefer the result.
			if r := <-result; r != nil && r.Nanos > 0 {
				return float64(r.Bytes) / (float64(r.Nanos) / 1e9), nil
			}
			return 0, err
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
	d := time.Duration(h.Nanos)
	buf := make([]byte, benchBlock)
	conn.SetReadDeadline(time.Now().Add(c.cfg.DialTimeout + d))
	n, err := io.ReadFull(conn, buf[:1])
	if err != nil {
		return
	}
	start := time.Now()
	total := uint64(n)
	conn.SetReadDeadline(start.Add(d))
	for {
		n, err := conn.Read(buf)
		total += uint64(n)
		if err != nil {
			break
		}
	}
	elapsed := time.Since(start)
	conn.SetDeadline(time.Now().Add(c.cfg.DialTimeout))
	conn.Write(wire.AppendFrame(nil, &wire.BenchResult{Bytes: total, Nanos: uint64(elapsed)}))
	// Drain until the sender notices and closes.
	conn.SetReadDeadline(time.Now().Add(c.cfg.DialTimeout))
	io.Copy(io.Discard, conn)
}
