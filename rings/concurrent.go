package rings

import (
	"context"
	"fmt"
	"sync"
)

// Concurrent is a Runner that runs ring phases at once, each on its own Stream and its own part of the
// external phase's region: Off and Len of every phase are relative to that region, and the parts must
// not overlap. A phase's Kind is a ring kind, never KindExternal. When one phase fails, Concurrent
// aborts the others' streams and returns the first error once every phase has returned.
//
// It serves collectives whose middle step is several independent rings, such as pccl's hierarchical
// AllReduce over sites of different sizes, where each piece of a peer's block is all-reduced with other
// peers: run one after the other, the pieces of all peers would form one chain.
type Concurrent struct {
	Phases    []Phase
	DType     DType
	Op        Op
	PartBytes int
}

// Run runs every phase on its part of in and out and waits for all of them.
func (c *Concurrent) Run(ctx context.Context, in, out []byte) error {
	if len(in) != len(out) {
		return fmt.Errorf("%w: concurrent phases: in has %d bytes, out %d", ErrInvalid, len(in), len(out))
	}
	for i, ph := range c.Phases {
		if ph.Kind == KindExternal {
			return fmt.Errorf("%w: concurrent phase %d is external", ErrInvalid, i)
		}
		if err := ph.check(len(out), c.DType, c.Op); err != nil {
			return fmt.Errorf("concurrent phase %d: %w", i, err)
		}
	}
	inPlace := len(in) == 0 || &in[0] == &out[0]
	pe := partElems(c.PartBytes, c.DType.Size())
	errs := make([]error, len(c.Phases))
	var wg sync.WaitGroup
	for i, ph := range c.Phases {
		wg.Go(func() {
			lo, hi := ph.Off, ph.Off+ph.Len
			if errs[i] = runPhase(ctx, ph, in[lo:hi], out[lo:hi], inPlace, c.DType, c.Op, pe, &defaultPool); errs[i] != nil {
				c.Abort(errs[i])
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Abort aborts every phase's stream.
func (c *Concurrent) Abort(err error) {
	for _, ph := range c.Phases {
		ph.Stream.Abort(err)
	}
}
