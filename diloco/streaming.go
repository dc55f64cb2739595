package diloco

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/sharedstate"
)

// Streaming DiLoCo. The parameters are cut into Fragments fragments of (nearly) equal length. Every
// peer counts the group's inner steps; every B = H/Fragments of them is a fragment boundary, and
// at the boundary after inner step b·B, fragment (b-1) mod Fragments starts its outer sync: the
// peer takes the fragment's pseudo-gradient (the global fragment minus its local one), and a
// goroutine of its own all-reduces it (compressed, with error feedback, when Compression is set),
// averages it and applies the Nesterov step to the global fragment, while the inner steps go on.
// SyncDelay inner steps after the start the peer waits for that goroutine and mixes the new global
// fragment into its local parameters: local = Mix·local + (1-Mix)·global. So each fragment syncs
// once every H inner steps, at most one is in flight, and an outer step (all Fragments of them)
// ends when the last fragment of it is applied.
//
// Membership happens at fragment boundaries only, where no fragment is in flight. At every
// boundary a peer casts an ArePeersPending vote in the background and reads its answer at the next
// boundary; a fragment whose all-reduce failed (a peer died) is also taken up there. Then
// UpdateTopology runs (on a yes, or after a failure), a shared-state sync hands newcomers the
// global parameters, the outer momentum and the counters, and the failed fragment is retried with
// the same contributions on the survivors, or dropped if newcomers joined (they have no part in
// it; the peers' local parameters still hold what it carried, so the next sync of that fragment
// sends it). A newcomer starts with the global parameters as its local ones, a fresh inner
// optimiser and a zero error-feedback buffer; its first pseudo-gradient, at the boundary where it
// joined, is zero.
//
// The global parameters, the momentum and the counters change only through all-reduce results
// and counters that every peer sees alike, so they stay bit-identical on every peer; the local
// parameters, the inner optimiser and the error-feedback buffer are each peer's own.

// streamer is the state of one peer's RunStreaming. Its fields are used by Run's goroutine, except
// where a fragment in flight (job) is said to own them.
type streamer struct {
	ctx  context.Context
	comm *pccl.Communicator
	cfg  TrainerConfig
	log  *slog.Logger
	w    Worker
	n    int // parameters
	b    int // inner steps between fragment boundaries

	st       *pccl.State
	outerSt  *pccl.State // the entries of global and mom alone, hashed by the job that ends an outer step
	global   []float32   // EntryParams; the fragment of a job in flight is the job's
	mom      []float32   // EntryMomentum; likewise
	progress []uint64    // EntryProgress: inner steps of the group, epoch, samples of the epoch consumed
	local    []float32   // this peer's parameters
	errfb    []float32   // error feedback, with Compression; the fragment of a job in flight is the job's

	z       compressor // owned by the job in flight
	payload []byte     // this peer's encoded fragment, owned by the job in flight
	slots   []byte     // the gathered payloads, likewise
	avg     []float32  // the sum of the decoded fragments, likewise
	delta   []float32  // the local fragment of the job in flight, then its pseudo-gradient (plus error feedback), then its average

	job    *fragJob          // fragment in flight, or nil
	failed *fragJob          // fragment whose all-reduce failed, taken up at the next boundary
	vote   chan pendingReply // ArePeersPending in flight, or nil

	ring     []uint64 // ring after the last topology update this peer saw
	rev      uint64   // revision of the last successful sync
	newcomer bool     // connected to a group with other peers: receive-only until caught up
	failures int
	sum      Summary
	lossSum  float64
	lossN    int
	started  time.Time // first inner step
}

// fragJob is the outer sync of one fragment.
type fragJob struct {
	frag     int
	lo, hi   int
	launched uint64 // the group's inner steps when it started
	outer    uint64 // the outer step it completes, when it is the last fragment; else 0
	prepared bool   // delta holds the pseudo-gradient (plus error feedback), and the payload its encoding
	done     chan error
	ring     []uint64 // ring of the successful all-reduce
}

type pendingReply struct {
	answer bool
	err    error
}

// RunStreaming trains w with streaming DiLoCo (see the comment at the top of streaming.go) until
// the group has done cfg.Steps outer steps of cfg.H inner steps, and returns the summary. It is Run
// for any model: Run's KindStreamingDiLoCo runs it with the MLP on a data set. Every peer of the
// run calls it with the same configuration and a worker of the same model; peers may join at any
// time and leave or die at any time. cfg.Kind is ignored. Summary.TestLoss and TestAccuracy are
// left zero; Summary.Params holds the final global parameters.
//
// RunStreaming returns early with ctx's error, with the error of a failed communicator, with ErrLeft or with
// ErrGaveUp. It does not close comm.
func RunStreaming(ctx context.Context, comm *pccl.Communicator, cfg TrainerConfig, w Worker) (Summary, error) {
	cfg.Kind = KindStreamingDiLoCo
	if err := cfg.Validate(); err != nil {
		return Summary{}, err
	}
	cfg = cfg.withDefaults()
	s := newStreamer(ctx, comm, cfg, w)
	err := s.run()
	if s.job != nil {
		// A fragment still in flight writes the global state: let it end first (it does soon, as
		// the communicator or ctx that ended Run ends it).
		<-s.job.done
	}
	s.sum.Steps = s.progress[0] / uint64(cfg.H)
	s.sum.Params = slices.Clone(s.global)
	s.sum.Digest = s.st.Digest(0)
	if !s.started.IsZero() {
		s.sum.TrainTime = time.Since(s.started)
	}
	return s.sum, err
}

func newStreamer(ctx context.Context, comm *pccl.Communicator, cfg TrainerConfig, w Worker) *streamer {
	n := w.NumParams()
	s := &streamer{
		ctx: ctx, comm: comm, cfg: cfg, log: cfg.Logger.With("trainer", KindStreamingDiLoCo.String()), w: w, n: n,
		b:        cfg.H / cfg.Fragments,
		st:       sharedstate.NewState(),
		global:   make([]float32, n),
		mom:      make([]float32, n),
		progress: make([]uint64, 3),
		local:    make([]float32, n),
		ring:     comm.Ring(),
		newcomer: comm.WorldSize() > 1,
	}
	w.Init(s.global)
	copy(s.local, s.global)
	longest := (n + cfg.Fragments - 1) / cfg.Fragments
	s.delta = make([]float32, longest)
	if cfg.Compression.Enabled() {
		s.z.c = cfg.Compression
		s.errfb = make([]float32, n)
		s.avg = make([]float32, longest)
		s.payload = make([]byte, cfg.Compression.PayloadBytes(longest))
	}
	// The global parameters and the momentum carry a Version, so that the job that ends an outer
	// step hashes them off the inner steps' path and the digest of the whole state reuses it.
	s.outerSt = sharedstate.NewState()
	for _, e := range []*pccl.Entry{
		{Name: EntryParams, DType: pccl.F32, Data: pccl.Bytes(s.global), Version: 1},
		{Name: EntryMomentum, DType: pccl.F32, Data: pccl.Bytes(s.mom), Version: 1},
		{Name: EntryProgress, DType: pccl.U64, Data: pccl.Bytes(s.progress)},
	} {
		if err := s.st.Add(e); err != nil {
			panic(err) // the names are constants: a failure is a bug here
		}
		if e.Version != 0 {
			s.outerSt.Add(e)
		}
	}
	return s
}

// applied records that job j changed the global parameters and the momentum; the job that ends an
// outer step hashes them, for the digest that reports it.
func (s *streamer) applied(j *fragJob) {
	for _, e := range s.outerSt.Entries {
		e.Version++
	}
	if j.outer > 0 && s.cfg.Progress != nil {
		s.outerSt.Digest(0)
	}
}

// span returns the elements of fragment f.
func (s *streamer) span(f int) (lo, hi int) {
	return f * s.n / s.cfg.Fragments, (f + 1) * s.n / s.cfg.Fragments
}

// limit returns the group's inner step count at which the run ends.
func (s *streamer) limit() uint64 {
	limit := uint64(s.cfg.Steps)
	if s.cfg.StopAt != nil {
		limit = min(limit, s.cfg.StopAt())
	}
	return limit * uint64(s.cfg.H)
}

// run is the loop of fragment boundaries.
func (s *streamer) run() error {
	tau := uint64(s.cfg.SyncDelay)
	for {
		c := s.progress[0]
		// The fragment due at this boundary.
		if s.job != nil && s.job.launched+tau == c {
			if err := s.settle(); err != nil {
				return err
			}
		}
		if _, err := s.membership(); err != nil {
			return err
		}
		c = s.progress[0] // a newcomer has just learnt it
		final := c >= s.limit()
		if c > 0 {
			s.launch(c)
			if tau == 0 || final {
				if err := s.settle(); err != nil {
					return err
				}
				if s.failed != nil {
					dropped, err := s.membership()
					if err != nil {
						return err
					}
					if dropped {
						// Newcomers joined while it was retried: everybody starts this
						// boundary's fragment again, the newcomers with the others.
						continue
					}
				}
			}
		}
		if final {
			return nil
		}
		if s.cfg.Leave != nil && s.cfg.Leave() {
			return s.leave()
		}
		s.vote = make(chan pendingReply, 1)
		go func(ch chan<- pendingReply) {
			answer, err := s.comm.ArePeersPending(s.ctx)
			ch <- pendingReply{answer, err}
		}(s.vote)
		if err := s.innerSteps(c + uint64(s.b)); err != nil {
			return err
		}
	}
}

// leave leaves the group in place of this boundary's vote, once the fragment in flight (which the
// others run too) is over, and returns ErrLeft.
func (s *streamer) leave() error {
	if s.job != nil {
		if err := s.settle(); err != nil {
			return err
		}
	}
	if err := s.comm.Leave(s.ctx); err != nil {
		return err
	}
	s.log.Info("left the group", "inner_steps", s.progress[0])
	return ErrLeft
}

// membership is the top of a boundary, where no fragment is in flight: it reads the answer of the
// last boundary's ArePeersPending, runs UpdateTopology on a yes or after a failed fragment, syncs
// the shared state when newcomers joined (or this peer is one), takes up the failed fragment, and
// waits while the group is below MinWorld. It reports whether it dropped the failed fragment
// because newcomers joined.
func (s *streamer) membership() (dropped bool, _ error) {
	pending := false
	if s.vote != nil {
		r := <-s.vote
		s.vote = nil
		if r.err != nil {
			if s.ctx.Err() != nil || !pccl.Retryable(r.err) {
				return false, r.err
			}
			pending = true // re-wire, as after a failed collective
		}
		pending = pending || r.answer
	}
	joined := s.newcomer
	if pending || s.failed != nil {
		j, err := s.updateTopology()
		if err != nil {
			return false, err
		}
		joined = joined || j
	}
	for {
		if s.comm.WorldSize() < s.cfg.MinWorld {
			if err := s.wait(); err != nil {
				return false, err
			}
			pending, err := s.comm.ArePeersPending(s.ctx)
			if err != nil {
				return false, err
			}
			if pending {
				j, err := s.updateTopology()
				if err != nil {
					return false, err
				}
				joined = joined || j
			}
			continue
		}
		if joined {
			if s.failed != nil {
				s.failed = nil // the newcomers have no part in it
				s.sum.Dropped++
				dropped = true
			}
			retry, err := s.sync()
			if err != nil {
				return false, err
			}
			if retry {
				if _, err := s.updateTopology(); err != nil {
					return false, err
				}
				continue
			}
			if s.newcomer {
				s.newcomer = false
				copy(s.local, s.global)
			}
			joined = false
		}
		if s.failed == nil {
			return dropped, nil
		}
		// The failed fragment, on the survivors with the same contributions.
		j, err := s.recover()
		if err != nil {
			return false, err
		}
		joined = j
	}
}

// recover retries the failed fragment synchronously, after another UpdateTopology for every
// failure, until it succeeds (s.failed is then nil) or the group changes under it: newcomers
// joined (reported) or it fell below MinWorld (s.failed stays set; the caller waits, syncs and
// drops it).
func (s *streamer) recover() (joined bool, _ error) {
	for s.failed != nil && s.comm.WorldSize() >= s.cfg.MinWorld {
		j := s.failed
		s.job, s.failed = j, nil
		j.done = make(chan error, 1)
		j.done <- s.reduce(j)
		if err := s.settle(); err != nil {
			return false, err
		}
		if s.failed == nil {
			return false, nil
		}
		joined, err := s.updateTopology()
		if err != nil || joined {
			return joined, err
		}
	}
	return false, nil
}

// launch starts the outer sync of the fragment whose turn it is at boundary c: its pseudo-gradient
// is taken now, the rest runs on a goroutine of its own.
func (s *streamer) launch(c uint64) {
	f := int((c/uint64(s.b) - 1) % uint64(s.cfg.Fragments))
	lo, hi := s.span(f)
	j := &fragJob{frag: f, lo: lo, hi: hi, launched: c, done: make(chan error, 1)}
	if f == s.cfg.Fragments-1 {
		j.outer = c / uint64(s.cfg.H)
	}
	// Only the copy holds up the inner steps; the job's goroutine takes the difference.
	copy(s.delta[:hi-lo], s.local[lo:hi])
	s.job = j
	go func() { j.done <- s.reduce(j) }()
}

// reduce all-reduces the pseudo-gradient of job j and applies the average to the global fragment.
// It runs on the job's goroutine, or on Run's for a retry, and touches only what the job owns.
func (s *streamer) reduce(j *fragJob) error {
	g := s.delta[:j.hi-j.lo]
	c := s.cfg.Compression
	if !j.prepared {
		// g holds the local fragment: the pseudo-gradient is the global one minus it, plus the
		// error feedback, in one pass.
		global := s.global[j.lo:j.hi]
		if c.Enabled() {
			e := s.errfb[j.lo:j.hi]
			for i := range g {
				g[i] = (global[i] - g[i]) + e[i]
			}
			s.z.encode(s.payload[:c.PayloadBytes(len(g))], g)
		} else {
			PseudoGradient(g, global, g)
		}
		j.prepared = true
	}
	if !c.Enabled() {
		desc := pccl.Desc{Tag: tagReduce, Count: len(g), DType: pccl.F32, Op: pccl.Avg}
		s.sum.BytesReduced += int64(4 * len(g))
		if err := s.comm.AllReduce(s.ctx, pccl.Bytes(g), pccl.Bytes(g), desc); err != nil {
			return err
		}
		j.ring = s.comm.Ring()
		s.outer(j).Step(s.global[j.lo:j.hi], g)
		s.applied(j)
		return nil
	}
	size := c.PayloadBytes(len(g))
	// Every peer's payload, gathered in the order of the ring.
	ring := s.comm.Ring()
	world := len(ring)
	if cap(s.slots) < world*size {
		s.slots = make([]byte, world*size)
	}
	slots := s.slots[:world*size]
	desc := pccl.Desc{Tag: tagReduce, Count: size, DType: pccl.U8}
	s.sum.BytesReduced += int64(len(slots) / 2)
	if err := s.comm.AllGather(s.ctx, s.payload[:size], slots, desc); err != nil {
		return err
	}
	j.ring = ring
	// The sum of the decoded fragments in rank order, then the step with its average: the same
	// bits on every peer.
	sum := s.avg[:len(g)]
	clear(sum)
	for r := range world {
		if err := c.DecodeAdd(sum, slots[r*size:(r+1)*size]); err != nil {
			return fmt.Errorf("diloco: fragment %d from peer %d: %w", j.frag, ring[r], err)
		}
	}
	s.outer(j).StepMean(s.global[j.lo:j.hi], sum, float32(world))
	s.z.feedback(s.errfb[j.lo:j.hi], g)
	s.applied(j)
	return nil
}

// outer returns the outer optimiser of job j's fragment: its slice of the momentum.
func (s *streamer) outer(j *fragJob) *Nesterov {
	return &Nesterov{Config: s.cfg.Outer.withDefaults(), State: s.mom[j.lo:j.hi]}
}

// settle waits for the fragment in flight. On success it mixes the new global fragment into the
// local parameters (and reports the outer step the fragment completes); after a retryable failure
// the fragment becomes s.failed, taken up at the next boundary.
func (s *streamer) settle() error {
	j := s.job
	t0 := time.Now()
	err := <-j.done
	s.sum.SyncWait += time.Since(t0)
	s.job = nil
	if err != nil {
		if s.ctx.Err() != nil {
			return s.ctx.Err()
		}
		if !pccl.Retryable(err) {
			return err
		}
		s.sum.Aborts++
		s.log.Info("fragment all-reduce failed", "fragment", j.frag, "err", err)
		if ferr := s.fail(err); ferr != nil {
			return ferr
		}
		s.failed = j
		return nil
	}
	mix := s.cfg.Mix
	l, g := s.local[j.lo:j.hi], s.global[j.lo:j.hi]
	if mix == 0 {
		copy(l, g)
	} else {
		keep := 1 - mix
		for i := range l {
			l[i] = float32(mix*l[i]) + float32(keep*g[i])
		}
	}
	if j.outer > 0 {
		s.completed(j)
	}
	return nil
}

// completed records outer step j.outer, which j's fragment ended, and reports it.
func (s *streamer) completed(j *fragJob) {
	s.failures = 0
	s.sum.LocalSteps++
	if s.cfg.Progress == nil {
		return
	}
	loss := float32(0)
	if s.lossN > 0 {
		loss = float32(s.lossSum / float64(s.lossN))
	}
	s.lossSum, s.lossN = 0, 0
	s.cfg.Progress(Progress{
		Step: j.outer, Loss: loss, Rank: slices.Index(j.ring, s.comm.ID()), World: len(j.ring),
		Revision: s.st.Revision, Reduced: j.ring, Aborts: s.sum.Aborts, Joins: s.sum.Joins,
		BytesReduced: s.sum.BytesReduced, BytesFetched: s.sum.BytesFetched, Digest: s.st.Digest(0),
		Params: s.global, InnerTime: s.sum.InnerTime, SyncWait: s.sum.SyncWait,
	})
}

// innerSteps runs inner steps until the group's count reaches end, settling the fragment in flight
// when its delay is up.
func (s *streamer) innerSteps(end uint64) error {
	ring := s.comm.Ring()
	rank, world := slices.Index(ring, s.comm.ID()), len(ring)
	if rank < 0 {
		return fmt.Errorf("diloco: peer %d is not in the ring %v", s.comm.ID(), ring)
	}
	p := s.progress
	s.w.Seek(rank, world, p[1], p[2])
	if s.started.IsZero() {
		s.started = time.Now()
	}
	for p[0] < end {
		if s.job != nil && s.job.launched+uint64(s.cfg.SyncDelay) == p[0] {
			if err := s.settle(); err != nil {
				return err
			}
		}
		if err := s.ctx.Err(); err != nil {
			return err
		}
		t0 := time.Now()
		loss := s.w.Step(s.local)
		s.sum.InnerTime += time.Since(t0)
		s.lossSum += float64(loss)
		s.lossN++
		s.sum.InnerSteps++
		s.sum.Samples += int64(s.cfg.BatchSize)
		p[0]++
		p[2] += uint64(world) * uint64(s.cfg.BatchSize)
		if n := uint64(s.w.Samples()); n > 0 {
			for ; p[2] >= n; p[2] -= n {
				p[1]++
			}
		}
	}
	return nil
}

// updateTopology runs UpdateTopology and reports whether the new ring holds peers the old one did
// not.
func (s *streamer) updateTopology() (bool, error) {
	return rewire(s.ctx, s.comm, &s.ring, &s.sum, s.log)
}

// sync runs one shared-state sync with the revision advanced by one, receive-only for a newcomer.
// It returns retry after a retryable failure (the caller updates the topology and syncs again).
func (s *streamer) sync() (retry bool, err error) {
	strategy := pccl.EnforcePopular
	if s.newcomer {
		strategy = pccl.ReceiveOnly
	}
	s.st.Revision = s.rev + 1
	res, err := s.comm.SyncSharedState(s.ctx, s.st, pccl.SyncOptions{Strategy: strategy})
	s.sum.BytesFetched += res.FetchedBytes
	if err != nil {
		s.st.Revision = s.rev
		if errors.Is(err, pccl.ErrSync) && s.ctx.Err() == nil {
			s.log.Warn("sync failed", "err", err)
			return true, s.fail(err)
		}
		return false, err
	}
	s.rev = s.st.Revision
	return false, nil
}

// fail counts a failure and returns ErrGaveUp once there were too many in a row.
func (s *streamer) fail(err error) error {
	s.failures++
	if s.failures >= s.cfg.MaxFailures {
		return fmt.Errorf("%w: %d, the last: %w", ErrGaveUp, s.failures, err)
	}
	return nil
}

// wait sleeps for RetryWait or until ctx ends.
func (s *streamer) wait() error {
	tm := time.NewTimer(s.cfg.RetryWait)
	defer tm.Stop()
	select {
	case <-s.ctx.Done():
		return s.ctx.Err()
	case <-tm.C:
		return nil
	}
}
