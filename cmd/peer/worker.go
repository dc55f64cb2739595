package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sync/atomic"
	"time"

	"github.com/concord-ccl/concord/diloco"
	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/sharedstate"
)

// roleWorker is the demo's peer process.
const (
	roleWorker   = "worker"
	envWorkerCfg = "CONCORD_DEMO_WORKER"
)

// workerConfig is what the demo tells each peer process (JSON in envWorkerCfg).
type workerConfig struct {
	Master  string        `json:"master"`
	Trainer string        `json:"trainer"` // ddp, diloco, async-diloco or allreduce
	H       int           `json:"h"`
	Batch   int           `json:"batch"`
	Seed    uint64        `json:"seed"`
	Size    int           `json:"size"` // allreduce: bytes per op
	Life    time.Duration `json:"life"` // hard bound on the process's lifetime
	Site    string        `json:"site,omitempty"`
	NICs    []string      `json:"nics,omitempty"`
}

// event is one line a worker reports (also used by the standalone commands' progress).
type event struct {
	Event  string  `json:"event"` // connected, step, done, error
	Time   int64   `json:"t"`     // unix nanoseconds
	Step   uint64  `json:"step,omitempty"`
	Loss   float32 `json:"loss,omitempty"`
	Acc    float64 `json:"acc,omitempty"`
	Rank   int     `json:"rank"`
	World  int     `json:"world,omitempty"`
	Rev    uint64  `json:"rev,omitempty"`
	Ops    int64   `json:"ops,omitempty"`
	Aborts int     `json:"aborts,omitempty"`
	Joins  int     `json:"joins,omitempty"`
	// Rejoins counts the times this peer was removed and joined again as a newcomer (peer run, train).
	Rejoins int    `json:"rejoins,omitempty"`
	State   string `json:"state,omitempty"` // hash of the shared state (or of the last result)
	Detail  string `json:"detail,omitempty"`
	// SiteOps and SiteGens count the collectives whose site phases ran on the intra-site tier and
	// the fabrics opened (pccl.Stats), in the done event.
	SiteOps  uint64 `json:"site_ops,omitempty"`
	SiteGens uint64 `json:"site_gens,omitempty"`
	// Reversed, Punched and Relayed count the links this peer opened to peers behind NAT by each way
	// of rendezvous (pccl.Stats), in step and done events.
	Reversed uint64 `json:"reversed,omitempty"`
	Punched  uint64 `json:"punched,omitempty"`
	Relayed  uint64 `json:"relayed,omitempty"`
}

// withLinks adds the rendezvous counts of comm to e.
func withLinks(e event, comm *pccl.Communicator) event {
	s := comm.Stats()
	e.Reversed, e.Punched, e.Relayed = s.LinksReversed, s.LinksPunched, s.LinksRelayed
	return e
}

// control is what the demo sends a worker on stdin.
type control struct {
	StopAt uint64 `json:"stop_at"`
}

func workerMain() int {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(envWorkerCfg)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Life)
	defer cancel()
	var stopAt atomic.Uint64
	stopAt.Store(^uint64(0))
	go func() {
		for raw := range cluster.Inbox() {
			var c control
			if json.Unmarshal(raw, &c) == nil && c.StopAt > 0 {
				stopAt.Store(c.StopAt)
			}
		}
	}()
	emit := func(e event) { e.Time = time.Now().UnixNano(); cluster.Emit(e) }
	comm, err := pccl.Connect(ctx, pccl.Config{Master: cfg.Master, Site: cfg.Site, NICs: cfg.NICs, Logger: cluster.Logger()})
	if err != nil {
		emit(event{Event: "error", Detail: err.Error()})
		return 1
	}
	defer comm.Close()
	emit(event{Event: "connected", Rank: comm.Rank(), World: comm.WorldSize()})
	if cfg.Trainer == "allreduce" {
		err = allreduceLoop(ctx, comm, loopConfig{size: cfg.Size, stopAt: stopAt.Load}, emit, cluster.Logger())
	} else {
		err = trainLoop(ctx, comm, cfg, stopAt.Load, emit)
	}
	if err != nil {
		emit(event{Event: "error", Detail: err.Error()})
		return 1
	}
	return 0
}

// stateHash folds a digest into one printable value.
func stateHash(d sharedstate.Digest) string {
	h := d.Revision
	for _, e := range d.Entries {
		h = (h ^ e.Hash) * 0x100000001b3
	}
	return fmt.Sprintf("%016x", h)
}

// trainLoop trains with a diloco trainer until the group reaches stopAt.
func trainLoop(ctx context.Context, comm *pccl.Communicator, cfg workerConfig, stopAt func() uint64, emit func(event)) error {
	kind, err := diloco.ParseKind(cfg.Trainer)
	if err != nil {
		return err
	}
	train, test, err := diloco.LoadEmbedded()
	if err != nil {
		return err
	}
	eval := &diloco.MLP{}
	tc := diloco.TrainerConfig{
		Kind: kind, H: cfg.H, BatchSize: cfg.Batch, Seed: cfg.Seed, Steps: 1 << 30, StopAt: stopAt,
		Logger: cluster.Logger(),
		Progress: func(p diloco.Progress) {
			e := event{Event: "step", Step: p.Step, Loss: p.Loss, Rank: p.Rank, World: p.World, Rev: p.Revision,
				Aborts: p.Aborts, Joins: p.Joins, State: stateHash(p.Digest)}
			if p.Rank == 0 && p.Step%10 == 0 {
				eval.Params = p.Params
				e.Acc = eval.Accuracy(test)
			}
			emit(e)
		},
	}
	if kind == diloco.KindAsyncDiLoCo {
		tc.Outer = diloco.NesterovConfig{LR: 0.5, Momentum: 0.3}
	}
	sum, err := diloco.Run(ctx, comm, tc, train, test)
	if err != nil {
		return err
	}
	cs := comm.Stats()
	emit(event{Event: "done", Step: sum.Steps, Acc: sum.TestAccuracy, Rank: comm.Rank(), World: comm.WorldSize(),
		Aborts: sum.Aborts, Joins: sum.Joins, State: stateHash(sum.Digest), SiteOps: cs.SiteCollectives, SiteGens: cs.SiteGenerations})
	return nil
}

// errLeft is what allreduceLoop returns after the peer left gracefully.
var errLeft = errors.New("left the group gracefully")

// loopConfig says what allreduceLoop runs.
type loopConfig struct {
	size   int           // bytes per AllReduce
	quant  pccl.Quant    // encoding of every AllReduce's frames on the wire
	stopAt func() uint64 // the group's step to stop at
	// leaving, if set, is asked at every membership step whether the peer is to leave the group.
	leaving func() bool
	// contribution is what peer id adds to element i at step s; nil is checkedContribution.
	contribution func(id, s uint64, i int) float32
}

// checkedContribution is what every peer of allreduceLoop contributes: small integers, so that a
// sum over any ring is exact in float32.
func checkedContribution(id, s uint64, i int) float32 {
	return float32((id*31 + s*7 + uint64(i)) % 1024)
}

// quantSlack returns how far an element of a quantized sum of the contributions of world peers may be
// from the exact sum: half a quantization step per encoding the element went through (every hop with
// a both-phase encoding, the all-gather only otherwise), each step at most the range of a partial sum
// over the ladder of levels, plus the floating-point rounding bound that the rings package states.
func quantSlack(q pccl.Quant, world int) float64 {
	if q == pccl.NoQuant {
		return 0
	}
	levels := 255.0
	if q == pccl.MinMaxU16 || q == pccl.MinMaxU16Both {
		levels = 65535
	}
	hops := 1
	if q.BothPhases() {
		hops = world
	}
	w := float64(world)
	span := 1023 * w // contributions lie in [0, 1023]: every partial sum in [0, 1023*world]
	const u = 1.0 / (1 << 24)
	rounding := 6 * u * (float64(hops)*2*span + w*span)
	return float64(hops)*span/levels/2 + rounding
}

// allreduceLoop runs AllReduces with the retry pattern until the group's step counter (shared state)
// reaches lc.stopAt. Each op's result is checked element by element against the sum of the
// contributions of the ring it ran on: exactly, or within the quantization's bound with lc.quant. When
// lc.leaving says so at a membership step, the peer leaves the group there (Communicator.Leave), so
// that the others go on without an abort, and the loop returns errLeft.
func allreduceLoop(ctx context.Context, comm *pccl.Communicator, lc loopConfig, emit func(event), log *slog.Logger) error {
	count := lc.size / 4
	stopAt, leaving, contribution := lc.stopAt, lc.leaving, lc.contribution
	if contribution == nil {
		contribution = checkedContribution
	}
	step := make([]uint64, 1)
	st := sharedstate.NewState()
	st.Add(&sharedstate.Entry{Name: "step", DType: pccl.U64, Data: pccl.Bytes(step)})
	buf := make([]float32, count)
	var ops int64
	aborts, joins := 0, 0
	fresh := comm.WorldSize() > 1 // joined a running group: adopt its state first
	// A newcomer enters the loop at the sync, where the peers that admitted it are headed; so does
	// every peer right after an UpdateTopology (it may have admitted someone).
	atSync := fresh
	// rewire is the retry pattern after a failure the group recovers from: UpdateTopology, then the
	// step again from its sync, where newcomers enter.
	rewire := func(err error) error {
		if !pccl.Retryable(err) && !errors.Is(err, pccl.ErrSync) {
			return err
		}
		aborts++
		log.Info("step failed, re-wiring", "err", err)
		atSync = true
		return comm.UpdateTopology(ctx)
	}
	for step[0] < stopAt() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !atSync && leaving != nil && leaving() {
			if err := comm.Leave(ctx); err != nil {
				return err
			}
			emit(event{Event: "left", Step: step[0], Rev: st.Revision, Ops: ops, Aborts: aborts, Joins: joins})
			return errLeft
		}
		if !atSync {
			pending, err := comm.ArePeersPending(ctx)
			if err != nil {
				if err := rewire(err); err != nil {
					return err
				}
				continue
			}
			if pending {
				if err := comm.UpdateTopology(ctx); err != nil {
					return err
				}
				joins++
			}
		}
		atSync = false
		if comm.WorldSize() < 2 {
			// Alone: wait for a peer to join.
			time.Sleep(50 * time.Millisecond)
			if err := comm.UpdateTopology(ctx); err != nil {
				return err
			}
			atSync = true
			continue
		}
		st.Revision++
		strategy := pccl.EnforcePopular
		if fresh {
			strategy = pccl.ReceiveOnly
		}
		res, err := comm.SyncSharedState(ctx, st, pccl.SyncOptions{Strategy: strategy})
		if err != nil {
			if err := rewire(err); err != nil {
				return fmt.Errorf("sync: %w", err)
			}
			continue
		}
		fresh = false
		emit(event{Event: "sync", Step: step[0], Rank: comm.Rank(), World: comm.WorldSize(), Rev: res.Revision,
			State: fmt.Sprintf("%016x", sharedstate.Hash(pccl.Bytes(step)))})
		for i := range buf {
			buf[i] = contribution(comm.ID(), step[0], i)
		}
		if err := comm.AllReduce(ctx, pccl.Bytes(buf), pccl.Bytes(buf), pccl.Desc{Tag: 1, Count: count, DType: pccl.F32, Op: pccl.Sum, Quant: lc.quant}); err != nil {
			if err := rewire(err); err != nil {
				return err
			}
			continue
		}
		ring := comm.Ring()
		slack := quantSlack(lc.quant, len(ring))
		for i, v := range buf {
			var want float32
			for _, id := range ring {
				want += contribution(id, step[0], i)
			}
			if d := math.Abs(float64(v) - float64(want)); v != want && !(d <= slack) {
				return fmt.Errorf("step %d element %d: %v, want %v (ring %v, quantization %v: at most %.3g off)", step[0], i, v, want, ring, lc.quant, slack)
			}
		}
		ops++
		step[0]++
		emit(withLinks(event{Event: "step", Step: step[0], Rank: comm.Rank(), World: comm.WorldSize(), Rev: st.Revision,
			Ops: ops, Aborts: aborts, Joins: joins, State: fmt.Sprintf("%016x", sharedstate.Hash(pccl.Bytes(buf)))}, comm))
	}
	cs := comm.Stats()
	emit(withLinks(event{Event: "done", Step: step[0], Rank: comm.Rank(), World: comm.WorldSize(), Ops: ops, Aborts: aborts,
		Joins: joins, State: fmt.Sprintf("%016x", sharedstate.Hash(pccl.Bytes(buf))), SiteOps: cs.SiteCollectives, SiteGens: cs.SiteGenerations}, comm))
	return nil
}
