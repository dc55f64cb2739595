package rings

import (
	"context"
	"errors"
	"fmt"
)

// run holds the state of one phase (one ring collective) on one rank.
//
// Schedule: a reduce-scatter takes steps 0..W-2, an all-gather steps W-1..2W-3, an all-reduce both
// (first..last). Step s sends chunk sendChunk(s) and receives chunk recvChunk(s) = sendChunk(s+1): a
// part of step s+1 is sent once the receiver has produced the same part of step s, except at the first
// step, whose data is there from the start.
//
// Ownership: the sender goroutine reads src, work and backup and writes nsent; the receiver goroutine
// writes work, scratch and backup and reads src; nsent is read only after the sender returned. A
// region of work (or backup) is written by the receiver before the sender reads it, ordered by a
// notice on ready. The owned chunk of an all-gather is written (adopted) by the sender only. quit and
// cause belong to the goroutine in execute: it closes quit and writes cause once, and reads cause
// only after both workers have returned.
type run struct {
	s       Stream
	ret     Retainer // s, if it keeps payloads until acknowledged; nil otherwise
	rank    int
	world   int
	src     []byte // the local contribution: a separate buffer, or work itself when inPlace
	work    []byte
	inPlace bool
	scratch []byte // inPlace only: receives a reduce-scatter part before it is folded into work
	dt      DType
	op      Op
	div     int    // the owner finalizes with Finalize(dt, op, chunk, div); 0: no finalization
	size    int    // bytes per element
	pe      int    // elements per part
	chunks  []Span // in elements
	first   int    // first step taken
	last    int    // last step taken

	// With quantization, the all-gather (and with a both-phase encoding the reduce-scatter) moves
	// encoded parts through qwork (qlen bytes in all): part p of chunk c occupies qpart(c, p). A region
	// is written (by an encoding or by a receive) before the sender reads it, ordered by the same notice
	// on ready; a region the reduce-scatter sent is received into again by the all-gather only after
	// release. racc (receiver) and sacc (sender) hold one part in the computing type (accSize bytes per
	// element): the reduce-scatter folds there, and F16 and BF16 are widened there to be encoded.
	quant    Quant
	gather   bool // the phase includes the all-gather
	scatterQ bool // the reduce-scatter hops are encoded too (a both-phase encoding)
	qwork    []byte
	qlen     int
	partBase []int // partBase[c]: number of parts in chunks before c
	racc     []byte
	sacc     []byte

	// An all-reduce's all-gather overwrites regions its reduce-scatter sent. sent gets one notice per
	// reduce-scatter frame whose Send returned, so that the receiver waits for that exact Send to be
	// over (and, with a Retainer, for the frame's acknowledgement) before it writes the region. By
	// causality the Send is over long before, as the value that overwrites the region depends on it;
	// the notice makes that order one this process can see (a Stream that copies payloads in Go, such
	// as QUIC's, would otherwise read and write the same bytes with no order between them that the
	// race detector knows of). rsBase[s] counts the frames sent before step s, and seen (owned by the
	// receiver) the notices taken.
	sent   chan struct{}
	rsBase []int
	seen   int
	nsent  int // frames whose Send returned nil

	// In place on the caller's buffer (an all-reduce with send and recv the same slice), backup keeps
	// the original bytes of every part before its first write, so that a failure can put them back:
	// saved[partBase[c]+p] says part p of chunk c has been saved. Both are written by the receiver
	// goroutine only, and read by restore after both goroutines returned.
	//
	// Every reduce-scatter hop receives its partial value into scratch and folds it into work in one
	// pass that copies the part's original into backup as it reads it (see reduce), so that the
	// original is read once for both. The all-gather then needs to save only the chunk this rank sent
	// at the first step, the one part of work the reduce-scatter never writes.
	backup []byte
	saved  []bool

	ready chan struct{} // receiver -> sender: one notice per completed (step, part) that is sent on
	quit  chan struct{} // closed by fail
	cause error         // first failure; written once by fail, read after both goroutines finished
}

// runPhase runs phase ph with contribution src and result in work (the phase's region; the same slice
// when inPlace). Without inPlace, the parts of work the phase never receives are copied from src first.
// On failure it returns an error wrapping ErrAborted and the cause, with ph.Stream aborted.
func runPhase(ctx context.Context, ph Phase, src, work []byte, inPlace bool, dt DType, op Op, pe int, pool *BufferPool) error {
	if ph.Kind == KindExternal {
		err := ph.Runner.Run(ctx, src, work)
		if err != nil && !errors.Is(err, ErrAborted) {
			err = fmt.Errorf("%w: %w", ErrAborted, err)
		}
		return err
	}
	return newRun(ph, src, work, inPlace, dt, op, pe).start(ctx, ph.Kind, pool)
}

// start runs the phase r was built for (of kind k), with its buffers from pool.
func (r *run) start(ctx context.Context, k Kind, pool *BufferPool) error {
	src, work, inPlace := r.src, r.work, r.inPlace
	if r.quant != NoQuant {
		r.qwork = pool.Get(r.qlen)
		defer pool.Put(r.qwork)
		// Chunk 0 is the largest (Partition), so a part of it is the largest part.
		n := min(r.pe, r.chunks[0].Len) * accSize(r.dt)
		r.racc = pool.Get(n)
		defer pool.Put(r.racc)
		r.sacc = pool.Get(n)
		defer pool.Put(r.sacc)
	}
	if r.world == 1 {
		if err := r.single(); err != nil {
			err = fmt.Errorf("%w: %w", ErrAborted, err)
			r.s.Abort(err)
			return err
		}
		return nil
	}
	if inPlace && r.first == 0 {
		r.scratch = pool.Get(min(r.pe, r.chunks[0].Len) * r.size)
		defer pool.Put(r.scratch)
	}
	if !inPlace {
		// A reduce-scatter never receives this rank's own chunk, an all-gather never its owned one.
		var c int
		switch k {
		case KindReduceScatter:
			c = r.rank
		case KindAllGather:
			c = OwnedChunk(r.rank, r.world)
		default:
			c = -1
		}
		if c >= 0 {
			sp := r.chunks[c]
			copy(work[sp.Off*r.size:(sp.Off+sp.Len)*r.size], src[sp.Off*r.size:])
		}
	}
	return r.execute(ctx)
}

func newRun(ph Phase, src, work []byte, inPlace bool, dt DType, op Op, pe int) *run {
	size := dt.Size()
	world := ph.World
	r := &run{
		s: ph.Stream, rank: ph.Rank, world: world, src: src, work: work, inPlace: inPlace, dt: dt, op: op,
		size: size, pe: pe,
		chunks:   Partition(len(work)/size, world),
		first:    0,
		last:     2*world - 3,
		quant:    ph.Quant,
		gather:   ph.Kind != KindReduceScatter,
		scatterQ: ph.Quant.BothPhases() && ph.Kind != KindAllGather,
		quit:     make(chan struct{}),
	}
	r.ret, _ = ph.Stream.(Retainer)
	switch ph.Kind {
	case KindReduceScatter:
		r.last = world - 2
	case KindAllGather:
		r.first = world - 1
	}
	if ph.Kind != KindAllGather {
		switch ph.Divisor {
		case DivideByWorld:
			r.div = world
		case NoFinalize:
		default:
			r.div = int(ph.Divisor)
		}
	}
	if r.quant != NoQuant {
		parts := r.indexParts()
		r.qlen = parts*QuantizedLen(dt, r.quant, 0) + len(work)/size*r.quant.codeBytes()
	}
	if world == 1 {
		return r
	}
	// The sender waits for one notice per part of steps first+1..last; the channel holds them all, so
	// the receiver never blocks on it. Its elements have no size, so the capacity costs no memory.
	n := 0
	for step := r.first + 1; step <= r.last; step++ {
		n += r.parts(r.sendChunk(step))
	}
	r.ready = make(chan struct{}, n)
	if ph.Kind == KindAllReduce {
		r.rsBase = make([]int, world-1)
		n := 0
		for step := range world - 1 {
			r.rsBase[step] = n
			n += r.parts(r.sendChunk(step))
		}
		r.sent = make(chan struct{}, n)
	}
	return r
}

// sendChunk returns the chunk this rank sends at step.
func (r *run) sendChunk(step int) int { return sendChunk(r.rank, r.world, step) }

// sendChunk returns the chunk rank sends at step in a ring of world peers.
func sendChunk(rank, world, step int) int {
	if step < world-1 {
		return mod(rank-step, world)
	}
	return mod(rank+1-(step-(world-1)), world)
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
// its decoded form, the value every other peer will decode. scratch is the calling goroutine's racc or
// sacc.
func (r *run) adopt(c, p int, scratch []byte) error {
	lo, hi := r.part(c, p)
	q := r.qpart(c, p)
	if err := encodePlain(r.dt, r.quant, q, r.work[lo:hi], scratch); err != nil {
		return fmt.Errorf("chunk %d part %d: %w", c, p, err)
	}
	Dequantize(r.dt, r.quant, r.work[lo:hi], q)
	return nil
}

// single computes the result of a ring of one: the local contribution, finalized (and passed through
// the encoding part by part, so that the result has the same form as in larger rings).
func (r *run) single() error {
	if !r.inPlace {
		copy(r.work, r.src)
	}
	if r.div > 0 {
		Finalize(r.dt, r.op, r.work, r.div)
	}
	if r.quant != NoQuant && r.gather {
		for p := range r.parts(0) {
			if err := r.adopt(0, p, r.racc); err != nil {
				return err
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

// execute runs the ring schedule and returns nil once this rank's work buffer holds its result and,
// with a Retainer, every frame sent has been acknowledged.
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
	// Both goroutines have returned: nothing touches work any more, except a Retainer that still
	// holds frames; the stream is aborted, so waiting for them ends at once.
	if failed {
		if r.ret != nil {
			r.eachSent(r.nsent, func(id ChunkID) error {
				_ = r.ret.AwaitAcked(id) // an aborted stream's answer; the frame is released either way
				return nil
			})
		}
		return r.cause
	}
	return nil
}

// eachSent calls f for the first n frames the sender sends, in order, and stops at f's first error.
func (r *run) eachSent(n int, f func(ChunkID) error) error {
	for step := r.first; step <= r.last; step++ {
		for p := range r.parts(r.sendChunk(step)) {
			if n == 0 {
				return nil
			}
			n--
			if err := f(ChunkID{Step: uint32(step), Part: uint32(p)}); err != nil {
				return err
			}
		}
	}
	return nil
}

// sendLoop is the sender goroutine. Step 0 sends straight from src; every later part waits until the
// receiver has produced it in work. With a Retainer it finally waits until every frame is acknowledged.
func (r *run) sendLoop() error {
	for step := r.first; step <= r.last; step++ {
		src := r.work
		if step == 0 {
			src = r.src
		}
		c := r.sendChunk(step)
		for p := range r.parts(c) {
			if step > r.first {
				select {
				case <-r.ready:
				case <-r.quit:
					return errStopped
				}
			}
			lo, hi := r.part(c, p)
			payload := src[lo:hi]
			switch {
			case r.quant != NoQuant && step >= r.world-1:
				if step == r.first {
					// An all-gather alone: this rank's owned chunk, encoded here.
					if err := r.adopt(c, p, r.sacc); err != nil {
						return err
					}
				}
				payload = r.qpart(c, p)
			case r.scatterQ:
				payload = r.qpart(c, p)
				if step == 0 {
					// The first hop carries this rank's own contribution, encoded here; later hops
					// send what the receiver encoded.
					if err := encodePlain(r.dt, r.quant, payload, r.src[lo:hi], r.sacc); err != nil {
						return fmt.Errorf("chunk %d part %d: %w", c, p, err)
					}
				}
			}
			id := ChunkID{Step: uint32(step), Part: uint32(p)}
			if err := r.s.Send(id, payload); err != nil {
				return fmt.Errorf("send chunk %d %v: %w", c, id, err)
			}
			r.nsent++
			if r.sent != nil && step < r.world-1 {
				r.sent <- struct{}{}
			}
		}
	}
	if r.ret == nil {
		return nil
	}
	return r.eachSent(r.nsent, func(id ChunkID) error {
		if err := r.ret.AwaitAcked(id); err != nil {
			return fmt.Errorf("await acknowledgement of %v: %w", id, err)
		}
		return nil
	})
}

// recvLoop is the receiver goroutine. It receives every frame into work, folds in the local
// contribution during the reduce-scatter, finalizes the owned chunk, and tells the sender what is ready.
//
// Safety of writing work during the all-gather of an all-reduce: it overwrites parts of work that the
// sender sent during the reduce-scatter. The final value of a part can only arrive after every peer
// folded in its contribution, which includes the partial value this rank sent for that part, so by
// causality our Send of that part is over before the final value arrives; with a Retainer, release
// also waits for its acknowledgement. In place, the reduce-scatter saved the original of every
// region it wrote, and the all-gather saves the one chunk it did not (the one sent at the first step)
// before it writes it. With quantization the all-gather receives into qwork, which a both-phase
// reduce-scatter sent from; the same argument (and release) covers those regions. A reduce-scatter
// step never receives a chunk sent earlier in the same phase (it receives a chunk's region, or with a
// both-phase encoding its qwork region, and folds into it before the sender sends it at the next
// step), and an all-gather alone receives each chunk before sending it.
func (r *run) recvLoop() error {
	for step := r.first; step <= r.last; step++ {
		c := r.recvChunk(step)
		for p := range r.parts(c) {
			lo, hi := r.part(c, p)
			dst := r.work[lo:hi]
			id := ChunkID{Step: uint32(step), Part: uint32(p)}
			switch {
			case step < r.world-1 && r.scatterQ:
				if err := r.s.Recv(id, r.qpart(c, p)); err != nil {
					return fmt.Errorf("recv chunk %d %v: %w", c, id, err)
				}
				var err error
				if r.dt == F64 {
					err = foldEncoded(r, View[float64](r.racc), step, c, p)
				} else {
					err = foldEncoded(r, View[float32](r.racc), step, c, p)
				}
				if err != nil {
					return err
				}
			case step < r.world-1:
				if err := r.reduce(id, c, p, dst, r.src[lo:hi]); err != nil {
					return fmt.Errorf("recv chunk %d %v: %w", c, id, err)
				}
				if step == r.world-2 {
					if r.div > 0 {
						Finalize(r.dt, r.op, dst, r.div)
					}
					if r.quant != NoQuant {
						if err := r.adopt(c, p, r.racc); err != nil {
							return err
						}
					}
				}
			case r.quant != NoQuant:
				// With a both-phase encoding the reduce-scatter sent this chunk's part from q.
				if err := r.release(step, p); err != nil {
					return err
				}
				q := r.qpart(c, p)
				if err := r.s.Recv(id, q); err != nil {
					return fmt.Errorf("recv chunk %d %v: %w", c, id, err)
				}
				Dequantize(r.dt, r.quant, dst, q)
			default:
				if err := r.release(step, p); err != nil {
					return err
				}
				r.save(c, p)
				if err := r.s.Recv(id, dst); err != nil {
					return fmt.Errorf("recv chunk %d %v: %w", c, id, err)
				}
			}
			if step < r.last {
				r.ready <- struct{}{}
			}
		}
	}
	return nil
}

// foldEncoded folds the encoded partial reduction of part p of chunk c, just received into its qwork
// region, with the local contribution, in the computing type T (acc is racc). At every hop but the last
// it encodes the result into the same region, which the sender sends at the next step. At the last it
// finalizes (the divide of Avg, in T), stores the result in work as elements of the phase's type and,
// when the all-gather follows, adopts its encoded form.
func foldEncoded[T float](r *run, acc []T, step, c, p int) error {
	lo, hi := r.part(c, p)
	q := r.qpart(c, p)
	acc = acc[:(hi-lo)/r.size]
	widen(r.dt, acc, r.src[lo:hi])
	decodeFold(acc, r.op, r.quant, q)
	if step < r.world-2 {
		if err := encode(acc, r.quant, q); err != nil {
			return fmt.Errorf("chunk %d part %d: %w", c, p, err)
		}
		return nil
	}
	if r.div > 0 && r.op == Avg {
		d := T(r.div)
		for i := range acc {
			acc[i] /= d
		}
	}
	narrow(r.dt, r.work[lo:hi], acc)
	if r.gather {
		return r.adopt(c, p, r.racc)
	}
	return nil
}

// reduce receives frame id, for part p of chunk c, and stores in dst the received value folded with
// the local contribution own, in that order (received op own). In place, own is dst itself, so the
// frame lands in scratch; with keepOriginal, the part's original goes to backup first, in the same
// pass as the fold where the kernel allows.
func (r *run) reduce(id ChunkID, c, p int, dst, own []byte) error {
	if !r.inPlace {
		if err := r.s.Recv(id, dst); err != nil {
			return err
		}
		Accumulate(r.dt, r.op, dst, own)
		return nil
	}
	tmp := r.scratch[:len(dst)]
	if err := r.s.Recv(id, tmp); err != nil {
		return err
	}
	if save := r.toSave(c, p); save != nil {
		if accumulateOntoSaving(r.dt, r.op, dst, tmp, save) {
			return nil
		}
		copy(save, dst) // the kernel did neither
	}
	if accumulateOnto(r.dt, r.op, dst, tmp) { // dst = tmp op dst, without a copy back
		return nil
	}
	Accumulate(r.dt, r.op, tmp, own)
	copy(dst, tmp)
	return nil
}

// keepOriginal makes r save the original bytes of every part of work into backup (as long as work)
// before it first writes them, for restore.
func (r *run) keepOriginal(backup []byte) {
	r.backup = backup
	r.saved = make([]bool, r.indexParts())
}

// indexParts fills partBase (partBase[c]: the parts of the chunks before c) and returns the number
// of parts in all.
func (r *run) indexParts() int {
	r.partBase = make([]int, len(r.chunks))
	parts := 0
	for c := range r.chunks {
		r.partBase[c] = parts
		parts += r.parts(c)
	}
	return parts
}

// save copies part p of chunk c of work into backup before its first write (with keepOriginal).
func (r *run) save(c, p int) {
	if save := r.toSave(c, p); save != nil {
		lo, hi := r.part(c, p)
		copy(save, r.work[lo:hi])
	}
}

// toSave returns the region of backup that part p of chunk c's original goes to, and counts the part
// saved: the caller copies it there before it writes the part. It returns nil without keepOriginal
// or if the part was saved already.
func (r *run) toSave(c, p int) []byte {
	if r.saved == nil || r.saved[r.partBase[c]+p] {
		return nil
	}
	r.saved[r.partBase[c]+p] = true
	lo, hi := r.part(c, p)
	return r.backup[lo:hi]
}

// restore puts back the original bytes of every part saved. It is called after both goroutines
// returned.
func (r *run) restore() {
	for c := range r.chunks {
		for p := range r.parts(c) {
			if r.saved[r.partBase[c]+p] {
				lo, hi := r.part(c, p)
				copy(r.work[lo:hi], r.backup[lo:hi])
			}
		}
	}
}

// release returns once the region that all-gather step's part p overwrites may be written: in an
// all-reduce, when the Send of the reduce-scatter frame that sent it has returned and, with a
// Retainer, that frame has been acknowledged.
func (r *run) release(step, p int) error {
	if r.sent == nil {
		return nil
	}
	k := step - (r.world - 1) // the reduce-scatter step that sent this chunk
	for r.seen <= r.rsBase[k]+p {
		select {
		case <-r.sent:
			r.seen++
		case <-r.quit:
			return errStopped
		}
	}
	if r.ret == nil {
		return nil
	}
	id := ChunkID{Step: uint32(k), Part: uint32(p)}
	if err := r.ret.AwaitAcked(id); err != nil {
		return fmt.Errorf("await acknowledgement of %v: %w", id, err)
	}
	return nil
}

// errStopped is what a worker returns when it stops because another failure came first; it is never
// the recorded cause.
var errStopped = errors.New("rings: stopped")
