package rings

import (
	"context"
	"fmt"
)

// DefaultPartBytes is the pipelining granularity used when Options.PartBytes is zero.
const DefaultPartBytes = 1 << 20

// Divisor selects how a reduce-scatter or an all-reduce finalizes the reduced value of each chunk: the
// divide of Avg (the other operations have no finalization step). Besides the two named values, a
// positive n divides by n.
type Divisor int

const (
	// DivideByWorld divides by the number of peers in the ring, as a flat AllReduce does.
	DivideByWorld Divisor = 0
	// NoFinalize leaves the reduced value unfinalized (for Avg, the sum) for a later phase to finalize.
	NoFinalize Divisor = -1
)

// Options tunes a ring collective. The zero value is ready to use.
type Options struct {
	// PartBytes is the pipelining granularity in bytes: every chunk travels as frames of at most this
	// many bytes. It is rounded down to whole elements, and is at least one element. Zero means
	// DefaultPartBytes (1 MiB); negative values are invalid.
	PartBytes int
	// Pool supplies the staging buffers. Nil means a pool shared by the whole package.
	Pool *BufferPool
	// Quant encodes frames on the wire. The zero value, NoQuant, sends full precision. Every MinMax
	// encoding encodes the all-gather: each chunk's owner quantizes every part of its final value once,
	// adopts the dequantized value itself, and every other peer forwards the encoded bytes verbatim and
	// decodes them the same way, so results stay bit-identical. MinMaxU8 and MinMaxU16 run the
	// reduce-scatter at full precision (ReduceScatter rejects them); MinMaxU8Both and MinMaxU16Both
	// also encode every reduce-scatter hop, whose receiver decodes and folds in its own contribution at
	// full precision, and support Sum, Avg, Min and Max only (other ops yield ErrInvalid). MinMax
	// encodings need F16, BF16, F32 or F64, and fail the operation with ErrNonFinite if a value to be
	// encoded (a partial or final reduction) is NaN or infinite. The package documentation states
	// the error bound.
	Quant Quant
	// Divisor is how AllReduce and ReduceScatter finalize each chunk. The zero value, DivideByWorld,
	// divides Avg by the ring's world size; a hierarchical Avg passes NoFinalize inside a site and the
	// total peer count across sites, so that the sum is divided once. AllGather rejects a Divisor other
	// than DivideByWorld.
	Divisor Divisor
	// OnFail, if not nil, is called once when the ring has failed, before the caller's buffers are
	// put back and the call returns (see Plan.OnFail).
	OnFail func(error)
}

// Validate reports the first field of o that holds an invalid value.
func (o Options) Validate() error {
	switch {
	case o.PartBytes < 0:
		return fmt.Errorf("%w: Options.PartBytes is %d, must be >= 0", ErrInvalid, o.PartBytes)
	case !o.Quant.Valid():
		return fmt.Errorf("%w: Options.Quant is %v", ErrInvalid, o.Quant)
	case o.Divisor < NoFinalize:
		return fmt.Errorf("%w: Options.Divisor is %d, must be >= %d", ErrInvalid, o.Divisor, NoFinalize)
	}
	return nil
}

// partElems returns the part size in elements of size bytes each.
func partElems(partBytes, size int) int {
	if partBytes == 0 {
		partBytes = DefaultPartBytes
	}
	return max(partBytes/size, 1)
}

func (o Options) pool() *BufferPool {
	if o.Pool == nil {
		return &defaultPool
	}
	return o.Pool
}

// OwnedChunk returns the chunk of Partition(count, world) that rank owns in a ring of world peers: the
// chunk whose final value it computes at the end of the reduce-scatter and sends first in the
// all-gather. It is chunk rank+1 (mod world).
func OwnedChunk(rank, world int) int { return mod(rank+1, world) }

// Shard returns the span of elements that rank owns in a ring of world peers over count elements:
// Partition(count, world)[OwnedChunk(rank, world)]. It panics if world < 1 or count < 0.
func Shard(count, rank, world int) Span { return Partition(count, world)[OwnedChunk(rank, world)] }

// AllReduce reduces send element-wise over the world peers of a ring with op and stores the result in
// recv. rank is this peer's position in [0, world); s leads to rank+1 and comes from rank-1 (mod
// world). send and recv hold count elements of type dt (the same number of bytes, a multiple of
// dt.Size()) and may be the same slice (in place). Every peer must call AllReduce with the same world,
// length, dt, op and Options (except Pool).
//
// AllReduce never writes send or recv before the result is accepted: once the local ring schedule has
// completed, it calls commit (if not nil), and only if commit returns nil is the result copied into recv,
// with one copy. Any failure before that, including a commit error, leaves send and recv exactly as they
// were. AllReduce reads send until it returns.
//
// On the first error of s.Send or s.Recv, or when ctx is done, AllReduce calls s.Abort, waits for its
// goroutines to finish, and returns an error that wraps both ErrAborted and the cause (ctx.Err(), the I/O
// error, ErrNonFinite from quantization, or commit's error). Invalid arguments yield an error wrapping
// ErrInvalid before s is used. A zero-length buffer is valid: nothing is sent, commit is still called.
//
// The result is bit-identical on every peer (see the package documentation). AllReduce is a Plan of one
// phase; it starts two goroutines (one sender, one receiver) and none outlives the call.
func AllReduce(ctx context.Context, s Stream, rank, world int, send, recv []byte, dt DType, op Op, opt Options, commit func() error) error {
	if err := opt.Validate(); err != nil {
		return err
	}
	p := Plan{
		DType: dt, Op: op, PartBytes: opt.PartBytes, Pool: opt.Pool, OnFail: opt.OnFail,
		Phases: []Phase{{
			Kind: KindAllReduce, Stream: s, Rank: rank, World: world,
			Len: len(send), Divisor: opt.Divisor, Quant: opt.Quant,
		}},
	}
	return p.Execute(ctx, send, recv, commit)
}

// ReduceScatter runs the first half of AllReduce in place on buf, which holds this peer's contribution
// (count elements of type dt). On success the chunk this rank owns (Shard(count, rank, world)) holds
// its reduction over every peer of the ring, finalized as opt.Divisor says, bit-identical to what
// AllReduce would hold there before its all-gather; the other chunks hold partial reductions of no
// further use. The arguments and Options are those of AllReduce (every peer passes the same ones), and
// opt.Quant must be NoQuant or a both-phase encoding (MinMaxU8Both, MinMaxU16Both), which encodes every
// hop; the owned chunk's final value is then not encoded (there is no all-gather).
//
// On failure (an I/O error, ctx done) ReduceScatter aborts s and returns an error wrapping ErrAborted
// and the cause; buf then holds unspecified bytes. A Plan keeps the caller's buffers intact instead.
// ReduceScatter starts two goroutines and none outlives the call.
func ReduceScatter(ctx context.Context, s Stream, rank, world int, buf []byte, dt DType, op Op, opt Options) error {
	ph := Phase{Kind: KindReduceScatter, Stream: s, Rank: rank, World: world, Len: len(buf), Divisor: opt.Divisor, Quant: opt.Quant}
	return runAlone(ctx, ph, buf, dt, op, opt)
}

// AllGather runs the second half of AllReduce in place on buf (count elements of type dt): every rank
// contributes the chunk it owns (Shard(count, rank, world)), and on success every peer's buf holds every
// owner's chunk, bit-identical on every peer. With opt.Quant set, each owner encodes its chunk once and
// adopts the decoded form, as AllReduce does. The arguments are those of AllReduce without the op
// (every peer passes the same ones), and opt.Divisor must be DivideByWorld.
//
// On failure AllGather aborts s and returns an error wrapping ErrAborted and the cause (ErrNonFinite if
// a quantized chunk is not finite); buf then holds unspecified bytes. AllGather starts two goroutines
// and none outlives the call.
func AllGather(ctx context.Context, s Stream, rank, world int, buf []byte, dt DType, opt Options) error {
	ph := Phase{Kind: KindAllGather, Stream: s, Rank: rank, World: world, Len: len(buf), Quant: opt.Quant}
	if opt.Divisor != DivideByWorld {
		return fmt.Errorf("%w: an all-gather does not finalize; Options.Divisor is %d", ErrInvalid, opt.Divisor)
	}
	return runAlone(ctx, ph, buf, dt, Sum, opt)
}

// runAlone runs one phase in place on buf, outside a Plan.
func runAlone(ctx context.Context, ph Phase, buf []byte, dt DType, op Op, opt Options) error {
	if err := opt.Validate(); err != nil {
		return err
	}
	if err := checkOp(dt, op); err != nil {
		return err
	}
	if err := ph.check(len(buf), dt, op); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		err = fmt.Errorf("%w: %w", ErrAborted, err)
		ph.Stream.Abort(err)
		return err
	}
	return runPhase(ctx, ph, buf, buf, true, dt, op, partElems(opt.PartBytes, dt.Size()), opt.pool())
}
