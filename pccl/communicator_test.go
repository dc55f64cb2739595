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

	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	cluster.Main(nil) // a master started by cluster.StartMaster is this test binary, re-executed
	goleak.VerifyTestMain(m)
}

// sumOfRanks has every communicator AllReduce its index+1 and checks the sum on each.
func sumOfRanks(ctx context.Context, comms []*pccl.Communicator) []error {
	want := int64(len(comms) * (len(comms) + 1) / 2)
	return each(comms, func(i int, c *pccl.Communicator) error {
		v := []int64{int64(i + 1)}
		if err := c.AllReduce(ctx, pccl.Bytes(v), pccl.Bytes(v), pccl.Desc{Tag: 1, Count: 1, DType: pccl.I64, Op: pccl.Sum}); err != nil {
			return err
		}
		if v[0] != want {
			return fmt.Errorf("sum %d, want %d", v[0], want)
		}
		return nil
	})
}

// fill returns count float32 values that depend on (seed, i); small integers so sums are exact.
func fill(count int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 7))
	v := make([]float32, count)
	for i := range v {
		v[i] = float32(r.IntN(200) - 100)
	}
	return v
}

func TestAllReduceSum(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		for _, n := range []int{4} {
			comms, _ := g.start(ctx, n)
			defer closeAll(comms)
			for _, count := range []int{0, 1, 3, 1000, 20011} {
				in := make([][]float32, n)
				want := make([]float32, count)
				for i := range comms {
					in[i] = fill(count, uint64(comms[i].ID()))
					for j, v := range in[i] {
						want[j] += v
					}
				}
				out := make([][]float32, n)
				for i := range out {
					out[i] = make([]float32, count)
				}
				errs := each(comms, func(i int, c *pccl.Communicator) error {
					return c.AllReduce(ctx, pccl.Bytes(in[i]), pccl.Bytes(out[i]), pccl.Desc{Tag: 1, Count: count, DType: pccl.F32, Op: pccl.Sum})
				})
				for i := range comms {
					if errs[i] != nil {
						t.Fatalf("count %d peer %d: %v", count, i, errs[i])
					}
					for j := range want {
						if out[i][j] != want[j] {
							t.Fatalf("count %d peer %d element %d: %v, want %v", count, i, j, out[i][j], want[j])
						}
					}
				}
			}
		}
	})
}

func TestDescriptorMismatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, _ := g.start(ctx, 3)
		defer closeAll(comms)
		errs := each(comms, func(i int, c *pccl.Communicator) error {
			count := 16
			if i == 2 {
				count = 17
			}
			buf := make([]float32, count)
			return c.AllReduce(ctx, pccl.Bytes(buf), pccl.Bytes(buf), pccl.Desc{Tag: 5, Count: count, DType: pccl.F32, Op: pccl.Sum})
		})
		for i, err := range errs {
			if !errors.Is(err, pccl.ErrDescriptorMismatch) {
				t.Errorf("peer %d: %v, want ErrDescriptorMismatch", i, err)
			}
		}
	})
}

// TestPartBytesMismatch: a peer that cuts its frames differently (Config.PartBytes) could not match
// the others' frames; the operation's descriptor carries the part size, so every caller gets
// ErrDescriptorMismatch at once instead of a stalled or garbled collective, and buffers stay as
// they were.
func TestPartBytesMismatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		g.parts = map[string]int{"peer3": 8192}
		comms, _ := g.start(ctx, 3)
		defer closeAll(comms)
		const count = 1 << 12
		bufs := make([][]float32, len(comms))
		errs := each(comms, func(i int, c *pccl.Communicator) error {
			bufs[i] = fill(count, c.ID())
			return c.AllReduce(ctx, pccl.Bytes(bufs[i]), pccl.Bytes(bufs[i]), pccl.Desc{Tag: 5, Count: count, DType: pccl.F32, Op: pccl.Sum})
		})
		for i, err := range errs {
			if !errors.Is(err, pccl.ErrDescriptorMismatch) {
				t.Errorf("peer %d: %v, want ErrDescriptorMismatch", i, err)
			}
			if want := fill(count, comms[i].ID()); !slices.Equal(bufs[i], want) {
				t.Errorf("peer %d: buffer changed", i)
			}
		}
	})
}

// TestPeerDiesMidCollective crashes one host during a large AllReduce: every survivor gets ErrPeerLeft
// with its buffers unchanged, re-wires with UpdateTopology and the retry is correct.
func TestPeerDiesMidCollective(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, hosts := g.start(ctx, 4)
		defer closeAll(comms)
		const count = 1 << 18
		victim := 2
		bufs := make([][]float32, len(comms))
		orig := make([][]byte, len(comms))
		for i, c := range comms {
			bufs[i] = fill(count, c.ID())
			orig[i] = bytes.Clone(pccl.Bytes(bufs[i]))
		}
		var wg sync.WaitGroup
		errs := make([]error, len(comms))
		for i, c := range comms {
			wg.Add(1)
			go func(i int, c *pccl.Communicator) {
				defer wg.Done()
				b := pccl.Bytes(bufs[i])
				errs[i] = c.AllReduce(ctx, b, b, pccl.Desc{Tag: 9, Count: count, DType: pccl.F32, Op: pccl.Sum})
			}(i, c)
		}
		crashOnceMoving(t, g, hosts, victim)
		wg.Wait()
		comms[victim].Close()
		survivors, sbufs, want := survivorsAborted(t, comms, errs, bufs, orig, victim)
		for i, c := range survivors {
			wg.Add(1)
			go func(i int, c *pccl.Communicator) {
				defer wg.Done()
				if err := c.UpdateTopology(ctx); err != nil {
					errs[i] = err
					return
				}
				b := pccl.Bytes(sbufs[i])
				errs[i] = c.AllReduce(ctx, b, b, pccl.Desc{Tag: 9, Count: count, DType: pccl.F32, Op: pccl.Sum})
			}(i, c)
		}
		wg.Wait()
		for i, c := range survivors {
			if errs[i] != nil {
				t.Fatalf("survivor %d retry: %v", i, errs[i])
			}
			if c.WorldSize() != 3 {
				t.Fatalf("world size %d after the crash, want 3", c.WorldSize())
			}
			for j := range want {
				if sbufs[i][j] != want[j] {
					t.Fatalf("survivor %d element %d: %v, want %v", i, j, sbufs[i][j], want[j])
				}
			}
		}
	})
}

// TestJoinDoesNotStall shows collectives completing while a newcomer registers, and the newcomer being
// accepted at the next UpdateTopology, then taking part.
func TestJoinDoesNotStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, _ := g.start(ctx, 2)
		defer closeAll(comms)

		joined := make(chan *pccl.Communicator, 1)
		joinErr := make(chan error, 1)
		go func() {
			c, err := g.connect(ctx, g.host())
			if err != nil {
				joinErr <- err
				return
			}
			joined <- c
		}()
		// Keep reducing among the accepted pair until the newcomer has registered, and a few more times.
		registered, rounds := false, 0
		for rounds < 5 {
			for _, err := range sumOfRanks(ctx, comms) {
				if err != nil {
					t.Fatal(err)
				}
			}
			if !registered {
				registered = len(g.srv.Snapshot().Peers) == 3
				continue
			}
			rounds++
		}
		select {
		case c := <-joined:
			t.Fatalf("peer %d accepted without an UpdateTopology", c.ID())
		case err := <-joinErr:
			t.Fatal(err)
		default:
		}
		pending := make([]bool, 2)
		var wg sync.WaitGroup
		for i, c := range comms {
			wg.Add(1)
			go func(i int, c *pccl.Communicator) {
				defer wg.Done()
				p, err := c.ArePeersPending(ctx)
				if err != nil {
					t.Error(err)
				}
				pending[i] = p
				if err := c.UpdateTopology(ctx); err != nil {
					t.Error(err)
				}
			}(i, c)
		}
		wg.Wait()
		if !pending[0] || !pending[1] {
			t.Fatalf("ArePeersPending = %v, want true on both", pending)
		}
		var newcomer *pccl.Communicator
		select {
		case newcomer = <-joined:
		case err := <-joinErr:
			t.Fatal(err)
		}
		comms = append(comms, newcomer)
		for i, err := range sumOfRanks(ctx, comms) {
			if err != nil {
				t.Fatalf("peer %d: %v", i, err)
			}
		}
		newcomer.Close()
	})
}

// TestHungPeerIsDetected black-holes one peer (as if SIGSTOPped): the master's heartbeat deadline
// declares it gone and the survivors' collective fails with ErrPeerLeft.
func TestHungPeerIsDetected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{HeartbeatInterval: 50 * time.Millisecond, HeartbeatTimeout: 300 * time.Millisecond})
		comms, hosts := g.start(ctx, 3)
		defer closeAll(comms)
		for _, other := range []string{"master", hosts[0], hosts[2]} {
			g.net.Partition(hosts[1], other)
		}
		var wg sync.WaitGroup
		errs := make([]error, 3)
		for _, i := range []int{0, 2} {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				v := make([]float32, 1<<16)
				errs[i] = comms[i].AllReduce(ctx, pccl.Bytes(v), pccl.Bytes(v), pccl.Desc{Tag: 2, Count: len(v), DType: pccl.F32, Op: pccl.Sum})
			}(i)
		}
		wg.Wait()
		for _, i := range []int{0, 2} {
			if !errors.Is(errs[i], pccl.ErrPeerLeft) {
				t.Fatalf("peer %d: %v, want ErrPeerLeft", i, errs[i])
			}
		}
		for _, other := range []string{"master", hosts[0], hosts[2]} {
			g.net.Heal(hosts[1], other)
		}
	})
}

func TestKickedForWrongToken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{Token: "secret"})
		_, err := g.connect(ctx, g.host())
		if !errors.Is(err, pccl.ErrKicked) {
			t.Fatalf("err = %v, want ErrKicked", err)
		}
	})
}

// crashOnceMoving waits until the victim's host has sent data to another host, a collective having
// started, and crashes it.
func crashOnceMoving(t *testing.T, g *group, hosts []string, victim int) {
	t.Helper()
	sent := func() (n int64) {
		for i, h := range hosts {
			if i != victim {
				n += g.net.Stats(hosts[victim], h)
			}
		}
		return n
	}
	for deadline := time.Now().Add(20 * time.Second); sent() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the collective never started moving data")
		}
		time.Sleep(100 * time.Microsecond)
	}
	g.net.Crash(hosts[victim])
}

// survivorsAborted checks that every peer but victim got ErrPeerLeft with its buffer still as orig
// holds it, and returns the survivors, their buffers and the sum of those.
func survivorsAborted(t *testing.T, comms []*pccl.Communicator, errs []error, bufs [][]float32, orig [][]byte, victim int) ([]*pccl.Communicator, [][]float32, []float32) {
	t.Helper()
	var survivors []*pccl.Communicator
	var sbufs [][]float32
	for i, c := range comms {
		if i == victim {
			continue
		}
		if !errors.Is(errs[i], pccl.ErrPeerLeft) {
			t.Fatalf("survivor %d: %v, want ErrPeerLeft", i, errs[i])
		}
		if !bytes.Equal(pccl.Bytes(bufs[i]), orig[i]) {
			t.Fatalf("survivor %d: buffer changed by the aborted call", i)
		}
		survivors = append(survivors, c)
		sbufs = append(sbufs, bufs[i])
	}
	want := make([]float32, len(bufs[0]))
	for _, b := range sbufs {
		for j, v := range b {
			want[j] += v
		}
	}
	return survivors, sbufs, want
}
