package pccl_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// TestRewireDoesNotAdmit: peers A, B and C run only AllReduces while D waits in Connect. C leaves in
// the middle of a collective; A and B repair their ring with Rewire and keep reducing, and D stays
// waiting however often they repair. Only an UpdateTopology of both admits D.
func TestRewireDoesNotAdmit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, _ := g.start(ctx, 3)
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
		for len(g.srv.Snapshot().Peers) < 4 {
			time.Sleep(2 * time.Millisecond)
		}

		// A and B vote for an AllReduce that C never joins; C leaves, which fails it for both.
		pair := comms[:2]
		failed := each(pair, func(i int, c *pccl.Communicator) error {
			if i == 0 {
				go func() {
					for g.srv.Snapshot().Ops == nil {
						time.Sleep(2 * time.Millisecond)
					}
					comms[2].Close()
				}()
			}
			v := []int64{int64(i + 1)}
			return c.AllReduce(ctx, pccl.Bytes(v), pccl.Bytes(v), pccl.Desc{Tag: 1, Count: 1, DType: pccl.I64, Op: pccl.Sum})
		})
		for i, err := range failed {
			if !pccl.Retryable(err) || !errors.Is(err, pccl.ErrPeerLeft) {
				t.Fatalf("peer %d: %v, want a retryable ErrPeerLeft", i, err)
			}
		}

		// The repair loop of PCCL's retry: Rewire after every failure, then the same AllReduce again.
		for round := 0; round < 5; round++ {
			errs := each(pair, func(i int, c *pccl.Communicator) error {
				for {
					v := []int64{int64(i + 1)}
					err := c.AllReduce(ctx, pccl.Bytes(v), pccl.Bytes(v), pccl.Desc{Tag: 1, Count: 1, DType: pccl.I64, Op: pccl.Sum})
					if err == nil {
						if v[0] != 3 {
							return errors.New("wrong sum")
						}
						return nil
					}
					if !pccl.Retryable(err) {
						return err
					}
					if err := c.Rewire(ctx); err != nil {
						return err
					}
				}
			})
			for i, err := range errs {
				if err != nil {
					t.Fatalf("round %d peer %d: %v", round, i, err)
				}
			}
			for _, c := range pair {
				if c.WorldSize() != 2 {
					t.Fatalf("round %d: world size %d, want 2", round, c.WorldSize())
				}
			}
			if round == 2 {
				// A repair with nothing to repair answers at once and still admits nobody.
				for i, err := range each(pair, func(_ int, c *pccl.Communicator) error { return c.Rewire(ctx) }) {
					if err != nil {
						t.Fatalf("peer %d: Rewire: %v", i, err)
					}
				}
			}
		}
		select {
		case c := <-joined:
			c.Close()
			t.Fatal("the newcomer was admitted by a repair")
		case err := <-joinErr:
			t.Fatal(err)
		default:
		}
		var registered int
		for _, p := range g.srv.Snapshot().Peers {
			if p.State == master.Registered {
				registered++
			}
		}
		if registered != 1 {
			t.Fatalf("%d registered peers, want the newcomer alone", registered)
		}

		var wg sync.WaitGroup
		for _, c := range pair {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := c.UpdateTopology(ctx); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		var d *pccl.Communicator
		select {
		case d = <-joined:
		case err := <-joinErr:
			t.Fatal(err)
		}
		defer d.Close()
		for i, err := range sumOfRanks(ctx, append(pair, d)) {
			if err != nil {
				t.Fatalf("peer %d: %v", i, err)
			}
		}
	})
}
