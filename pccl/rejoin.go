package pccl

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"
)

// RejoinConfig tunes Rejoin. The zero value works.
type RejoinConfig struct {
	// MinBackoff is the wait before the first new connection after a failure. Default 100ms.
	MinBackoff time.Duration
	// MaxBackoff caps the wait, which doubles with every failed attempt in a row. Default 5s.
	MaxBackoff time.Duration
	// MaxAttempts bounds the connections in a row that fail before the body runs again (0: no bound;
	// the context bounds the whole).
	MaxAttempts int
	// OnRejoin, if set, is called when the body failed with a rejoinable error, before the peer
	// connects again, with that error and the number of rejoins so far (1 for the first).
	OnRejoin func(err error, rejoins int)
	// OnConnectError, if set, is called when a connection fails (the master is not up yet, or not
	// reachable), before the next attempt, with the error and the failures in a row.
	OnConnectError func(err error, failures int)
}

// Rejoin connects with cfg and runs body with the Communicator, and keeps a peer in the run through
// kicks: when Connect or body fails with an error Rejoinable accepts (the master removed this peer after
// a partition, a long silence or an unreachable address, or was unreachable past MasterTimeout), it
// closes the Communicator, waits with a jittered exponential backoff, connects again as a newcomer and
// calls body again. A newcomer holds stale state: body's first group call must be the sync that
// fetches the group's state (SyncSharedState with ReceiveOnly), which is what the accepted peers call
// right after the UpdateTopology that admitted it. rejoins counts the rejoins before this call of body.
//
// Rejoin returns nil when body does, and otherwise the first error it cannot come back from: one that
// is not rejoinable (a wrong token or protocol version: ErrRefused; bad arguments; a descriptor
// mismatch; ctx's end), or the last error once MaxAttempts connections in a row failed.
func Rejoin(ctx context.Context, cfg Config, rc RejoinConfig, body func(ctx context.Context, c *Communicator, rejoins int) error) error {
	if rc.MinBackoff <= 0 {
		rc.MinBackoff = 100 * time.Millisecond
	}
	if rc.MaxBackoff <= 0 {
		rc.MaxBackoff = 5 * time.Second
	}
	rc.MaxBackoff = max(rc.MaxBackoff, rc.MinBackoff)
	rejoins, failures := 0, 0
	for {
		c, err := Connect(ctx, cfg)
		ran := err == nil
		if ran {
			failures = 0
			err = body(ctx, c, rejoins)
			c.Close()
			if err == nil {
				return nil
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !Rejoinable(err) {
			return err
		}
		failures++
		if rc.MaxAttempts > 0 && failures > rc.MaxAttempts {
			return fmt.Errorf("pccl: rejoin: %d attempts in a row failed: %w", rc.MaxAttempts, err)
		}
		if ran {
			rejoins++
			if rc.OnRejoin != nil {
				rc.OnRejoin(err, rejoins)
			}
		} else if rc.OnConnectError != nil {
			rc.OnConnectError(err, failures)
		}
		d := min(rc.MinBackoff<<min(failures-1, 16), rc.MaxBackoff)
		d = d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
