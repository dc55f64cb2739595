package main

/*
#include "impl.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/concord-ccl/concord/pccl"
)

// Backoff of concordRejoin between failed connections: it doubles from rejoinMinBackoff up to
// rejoinMaxBackoff, and each wait is drawn from its upper half, so that peers cut off together do not
// all come back in the same instant (pccl.RejoinConfig's defaults).
const (
	rejoinMinBackoff = 100 * time.Millisecond
	rejoinMaxBackoff = 5 * time.Second
)

//export concordRejoin
func concordRejoin(p *C.pcclComm_t, timeoutMillis C.uint64_t) C.pcclResult_t {
	if !initialized.Load() {
		return fail(C.pcclNotInitialized, errNotInitialized)
	}
	c, err := commOf(p)
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	c.mu.Lock()
	if n := len(c.ops); n > 0 {
		c.mu.Unlock()
		return fail(C.pcclPendingAsyncOps, fmt.Errorf("pccl: rejoin: %w: %d all-reduces not awaited", pccl.ErrBusy, n))
	}
	old := c.c
	c.c, c.dirty = nil, false
	cfg, err := c.connectConfig()
	c.mu.Unlock()
	if old != nil {
		old.Close()
	}
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	var deadline time.Time
	if timeoutMillis > 0 {
		deadline = time.Now().Add(time.Duration(timeoutMillis) * time.Millisecond)
	}
	for failures := 0; ; failures++ {
		ctx, cancel := c.ctx, context.CancelFunc(func() {})
		if !deadline.IsZero() {
			ctx, cancel = context.WithDeadline(c.ctx, deadline)
		}
		pc, err := pccl.Connect(ctx, cfg)
		expired := ctx.Err() != nil
		cancel()
		if err == nil {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.c != nil { // connected meanwhile by another thread's call
				pc.Close()
				return fail(C.pcclInvalidUsage, errors.New("pccl: rejoin: the communicator was connected meanwhile"))
			}
			c.c = pc
			return C.pcclSuccess
		}
		switch {
		case c.ctx.Err() != nil:
			return fail(C.pcclInvalidUsage, fmt.Errorf("pccl: rejoin: the communicator was destroyed: %w", err))
		case expired:
			return fail(C.pcclMasterConnectionFailed, fmt.Errorf("pccl: rejoin: not admitted within %v: %w", time.Duration(timeoutMillis)*time.Millisecond, err))
		case errors.Is(err, pccl.ErrInvalid):
			return fail(C.pcclInvalidArgument, fmt.Errorf("pccl: rejoin: not retrying: %w", err))
		case !pccl.Rejoinable(err):
			return fail(C.pcclMasterConnectionFailed, fmt.Errorf("pccl: rejoin: not retrying: %w", err))
		}
		wait := min(rejoinMinBackoff<<min(failures, 16), rejoinMaxBackoff)
		wait = wait/2 + time.Duration(rand.Int64N(int64(wait/2)+1))
		if !deadline.IsZero() && time.Now().Add(wait).After(deadline) {
			return fail(C.pcclMasterConnectionFailed, fmt.Errorf("pccl: rejoin: gave up after %v: %w", time.Duration(timeoutMillis)*time.Millisecond, err))
		}
		select {
		case <-time.After(wait):
		case <-c.ctx.Done():
			return fail(C.pcclInvalidUsage, fmt.Errorf("pccl: rejoin: the communicator was destroyed: %w", err))
		}
	}
}
