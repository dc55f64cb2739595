package pccl_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/pccl"
)

// startSitesLinked connects sites*per peers, peer i in site i%sites, with fast links inside a site
// and slow ones between sites, and admits them.
func (g *group) startSitesLinked(ctx context.Context, sites, per int) []*pccl.Communicator {
	g.t.Helper()
	hosts := make([]string, sites*per)
	for i := range hosts {
		hosts[i] = g.host()
	}
	g.link(hosts, func(i, j int) pccl.LinkConfig {
		if i%sites == j%sites {
			return pccl.LinkConfig{Latency: 100 * time.Microsecond, Bandwidth: 200e6}
		}
		return pccl.LinkConfig{Latency: 10 * time.Millisecond, Bandwidth: 20e6}
	})
	return g.admit(ctx, hosts, func(i int, cfg *pccl.Config) { cfg.Site = fmt.Sprintf("site%d", i%sites) })
}

// TestBubbleHierarchicalCancel cancels one caller's context in the middle of a hierarchical AllReduce
// over two sites of two: that caller gets context.Canceled, every other peer ErrAborted, every buffer
// is untouched, and the next AllReduce runs hierarchically on the same links, correctly.
func TestBubbleHierarchicalCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		comms := b.startSitesLinked(ctx, 2, 2)
		defer closeAll(comms)
		requireHierarchical(t, comms, 2, 2)
		opened := make([]uint64, len(comms))
		for i, c := range comms {
			opened[i] = c.Stats().LinksOpened
		}
		const count = 1 << 18
		bufs, _ := inputs(len(comms), count, 3)
		cancelCtx, cancel := context.WithCancel(ctx)
		errs := make([]error, len(comms))
		var wg sync.WaitGroup
		for i, c := range comms {
			callCtx := ctx
			if i == 0 {
				callCtx = cancelCtx
			}
			wg.Go(func() {
				errs[i] = c.AllReduce(callCtx, pccl.Bytes(bufs[i]), pccl.Bytes(bufs[i]), pccl.Desc{Tag: 4, Count: count, DType: pccl.F32, Op: pccl.Sum})
			})
		}
		// A megabyte over 20 MB/s between sites: 20 ms in, the WAN phase is moving data.
		time.Sleep(20 * time.Millisecond)
		cancel()
		wg.Wait()
		orig, _ := inputs(len(comms), count, 3)
		for i := range comms {
			who := fmt.Sprintf("peer %d", i)
			switch {
			case i == 0 && !errors.Is(errs[i], context.Canceled):
				t.Fatalf("%s: %v, want the caller's context.Canceled", who, errs[i])
			case i != 0 && !errors.Is(errs[i], pccl.ErrAborted):
				t.Fatalf("%s: %v, want ErrAborted", who, errs[i])
			}
			checkSum(t, who+"'s untouched buffer", bufs[i], orig[i])
		}
		bufs, want := inputs(len(comms), count, 5)
		errs = each(comms, func(i int, c *pccl.Communicator) error {
			return c.AllReduce(ctx, pccl.Bytes(bufs[i]), pccl.Bytes(bufs[i]), pccl.Desc{Tag: 4, Count: count, DType: pccl.F32, Op: pccl.Sum})
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("peer %d after the cancel: %v", i, err)
			}
			checkSum(t, fmt.Sprintf("peer %d after the cancel", i), bufs[i], want)
		}
		for i, c := range comms {
			if n := c.Stats().LinksOpened; n != opened[i] {
				t.Fatalf("peer %d opened %d links after the cancel", i, n-opened[i])
			}
		}
	})
}
