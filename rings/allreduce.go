package rings

import (
	"context"
	"errors"
	"fmt"
)

// ChunkID names one frame of an operation: the step of the ring schedule (reduce-scatter steps are
// 0..W-2, all-gather steps W-1..2W-3) and the part index within that step's chunk.
type ChunkID struct{ Step, Part uint32 }

// String returns "step S part P".
func (id ChunkID) String() string { return fmt.Sprintf("step %d part %d", id.Step, id.Part) }

// Stream carries one operation's frames to the next peer in the ring and from the previous one.
//
// Send and Recv are called concurrently (one goroutine each); each of them is called sequentially.
// Abort may be called at any time from any goroutine, more than once.
type Stream interface {
	// Send writes one frame to the next peer. payload belongs to the caller: Send must have copied or
	// fully transmitted it before it returns, and must not touch it afterwards. AllReduce relies on
	// this: the all-gather overwrites regions of its staging buffer that earlier steps sent.
	Send(id ChunkID, payload []byte) error
	// Recv reads the next frame from the previous peer into dst. The frame must carry id and exactly
	// len(dst) bytes, else Recv returns an error. dst is not retained after Recv returns.
	Recv(id ChunkID, dst []byte) error
	// Abort makes every pending and later Send and Recv return promptly with an error wrapping err.
	Abort(err error)
}

// DefaultPartBytes is the pipelining granularity used when Options.PartBytes is zero.
const DefaultPartBytes = 1 << 20

// Options tunes a ring collective. The zero value is ready to use.
type Options struct {
	// PartBytes is the pipelining granularity in bytes: every chunk travels as frames of at most this
	// many bytes. It is rounded down to whole elements, and is at least one element. Zero means
	// DefaultPartBytes (1 MiB); negative values are invalid.
	PartBytes int
	// Pool supplies the staging buffers. Nil means a pool shared by the whole package.
	Pool *BufferPool
	// Quant encodes the all-gather: each chunk's owner quantizes every part of its final value once,
	// adopts the dequantized value itself, and every other peer forwards the encoded bytes verbatim and
	// decodes them the same way, so results stay bit-identical. The reduce-scatter always runs at full
	// precision. The zero value, NoQuant, sends full precision; MinMax encodings need F32 or F64 and fail
	// the operation with ErrNonFinite if a final value is NaN or infinite.
	Quant Quant
}

// Validate reports the first field of o that holds an invalid value.
func (o Options) Validate() error {
	if o.PartBytes < 0 {
		return fmt.Errorf("%w: Options.PartBytes is %d, must be >= 0", ErrInvalid, o.PartBytes)
	}
	if !o.Quant.Valid() {
		return fmt.Errorf("%w: Options.Quant is %v", ErrInvalid, o.Quant)
	}
	return nil
}

// partElems returns the part size in elements of size bytes each.
func (o Options) partElems(size int) int {
	pb := o.PartBytes
	if pb == 0 {
		pb = DefaultPartBytes
	}
	return max(pb/size, 1)
}

// AllReduce reduces send element-wise over the world peers of a ring with op and stores the result in
// recv. rank is this peer's position in [0, world); s leads to rank+1 and comes from rank-1 (mod
// world). send and recv hold count elements of type dt (the same number of bytes, a multiple of
// dt.Size()) and may be the same slice (in place). Every peer must call AllReduce with the same world,
// length, dt, op and Options.PartBytes.
//
// AllReduce never writes send or recv before the result is accepted: once the local ring schedule has
// completed, it calls commit (if not nil), and only if commit returns nil is the result copied into recv,
// with one copy. Any failure before that, including a commit error, leaves send and recv exactly as they
// were. AllReduce reads send until it returns.
//
// On the first error of s.Send or s.Recv, or when ctx is done, AllReduce calls s.Abort, waits for its
// goroutines to finish, and returns an error that wraps both ErrAborted and the cause (ctx.Err(), the I/O
// error, ErrNonFinite from quantization, or commit's error). Invalid arguments yield an error wrapping ErrInvalid before s is used.
// A zero-length buffer is valid: nothing is sent, commit is still called.
//
// The result is bit-identical on every peer (see the package documentation). AllReduce starts two
// goroutines (one sender, one receiver) and none outlives the call.
func AllReduce(ctx context.Context, s Stream, rank, world int, send, recv []byte, dt DType, op Op, opt Options, commit func() error) error {
	if err := checkArgs(rank, world, send, recv, dt, op, opt); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		err = fmt.Errorf("%w: %w", ErrAborted, err)
		s.Abort(err)
		return err
	}
	pool := opt.Pool
	if pool == nil {
		pool = &defaultPool
	}
	work := pool.Get(len(send))
	defer pool.Put(work)

	r := newRun(s, rank, world, send, work, dt, op, opt)
	if r.quant != NoQuant {
		r.qwork = pool.Get(r.qlen)
		defer pool.Put(r.qwork)
	}
	if world == 1 {
		if err := r.single(); err != nil {
			return err
		}
	} else if err := r.execute(ctx); err != nil {
		return err
	}
	if commit != nil {
		if err := commit(); err != nil {
			return fmt.Errorf("%w: commit: %w", ErrAborted, err)
		}
	}
	copy(recv, work)
	return nil
}

func checkArgs(rank, world int, send, recv []byte, dt DType, op Op, opt Options) error {
	switch {
	case !dt.Valid():
		return fmt.Errorf("%w: dtype %v", ErrInvalid, dt)
	case !op.Valid():
		return fmt.Errorf("%w: op %v", ErrInvalid, op)
	case world < 1:
		return fmt.Errorf("%w: world %d, must be >= 1", ErrInvalid, world)
	case rank < 0 || rank >= world:
		return fmt.Errorf("%w: rank %d outside [0, %d)", ErrInvalid, rank, world)
	case len(send) != len(recv):
		return fmt.Errorf("%w: send has %d bytes, recv has %d", ErrInvalid, len(send), len(recv))
	case len(send)%dt.Size() != 0:
		return fmt.Errorf("%w: %d bytes is not a whole number of %v elements", ErrInvalid, len(send), dt)
	}
	if err := opt.Validate(); err != nil {
		return err
	}
	if !opt.Quant.Supports(dt) {
		return fmt.Errorf("%w: quantization %v does not support %v", ErrInvalid, opt.Quant, dt)
	}
	return nil
}

// run holds the state of one AllReduce.
//
// Ownership: the sender goroutine only reads send and work; the receiver goroutine writes work and reads
// send. A region of work is written by the receiver before the sender reads it, ordered by a notice on
// ready. quit and cause belong to the goroutine in execute: it closes quit and writes cause once, and
// reads cause only after both workers have returned.
type run struct {
	s      Stream
	rank   int
	world  int
	send   []byte
	work   []byte
	dt     DType
	op     Op
	size   int    // bytes per element
	pe     int    // elements per part
	chunks []Span // in elements

	// With quantization, the all-gather moves encoded parts through qwork (qlen bytes in all): part p
	// of chunk c occupies qpart(c, p). Each region is written once (by the owner's encoding or by a
	// receive) before the sender reads it, ordered by the same notice on ready.
	quant    Quant
	qwork    []byte
	qlen     int
	partBase []int // partBase[c]: number of parts in chunks before c

	ready chan struct{} // receiver -> sender: one notice per completed (step, part) that is sent on
	quit  chan struct{} // closed by fail
	cause error         // first failure; written once by fail, read after both goroutines finished
}

func newRun(s Stream, rank, world int, send, work []byte, dt DType, op Op, opt Options) *run {
	size := dt.Size()
	r := &run{
		s: s, rank: rank, world: world, send: send, work: work, dt: dt, op: op,
		size:   size,
		pe:     opt.partElems(size),
		chunks: Partition(len(send)/size, world),
		quit:   make(chan struct{}),
		quant:  opt.Quant,
	}
	if r.quant != NoQuant {
		r.partBase = make([]int, world)
		parts := 0
		for c := range r.chunks {
			r.partBase[c] = parts
			parts += r.parts(c)
		}
		r.qlen = parts*QuantizedLen(dt, r.quant, 0) + len(send)/size*r.quant.codeBytes()
	}
	// The sender waits for one notice per part of steps 1..2W-3; the channel holds them all, so the
	// receiver never blocks on it. Its elements have no size, so the capacity costs no memory.
	n := 0
	for step := 1; step <= 2*world-3; step++ {
		n += r.parts(r.sendChunk(step))
	}
	r.ready = make(chan struct{}, n)
	return r
}

// sendChunk returns the chunk this rank sends at step.
func (r *run) sendChunk(step int) int {
	if step < r.world-1 {
		return mod(r.rank-step, r.world)
	}
	return mod(r.rank+1-(step-(r.world-1)), r.world)
}

// recvChunk returns the chunk this rank receives at step.
func (r *run) recvChunk(step int) int {
	if step < r.world-1 {
		return mod(r.rank-step-1, r.world)
	}
	return mod(r.rank-(step-(r.world-1)), r.world)
}

// parts returns the number of frames chunk c travels in.
func (r *run) parts(c int) int { return (r.chunks[c].Len + r.pe - 1) / r.pe }

// part returns the byte range of part p of chunk c.
func (r *run) part(c, p int) (lo, hi int) {
	sp := r.chunks[c]
	off := p * r.pe
	n := min(r.pe, sp.Len-off)
	lo = (sp.Off + off) * r.size
	return lo, lo + n*r.size
}

// qpart returns the encoded region of part p of chunk c in qwork.
func (r *run) qpart(c, p int) []byte {
	lo, hi := r.part(c, p)
	n := (hi - lo) / r.size
	first := r.chunks[c].Off + p*r.pe // elements before this part
	off := (r.partBase[c]+p)*QuantizedLen(r.dt, r.quant, 0) + first*r.quant.codeBytes()
	return r.qwork[off : off+QuantizedLen(r.dt, r.quant, n)]
}

// adopt encodes the final value of part p of owned chunk c into qwork and replaces the value in work by
// its decoded form, the value every other peer will decode.
func (r *run) adopt(c, p int) error {
	lo, hi := r.part(c, p)
	q := r.qpart(c, p)
	if err := Quantize(r.dt, r.quant, q, r.work[lo:hi]); err != nil {
		return fmt.Errorf("chunk %d part %d: %w", c, p, err)
	}
	Dequantize(r.dt, r.quant, r.work[lo:hi], q)
	return nil
}

// single computes the result of a ring of one: the local contribution, finalized (and passed through
// the encoding part by part, so that the result has the same form as in larger rings).
func (r *run) single() error {
	copy(r.work, r.send)
	Finalize(r.dt, r.op, r.work, 1)
	if r.quant != NoQuant {
		for p := range r.parts(0) {
			if err := r.adopt(0, p); err != nil {
				return fmt.Errorf("%w: %w", ErrAborted, err)
			}
		}
	}
	return nil
}

func mod(a, m int) int {
	a %= m
	if a < 0 {
		a += m
	}
	return a
}

// execute runs the ring schedule and returns nil once this rank's work buffer holds the full result.
func (r *run) execute(ctx context.Context) error {
	results := make(chan error, 2)
	go func() { results <- r.sendLoop() }()
	go func() { results <- r.recvLoop() }()

	var failed bool
	fail := func(err error) {
		if failed {
			return
		}
		failed = true
		r.cause = fmt.Errorf("%w: %w", ErrAborted, err)
		close(r.quit)
		r.s.Abort(r.cause)
	}
	done := ctx.Done()
	for pending := 2; pending > 0; {
		select {
		case err := <-results:
			pending--
			if err != nil {
				fail(err)
			}
		case <-done:
			done = nil
			fail(ctx.Err())
		}
	}
	// Both goroutines have returned: nothing touches work any more.
	if failed {
		return r.cause
	}
	return nil
}

// sendLoop is the sender goroutine. Step 0 sends straight from the caller's buffer; every later part
// waits until the receiver has produced it in work.
func (r *run) sendLoop() error {
	last := 2*r.world - 3
	for step := 0; step <= last; step++ {
		src := r.work
		if step == 0 {
			src = r.send
		}
		c := r.sendChunk(step)
		for p := range r.parts(c) {
			if step > 0 {
				select {
				case <-r.ready:
				case <-r.quit:
					return errStopped
				}
			}
			lo, hi := r.part(c, p)
			payload := src[lo:hi]
			if r.quant != NoQuant && step >= r.world-1 {
				payload = r.qpart(c, p)
			}
			id := ChunkID{Step: uint32(step), Part: uint32(p)}
			if err := r.s.Send(id, payload); err != nil {
				return fmt.Errorf("send chunk %d %v: %w", c, id, err)
			}
		}
	}
	return nil
}

// recvLoop is the receiver goroutine. It receives every frame into work, folds in the local
// contribution during reduce-scatter, finalizes the owned chunk, and tells the sender what is ready.
//
// Safety of writing work during the all-gather: it overwrites parts of work that the sender sent during
// the reduce-scatter. The final value of a part can only arrive after every peer folded in its
// contribution, which includes the partial sum this rank sent for that part, and Send does not touch a
// payload after returning. By causality our Send of that part is over before the final value arrives.
// With quantization the encoded parts live in qwork, where every region is written exactly once.
func (r *run) recvLoop() error {
	last := 2*r.world - 3
	for step := 0; step <= last; step++ {
		c := r.recvChunk(step)
		for p := range r.parts(c) {
			lo, hi := r.part(c, p)
			dst := r.work[lo:hi]
			id := ChunkID{Step: uint32(step), Part: uint32(p)}
			if step < r.world-1 {
				if err := r.s.Recv(id, dst); err != nil {
					return fmt.Errorf("recv chunk %d %v: %w", c, id, err)
				}
				Accumulate(r.dt, r.op, dst, r.send[lo:hi])
				if step == r.world-2 {
					Finalize(r.dt, r.op, dst, r.world)
					if r.quant != NoQuant {
						if err := r.adopt(c, p); err != nil {
							return err
						}
					}
				}
			} else if r.quant != NoQuant {
				q := r.qpart(c, p)
				if err := r.s.Recv(id, q); err != nil {
					return fmt.Errorf("recv chunk %d %v: %w", c, id, err)
				}
				Dequantize(r.dt, r.quant, dst, q)
			} else if err := r.s.Recv(id, dst); err != nil {
				return fmt.Errorf("recv chunk %d %v: %w", c, id, err)
			}
			if step < last {
				r.ready <- struct{}{}
			}
		}
	}
	return nil
}

// errStopped is what the sender returns when it stops because another failure came first; it is never
// the recorded cause.
var errStopped = errors.New("rings: stopped")
