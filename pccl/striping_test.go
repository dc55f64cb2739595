package pccl_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/pccl"
)

// pacedTransport caps every data connection a host dials at rate bytes per second, the first one at
// slow bytes per second, as a per-flow cap of a wide-area path would: writes run ahead of the pace by
// at most window bytes (the send buffer), then block.
type pacedTransport struct {
	pccl.Transport
	rate, slow float64
	window     int

	mu     sync.Mutex
	dialed int
}

func (p *pacedTransport) Dial(ctx context.Context, addr string) (net.Conn, error) {
	conn, err := p.Transport.Dial(ctx, addr)
	if err != nil || !strings.HasSuffix(addr, ":9000") {
		return conn, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	rate := p.rate
	if p.dialed == 0 {
		rate = p.slow
	}
	p.dialed++
	return &pacedConn{Conn: conn, rate: rate, window: p.window}, nil
}

type pacedConn struct {
	net.Conn
	rate   float64
	window int

	mu   sync.Mutex
	free time.Time // when the bytes written so far have left at the pace
}

func (c *pacedConn) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		m := min(len(b), 16<<10)
		c.mu.Lock()
		now := time.Now()
		c.free = later(c.free, now).Add(time.Duration(float64(m) / c.rate * float64(time.Second)))
		wait := c.free.Sub(now) - time.Duration(float64(c.window)/c.rate*float64(time.Second))
		c.mu.Unlock()
		if wait > 0 {
			time.Sleep(wait) // the bubble's clock: the link's pace
		}
		k, err := c.Conn.Write(b[:m])
		n += k
		if err != nil {
			return n, err
		}
		b = b[m:]
	}
	return n, nil
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// stripedRun connects three peers with pools of four connections, each connection capped at 8 MB/s
// except the first one peer 1 dials, capped at slow, runs rounds of one AllReduce of 4 MiB per peer
// (concurrent ones when concurrent > 1, with distinct tags), checks every element on every peer, and
// returns the time the AllReduces took on the bubble's clock.
func stripedRun(t *testing.T, even bool, slow float64, concurrent int) time.Duration {
	var took time.Duration
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		const n = 3
		hosts := []string{b.host(), b.host(), b.host()}
		b.link(hosts, func(int, int) pccl.LinkConfig { return pccl.LinkConfig{Latency: time.Millisecond} })
		comms := b.admit(ctx, hosts, func(i int, cfg *pccl.Config) {
			rate, first := 8e6, slow
			if i > 0 {
				first = rate
			}
			cfg.Transport = &pacedTransport{Transport: b.net.Host(hosts[i]), rate: rate, slow: first, window: 256 << 10}
			cfg.PartBytes, cfg.PoolSize, cfg.EvenStriping = 64<<10, 4, even
		})
		defer closeAll(comms)

		const count = 1 << 20
		bufs := make([][][]float32, concurrent)
		wants := make([][]float32, concurrent)
		for op := range concurrent {
			bufs[op], wants[op] = inputs(n, count, op)
		}
		start := time.Now()
		var opWG sync.WaitGroup
		results := make([][]error, concurrent)
		for op := range concurrent {
			opWG.Go(func() {
				desc := pccl.Desc{Tag: uint64(10 + op), Count: count, DType: pccl.F32, Op: pccl.Sum}
				results[op] = each(comms, func(i int, c *pccl.Communicator) error {
					return c.AllReduce(ctx, pccl.Bytes(bufs[op][i]), pccl.Bytes(bufs[op][i]), desc)
				})
			})
		}
		opWG.Wait()
		took = time.Since(start)
		for op := range concurrent {
			for i, err := range results[op] {
				if err != nil {
					t.Fatalf("op %d peer %d: %v", op, i, err)
				}
				checkSum(t, fmt.Sprintf("op %d peer %d", op, i), bufs[op][i], wants[op])
			}
		}
	})
	return took
}

// TestAdaptiveStripingAroundSlowConnection caps one of the four connections from peer 1 at a
// quarter of the others' rate. An even split is held to four times the slow connection's rate;
// adaptive striping gives the slow connection less and moves the AllReduce much faster, with every
// element right either way.
func TestAdaptiveStripingAroundSlowConnection(t *testing.T) {
	ideal := stripedRun(t, false, 8e6, 1)
	even := stripedRun(t, true, 2e6, 1)
	adaptive := stripedRun(t, false, 2e6, 1)
	t.Logf("uncapped %v, capped even split %v, capped adaptive %v (%.0f%% of uncapped speed)",
		ideal, even, adaptive, 100*ideal.Seconds()/adaptive.Seconds())
	if adaptive.Seconds() > 0.7*even.Seconds() {
		t.Errorf("adaptive striping took %v, not well below the even split's %v", adaptive, even)
	}
}

// TestStripingSharedByConcurrentOperations runs three AllReduces at once over the same pools, with
// one slow connection: all of them complete with every element right.
func TestStripingSharedByConcurrentOperations(t *testing.T) {
	stripedRun(t, false, 2e6, 3)
}
