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

// startGroup connects peers on the given hosts into peer group id of g's master, and admits them.
// Every host is linked to every other host of the group.
func (g *group) startGroup(ctx context.Context, id uint32, hosts []string) []*pccl.Communicator {
	g.t.Helper()
	g.link(hosts, func(int, int) pccl.LinkConfig { return pccl.LinkConfig{Latency: time.Millisecond, Bandwidth: 50e6} })
	return g.admit(ctx, hosts, func(i int, cfg *pccl.Config) { cfg.Group = id })
}

// checkGroupInfo checks what every communicator of a group reports about its group and the run.
func checkGroupInfo(t *testing.T, comms []*pccl.Communicator, want pccl.GroupInfo) {
	t.Helper()
	for i, c := range comms {
		if got := c.GroupInfo(); got != want {
			t.Fatalf("group %d peer %d: GroupInfo %+v, want %+v", want.Group, i, got, want)
		}
	}
}

// TestBubbleTwoGroups runs groups of 2 and 3 peers on one master: each all-reduces on its own ring,
// both report the run's sizes, and a peer of group 1 crashing mid-operation fails only group 1's
// operation; group 0's in-flight and next all-reduces complete with correct sums.
func TestBubbleTwoGroups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		g0 := b.startGroup(ctx, 0, []string{"a1", "a2"})
		defer closeAll(g0)
		g1 := b.startGroup(ctx, 1, []string{"b1", "b2", "b3"})
		defer closeAll(g1)
		groups := [][]*pccl.Communicator{g0, g1}

		// Group 0 learns of group 1 at its next topology.
		for gi, g := range groups {
			for i, err := range each(g, func(_ int, c *pccl.Communicator) error { return c.UpdateTopology(ctx) }) {
				if err != nil {
					t.Fatalf("group %d peer %d: update topology: %v", gi, i, err)
				}
			}
		}
		checkGroupInfo(t, g0, pccl.GroupInfo{Group: 0, GroupWorldSize: 2, GlobalWorldSize: 5, Groups: 2, LargestGroup: 3})
		checkGroupInfo(t, g1, pccl.GroupInfo{Group: 1, GroupWorldSize: 3, GlobalWorldSize: 5, Groups: 2, LargestGroup: 3})

		const count = 1 << 16
		desc := pccl.Desc{Tag: 1, Count: count, DType: pccl.F32, Op: pccl.Sum}
		// allReduce runs one all-reduce in every group at once, with the same tag, and returns each
		// group's buffers, expected sums and errors.
		allReduce := func(seed int, during func()) ([][][]float32, [][]float32, [][]error) {
			bufs := make([][][]float32, len(groups))
			wants := make([][]float32, len(groups))
			errs := make([][]error, len(groups))
			var wg sync.WaitGroup
			for gi, g := range groups {
				bufs[gi], wants[gi] = inputs(len(g), count, seed+gi)
				errs[gi] = make([]error, len(g))
				for i, c := range g {
					wg.Go(func() {
						errs[gi][i] = c.AllReduce(ctx, pccl.Bytes(bufs[gi][i]), pccl.Bytes(bufs[gi][i]), desc)
					})
				}
			}
			if during != nil {
				during()
			}
			wg.Wait()
			return bufs, wants, errs
		}

		bufs, wants, errs := allReduce(0, nil)
		for gi := range groups {
			for i, err := range errs[gi] {
				if err != nil {
					t.Fatalf("group %d peer %d: %v", gi, i, err)
				}
				checkSum(t, fmt.Sprintf("group %d peer %d", gi, i), bufs[gi][i], wants[gi])
			}
		}

		// Crash b2 while both groups move data.
		bufs, wants, errs = allReduce(10, func() {
			time.Sleep(2 * time.Millisecond)
			b.net.Crash("b2")
		})
		for i, err := range errs[0] {
			if err != nil {
				t.Fatalf("group 0 peer %d, during group 1's crash: %v", i, err)
			}
			checkSum(t, fmt.Sprintf("group 0 peer %d during the crash", i), bufs[0][i], wants[0])
		}
		for _, i := range []int{0, 2} {
			if !errors.Is(errs[1][i], pccl.ErrPeerLeft) {
				t.Fatalf("group 1 survivor %d: %v, want ErrPeerLeft", i, errs[1][i])
			}
		}
		g1[1].Close()
		g1 = []*pccl.Communicator{g1[0], g1[2]}
		groups[1] = g1

		// Group 0 goes on without noticing; group 1 re-wires and all-reduces again.
		for i, err := range each(g1, func(_ int, c *pccl.Communicator) error { return c.UpdateTopology(ctx) }) {
			if err != nil {
				t.Fatalf("group 1 survivor %d: update topology: %v", i, err)
			}
		}
		bufs, wants, errs = allReduce(20, nil)
		for gi := range groups {
			for i, err := range errs[gi] {
				if err != nil {
					t.Fatalf("group %d peer %d after the crash: %v", gi, i, err)
				}
				checkSum(t, fmt.Sprintf("group %d peer %d after the crash", gi, i), bufs[gi][i], wants[gi])
			}
		}
		checkGroupInfo(t, g1, pccl.GroupInfo{Group: 1, GroupWorldSize: 2, GlobalWorldSize: 4, Groups: 2, LargestGroup: 2})
		for i, err := range each(g0, func(_ int, c *pccl.Communicator) error { return c.UpdateTopology(ctx) }) {
			if err != nil {
				t.Fatalf("group 0 peer %d: update topology: %v", i, err)
			}
		}
		checkGroupInfo(t, g0, pccl.GroupInfo{Group: 0, GroupWorldSize: 2, GlobalWorldSize: 4, Groups: 2, LargestGroup: 2})
	})
}
