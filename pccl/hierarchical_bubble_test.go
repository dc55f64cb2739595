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

// startSites connects sites*per peers in the bubble, peer i in site i%sites, with fast links inside
// a site and slow ones between sites, and admits them.
func (b *bubble) startSites(ctx context.Context, sites, per int) []*pccl.Communicator {
	b.t.Helper()
	n := sites * per
	for i := range n {
		b.hosts = append(b.hosts, fmt.Sprintf("peer%d", i+1))
	}
	for i, from := range b.hosts {
		for j, to := range b.hosts {
			switch {
			case i == j:
			case i%sites == j%sites:
				b.net.SetLink(from, to, pccl.LinkConfig{Latency: 100 * time.Microsecond, Bandwidth: 200e6})
			default:
				b.net.SetLink(from, to, pccl.LinkConfig{Latency: 10 * time.Millisecond, Bandwidth: 20e6})
			}
		}
	}
	comms := make([]*pccl.Communicator, n)
	errs := make([]error, n)
	connect := func(i int) {
		comms[i], errs[i] = pccl.Connect(ctx, pccl.Config{Master: bubbleMaster, ListenAddr: b.hosts[i] + ":9000",
			Transport: b.net.Host(b.hosts[i]), PartBytes: 16 << 10, Site: fmt.Sprintf("site%d", i%sites)})
	}
	connect(0)
	if errs[0] != nil {
		b.t.Fatal(errs[0])
	}
	var wg sync.WaitGroup
	for i := 1; i < n; i++ {
		wg.Go(func() { connect(i) })
	}
	for len(b.srv.Snapshot().Peers) < n {
		time.Sleep(time.Millisecond) // the bubble's clock: other goroutines run meanwhile
	}
	if err := comms[0].UpdateTopology(ctx); err != nil {
		b.t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			closeAll(comms)
			b.t.Fatalf("peer %d: %v", i, err)
		}
	}
	return comms
}

// TestBubbleHierarchicalCancel cancels one caller's context in the middle of a hierarchical AllReduce
// over two sites of two: that caller gets context.Canceled, every other peer ErrAborted, every buffer
// is untouched, and the next AllReduce runs hierarchically on the same links, correctly.
func TestBubbleHierarchicalCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		comms := b.startSites(ctx, 2, 2)
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
