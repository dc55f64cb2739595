package rings

import (
	"context"
	"fmt"
)

// Kind is the collective a Phase runs.
type Kind uint8

// The collectives a Phase can run.
const (
	// KindReduceScatter reduces the region so that each rank's owned chunk holds its reduction over
	// the ring (see ReduceScatter).
	KindReduceScatter Kind = iota + 1
	// KindAllGather spreads each rank's owned chunk of the region to every rank (see AllGather).
	KindAllGather
	// KindAllReduce reduces the whole region over the ring (a reduce-scatter, then an all-gather).
	KindAllReduce
	// KindExternal runs the phase's Runner on the region: a collective of another tier (pccl's
	// hierarchical AllReduce runs its intra-site phases on the rdma fabric this way).
	KindExternal
)

var kindNames = [...]string{KindReduceScatter: "reduce-scatter", KindAllGather: "all-gather", KindAllReduce: "all-reduce",
	KindExternal: "external"}

// Valid reports whether k is one of the defined kinds.
func (k Kind) Valid() bool { return k >= KindReduceScatter && k <= KindExternal }

// Runner runs a KindExternal phase.
type Runner interface {
	// Run reads the phase's input from in and leaves its output in out; both are the phase's region
	// (in is the caller's send buffer for the first phase of a plan, out's own bytes for the others).
	// It returns once nothing it started can still read in or write out, also after an error; it
	// returns an error when ctx ends first.
	Run(ctx context.Context, in, out []byte) error
	// Abort tells the runner that the plan failed in another phase, so that it can let the peers of
	// its phase know. It may be called whether or not Run ran, and from any goroutine.
	Abort(err error)
}

// String returns "reduce-scatter", "all-gather", "all-reduce" or "external".
func (k Kind) String() string {
	if k.Valid() {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Phase is one ring collective of a Plan: Kind runs over the ring that Stream, Rank and World describe
// (as in AllReduce), on bytes [Off, Off+Len) of the plan's staging buffer. A KindExternal phase runs
// Runner on that region instead; it has no Stream, Divisor or Quant, and Rank and World only describe
// it.
type Phase struct {
	Kind   Kind
	Stream Stream
	Runner Runner // KindExternal only
	// Rank is this peer's position in the phase's ring, in [0, World).
	Rank, World int
	// Off and Len delimit the phase's region of the staging buffer, in bytes; both are multiples of
	// the element size. The region is partitioned into World chunks as Partition(Len/size, World).
	Off, Len int
	// Divisor is the finalization of a reduce-scatter or all-reduce phase (see Options.Divisor); an
	// all-gather phase needs DivideByWorld.
	Divisor Divisor
	// Quant encodes the phase's frames (see Options.Quant): the all-gather of an all-gather or
	// all-reduce phase, and with a both-phase encoding (MinMaxU8Both, MinMaxU16Both) the reduce-scatter
	// of a reduce-scatter or all-reduce phase too. A reduce-scatter phase needs NoQuant or a
	// both-phase encoding.
	Quant Quant
}

// Plan is a collective operation built from ring phases, run by Execute on one staging buffer under one
// commit. The flat AllReduce is the plan of one KindAllReduce phase over the whole buffer. A
// hierarchical AllReduce over sites of equal size is three phases (over sites of different sizes, the
// middle one is a KindAllReduce per piece of this peer's Shard that one peer in every site owns):
//
//	KindReduceScatter in the site, whole buffer, NoFinalize
//	KindAllReduce across sites (one peer per site with the same site rank), on this peer's
//	        Shard of the buffer in the site, Divisor = the total peer count
//	KindAllGather in the site, whole buffer
//
// Every peer of a phase's ring must run that phase with the same Kind, World, Len, Divisor and Quant,
// and the same DType, Op and PartBytes. A Plan is a description: Execute does not modify it, and the
// same Plan may be executed many times, but never concurrently on the same Streams.
type Plan struct {
	DType DType
	Op    Op
	// PartBytes is the pipelining granularity of every phase (see Options.PartBytes).
	PartBytes int
	// Pool supplies the staging buffer and the phases' scratch space. Nil means a pool shared by the
	// whole package.
	Pool *BufferPool
	// Phases run in order.
	Phases []Phase
	// OnFail, if not nil, is called once with the error when Execute fails (its arguments valid),
	// after every Stream of the plan was aborted and its goroutines returned, and before the caller's
	// buffers are put back and Execute returns: the caller may tell others of the failure while the
	// restore runs. A commit error does not call it (the caller's commit knows).
	OnFail func(error)
}

// Execute runs the plan's phases in order on a staging buffer taken from the pool: the first phase
// reads its contribution from send, outside its region the staging buffer starts as a copy of send,
// and every later phase works in place on the staging buffer. After the last phase Execute calls commit (if not
// nil) once, and only if commit returns nil copies the staging buffer into recv, with one copy. send and
// recv have the same length (a multiple of the element size) and may be the same slice. A plan of one
// unquantized all-reduce phase over the whole buffer, with send and recv the same slice, works in the
// buffer itself instead, saving each part's original bytes before it first writes them and putting
// them back on failure: the result needs no copy after the commit. With a Retainer the bytes are put
// back only once AwaitAcked has returned for every frame sent, when the Stream reads none of them
// any more.
//
// Any failure leaves send and recv exactly as they were. On the first error of a phase or when ctx is
// done, Execute aborts every Stream of the plan (so that the peers of later phases stop too) and waits
// for its goroutines; a commit error aborts nothing, as every phase has completed. The error wraps
// ErrAborted and the cause (ctx.Err(), the I/O error, ErrNonFinite from quantization, or commit's
// error). Invalid arguments yield an error wrapping ErrInvalid before any
// Stream is used. Execute reads send until it returns; every phase starts two goroutines and none
// outlives the call.
func (p Plan) Execute(ctx context.Context, send, recv []byte, commit func() error) error {
	if err := p.check(send, recv); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		err = fmt.Errorf("%w: %w", ErrAborted, err)
		p.abort(err)
		p.failed(err)
		return err
	}
	pool := p.Pool
	if pool == nil {
		pool = &defaultPool
	}
	if p.inPlace(send, recv) {
		return p.executeInPlace(ctx, recv, commit, pool)
	}
	work := pool.Get(len(send))
	defer pool.Put(work)

	pe := partElems(p.PartBytes, p.DType.Size())
	for i, ph := range p.Phases {
		lo, hi := ph.Off, ph.Off+ph.Len
		var err error
		if i == 0 {
			// The first phase reads its contribution straight from send, saving a copy.
			copy(work[:lo], send[:lo])
			copy(work[hi:], send[hi:])
			err = runPhase(ctx, ph, send[lo:hi], work[lo:hi], false, p.DType, p.Op, pe, pool)
		} else {
			err = runPhase(ctx, ph, work[lo:hi], work[lo:hi], true, p.DType, p.Op, pe, pool)
		}
		if err != nil {
			if len(p.Phases) > 1 {
				err = fmt.Errorf("phase %d (%v): %w", i, ph.Kind, err)
			}
			p.abort(err)
			p.failed(err)
			return err
		}
	}
	if commit != nil {
		if err := commit(); err != nil {
			return fmt.Errorf("%w: commit: %w", ErrAborted, err)
		}
	}
	copy(recv, work)
	return nil
}

// inPlace reports whether the plan runs on the caller's buffer with a backup instead of a staging
// buffer: one all-reduce phase over the whole buffer, without quantization, in a ring of more than
// one peer, with send and recv the same slice. A Retainer is no obstacle: a failed run waits for
// AwaitAcked of every frame it sent before it returns, so the restore rewrites no frame the Stream
// may still read.
func (p Plan) inPlace(send, recv []byte) bool {
	if len(p.Phases) != 1 || len(send) == 0 {
		return false
	}
	ph := p.Phases[0]
	return ph.Kind == KindAllReduce && ph.Off == 0 && ph.Len == len(send) && ph.Quant == NoQuant &&
		ph.World > 1 && &send[0] == &recv[0]
}

// executeInPlace runs the plan's one all-reduce phase in buf itself. The original bytes of every part
// go to a backup buffer as long as buf before the phase first writes them, at a reduce-scatter hop in
// the same pass as the fold (the copy is spread over the operation, where a staging buffer would copy
// the whole result after the commit), and a failure, including a commit error, puts them back.
func (p Plan) executeInPlace(ctx context.Context, buf []byte, commit func() error, pool *BufferPool) error {
	ph := p.Phases[0]
	backup := pool.Get(len(buf))
	defer pool.Put(backup)
	r := newRun(ph, buf, buf, true, p.DType, p.Op, partElems(p.PartBytes, p.DType.Size()))
	r.keepOriginal(backup)
	if err := r.start(ctx, ph.Kind, pool); err != nil {
		p.abort(err)
		p.failed(err)
		r.restore()
		return err
	}
	if commit != nil {
		if err := commit(); err != nil {
			r.restore()
			return fmt.Errorf("%w: commit: %w", ErrAborted, err)
		}
	}
	return nil
}

// failed tells OnFail of err, the failure of a phase.
func (p Plan) failed(err error) {
	if p.OnFail != nil {
		p.OnFail(err)
	}
}

// abort aborts every Stream and Runner of the plan, so that the peers of phases this peer will not run
// stop too.
func (p Plan) abort(err error) {
	for _, ph := range p.Phases {
		if ph.Kind == KindExternal {
			ph.Runner.Abort(err)
			continue
		}
		ph.Stream.Abort(err)
	}
}

// check validates the plan for buffers send and recv.
func (p Plan) check(send, recv []byte) error {
	if err := checkOp(p.DType, p.Op); err != nil {
		return err
	}
	switch {
	case p.PartBytes < 0:
		return fmt.Errorf("%w: PartBytes is %d, must be >= 0", ErrInvalid, p.PartBytes)
	case len(p.Phases) == 0:
		return fmt.Errorf("%w: a plan needs at least one phase", ErrInvalid)
	case len(send) != len(recv):
		return fmt.Errorf("%w: send has %d bytes, recv has %d", ErrInvalid, len(send), len(recv))
	}
	for i, ph := range p.Phases {
		if err := ph.check(len(send), p.DType, p.Op); err != nil {
			if len(p.Phases) == 1 {
				return err
			}
			return fmt.Errorf("phase %d: %w", i, err)
		}
	}
	return nil
}

func checkOp(dt DType, op Op) error {
	switch {
	case !dt.Valid():
		return fmt.Errorf("%w: dtype %v", ErrInvalid, dt)
	case !op.Valid():
		return fmt.Errorf("%w: op %v", ErrInvalid, op)
	}
	return nil
}

// check validates ph over a staging buffer of n bytes of dt, reduced with op (both already valid).
func (ph Phase) check(n int, dt DType, op Op) error {
	size := dt.Size()
	switch {
	case !ph.Kind.Valid():
		return fmt.Errorf("%w: kind %v", ErrInvalid, ph.Kind)
	case n%size != 0:
		return fmt.Errorf("%w: %d bytes is not a whole number of %v elements", ErrInvalid, n, dt)
	case ph.Off < 0 || ph.Len < 0 || ph.Off > n-ph.Len:
		return fmt.Errorf("%w: region [%d, %d+%d) outside the %d-byte buffer", ErrInvalid, ph.Off, ph.Off, ph.Len, n)
	case ph.Off%size != 0 || ph.Len%size != 0:
		return fmt.Errorf("%w: region [%d, %d+%d) is not made of whole %v elements", ErrInvalid, ph.Off, ph.Off, ph.Len, dt)
	}
	if ph.Kind == KindExternal {
		if ph.Runner == nil {
			return fmt.Errorf("%w: an external phase needs a Runner", ErrInvalid)
		}
		return nil
	}
	switch {
	case ph.Stream == nil:
		return fmt.Errorf("%w: no stream", ErrInvalid)
	case ph.World < 1:
		return fmt.Errorf("%w: world %d, must be >= 1", ErrInvalid, ph.World)
	case ph.Rank < 0 || ph.Rank >= ph.World:
		return fmt.Errorf("%w: rank %d outside [0, %d)", ErrInvalid, ph.Rank, ph.World)
	case ph.Divisor < NoFinalize:
		return fmt.Errorf("%w: divisor %d, must be >= %d", ErrInvalid, ph.Divisor, NoFinalize)
	case ph.Kind == KindAllGather && ph.Divisor != DivideByWorld:
		return fmt.Errorf("%w: an all-gather does not finalize; divisor is %d", ErrInvalid, ph.Divisor)
	case !ph.Quant.Valid():
		return fmt.Errorf("%w: quantization %v", ErrInvalid, ph.Quant)
	case ph.Kind == KindReduceScatter && ph.Quant != NoQuant && !ph.Quant.BothPhases():
		return fmt.Errorf("%w: %v encodes only an all-gather; a reduce-scatter needs NoQuant or a both-phase encoding", ErrInvalid, ph.Quant)
	case !ph.Quant.Supports(dt):
		return fmt.Errorf("%w: quantization %v does not support %v", ErrInvalid, ph.Quant, dt)
	case ph.Kind != KindAllGather && !ph.Quant.SupportsOp(op):
		return fmt.Errorf("%w: quantization %v does not support %v", ErrInvalid, ph.Quant, op)
	}
	return nil
}
