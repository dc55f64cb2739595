package pccl_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// gatherInputs returns n payloads of size random bytes each, different per peer and per seed.
func gatherInputs(n, size int, seed uint64) [][]byte {
	r := rand.New(rand.NewPCG(seed, 0xa11))
	sends := make([][]byte, n)
	for i := range sends {
		sends[i] = make([]byte, size)
		for j := range sends[i] {
			sends[i][j] = byte(r.Uint32())
		}
	}
	return sends
}

// gatherOnEvery runs an AllGather of count elements of dt on every communicator at once and checks
// every byte of every peer's result: slot r holds the payload of the peer at rank r of the ring.
func gatherOnEvery(ctx context.Context, t *testing.T, comms []*pccl.Communicator, tag uint64, count int, dt pccl.DType, seed uint64) {
	t.Helper()
	size := count * dt.Size()
	sends := gatherInputs(len(comms), size, seed)
	recvs := make([][]byte, len(comms))
	errs := each(comms, func(i int, c *pccl.Communicator) error {
		recvs[i] = make([]byte, len(c.Ring())*size)
		return c.AllGather(ctx, sends[i], recvs[i], pccl.Desc{Tag: tag, Count: count, DType: dt})
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	byID := map[uint64][]byte{}
	for i, c := range comms {
		byID[c.ID()] = sends[i]
	}
	for i, c := range comms {
		ring := c.Ring()
		if len(recvs[i]) != len(ring)*size {
			t.Fatalf("peer %d: %d bytes for %d peers of %d", i, len(recvs[i]), len(ring), size)
		}
		for r, id := range ring {
			if got := recvs[i][r*size : (r+1)*size]; !bytes.Equal(got, byID[id]) {
				t.Fatalf("peer %d: slot %d (peer %d) differs from that peer's payload", i, r, id)
			}
		}
	}
}

// TestAllGather gathers on flat rings of two and four peers, payloads of several sizes and types
// (none, one byte, sizes that do not divide by the peer count), and after the ring lost peers, down to
// one.
func TestAllGather(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, _ := g.start(ctx, 4)
		defer closeAll(comms)
		for k, tc := range []struct {
			count int
			dt    pccl.DType
		}{{0, pccl.U8}, {1, pccl.U8}, {1001, pccl.F32}, {33331, pccl.BF16}, {1 << 16, pccl.F64}} {
			gatherOnEvery(ctx, t, comms, 7, tc.count, tc.dt, uint64(k))
		}
		// Two tags at once: an AllGather beside an AllReduce.
		bufs, want := inputs(4, 5000, 3)
		sends := gatherInputs(4, 999, 9)
		recvs := make([][]byte, 4)
		errs := each(comms, func(i int, c *pccl.Communicator) error {
			recvs[i] = make([]byte, 4*999)
			r := c.AllReduceAsync(ctx, pccl.Bytes(bufs[i]), pccl.Bytes(bufs[i]), pccl.Desc{Tag: 1, Count: 5000, DType: pccl.F32, Op: pccl.Sum})
			return errors.Join(c.AllGather(ctx, sends[i], recvs[i], pccl.Desc{Tag: 2, Count: 999, DType: pccl.U8}), r.Wait())
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		for i := range comms {
			checkSum(t, fmt.Sprintf("peer %d", i), bufs[i], want)
			if !bytes.Equal(recvs[i], recvs[0]) {
				t.Fatalf("peer %d gathered other bytes than peer 0", i)
			}
		}
		// Down to two peers.
		comms[3].Close()
		comms[2].Close()
		left := comms[:2]
		if err := errors.Join(each(left, func(_ int, c *pccl.Communicator) error { return c.UpdateTopology(ctx) })...); err != nil {
			t.Fatal(err)
		}
		gatherOnEvery(ctx, t, left, 7, 4097, pccl.F32, 11)
		// A ring of one gathers its own payload.
		comms[1].Close()
		if err := comms[0].UpdateTopology(ctx); err != nil {
			t.Fatal(err)
		}
		gatherOnEvery(ctx, t, comms[:1], 7, 33, pccl.U16, 12)
	})
}

// TestAllGatherHierarchical gathers on two sites of three peers, where it runs as the hierarchical
// byte sum, with a payload large enough for the WAN pipeline.
func TestAllGatherHierarchical(t *testing.T) {
	bubbled(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, _ := g.startSites(ctx, 2, 3)
		defer closeAll(comms)
		requireHierarchical(t, comms, 2, 3)
		gatherOnEvery(ctx, t, comms, 5, 3, pccl.U8, 1)
		gatherOnEvery(ctx, t, comms, 5, 1<<18, pccl.F32, 2)
	})
}

// TestAllGatherErrors: bad arguments are ErrInvalid before anything is sent; an AllGather against an
// AllReduce on the same tag is a descriptor mismatch for both; recv stays as it was.
func TestAllGatherErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, _ := g.start(ctx, 3)
		defer closeAll(comms)
		c := comms[0]
		send := make([]byte, 64)
		for _, tc := range []struct {
			name string
			recv []byte
			d    pccl.Desc
		}{
			{"op", make([]byte, 3*64), pccl.Desc{Count: 64, DType: pccl.U8, Op: pccl.Sum}},
			{"quant", make([]byte, 3*64), pccl.Desc{Count: 16, DType: pccl.F32, Quant: pccl.MinMaxU8}},
			{"count", make([]byte, 3*64), pccl.Desc{Count: 63, DType: pccl.U8}},
			{"recv", make([]byte, 2*64), pccl.Desc{Count: 64, DType: pccl.U8}},
			{"dtype", make([]byte, 3*64), pccl.Desc{Count: 64, DType: 200}},
		} {
			if err := c.AllGather(ctx, send, tc.recv, tc.d); !errors.Is(err, pccl.ErrInvalid) {
				t.Fatalf("%s: %v, want ErrInvalid", tc.name, err)
			}
		}
		sends := gatherInputs(3, 400, 5)
		recv := bytes.Repeat([]byte{0xee}, 3*400)
		errs := each(comms, func(i int, c *pccl.Communicator) error {
			if i == 0 {
				return c.AllGather(ctx, sends[i], recv, pccl.Desc{Tag: 4, Count: 400, DType: pccl.U8})
			}
			buf := bytes.Clone(sends[i])
			return c.AllReduce(ctx, buf, buf, pccl.Desc{Tag: 4, Count: 400, DType: pccl.U8, Op: pccl.Sum})
		})
		for i, err := range errs {
			if !errors.Is(err, pccl.ErrDescriptorMismatch) {
				t.Fatalf("peer %d: %v, want ErrDescriptorMismatch", i, err)
			}
		}
		if slices.ContainsFunc(recv, func(b byte) bool { return b != 0xee }) {
			t.Fatal("a failed AllGather wrote recv")
		}
		gatherOnEvery(ctx, t, comms, 4, 400, pccl.U8, 6)
	})
}

// TestAllGatherPeerDies crashes a peer while an AllGather moves data: every survivor gets
// ErrPeerLeft with recv untouched, and the retry on the re-wired ring gathers the survivors'.
func TestAllGatherPeerDies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		comms := b.startLinked(ctx, 4, pccl.LinkConfig{Latency: time.Millisecond, Bandwidth: 50e6})
		defer closeAll(comms)
		const size = 1 << 18
		desc := pccl.Desc{Tag: 9, Count: size, DType: pccl.U8}
		sends := gatherInputs(4, size, 7)
		recvs := make([][]byte, 4)
		errs := make([]error, 4)
		var wg sync.WaitGroup
		for i, c := range comms {
			recvs[i] = bytes.Repeat([]byte{0x5a}, 4*size)
			wg.Go(func() { errs[i] = c.AllGather(ctx, sends[i], recvs[i], desc) })
		}
		time.Sleep(2 * time.Millisecond)
		const victim = 1
		b.net.Crash(b.hosts[victim])
		wg.Wait()
		comms[victim].Close()
		var survivors []*pccl.Communicator
		for i, c := range comms {
			if i == victim {
				continue
			}
			if !errors.Is(errs[i], pccl.ErrPeerLeft) {
				t.Fatalf("survivor %d: %v, want ErrPeerLeft", i, errs[i])
			}
			if slices.ContainsFunc(recvs[i], func(b byte) bool { return b != 0x5a }) {
				t.Fatalf("survivor %d: a failed AllGather wrote recv", i)
			}
			survivors = append(survivors, c)
		}
		if err := errors.Join(each(survivors, func(_ int, c *pccl.Communicator) error { return c.UpdateTopology(ctx) })...); err != nil {
			t.Fatal(err)
		}
		gatherOnEvery(ctx, t, survivors, 9, size, pccl.U8, 8)
	})
}
