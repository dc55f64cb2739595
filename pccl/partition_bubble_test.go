package pccl_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/sharedstate"
)

// checked is a training-like loop on one peer: each step the group syncs a step counter as shared
// state, then all-reduces values derived from (peer id, step) and checks every element against the
// exact sum over the ring that ran it. It follows the retry pattern: after any retryable failure the
// peer calls UpdateTopology and restarts the step at its sync, where newcomers enter. A fresh peer (a
// newcomer to a group that holds state) adopts the group's state at its first sync. Each step computes
// for compute first. record sees every revision this peer accepted and its state's hash.
func checked(ctx context.Context, c *pccl.Communicator, fresh bool, steps uint64, compute time.Duration, record func(rev, hash uint64)) error {
	return stepLoop(ctx, c, loopOptions{fresh: fresh, steps: steps, compute: compute, record: record})
}

// loopOptions are the knobs of checkedLoop: see checked. leave, if set, is asked at every membership
// step; when it says so, the peer leaves there (Communicator.Leave). aborts counts the retries.
type loopOptions struct {
	fresh   bool
	steps   uint64
	compute time.Duration
	record  func(rev, hash uint64)
	leave   func() bool
	aborts  *int
}

func stepLoop(ctx context.Context, c *pccl.Communicator, o loopOptions) error {
	fresh, steps, compute, record := o.fresh, o.steps, o.compute, o.record
	const count = 1 << 12
	step := make([]uint64, 1)
	st := sharedstate.NewState()
	st.Add(&sharedstate.Entry{Name: "step", DType: pccl.U64, Data: pccl.Bytes(step)})
	buf := make([]float32, count)
	value := func(id, s uint64, i int) float32 { return float32((id%97*31 + s*7 + uint64(i)) % 1024) }
	atSync := fresh
	retry := func(err error) error {
		if !pccl.Retryable(err) && !errors.Is(err, pccl.ErrSync) {
			return err
		}
		if o.aborts != nil {
			*o.aborts++
		}
		atSync = true
		return c.UpdateTopology(ctx)
	}
	for step[0] < steps {
		if !atSync && o.leave != nil && o.leave() {
			return c.Leave(ctx)
		}
		if !atSync {
			pending, err := c.ArePeersPending(ctx)
			if err != nil {
				if err := retry(err); err != nil {
					return err
				}
				continue
			}
			if pending {
				if err := c.UpdateTopology(ctx); err != nil {
					return err
				}
			}
		}
		atSync = false
		if c.WorldSize() < 2 {
			time.Sleep(20 * time.Millisecond)
			if err := c.UpdateTopology(ctx); err != nil {
				return err
			}
			atSync = true
			continue
		}
		st.Revision++
		opts := pccl.SyncOptions{Strategy: pccl.EnforcePopular}
		if fresh {
			opts.Strategy = pccl.ReceiveOnly
		}
		res, err := c.SyncSharedState(ctx, st, opts)
		if err != nil {
			if err := retry(err); err != nil {
				return err
			}
			continue
		}
		fresh = false
		record(res.Revision, sharedstate.Hash(pccl.Bytes(step)))
		time.Sleep(compute)
		for i := range buf {
			buf[i] = value(c.ID(), step[0], i)
		}
		desc := pccl.Desc{Tag: 1, Count: count, DType: pccl.F32, Op: pccl.Sum}
		if err := c.AllReduce(ctx, pccl.Bytes(buf), pccl.Bytes(buf), desc); err != nil {
			if err := retry(err); err != nil {
				return err
			}
			continue
		}
		ring := c.Ring()
		for i, v := range buf {
			var want float32
			for _, id := range ring {
				want += value(id, step[0], i)
			}
			if v != want {
				return fmt.Errorf("step %d element %d: %v, want %v (ring %v)", step[0], i, v, want, ring)
			}
		}
		step[0]++
	}
	return nil
}

// revisions collects every accepted revision's state hash from every peer; two different hashes for
// one revision would be two sides of a partition advancing apart.
type revisions struct {
	mu   sync.Mutex
	hash map[uint64]uint64
	err  error
}

func (r *revisions) record(rev, hash uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hash == nil {
		r.hash = map[uint64]uint64{}
	}
	if h, ok := r.hash[rev]; ok && h != hash && r.err == nil {
		r.err = fmt.Errorf("revision %d accepted with state %x and with %x", rev, h, hash)
	}
	r.hash[rev] = hash
}

// TestBubbleMasterCutLosesNothing cuts the master off from all three peers for 15 s, ten heartbeat
// timeouts, while they run the checked loop. The master hears nobody and kicks nobody; the peers wait,
// then resume their sessions on new connections (the old ones never deliver again), and the loop goes
// on with every result exact, no peer kicked and no collective aborted.
func TestBubbleMasterCutLosesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		comms := b.startLinked(ctx, 3, pccl.LinkConfig{Latency: time.Millisecond, Bandwidth: 50e6})
		defer closeAll(comms)
		var revs revisions
		const steps = 40
		done := make(chan []error)
		go func() {
			done <- each(comms, func(i int, c *pccl.Communicator) error { return checked(ctx, c, false, steps, 0, revs.record) })
		}()
		time.Sleep(100 * time.Millisecond)
		for _, h := range b.hosts {
			b.net.Partition("master", h)
		}
		time.Sleep(15 * time.Second)
		for _, h := range b.hosts {
			b.net.Heal("master", h)
		}
		for i, err := range <-done {
			if err != nil {
				t.Fatalf("peer %d: %v", i, err)
			}
		}
		if revs.err != nil {
			t.Fatal(revs.err)
		}
		for rev := uint64(1); rev <= steps; rev++ {
			if _, ok := revs.hash[rev]; !ok {
				t.Errorf("revision %d was never accepted: revisions are not consecutive", rev)
			}
		}
		snap := b.srv.Snapshot()
		if snap.Counters.Kicked != 0 || snap.Counters.Timeouts != 0 || snap.Counters.OpsAborted != 0 || len(snap.Peers) != 3 {
			t.Fatalf("after the cut: %d peers, counters %+v; want 3 peers, nobody kicked, nothing aborted", len(snap.Peers), snap.Counters)
		}
	})
}

// TestBubblePeerCutRejoins cuts one of four peers off from everyone for 5 s while all run the checked
// loop under pccl.Rejoin. The master still hears three, so it kicks the cut peer after the heartbeat
// timeout and the others go on. When the cut heals, the peer learns it was removed, connects again as
// a newcomer, fetches the group's state and finishes with the others.
func TestBubblePeerCutRejoins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		link := pccl.LinkConfig{Latency: time.Millisecond, Bandwidth: 50e6}
		hosts := []string{"peer1", "peer2", "peer3", "peer4"}
		for _, from := range hosts {
			for _, to := range hosts {
				if from != to {
					b.net.SetLink(from, to, link)
				}
			}
		}
		var revs revisions
		const steps = 100 // 10 s of compute: the cut peer is back before the end
		rejoins := make([]int, len(hosts))
		errs := make([]error, len(hosts))
		var wg sync.WaitGroup
		for i, h := range hosts {
			wg.Go(func() {
				cfg := pccl.Config{Master: masterAddr, ListenAddr: h + ":9000", Transport: b.net.Host(h), PartBytes: 16 << 10}
				errs[i] = pccl.Rejoin(ctx, cfg, pccl.RejoinConfig{}, func(ctx context.Context, c *pccl.Communicator, n int) error {
					rejoins[i] = n
					return checked(ctx, c, c.WorldSize() > 1, steps, 100*time.Millisecond, revs.record)
				})
			})
		}
		for len(b.srv.Snapshot().Ring) < 4 {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond)
		cut := hosts[3]
		for _, h := range append([]string{"master"}, hosts[:3]...) {
			b.net.Partition(cut, h)
		}
		time.Sleep(5 * time.Second)
		for _, h := range append([]string{"master"}, hosts[:3]...) {
			b.net.Heal(cut, h)
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("peer %d: %v", i, err)
			}
		}
		if revs.err != nil {
			t.Fatal(revs.err)
		}
		if rejoins[3] != 1 || rejoins[0]+rejoins[1]+rejoins[2] != 0 {
			t.Fatalf("rejoins per peer %v, want only the cut one, once", rejoins)
		}
		if snap := b.srv.Snapshot(); snap.Counters.Timeouts != 1 {
			t.Fatalf("counters %+v: want exactly one timeout (the cut peer)", snap.Counters)
		}
	})
}

// TestBubbleMasterFlaps cuts the master off from a random subset of three peers, again and again, for
// 0.3 to 3 s each time, while they run the checked loop: sessions are resumed over and over, frames
// are sent again and skipped, and every result stays exact, every revision has one state. The cuts
// come from a fixed seed; the peers that are cut longer than the heartbeat timeout while the master
// hears the others are kicked and come back through Rejoin.
func TestBubbleMasterFlaps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		link := pccl.LinkConfig{Latency: time.Millisecond, Bandwidth: 50e6}
		hosts := []string{"peer1", "peer2", "peer3"}
		for _, from := range hosts {
			for _, to := range hosts {
				if from != to {
					b.net.SetLink(from, to, link)
				}
			}
		}
		var revs revisions
		const steps = 300 // 30 s of compute
		errs := make([]error, len(hosts))
		var wg sync.WaitGroup
		for i, h := range hosts {
			wg.Go(func() {
				cfg := pccl.Config{Master: masterAddr, ListenAddr: h + ":9000", Transport: b.net.Host(h), PartBytes: 16 << 10}
				errs[i] = pccl.Rejoin(ctx, cfg, pccl.RejoinConfig{}, func(ctx context.Context, c *pccl.Communicator, n int) error {
					return checked(ctx, c, c.WorldSize() > 1, steps, 100*time.Millisecond, revs.record)
				})
			})
		}
		for len(b.srv.Snapshot().Ring) < len(hosts) {
			time.Sleep(10 * time.Millisecond)
		}
		rng := rand.New(rand.NewPCG(7, 11))
		for range 12 {
			time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond)
			var cut []string
			for _, h := range hosts {
				if rng.IntN(2) == 0 {
					cut = append(cut, h)
				}
			}
			for _, h := range cut {
				b.net.Partition("master", h)
			}
			time.Sleep(time.Duration(300+rng.IntN(2700)) * time.Millisecond)
			for _, h := range cut {
				b.net.Heal("master", h)
			}
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("peer %d: %v", i, err)
			}
		}
		if revs.err != nil {
			t.Fatal(revs.err)
		}
		t.Logf("counters after the flaps: %+v, %d revisions", b.srv.Snapshot().Counters, len(revs.hash))
	})
}

// TestBubbleLeaveAtSafePoint has one of four peers leave at the membership step of the checked loop
// (a preemption notice): the others are answered "pending", re-wire without it at UpdateTopology and
// go on with no collective aborted and no retry.
func TestBubbleLeaveAtSafePoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		comms := b.startLinked(ctx, 4, pccl.LinkConfig{Latency: time.Millisecond, Bandwidth: 50e6})
		var revs revisions
		aborts := make([]int, 4)
		var steps [4]uint64
		errs := each(comms, func(i int, c *pccl.Communicator) error {
			o := loopOptions{steps: 40, compute: 10 * time.Millisecond, aborts: &aborts[i],
				record: func(rev, hash uint64) { revs.record(rev, hash); steps[i]++ }}
			if i == 3 {
				o.leave = func() bool { return steps[i] >= 10 }
			}
			return stepLoop(ctx, c, o)
		})
		closeAll(comms[:3])
		for i, err := range errs {
			if err != nil {
				t.Fatalf("peer %d: %v", i, err)
			}
		}
		if revs.err != nil {
			t.Fatal(revs.err)
		}
		for i := range 3 {
			if aborts[i] != 0 {
				t.Errorf("peer %d retried %d times around a graceful leave, want none", i, aborts[i])
			}
		}
		snap := b.srv.Snapshot()
		if snap.Counters.OpsAborted != 0 || snap.Counters.Kicked != 0 {
			t.Errorf("counters %+v: want nothing aborted, nobody kicked", snap.Counters)
		}
	})
}
