package sim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/concord-ccl/concord/pccl"
)

// admitRetry is how long Admit waits between two rounds that admitted nobody.
const admitRetry = 20 * time.Millisecond

// WaitRegistered waits until the running master knows n peers (registered or accepted), or ctx
// ends.
func (c *Cluster) WaitRegistered(ctx context.Context, n int) error {
	for {
		srv := c.Master()
		if srv != nil && len(srv.Snapshot().Peers) >= n {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("sim: waiting for %d peers to register: %w", n, ctx.Err())
		}
		time.Sleep(time.Millisecond)
	}
}

// Admit has every accepted peer run ArePeersPending and, when peers are pending, UpdateTopology, in
// rounds, until the ring holds world peers. accepted must be the whole group: each round is a vote
// of all of them.
func Admit(ctx context.Context, accepted []*pccl.Communicator, world int) error {
	for accepted[0].WorldSize() < world {
		errs := make([]error, len(accepted))
		var wg sync.WaitGroup
		for i, c := range accepted {
			wg.Go(func() {
				pending, err := c.ArePeersPending(ctx)
				if err == nil && pending {
					err = c.UpdateTopology(ctx)
				}
				errs[i] = err
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if accepted[0].WorldSize() < world {
			time.Sleep(admitRetry)
		}
	}
	return nil
}
