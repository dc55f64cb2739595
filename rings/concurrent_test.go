package rings

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
)

// TestConcurrentPhases runs two all-reduces at once, each on its own ring and its own part of the
// buffer, as one external phase of a plan: every rank's result is the reference on both parts.
func TestConcurrentPhases(t *testing.T) {
	const world, count, split = 3, 1001, 377
	dt, size := I64, I64.Size()
	rng := rand.New(rand.NewPCG(7, 9))
	inputs := make([][]byte, world)
	for r := range inputs {
		inputs[r] = exactElements(rng, dt, Sum, count)
	}
	want := refReduced(dt, Sum, inputs, world)
	a, b := memRing(world), memRing(world)
	outs := make([][]byte, world)
	errs := onEveryRank(world, func(r int) error {
		c := &Concurrent{DType: dt, Op: Sum, PartBytes: 64, Phases: []Phase{
			{Kind: KindAllReduce, Stream: a[r], Rank: r, World: world, Len: split * size, Divisor: Divisor(world)},
			{Kind: KindAllReduce, Stream: b[r], Rank: r, World: world, Off: split * size, Len: (count - split) * size, Divisor: Divisor(world)},
		}}
		p := Plan{DType: dt, Op: Sum, PartBytes: 64, Phases: []Phase{{Kind: KindExternal, Runner: c, Rank: r, World: world, Len: count * size}}}
		outs[r] = make([]byte, count*size)
		return p.Execute(context.Background(), inputs[r], outs[r], nil)
	})
	for r := range world {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		if !bytes.Equal(outs[r], want) {
			t.Fatalf("rank %d: result differs from the reference", r)
		}
	}
}

// TestConcurrentPhaseAbort aborts one of two concurrent phases: the other is aborted too, and every
// rank's Execute returns ErrAborted with its buffers unchanged.
func TestConcurrentPhaseAbort(t *testing.T) {
	const world, count = 3, 4096
	dt, size := I64, I64.Size()
	a, b := memRing(world), memRing(world)
	cause := errors.New("piece failed")
	errs := onEveryRank(world, func(r int) error {
		c := &Concurrent{DType: dt, Op: Sum, PartBytes: 64, Phases: []Phase{
			{Kind: KindAllReduce, Stream: a[r], Rank: r, World: world, Len: count / 2 * size, Divisor: Divisor(world)},
			{Kind: KindAllReduce, Stream: b[r], Rank: r, World: world, Off: count / 2 * size, Len: count / 2 * size, Divisor: Divisor(world)},
		}}
		if r == 1 {
			a[r].Abort(cause)
		}
		in := bytes.Repeat([]byte{1}, count*size)
		out := make([]byte, count*size)
		p := Plan{DType: dt, Op: Sum, Phases: []Phase{{Kind: KindExternal, Runner: c, Rank: r, World: world, Len: count * size}}}
		err := p.Execute(context.Background(), in, out, nil)
		if !bytes.Equal(out, make([]byte, count*size)) {
			t.Errorf("rank %d: out written by an aborted plan", r)
		}
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, ErrAborted) {
			t.Fatalf("rank %d: %v, want ErrAborted", r, err)
		}
	}
}
