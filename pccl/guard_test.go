package pccl_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// startWithStats connects n peers of g that report their contributions, and admits them all.
func startWithStats(ctx context.Context, t *testing.T, g *group, n int) []*pccl.Communicator {
	t.Helper()
	return admitEach(ctx, t, n, func() (*pccl.Communicator, error) {
		host := g.host()
		return pccl.Connect(ctx, pccl.Config{Master: g.addr, ListenAddr: host + ":9000", Transport: g.net.Host(host),
			PartBytes: 4096, ContributionStats: true})
	})
}

// TestGuardExcludesNonFinitePeer runs the contribution guard with the excluding policy: the peer whose
// contribution holds a NaN is kicked with an error that says why; the others fail retryably, re-wire
// without it and reduce correctly among themselves.
func TestGuardExcludesNonFinitePeer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{Guard: master.GuardPolicy{RejectNonFinite: true, Exclude: true}})
		comms := startWithStats(ctx, t, g, 3)
		defer closeAll(comms)
		const bad = 1
		errs := each(comms, func(i int, c *pccl.Communicator) error {
			v := []float32{1, 2}
			if i == bad {
				v[1] = float32(math.NaN())
			}
			return c.AllReduce(ctx, pccl.Bytes(v), pccl.Bytes(v), pccl.Desc{Tag: 1, Count: 2, DType: pccl.F32, Op: pccl.Sum})
		})
		for i, err := range errs {
			switch {
			case i == bad:
				if !errors.Is(err, pccl.ErrKicked) || !strings.Contains(err.Error(), "NaN") {
					t.Fatalf("offender: %v, want ErrKicked saying NaN", err)
				}
			case !errors.Is(err, pccl.ErrPeerLeft) || !pccl.Retryable(err):
				t.Fatalf("peer %d: %v, want a retryable ErrPeerLeft", i, err)
			}
		}
		good := []*pccl.Communicator{comms[0], comms[2]}
		errs = each(good, func(i int, c *pccl.Communicator) error {
			if err := c.UpdateTopology(ctx); err != nil {
				return err
			}
			v := []float32{1, 2}
			if err := c.AllReduce(ctx, pccl.Bytes(v), pccl.Bytes(v), pccl.Desc{Tag: 1, Count: 2, DType: pccl.F32, Op: pccl.Sum}); err != nil {
				return err
			}
			if v[0] != 2 || v[1] != 4 {
				t.Errorf("peer %d: result %v, want [2 4]", i, v)
			}
			return nil
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("retry, peer %d: %v", i, err)
			}
		}
	})
}

// TestGuardFailsOutlierForAll runs the failing policy: a contribution with a norm far above the others'
// fails the collective for every peer with a non-retryable ErrLocalFailure naming the offender.
func TestGuardFailsOutlierForAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{Guard: master.GuardPolicy{NormFactor: 10}})
		comms := startWithStats(ctx, t, g, 3)
		defer closeAll(comms)
		const bad = 2
		errs := each(comms, func(i int, c *pccl.Communicator) error {
			v := []float64{1, 1}
			if i == bad {
				v[0] = 1e6
			}
			return c.AllReduce(ctx, pccl.Bytes(v), pccl.Bytes(v), pccl.Desc{Tag: 1, Count: 2, DType: pccl.F64, Op: pccl.Sum})
		})
		for i, err := range errs {
			if !errors.Is(err, pccl.ErrLocalFailure) || pccl.Retryable(err) || !strings.Contains(err.Error(), "norm") {
				t.Fatalf("peer %d: %v, want a non-retryable ErrLocalFailure about the norm", i, err)
			}
			if id := comms[bad].ID(); !strings.Contains(err.Error(), fmt.Sprintf("peer %d", id)) {
				t.Fatalf("peer %d: %v does not name the offender %d", i, err, id)
			}
		}
	})
}
