// Command diloco trains Concord's Fashion-MNIST MLP with the DDP, DiLoCo and async DiLoCo trainers of
// package diloco on a local cluster, and compares them with one process training alone.
//
//	go run ./bench/diloco --trainer diloco --peers 4 --full
//	go run ./bench/diloco --trainer all --peers 4 --full --churn 5s
//
// For each trainer it starts a master and --peers peer processes (this program, re-executed) on
// loopback. Every peer runs diloco.Run with the same configuration: --steps is the budget of
// optimiser steps of each peer (DDP: --steps outer steps of one step each; the DiLoCo kinds:
// --steps/--h outer steps of --h inner steps), --batch images per step. With --churn D, every D one
// training peer is killed (SIGKILL) and a replacement is started, until the run ends; the
// replacement joins through the trainers' churn handling. Each peer prints one JSON line per outer
// step with a hash of its shared state; the parent checks that every peer completing a step holds the
// same state (state_identical) and that the finished peers hold identical parameters, then evaluates
// those parameters on the test set. In the same run it trains the same MLP with diloco.TrainLocal for
// --steps steps (test_accuracy_single).
//
// bytes_communicated of a trainer is the sum over all peers (killed ones included, up to their last
// step) of the payload each passed to AllReduce (every attempt) plus the shared state it fetched in
// syncs; a ring all-reduce moves 2(W-1)/W times its payload per peer. samples counts the training
// images processed in completed outer steps.
//
// Without --churn a trainer starts once all --peers peers are in (MinWorld = --peers), so every peer
// trains every step; with it MinWorld is 2 and the group trains on while a replacement starts.
// Async DiLoCo takes its own outer hyper-parameters (--async-outer-lr 0.5, --async-outer-momentum
// 0.3): its update lands one step late, and DiLoCo's 0.7 and 0.9 overshoot with that delay.
//
// Targets: DiLoCo (with churn when --churn is set) reaches test accuracy >= 0.85 and stays within
// 0.02 of the single process; DiLoCo communicates at least H times fewer bytes per sample than DDP
// (checked when both ran without churn: with churn the number of joins, whose state transfers count,
// differs between the runs). Progress goes to stderr; the JSON result is the last line on
// stdout. --full reads the full data set from diloco.DefaultDir() and fails clearly if it is not
// installed; without it the embedded subset is used.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/concord-ccl/concord/diloco"
	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/pccl/master"
)

// Targets the result is compared to.
const (
	targetAccuracy = 0.85 // DiLoCo test accuracy
	targetGap      = 0.02 // largest shortfall of DiLoCo against the single process
)

// graceAfterDone is how long the other peers may take to finish once the first one has.
const graceAfterDone = 60 * time.Second

// opts are the command-line settings.
type opts struct {
	trainers []string
	peers    int
	full     bool
	h        int
	steps    int
	batch    int
	churn    time.Duration
	seed     uint64
	innerLR  float64
	outerLR  float64
	momentum float64
	asyncLR  float64
	asyncMom float64
	timeout  time.Duration
	verbose  bool
}

// trainerResult is the outcome of one trainer.
type trainerResult struct {
	Trainer           string  `json:"trainer"`
	TestAccuracy      float64 `json:"test_accuracy"`
	TestLoss          float64 `json:"test_loss"`
	OuterSteps        int     `json:"outer_steps"`
	InnerStepsPerPeer int     `json:"inner_steps_per_peer"`
	BytesCommunicated int64   `json:"bytes_communicated"`
	BytesReduced      int64   `json:"bytes_reduced"`
	BytesFetched      int64   `json:"bytes_fetched"`
	Samples           int64   `json:"samples"`
	Kills             int     `json:"kills"`
	Started           int     `json:"peers_started"`
	Finished          int     `json:"peers_finished"`
	Aborts            int     `json:"aborts"`
	Dropped           int     `json:"dropped_steps"`
	StateIdentical    bool    `json:"state_identical"`
	Seconds           float64 `json:"seconds"`
}

// result is the JSON last line.
type result struct {
	Trainer            string           `json:"trainer"`
	Peers              int              `json:"peers"`
	Full               bool             `json:"full"`
	TrainImages        int              `json:"train_images"`
	TestImages         int              `json:"test_images"`
	H                  int              `json:"h"`
	Steps              int              `json:"steps"`
	Batch              int              `json:"batch"`
	ChurnSeconds       float64          `json:"churn_s"`
	TestAccuracy       float64          `json:"test_accuracy"`
	TestAccuracySingle float64          `json:"test_accuracy_single"`
	SingleSeconds      float64          `json:"single_seconds"`
	BytesCommunicated  map[string]int64 `json:"bytes_communicated"`
	Trainers           []trainerResult  `json:"trainers"`
	TargetAccuracy     float64          `json:"target_accuracy"`
	TargetGap          float64          `json:"target_gap"`
	AccuracyOK         *bool            `json:"accuracy_ok,omitempty"`
	GapToSingle        float64          `json:"diloco_minus_single,omitempty"`
	BytesRatio         float64          `json:"bytes_ratio_ddp_over_diloco,omitempty"`
	ReduceBytesRatio   float64          `json:"reduce_bytes_ratio_ddp_over_diloco,omitempty"`
	BytesPerSample     map[string]int64 `json:"bytes_per_sample"`
	BytesOK            *bool            `json:"bytes_ok,omitempty"`
	TargetsMet         bool             `json:"targets_met"`
	Failure            string           `json:"failure,omitempty"`
}

// roles are the roles this program runs as a child.
var roles = map[string]func() int{rolePeer: peerMain}

func main() {
	cluster.Main(roles)
	os.Exit(run())
}

func run() int {
	var o opts
	fs := flag.NewFlagSet("diloco", flag.ContinueOnError)
	trainer := fs.String("trainer", "diloco", "ddp, diloco, async-diloco or all")
	fs.IntVar(&o.peers, "peers", 4, "number of peer processes")
	fs.BoolVar(&o.full, "full", false, "train on the full Fashion-MNIST set in "+diloco.DefaultDir())
	fs.IntVar(&o.h, "h", 50, "inner steps per outer step (DiLoCo kinds)")
	fs.IntVar(&o.steps, "steps", 2000, "optimiser steps per peer, and of the single process")
	fs.IntVar(&o.batch, "batch", 64, "images per step")
	fs.DurationVar(&o.churn, "churn", 0, "kill a training peer and start a replacement this often (0: never)")
	fs.Uint64Var(&o.seed, "seed", 1, "model seed and churn victim seed")
	fs.Float64Var(&o.innerLR, "lr", 1e-3, "AdamW learning rate")
	fs.Float64Var(&o.outerLR, "outer-lr", 0.7, "Nesterov learning rate")
	fs.Float64Var(&o.momentum, "outer-momentum", 0.9, "Nesterov momentum")
	fs.Float64Var(&o.asyncLR, "async-outer-lr", 0.5, "Nesterov learning rate of async DiLoCo")
	fs.Float64Var(&o.asyncMom, "async-outer-momentum", 0.3, "Nesterov momentum of async DiLoCo (a late update with high momentum overshoots)")
	fs.DurationVar(&o.timeout, "timeout", 20*time.Minute, "give up (and kill every child) after this long")
	fs.BoolVar(&o.verbose, "v", false, "copy the peers' stderr to stderr")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	switch *trainer {
	case "all":
		o.trainers = []string{"diloco", "ddp", "async-diloco"}
	default:
		if _, err := diloco.ParseKind(*trainer); err != nil {
			fmt.Fprintln(os.Stderr, "diloco:", err)
			return 2
		}
		o.trainers = []string{*trainer}
	}
	if o.peers < 2 || o.h < 1 || o.steps < o.h || o.batch < 1 {
		fmt.Fprintln(os.Stderr, "diloco: need --peers >= 2, --h >= 1, --steps >= --h, --batch >= 1")
		return 2
	}
	res := result{
		Trainer: *trainer, Peers: o.peers, Full: o.full, H: o.h, Steps: o.steps, Batch: o.batch,
		ChurnSeconds: o.churn.Seconds(), TargetAccuracy: targetAccuracy, TargetGap: targetGap,
		BytesCommunicated: map[string]int64{}, BytesPerSample: map[string]int64{},
	}
	err := bench(&o, &res)
	if err != nil {
		fmt.Fprintln(os.Stderr, "diloco: FAILED:", err)
		res.Failure = err.Error()
		res.TargetsMet = false
	}
	js, _ := json.Marshal(res)
	fmt.Println(string(js))
	if err != nil {
		return 1
	}
	return 0
}

// bench runs the single process and every trainer and fills res.
func bench(o *opts, res *result) error {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, o.timeout)
	defer cancelT()

	train, test, err := loadData(o.full)
	if err != nil {
		return err
	}
	res.TrainImages, res.TestImages = train.N, test.N

	start := time.Now()
	lc := diloco.LocalConfig{Seed: o.seed, Steps: o.steps, BatchSize: o.batch, AdamW: diloco.AdamWConfig{LR: float32(o.innerLR)}}
	single := diloco.TrainLocal(lc, train, test)
	res.TestAccuracySingle = single.TestAccuracy
	res.SingleSeconds = time.Since(start).Seconds()
	fmt.Fprintf(os.Stderr, "single process: %d steps, test accuracy %.4f (%.1fs)\n", o.steps, single.TestAccuracy, res.SingleSeconds)

	for _, name := range o.trainers {
		tr, err := runTrainer(ctx, o, name, test)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Fprintf(os.Stderr, "%s: test accuracy %.4f, %d bytes communicated, %d samples, %d kills, state identical %v (%.1fs)\n",
			name, tr.TestAccuracy, tr.BytesCommunicated, tr.Samples, tr.Kills, tr.StateIdentical, tr.Seconds)
		res.Trainers = append(res.Trainers, tr)
		res.BytesCommunicated[name] = tr.BytesCommunicated
		if tr.Samples > 0 {
			res.BytesPerSample[name] = tr.BytesCommunicated / tr.Samples
		}
	}
	res.TestAccuracy = res.Trainers[0].TestAccuracy
	res.TargetsMet = true
	for _, tr := range res.Trainers {
		res.TargetsMet = res.TargetsMet && tr.StateIdentical
		if tr.Trainer == "diloco" {
			// The target bounds the shortfall; being better than the single process is fine.
			ok := tr.TestAccuracy >= targetAccuracy && tr.TestAccuracy >= single.TestAccuracy-targetGap
			res.GapToSingle = tr.TestAccuracy - single.TestAccuracy
			res.AccuracyOK = &ok
			res.TargetsMet = res.TargetsMet && ok
		}
	}
	var ddp, dl *trainerResult
	for i := range res.Trainers {
		switch res.Trainers[i].Trainer {
		case "ddp":
			ddp = &res.Trainers[i]
		case "diloco":
			dl = &res.Trainers[i]
		}
	}
	if ddp != nil && dl != nil && ddp.Samples > 0 && dl.Samples > 0 && dl.BytesCommunicated > 0 {
		perSample := func(b, s int64) float64 { return float64(b) / float64(s) }
		res.BytesRatio = perSample(ddp.BytesCommunicated, ddp.Samples) / perSample(dl.BytesCommunicated, dl.Samples)
		res.ReduceBytesRatio = perSample(ddp.BytesReduced, ddp.Samples) / perSample(dl.BytesReduced, dl.Samples)
		if o.churn == 0 {
			// Exact: ddp bytes/sample >= H * diloco bytes/sample.
			ok := ddp.BytesCommunicated*dl.Samples >= int64(o.h)*dl.BytesCommunicated*ddp.Samples
			res.BytesOK = &ok
			res.TargetsMet = res.TargetsMet && ok
		}
	}
	return nil
}

// procStat is what the parent knows of one peer process.
type procStat struct {
	connected bool
	steps     int // outer steps it completed
	reduced   int64
	fetched   int64
	done      *peerEvent
	failed    string
	killed    bool
}

// runTrainer runs one trainer on a fresh cluster and evaluates its result.
func runTrainer(ctx context.Context, o *opts, name string, test *diloco.Dataset) (trainerResult, error) {
	start := time.Now()
	tr := trainerResult{Trainer: name, StateIdentical: true, InnerStepsPerPeer: o.steps}
	kind, _ := diloco.ParseKind(name)
	h := o.h
	if kind == diloco.KindDDP {
		h = 1
	}
	tr.OuterSteps = o.steps / h
	var stderr io.Writer = io.Discard
	if o.verbose {
		stderr = os.Stderr
	}
	c := cluster.New(cluster.Config{Stderr: stderr})
	defer c.Close()
	_, addr, err := c.StartMaster(ctx, master.LAN())
	if err != nil {
		return tr, err
	}
	dir, err := os.MkdirTemp("", "concord-bench-diloco-")
	if err != nil {
		return tr, err
	}
	defer os.RemoveAll(dir)
	p := params{
		Kind: name, H: h, Batch: o.batch, Steps: tr.OuterSteps, Seed: o.seed, Full: o.full, OutDir: dir,
		Lifetime: o.timeout, InnerLR: float32(o.innerLR), OuterLR: float32(o.outerLR), OuterMom: float32(o.momentum),
		MinWorld: o.peers, RetryWait: 20 * time.Millisecond,
	}
	if kind == diloco.KindAsyncDiLoCo {
		p.OuterLR, p.OuterMom = float32(o.asyncLR), float32(o.asyncMom)
	}
	if o.churn > 0 {
		// Train on with fewer peers while a replacement starts.
		p.MinWorld = 2
	}
	js, _ := json.Marshal(p)
	env := []string{envMaster + "=" + addr, envParams + "=" + string(js)}
	stats := map[*cluster.Proc]*procStat{}
	var procs []*cluster.Proc
	spawn := func() error {
		pr, err := c.Spawn(cluster.Spec{Role: rolePeer, Env: env})
		if err != nil {
			return err
		}
		procs = append(procs, pr)
		stats[pr] = &procStat{}
		tr.Started++
		return nil
	}
	for range o.peers {
		if err := spawn(); err != nil {
			return tr, err
		}
	}

	rng := rand.New(rand.NewPCG(o.seed, 99))
	var churn <-chan time.Time
	if o.churn > 0 {
		tk := time.NewTicker(o.churn)
		defer tk.Stop()
		churn = tk.C
	}
	check := time.NewTicker(200 * time.Millisecond)
	defer check.Stop()
	states := map[uint64]string{} // state hash of every completed step
	var firstDone time.Time
	lines := c.Lines()
	for {
		select {
		case <-ctx.Done():
			return tr, fmt.Errorf("waiting for the peers: %w", ctx.Err())
		case l, ok := <-lines:
			if !ok {
				return tr, errors.New("cluster closed")
			}
			st := stats[l.Proc]
			if st == nil {
				continue // the master
			}
			var ev peerEvent
			if err := l.Decode(&ev); err != nil {
				return tr, err
			}
			switch ev.Event {
			case "connected":
				st.connected = true
			case "step":
				st.steps++
				st.reduced, st.fetched = ev.Reduced, ev.Fetched
				if prev, ok := states[ev.Step]; !ok {
					states[ev.Step] = ev.State
				} else if prev != ev.State {
					tr.StateIdentical = false
					fmt.Fprintf(os.Stderr, "%s: step %d: state %s differs from %s\n", l.Proc.Name(), ev.Step, ev.State, prev)
				}
				if o.verbose && ev.Step%10 == 0 {
					fmt.Fprintf(os.Stderr, "%s: step %d loss %.4f world %d\n", l.Proc.Name(), ev.Step, ev.Loss, ev.World)
				}
			case "done":
				st.done = &ev
				st.reduced, st.fetched = ev.Reduced, ev.Fetched
				if firstDone.IsZero() {
					firstDone = time.Now()
					churn = nil
				}
			case "error":
				if !st.killed {
					st.failed = ev.Detail
				}
			}
		case <-churn:
			var training []*cluster.Proc
			for _, pr := range procs {
				st := stats[pr]
				if st.steps > 0 && !st.killed && st.done == nil && st.failed == "" {
					training = append(training, pr)
				}
			}
			if len(training) < 2 {
				continue
			}
			victim := training[rng.IntN(len(training))]
			stats[victim].killed = true
			victim.Kill()
			tr.Kills++
			fmt.Fprintf(os.Stderr, "%s: killed %s, starting a replacement\n", name, victim.Name())
			if err := spawn(); err != nil {
				return tr, err
			}
		case <-check.C:
		}
		for _, pr := range procs {
			if st := stats[pr]; st.failed != "" {
				return tr, fmt.Errorf("%s: %s", pr.Name(), st.failed)
			}
		}
		if firstDone.IsZero() {
			continue
		}
		// Finished once every admitted peer that was not killed is done.
		finished := true
		for _, pr := range procs {
			st := stats[pr]
			if st.connected && !st.killed && st.done == nil {
				select {
				case <-pr.Done():
				default:
					finished = false
				}
			}
		}
		if finished || time.Since(firstDone) > graceAfterDone {
			break
		}
	}

	var final []float32
	for _, pr := range procs {
		st := stats[pr]
		tr.BytesReduced += st.reduced
		tr.BytesFetched += st.fetched
		tr.Samples += int64(st.steps) * int64(h) * int64(o.batch)
		if st.done == nil {
			continue
		}
		tr.Finished++
		tr.Aborts += st.done.Aborts
		tr.Dropped += st.done.Dropped
		b, err := os.ReadFile(st.done.Params)
		if err != nil {
			return tr, err
		}
		v, err := decodeParams(b)
		if err != nil {
			return tr, err
		}
		if final == nil {
			final = v
		} else if !slices.Equal(final, v) {
			tr.StateIdentical = false
			fmt.Fprintf(os.Stderr, "%s: final parameters differ from another peer's\n", pr.Name())
		}
	}
	tr.BytesCommunicated = tr.BytesReduced + tr.BytesFetched
	if final == nil {
		return tr, errors.New("no peer finished")
	}
	m := &diloco.MLP{Params: final}
	tr.TestAccuracy = m.Accuracy(test)
	tr.TestLoss = m.Loss(test)
	if math.IsNaN(tr.TestLoss) {
		tr.TestLoss = -1
	}
	tr.Seconds = time.Since(start).Seconds()
	return tr, nil
}
