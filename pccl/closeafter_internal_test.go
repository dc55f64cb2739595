package pccl

import (
	"context"
	"testing"
	"time"
)

// TestAfterEnd checks when CloseAfter closes the communicator: grace after its context ended, and
// never once stop was called.
func TestAfterEnd(t *testing.T) {
	const grace = 20 * time.Millisecond
	closed := make(chan struct{}, 1)
	closeComm := func() { closed <- struct{}{} }

	// The context ends and stop is not called: called after grace.
	ctx, cancel := context.WithCancel(context.Background())
	done := afterEnd(ctx, grace, closeComm)
	cancel()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("not called after the context ended")
	}
	done()

	// stop comes first, before or after the context ends: never called.
	const returnGrace = 200 * time.Millisecond // well past the gap between cancel and done below
	for _, endFirst := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		done := afterEnd(ctx, returnGrace, closeComm)
		if endFirst {
			cancel()
		}
		done()
		cancel()
		time.Sleep(2 * returnGrace)
		select {
		case <-closed:
			t.Fatalf("called although stop came first (context ended first: %v)", endFirst)
		default:
		}
	}
}
