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

// Kind selects the training algorithm a Trainer runs.
type Kind uint8

// Training algorithms.
const (
	// KindDiLoCo runs H inner AdamW steps per outer step, then all-reduces the
	// pseudo-gradient and applies one Nesterov step. It is the zero value.
	KindDiLoCo Kind = iota
	// KindDDP all-reduces the gradient of every minibatch and applies one AdamW
	// step with the average; an outer step is one optimiser step.
	KindDDP
	// KindAsyncDiLoCo is DiLoCo whose all-reduce of outer step t overlaps the
	// inner steps of step t+1; its result is applied one outer step late.
	KindAsyncDiLoCo
	// KindStreamingDiLoCo syncs the parameters in Fragments fragments on a
	// staggered schedule, each fragment's all-reduce overlapping SyncDelay
	// inner steps and mixed into the local parameters with weight Mix, its
	// outer gradients optionally compressed with error feedback (see
	// RunStreaming).
	KindStreamingDiLoCo
)

// String returns the name ParseKind accepts.
func (k Kind) String() string {
	switch k {
	case KindDiLoCo:
		return "diloco"
	case KindDDP:
		return "ddp"
	case KindAsyncDiLoCo:
		return "async-diloco"
	case KindStreamingDiLoCo:
		return "streaming-diloco"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// ParseKind returns the Kind named s: "ddp", "diloco", "async-diloco" or
// "streaming-diloco".
func ParseKind(s string) (Kind, error) {
	for _, k := range []Kind{KindDiLoCo, KindDDP, KindAsyncDiLoCo, KindStreamingDiLoCo} {
		if k.String() == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown trainer kind %q (want ddp, diloco, async-diloco or streaming-diloco)", ErrBadConfig, s)
}

// Names of the shared-state entries the trainers register. A peer that joins
// a run receives all of them from the peers already training.
const (
	// EntryParams holds the global parameters, NumParams float32s (for DDP the
	// model's parameters themselves).
	EntryParams = "params"
	// EntryMomentum holds the Nesterov momentum buffer (DiLoCo kinds).
	EntryMomentum = "outer.momentum"
	// EntryAdamW holds the AdamW state, 2*NumParams+1 float32s (DDP only: in
	// DiLoCo every peer keeps its own inner optimiser).
	EntryAdamW = "inner.adamw"
	// EntryProgress holds three uint64s: the outer step counter (for
	// streaming DiLoCo, the inner step counter), the data epoch and the
	// number of samples of that epoch consumed by the group.
	EntryProgress = "progress"
)

// tagReduce is the collective tag of the trainers' all-reduce; one is in
// flight at a time.
const tagReduce = 1

// TrainerConfig configures Run. The zero value works: DiLoCo with the
// defaults below.
type TrainerConfig struct {
	// Kind is the algorithm. Default KindDiLoCo.
	Kind Kind
	// H is the number of inner steps per outer step of the DiLoCo kinds.
	// Default 50. DDP ignores it (one optimiser step per outer step).
	H int
	// BatchSize is the number of images per inner step on each peer.
	// Default 64.
	BatchSize int
	// Inner holds the AdamW hyper-parameters (the only optimiser of DDP).
	// Zero fields take the AdamW defaults.
	Inner AdamWConfig
	// Outer holds the Nesterov hyper-parameters of the DiLoCo kinds. Zero
	// fields take the Nesterov defaults.
	Outer NesterovConfig
	// Fragments is the number of fragments of streaming DiLoCo; it must
	// divide H. Default 4. Other kinds ignore it.
	Fragments int
	// SyncDelay is the number of inner steps a fragment's outer sync of
	// streaming DiLoCo overlaps before its result is mixed in, in
	// [0, H/Fragments]; 0 waits for it at once. Default 0.
	SyncDelay int
	// Mix is the weight of the local parameters when streaming DiLoCo mixes
	// a synced fragment into them (local = Mix·local + (1-Mix)·global), in
	// [0, 1). Default 0: the local fragment becomes the global one.
	Mix float32
	// Compression encodes streaming DiLoCo's outer gradients (int8 or int4
	// values, top-k), with error feedback. Default: none, a float32
	// all-reduce.
	Compression Compression
	// Seed selects the initial parameters (see InitParams); every peer of a
	// run must use the same seed. Default 0.
	Seed uint64
	// Steps is the number of outer steps of the run, counted by the group:
	// a peer that joins late stops at the same step as the others.
	// Default 40.
	Steps int
	// MinWorld is the smallest group that trains. With fewer accepted
	// peers a peer admits newcomers and waits, and a step whose all-reduce
	// finds the group shrunk below MinWorld is dropped. Default 2.
	MinWorld int
	// RetryWait is how long a peer waits before it looks for peers again
	// while the group is below MinWorld or the master reports too few
	// peers. Default 50ms.
	RetryWait time.Duration
	// MaxFailures is the number of failed syncs and all-reduces in a row
	// (without a completed outer step) after which Run gives up. Default 50.
	MaxFailures int
	// Progress, if set, is called by Run's goroutine after every outer step
	// this peer completes.
	Progress func(Progress)
	// StopAt, if set, is read after every outer step: Run ends once the
	// group's step counter reaches min(Steps, StopAt()). Every peer must
	// see the same value by the time the group reaches it (a supervisor
	// picks a step a few ahead of the group and tells every peer).
	StopAt func() uint64
	// Leave, if set, is asked at every membership step (the top of an outer step; a fragment
	// boundary of streaming DiLoCo): when it reports true, the peer leaves the group there
	// (pccl.Communicator.Leave), after the collective it has in flight, so that the others go on
	// without an abort, and Run returns ErrLeft. A preemption notice or SIGTERM handler sets it.
	Leave func() bool
	// Logger receives diagnostics. Default: discard.
	Logger *slog.Logger
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c TrainerConfig) withDefaults() TrainerConfig {
	if c.H == 0 {
		c.H = 50
	}
	if c.Kind == KindDDP {
		c.H = 1
	}
	if c.Fragments == 0 {
		c.Fragments = 4
	}
	if c.BatchSize == 0 {
		c.BatchSize = 64
	}
	if c.Steps == 0 {
		c.Steps = 40
	}
	if c.MinWorld == 0 {
		c.MinWorld = 2
	}
	if c.RetryWait == 0 {
		c.RetryWait = 50 * time.Millisecond
	}
	if c.MaxFailures == 0 {
		c.MaxFailures = 50
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate reports the first field of c (after defaults) that is out of
// range, wrapping ErrBadConfig.
func (c TrainerConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Kind > KindStreamingDiLoCo:
		return fmt.Errorf("%w: TrainerConfig.Kind %d is not a known kind", ErrBadConfig, c.Kind)
	case c.H < 0:
		return fmt.Errorf("%w: TrainerConfig.H %d must not be negative", ErrBadConfig, c.H)
	case c.BatchSize < 0:
		return fmt.Errorf("%w: TrainerConfig.BatchSize %d must not be negative", ErrBadConfig, c.BatchSize)
	case c.Steps < 0:
		return fmt.Errorf("%w: TrainerConfig.Steps %d must not be negative", ErrBadConfig, c.Steps)
	case c.MinWorld < 0:
		return fmt.Errorf("%w: TrainerConfig.MinWorld %d must not be negative", ErrBadConfig, c.MinWorld)
	case c.RetryWait < 0:
		return fmt.Errorf("%w: TrainerConfig.RetryWait %v must not be negative", ErrBadConfig, c.RetryWait)
	case c.MaxFailures < 0:
		return fmt.Errorf("%w: TrainerConfig.MaxFailures %d must not be negative", ErrBadConfig, c.MaxFailures)
	case c.Fragments < 0:
		return fmt.Errorf("%w: TrainerConfig.Fragments %d must not be negative", ErrBadConfig, c.Fragments)
	case c.Kind == KindStreamingDiLoCo && c.H%c.Fragments != 0:
		return fmt.Errorf("%w: TrainerConfig.Fragments %d must divide H %d", ErrBadConfig, c.Fragments, c.H)
	case c.Kind == KindStreamingDiLoCo && (c.SyncDelay < 0 || c.SyncDelay > c.H/c.Fragments):
		return fmt.Errorf("%w: TrainerConfig.SyncDelay %d must be in [0, H/Fragments = %d]", ErrBadConfig, c.SyncDelay, c.H/c.Fragments)
	case !(c.Mix >= 0 && c.Mix < 1):
		return fmt.Errorf("%w: TrainerConfig.Mix %v must be in [0, 1)", ErrBadConfig, c.Mix)
	}
	if err := c.Compression.Validate(); err != nil {
		return err
	}
	if err := c.Inner.Validate(); err != nil {
		return err
	}
	return c.Outer.Validate()
}

// Progress describes one completed outer step of one peer.
type Progress struct {
	// Step is the group's outer step counter after this step (1 after the
	// first step of the run).
	Step uint64
	// Loss is the mean minibatch loss of this peer's inner steps in this
	// outer step.
	Loss float32
	// Rank and World are this peer's rank and the group's size when the
	// step completed.
	Rank, World int
	// Revision is the shared-state revision after the step's syncs.
	Revision uint64
	// Reduced lists the ids of the peers whose contributions were averaged
	// by the all-reduce applied in this step, in ring order; empty when the
	// step applied none (the first step of async DiLoCo, or a late result
	// that was dropped).
	Reduced []uint64
	// Aborts and Joins count, since Run started, the collectives of this
	// peer that failed and were retried or dropped, and the topology
	// updates that admitted newcomers.
	Aborts, Joins int
	// BytesReduced and BytesFetched are the totals so far (see Summary).
	BytesReduced, BytesFetched int64
	// Digest is the digest of the shared state after the step. Every peer
	// that completes the same step has the same digest.
	Digest sharedstate.Digest
	// Params is the global parameter vector after the step. It is the
	// trainer's own memory: read it during the callback, do not keep it.
	Params []float32
	// InnerTime is the time this peer has spent in inner steps since Run
	// started, and SyncWait the time it waited for fragments in flight
	// (streaming DiLoCo; zero for the other kinds).
	InnerTime, SyncWait time.Duration
}

// Summary is what Run reports when it returns.
type Summary struct {
	// Steps is the group's outer step counter at the end.
	Steps uint64
	// LocalSteps is the number of outer steps this peer took part in.
	LocalSteps int
	// InnerSteps is the number of minibatch gradients this peer computed.
	InnerSteps int
	// Samples is the number of training images this peer processed.
	Samples int64
	// BytesReduced is the payload handed to AllReduce, summed over every
	// attempt (failed ones included); an AllGather counts half its receive
	// buffer, which is what it sends. On a ring each peer sends 2(W-1)/W
	// times this.
	BytesReduced int64
	// BytesFetched is the shared state this peer received from others
	// (SyncResult.FetchedBytes summed over every sync).
	BytesFetched int64
	// Aborts, Joins and Dropped count the failed collectives, the topology
	// updates that admitted newcomers and the steps dropped because of
	// churn.
	Aborts, Joins, Dropped int
	// Params is a copy of the final global parameters.
	Params []float32
	// Digest is the digest of the final shared state.
	Digest sharedstate.Digest
	// TestLoss and TestAccuracy evaluate Params on the test set given to
	// Run (zero when it was nil).
	TestLoss, TestAccuracy float64
	// InnerTime is the time spent in inner steps (streaming DiLoCo), and
	// TrainTime the time from the first inner step to the end of Run: their
	// ratio is the share of the wall time the peer spent computing.
	InnerTime, TrainTime time.Duration
	// SyncWait is the part of TrainTime streaming DiLoCo spent waiting for
	// fragments in flight, whose syncs took longer than SyncDelay inner
	// steps.
	SyncWait time.Duration
}

// ErrGaveUp is returned by Run (wrapped, with the last error) after
// TrainerConfig.MaxFailures failed syncs or all-reduces in a row.
var ErrGaveUp = errors.New("diloco: too many failures in a row")

// ErrLeft is what Run returns after the peer left the group gracefully (TrainerConfig.Leave); the
// Summary holds the steps it took part in.
var ErrLeft = errors.New("diloco: left the group gracefully")

// Run trains with comm, a Communicator that has just connected, until the
// group's step counter reaches cfg.Steps, and returns the summary. Every
// peer of the run calls Run with the same configuration (Seed, Kind, H,
// BatchSize, the optimisers) on the same training set; peers may join at any
// time and leave or die at any time.
//
// Every outer step starts with the membership vote (if peers are pending,
// UpdateTopology admits them) and, for DDP and DiLoCo, a shared-state sync
// whose revision advances by one, so that a newcomer receives the global
// parameters, the optimiser state the algorithm shares and the step and data
// counters. Data is read from Shard(rank, world, epoch) at the group's
// position, so a changed group re-shards deterministically. A failed
// all-reduce (ErrPeerLeft, ErrAborted) is followed by UpdateTopology and
// retried with the same buffers; if that admitted newcomers or left fewer
// than MinWorld peers, the step is dropped and started again, which is
// where newcomers enter. After each all-reduce every peer applies the same
// update to the same state, so the shared state stays bit-identical.
//
// Run returns early with ctx's error, with the error of a failed
// communicator (ErrKicked, ErrMasterLost, ErrClosed), with ErrLeft after a
// graceful leave (TrainerConfig.Leave), or with ErrGaveUp. It does not close
// comm. test may be nil. A peer that the master removed (ErrKicked after a
// partition) rejoins by running Run again under pccl.Rejoin: as a newcomer it
// fetches the group's state at its first sync.
func Run(ctx context.Context, comm *pccl.Communicator, cfg TrainerConfig, train, test *Dataset) (Summary, error) {
	if err := cfg.Validate(); err != nil {
		return Summary{}, err
	}
	if train == nil || train.N == 0 {
		return Summary{}, fmt.Errorf("%w: empty training set", ErrBadConfig)
	}
	if cfg.Kind == KindStreamingDiLoCo {
		sum, err := RunStreaming(ctx, comm, cfg, newMLPWorker(train, cfg.withDefaults()))
		if err == nil && test != nil && test.N > 0 {
			m := &MLP{Params: sum.Params}
			sum.TestLoss = m.Loss(test)
			sum.TestAccuracy = m.Accuracy(test)
		}
		return sum, err
	}
	t := newTrainer(ctx, comm, cfg.withDefaults(), train)
	var err error
	if t.cfg.Kind == KindAsyncDiLoCo {
		err = t.runAsync()
	} else {
		err = t.runSync()
	}
	t.sum.Steps = t.progress[0]
	t.sum.Params = slices.Clone(t.params)
	t.sum.Digest = t.st.Digest(0)
	if err != nil {
		return t.sum, err
	}
	if test != nil && test.N > 0 {
		m := &MLP{Params: slices.Clone(t.params)}
		t.sum.TestLoss = m.Loss(test)
		t.sum.TestAccuracy = m.Accuracy(test)
	}
	return t.sum, nil
}

// trainer is the state of one peer's Run. It is used by Run's goroutine only.
type trainer struct {
	ctx   context.Context
	comm  *pccl.Communicator
	cfg   TrainerConfig
	log   *slog.Logger
	train *Dataset

	st       *pccl.State
	params   []float32 // global parameters (EntryParams)
	progress []uint64  // EntryProgress: step, epoch, samples of the epoch consumed
	outer    *Nesterov // DiLoCo kinds: EntryMomentum
	inner    *AdamW    // shared (EntryAdamW) for DDP, local otherwise
	model    *MLP      // Params aliases params for DDP, is the inner copy otherwise
	grads    []float32
	x        []float32
	y        []uint8

	sampler       *Sampler
	sRank, sWorld int
	ring          []uint64 // ring after the last topology update this peer saw
	rev           uint64   // revision of the last successful sync
	newcomer      bool     // connected to a group with other peers: receive-only until caught up
	failures      int      // failed syncs and reduces since the last completed step
	sum           Summary
	reducedBy     []uint64 // ring of the last successful all-reduce
	stepLoss      float32
	stepWorld     int
	stepRank      int
}

func newTrainer(ctx context.Context, comm *pccl.Communicator, cfg TrainerConfig, train *Dataset) *trainer {
	t := &trainer{
		ctx: ctx, comm: comm, cfg: cfg, log: cfg.Logger.With("trainer", cfg.Kind.String()), train: train,
		st:       sharedstate.NewState(),
		params:   make([]float32, NumParams),
		progress: make([]uint64, 3),
		inner:    NewAdamW(cfg.Inner, NumParams),
		grads:    make([]float32, NumParams),
		x:        make([]float32, cfg.BatchSize*InputSize),
		y:        make([]uint8, cfg.BatchSize),
		ring:     comm.Ring(),
		newcomer: comm.WorldSize() > 1,
	}
	InitParams(t.params, cfg.Seed)
	add := func(name string, dt pccl.DType, data []byte) {
		if err := t.st.Add(&pccl.Entry{Name: name, DType: dt, Data: data}); err != nil {
			panic(err) // the names are constants: a failure is a bug here
		}
	}
	add(EntryParams, pccl.F32, pccl.Bytes(t.params))
	add(EntryProgress, pccl.U64, pccl.Bytes(t.progress))
	if cfg.Kind == KindDDP {
		t.model = &MLP{Params: t.params}
		add(EntryAdamW, pccl.F32, pccl.Bytes(t.inner.State))
	} else {
		t.model = &MLP{Params: slices.Clone(t.params)}
		t.outer = NewNesterov(cfg.Outer, NumParams)
		add(EntryMomentum, pccl.F32, pccl.Bytes(t.outer.State))
	}
	return t
}

// done reports whether the group has reached the last step.
func (t *trainer) done() bool {
	limit := uint64(t.cfg.Steps)
	if t.cfg.StopAt != nil {
		limit = min(limit, t.cfg.StopAt())
	}
	return t.progress[0] >= limit
}

// fail counts a failure and returns ErrGaveUp once there were too many in a
// row.
func (t *trainer) fail(err error) error {
	t.failures++
	if t.failures >= t.cfg.MaxFailures {
		return fmt.Errorf("%w: %d, the last: %w", ErrGaveUp, t.failures, err)
	}
	return nil
}

// wait sleeps for RetryWait or until ctx ends.
func (t *trainer) wait() error {
	tm := time.NewTimer(t.cfg.RetryWait)
	defer tm.Stop()
	select {
	case <-t.ctx.Done():
		return t.ctx.Err()
	case <-tm.C:
		return nil
	}
}

// leaving reports whether TrainerConfig.Leave asks this peer to leave.
func (t *trainer) leaving() bool { return t.cfg.Leave != nil && t.cfg.Leave() }

// leave leaves the group in place of this membership step's vote and returns ErrLeft.
func (t *trainer) leave() error {
	if err := t.comm.Leave(t.ctx); err != nil {
		return err
	}
	t.log.Info("left the group", "step", t.progress[0])
	return ErrLeft
}

// membership is the vote at the top of an outer step: if peers are pending,
// UpdateTopology admits them. It reports whether newcomers joined.
func (t *trainer) membership() (bool, error) {
	pending, err := t.comm.ArePeersPending(t.ctx)
	if err != nil || !pending {
		return false, err
	}
	return t.updateTopology()
}

// updateTopology runs UpdateTopology and reports whether the new ring holds
// peers the old one did not.
func (t *trainer) updateTopology() (bool, error) {
	return rewire(t.ctx, t.comm, &t.ring, &t.sum, t.log)
}

// rewire runs UpdateTopology on comm and reports whether the new ring holds
// peers *ring did not; it counts such a change in sum.Joins and keeps the new
// ring in *ring.
func rewire(ctx context.Context, comm *pccl.Communicator, ring *[]uint64, sum *Summary, log *slog.Logger) (bool, error) {
	if err := comm.UpdateTopology(ctx); err != nil {
		return false, err
	}
	next := comm.Ring()
	joined := slices.ContainsFunc(next, func(id uint64) bool { return !slices.Contains(*ring, id) })
	if joined {
		sum.Joins++
		log.Info("peers joined", "ring", next)
	}
	*ring = next
	return joined, nil
}

// sync runs one shared-state sync with the revision advanced by one. A
// newcomer takes part receive-only (the loops clear t.newcomer once it has
// caught up). It returns
// nil, a retryable error (ErrSync: the caller votes on membership again) or
// a fatal one.
func (t *trainer) sync(strategy pccl.Strategy) (retry bool, err error) {
	if t.newcomer {
		strategy = pccl.ReceiveOnly
	}
	t.st.Revision = t.rev + 1
	res, err := t.comm.SyncSharedState(t.ctx, t.st, pccl.SyncOptions{Strategy: strategy})
	t.sum.BytesFetched += res.FetchedBytes
	if err != nil {
		t.st.Revision = t.rev
		if errors.Is(err, pccl.ErrSync) && t.ctx.Err() == nil {
			t.log.Warn("sync failed", "err", err)
			return true, t.fail(err)
		}
		return false, err
	}
	t.rev = t.st.Revision
	return false, nil
}

// recover handles a failed all-reduce: after UpdateTopology the same reduce
// may be retried (retry), or the step must be dropped because newcomers
// joined (joined) or the group fell below MinWorld. Other errors end Run.
func (t *trainer) recover(err error) (retry, joined bool, _ error) {
	if t.ctx.Err() != nil {
		return false, false, t.ctx.Err()
	}
	if !pccl.Retryable(err) {
		return false, false, err
	}
	if errors.Is(err, pccl.ErrTooFewPeers) {
		if werr := t.wait(); werr != nil {
			return false, false, werr
		}
	}
	t.sum.Aborts++
	t.log.Info("all-reduce failed, updating the topology", "err", err)
	if ferr := t.fail(err); ferr != nil {
		return false, false, ferr
	}
	joined, uerr := t.updateTopology()
	if uerr != nil {
		return false, false, uerr
	}
	return !joined && t.comm.WorldSize() >= t.cfg.MinWorld, joined, nil
}

// reduce averages buf over the group with the retry pattern. It returns false
// when the step must be dropped (see recover).
func (t *trainer) reduce(buf []float32) (bool, error) {
	b := pccl.Bytes(buf)
	desc := pccl.Desc{Tag: tagReduce, Count: len(buf), DType: pccl.F32, Op: pccl.Avg}
	for {
		t.sum.BytesReduced += int64(len(b))
		err := t.comm.AllReduce(t.ctx, b, b, desc)
		if err == nil {
			t.reducedBy = t.comm.Ring()
			return true, nil
		}
		if retry, _, err := t.recover(err); !retry || err != nil {
			return false, err
		}
	}
}

// position points the sampler at the group's data position for this peer's
// rank in the current ring.
func (t *trainer) position() error {
	rank, world := t.comm.Rank(), t.comm.WorldSize()
	if rank < 0 || rank >= world {
		return fmt.Errorf("diloco: peer %d is not in the ring %v", t.comm.ID(), t.comm.Ring())
	}
	if t.sampler == nil || rank != t.sRank || world != t.sWorld {
		t.sampler = NewSampler(t.train, rank, world)
		t.sRank, t.sWorld = rank, world
	}
	t.sampler.Epoch = t.progress[1]
	t.sampler.Pos = int(t.progress[2] / uint64(world))
	return nil
}

// advance moves the group's step and data counters past one outer step of
// the group in force. Every peer that completes the step sees the same ring
// here (the same topology updates happened on all of them), so all compute
// the same counters.
func (t *trainer) advance() {
	t.stepRank, t.stepWorld = t.comm.Rank(), t.comm.WorldSize()
	p := t.progress
	p[0]++
	p[2] += uint64(t.stepWorld) * uint64(t.cfg.H) * uint64(t.cfg.BatchSize)
	for n := uint64(t.train.N); p[2] >= n; p[2] -= n {
		p[1]++
	}
}

// innerSteps runs the H local steps of one outer step on the model and
// returns the mean loss. For DDP it only computes the gradient (H is 1).
func (t *trainer) innerSteps(applyStep bool) float32 {
	var total float64
	for range t.cfg.H {
		bx, by := t.train.Batch(t.sampler.Next(t.cfg.BatchSize), t.x, t.y)
		total += float64(t.model.LossGrad(bx, by, t.grads))
		if applyStep {
			t.inner.Step(t.model.Params, t.grads)
		}
	}
	t.sum.InnerSteps += t.cfg.H
	t.sum.Samples += int64(t.cfg.H * t.cfg.BatchSize)
	return float32(total / float64(t.cfg.H))
}

// completed records a finished outer step and reports it.
func (t *trainer) completed(reduced []uint64) {
	t.failures = 0
	t.sum.LocalSteps++
	if t.cfg.Progress == nil {
		return
	}
	t.cfg.Progress(Progress{
		Step: t.progress[0], Loss: t.stepLoss, Rank: t.stepRank, World: t.stepWorld,
		Revision: t.st.Revision, Reduced: reduced, Aborts: t.sum.Aborts, Joins: t.sum.Joins,
		BytesReduced: t.sum.BytesReduced, BytesFetched: t.sum.BytesFetched, Digest: t.st.Digest(0),
		Params: t.params,
	})
}

// runSync is the loop of DDP and DiLoCo.
func (t *trainer) runSync() error {
	skipVote := true // where a newcomer enters: its admission was the vote
	delta := t.grads
	if t.cfg.Kind != KindDDP {
		delta = make([]float32, NumParams)
	}
	for {
		if !skipVote {
			if t.leaving() {
				return t.leave()
			}
			if _, err := t.membership(); err != nil {
				return err
			}
		}
		skipVote = false
		if t.comm.WorldSize() < t.cfg.MinWorld {
			if err := t.wait(); err != nil {
				return err
			}
			continue
		}
		if retry, err := t.sync(pccl.EnforcePopular); retry || err != nil {
			if err != nil {
				return err
			}
			continue
		}
		t.newcomer = false
		if t.done() {
			return nil
		}
		if err := t.position(); err != nil {
			return err
		}
		if t.cfg.Kind == KindDDP {
			t.stepLoss = t.innerSteps(false)
		} else {
			copy(t.model.Params, t.params)
			t.stepLoss = t.innerSteps(true)
			PseudoGradient(delta, t.params, t.model.Params)
		}
		ok, err := t.reduce(delta)
		if err != nil {
			return err
		}
		if !ok {
			t.sum.Dropped++
			skipVote = true
			continue
		}
		if t.cfg.Kind == KindDDP {
			t.inner.Step(t.params, delta)
		} else {
			t.outer.Step(t.params, delta)
		}
		t.advance()
		t.completed(t.reducedBy)
	}
}
