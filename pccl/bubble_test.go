package pccl_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/pccl"
)

// inputs returns each peer's buffer for a sum: peer i, element j holds i*1000+j+seed (exact in
// float32 for the sizes used), and the expected sum.
func inputs(n, count, seed int) ([][]float32, []float32) {
	bufs := make([][]float32, n)
	want := make([]float32, count)
	for i := range bufs {
		bufs[i] = make([]float32, count)
		for j := range bufs[i] {
			v := float32((i*1000 + j + seed) % 4096)
			bufs[i][j] = v
			want[j] += v
		}
	}
	return bufs, want
}

func checkSum(t *testing.T, who string, got, want []float32) {
	t.Helper()
	for j := range want {
		if got[j] != want[j] {
			t.Fatalf("%s: element %d is %v, want %v", who, j, got[j], want[j])
		}
	}
}

// TestBubbleCrashAndRetry runs a group of four in a bubble: an AllReduce, a peer crash mid-operation
// (the survivors get ErrPeerLeft and their buffers back untouched), UpdateTopology, and a correct
// retry. Only the links next to the crashed peer are dialled again.
func TestBubbleCrashAndRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		comms := b.startLinked(ctx, 4, pccl.LinkConfig{Latency: time.Millisecond, Bandwidth: 50e6})
		defer closeAll(comms)
		const count = 1 << 16
		desc := pccl.Desc{Tag: 3, Count: count, DType: pccl.F32, Op: pccl.Sum}

		bufs, want := inputs(4, count, 0)
		errs := each(comms, func(i int, c *pccl.Communicator) error {
			return c.AllReduce(ctx, pccl.Bytes(bufs[i]), pccl.Bytes(bufs[i]), desc)
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("peer %d: %v", i, err)
			}
			checkSum(t, fmt.Sprintf("peer %d", i), bufs[i], want)
		}

		// Crash peer 2 while the next AllReduce moves data.
		const victim = 2
		before := make([]pccl.Stats, 4)
		for i, c := range comms {
			before[i] = c.Stats()
		}
		bufs, _ = inputs(4, count, 1)
		orig := make([][]byte, len(bufs))
		for i := range bufs {
			orig[i] = bytes.Clone(pccl.Bytes(bufs[i]))
		}
		var wg sync.WaitGroup
		for i, c := range comms {
			wg.Go(func() {
				errs[i] = c.AllReduce(ctx, pccl.Bytes(bufs[i]), pccl.Bytes(bufs[i]), desc)
			})
		}
		time.Sleep(2 * time.Millisecond)
		b.net.Crash(b.hosts[victim])
		wg.Wait()
		comms[victim].Close()
		survivors, sbufs, swant := survivorsAborted(t, comms, errs, bufs, orig, victim)
		errs = each(survivors, func(i int, c *pccl.Communicator) error {
			if err := c.UpdateTopology(ctx); err != nil {
				return err
			}
			return c.AllReduce(ctx, pccl.Bytes(sbufs[i]), pccl.Bytes(sbufs[i]), desc)
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("survivor %d retry: %v", i, err)
			}
			if w := survivors[i].WorldSize(); w != 3 {
				t.Fatalf("survivor %d: world size %d after the crash, want 3", i, w)
			}
			checkSum(t, fmt.Sprintf("survivor %d retry", i), sbufs[i], swant)
		}
		// Only the victim's predecessor had to dial a new successor.
		var opened uint64
		for i, c := range comms {
			if i != victim {
				opened += c.Stats().LinksOpened - before[i].LinksOpened
			}
		}
		if opened != 1 {
			t.Fatalf("survivors opened %d links after the crash, want 1 (the victim's predecessor's pool)", opened)
		}
	})
}

// TestBubbleCancelOneOfThreeTags runs three tags at once on three peers and cancels one caller's
// context mid-operation: that tag fails everywhere, the other two complete with correct results, and
// the links stay up for them.
func TestBubbleCancelOneOfThreeTags(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		comms := b.startLinked(ctx, 3, pccl.LinkConfig{Latency: time.Millisecond, Bandwidth: 20e6})
		defer closeAll(comms)
		const count = 1 << 16
		opened := make([]uint64, 3)
		for i, c := range comms {
			opened[i] = c.Stats().LinksOpened
		}

		type result struct {
			bufs [][]float32
			want []float32
			errs []error
		}
		results := make([]result, 3)
		cancelCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for tag := range 3 {
			r := &results[tag]
			r.bufs, r.want = inputs(3, count, 100*tag)
			r.errs = make([]error, 3)
			for i, c := range comms {
				callCtx := ctx
				if tag == 1 && i == 0 {
					callCtx = cancelCtx
				}
				wg.Go(func() {
					d := pccl.Desc{Tag: uint64(10 + tag), Count: count, DType: pccl.F32, Op: pccl.Sum}
					r.errs[i] = c.AllReduce(callCtx, pccl.Bytes(r.bufs[i]), pccl.Bytes(r.bufs[i]), d)
				})
			}
		}
		// The three collectives share each link; 5 ms in, tag 11 is mid-transfer.
		time.Sleep(5 * time.Millisecond)
		cancel()
		wg.Wait()

		for tag := range 3 {
			r := results[tag]
			for i := range comms {
				who := fmt.Sprintf("tag %d peer %d", 10+tag, i)
				if tag != 1 {
					if r.errs[i] != nil {
						t.Fatalf("%s: %v", who, r.errs[i])
					}
					checkSum(t, who, r.bufs[i], r.want)
					continue
				}
				switch {
				case i == 0 && !errors.Is(r.errs[i], context.Canceled):
					t.Fatalf("%s: %v, want the caller's context.Canceled", who, r.errs[i])
				case i != 0 && !errors.Is(r.errs[i], pccl.ErrAborted):
					t.Fatalf("%s: %v, want ErrAborted", who, r.errs[i])
				}
				orig, _ := inputs(3, count, 100*tag)
				checkSum(t, who+"'s untouched buffer", r.bufs[i], orig[i])
			}
		}
		for i, c := range comms {
			if n := c.Stats().LinksOpened; n != opened[i] {
				t.Fatalf("peer %d opened %d links during the operations", i, n-opened[i])
			}
		}
		// The group goes on without re-wiring.
		bufs, want := inputs(3, count, 7)
		errs := each(comms, func(i int, c *pccl.Communicator) error {
			return c.AllReduce(ctx, pccl.Bytes(bufs[i]), pccl.Bytes(bufs[i]), pccl.Desc{Tag: 11, Count: count, DType: pccl.F32, Op: pccl.Sum})
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("peer %d after the cancel: %v", i, err)
			}
			checkSum(t, fmt.Sprintf("peer %d after the cancel", i), bufs[i], want)
		}
	})
}

// TestBubbleSilentLinkIsReported cuts two neighbours apart mid-operation while both still reach the
// master: no connection closes and no heartbeat stops, so only the data path's progress deadline can
// tell. Every caller gets ErrPeerLeft instead of hanging.
func TestBubbleSilentLinkIsReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		comms := b.startLinked(ctx, 3, pccl.LinkConfig{Latency: time.Millisecond, Bandwidth: 20e6})
		defer closeAll(comms)
		// The default progress floor (10s) decides, well before the master timeout would.
		if took := partitionMidOp(t, b, comms, b.hosts[0], b.hosts[1]); took < 10*time.Second || took > 20*time.Second {
			t.Fatalf("the silent link was reported after %v of bubble time, want the 10s progress floor", took)
		}
	})
}

// sumEverywhere runs an F32 sum AllReduce of count elements (tag 1) on every peer and checks every
// element of every result; what names the call in a failure.
func sumEverywhere(t *testing.T, comms []*pccl.Communicator, count, seed int, what string) {
	t.Helper()
	bufs, want := inputs(len(comms), count, seed)
	errs := each(comms, func(i int, c *pccl.Communicator) error {
		return c.AllReduce(context.Background(), pccl.Bytes(bufs[i]), pccl.Bytes(bufs[i]),
			pccl.Desc{Tag: 1, Count: count, DType: pccl.F32, Op: pccl.Sum})
	})
	for i, err := range errs {
		who := strings.TrimSpace(fmt.Sprintf("peer %d %s", i, what))
		if err != nil {
			t.Fatalf("%s: %v", who, err)
		}
		checkSum(t, who, bufs[i], want)
	}
}

// partitionMidOp starts an AllReduce on every peer, cuts hosts x and y apart 3 ms in, and checks
// that every caller fails with a retryable ErrPeerLeft and its buffer untouched. It returns how long
// the callers took, in bubble time.
func partitionMidOp(t *testing.T, b *group, comms []*pccl.Communicator, x, y string) time.Duration {
	t.Helper()
	const count = 1 << 16
	n := len(comms)
	bufs, _ := inputs(n, count, 0)
	orig, _ := inputs(n, count, 0)
	desc := pccl.Desc{Tag: 1, Count: count, DType: pccl.F32, Op: pccl.Sum}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, c := range comms {
		wg.Go(func() {
			errs[i] = c.AllReduce(context.Background(), pccl.Bytes(bufs[i]), pccl.Bytes(bufs[i]), desc)
		})
	}
	time.Sleep(3 * time.Millisecond)
	b.net.Partition(x, y)
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, pccl.ErrPeerLeft) || !pccl.Retryable(err) {
			t.Fatalf("peer %d: %v, want a retryable ErrPeerLeft", i, err)
		}
		checkSum(t, fmt.Sprintf("peer %d's untouched buffer", i), bufs[i], orig[i])
	}
	return time.Since(start)
}

// TestBubbleBlackHoledLinkIsAvoided black-holes the route between two ring neighbours of four peers
// mid-operation, while both still reach the master and everyone else: the operation fails on every
// peer within the progress deadline, the next UpdateTopology wires a ring in which the two are not
// neighbours, nobody is evicted, and the next AllReduce is correct on all four.
func TestBubbleBlackHoledLinkIsAvoided(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		comms := b.startLinked(ctx, 4, pccl.LinkConfig{Latency: time.Millisecond, Bandwidth: 20e6})
		defer closeAll(comms)
		host := map[uint64]string{}
		for i, c := range comms {
			host[c.ID()] = b.hosts[i]
		}
		ring := comms[0].Ring()
		x, y := ring[0], ring[1]
		if took := partitionMidOp(t, b, comms, host[x], host[y]); took > 20*time.Second {
			t.Fatalf("the silent link failed the operation after %v of bubble time, want about the 10s progress floor", took)
		}
		errs := each(comms, func(_ int, c *pccl.Communicator) error { return c.UpdateTopology(ctx) })
		for i, err := range errs {
			if err != nil {
				t.Fatalf("peer %d: UpdateTopology: %v", i, err)
			}
		}
		after := comms[0].Ring()
		if len(after) != 4 {
			t.Fatalf("ring %v after the cut, want all four peers", after)
		}
		for i, a := range after {
			if next := after[(i+1)%4]; (a == x && next == y) || (a == y && next == x) {
				t.Fatalf("ring %v still joins %d and %d, whose link is black-holed", after, x, y)
			}
		}
		sumEverywhere(t, comms, 1<<16, 7, "after the re-wiring")
		s := b.srv.Snapshot()
		if len(s.Peers) != 4 || s.Counters.Kicked != 0 || s.Counters.LinksCut == 0 {
			t.Fatalf("%d peers, %d kicked, %d links cut; want 4 peers, none kicked and the link cut", len(s.Peers),
				s.Counters.Kicked, s.Counters.LinksCut)
		}
	})
}

// TestBubbleNonFiniteQuantizedResultIsNotRetryable feeds an infinity into a quantized AllReduce: the
// owner of the chunk cannot encode its result, and every peer gets ErrLocalFailure, which Retryable
// rejects, with its buffer untouched, so no retry loop spins on it.
func TestBubbleNonFiniteQuantizedResultIsNotRetryable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		comms := b.startLinked(ctx, 3, pccl.LinkConfig{Latency: time.Millisecond, Bandwidth: 20e6})
		defer closeAll(comms)
		const count = 4096
		bufs, _ := inputs(3, count, 3)
		bufs[1][count/2] = float32(math.Inf(1))
		orig, _ := inputs(3, count, 3)
		orig[1][count/2] = float32(math.Inf(1))
		d := pccl.Desc{Tag: 5, Count: count, DType: pccl.F32, Op: pccl.Sum, Quant: pccl.MinMaxU8}
		errs := each(comms, func(i int, c *pccl.Communicator) error {
			return c.AllReduce(ctx, pccl.Bytes(bufs[i]), pccl.Bytes(bufs[i]), d)
		})
		for i, err := range errs {
			if !errors.Is(err, pccl.ErrLocalFailure) || pccl.Retryable(err) {
				t.Fatalf("peer %d: %v, want a non-retryable ErrLocalFailure", i, err)
			}
			for j := range orig[i] {
				if math.Float32bits(bufs[i][j]) != math.Float32bits(orig[i][j]) {
					t.Fatalf("peer %d: element %d changed to %v", i, j, bufs[i][j])
				}
			}
		}
	})
}

// TestBubbleTelemetryFillsTheDelayMatrix runs a few collectives and checks that every peer's link
// timings reached the master: each ring link has a delay in the master's matrix.
func TestBubbleTelemetryFillsTheDelayMatrix(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		comms := b.startLinked(ctx, 3, pccl.LinkConfig{Latency: time.Millisecond, Bandwidth: 20e6})
		defer closeAll(comms)
		for range 3 {
			sumEverywhere(t, comms, 1<<14, 1, "")
		}
		snap := b.srv.Snapshot()
		n := len(snap.Ring)
		if len(snap.Delay) != n || len(snap.Groups) != 1 {
			t.Fatalf("delay matrix has %d rows for a ring of %d; %d groups", len(snap.Delay), n, len(snap.Groups))
		}
		for i := range n {
			from, to := snap.Ring[i], snap.Ring[(i+1)%n]
			found := false
			for _, l := range snap.Groups[0].Links {
				if l.From == from && l.To == to && l.Transfer > 0 && l.Age == 0 {
					found = true
				}
			}
			if !found {
				t.Fatalf("ring link %d -> %d has no fresh timing at the master: %+v", from, to, snap.Groups[0].Links)
			}
		}
	})
}
