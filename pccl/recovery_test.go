package pccl_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/sharedstate"
)

// The recovery scenario trains a small model on four peers, crashes one host in the middle of a
// gradient all-reduce, admits a replacement whose memory is zeroed, and lets training go on. No
// checkpoint is involved: the replacement gets its weights and step counter from the shared-state
// sync, and every peer resumes at the step the master derives from the step reports.
const (
	recPeers    = 4
	recWeights  = 1 << 17 // f32 elements, large enough for the crash to land mid-transfer
	recTag      = 11
	recAttempts = 8    // all-reduce attempts per step before the loop gives up
	recLR       = 0.25 // learning rate, a power of two so that updates stay exact
	recSteps    = 3    // steps before the crash, and again after the replacement joined
)

// trainer is one peer's training loop state. It is used by one goroutine at a time.
type trainer struct {
	host    string
	c       *pccl.Communicator
	st      *pccl.State
	weights []float32
	counter []uint64 // one element: the next step to run, kept in the shared state
	step    uint64   // the step this peer runs next
}

// stepReport is what one peer saw during one step.
type stepReport struct {
	resume  uint64             // ResumeStep returned by the sync
	fetched int64              // bytes the sync fetched
	synced  sharedstate.Digest // the state right after the sync
	after   sharedstate.Digest // the state after the update
	world   int                // ring size of the successful all-reduce
}

// newTrainer registers the weights and the step counter. A fresh replacement passes zero = true and
// starts with zeroed memory; the founding peers start from the same deterministic initialization.
func newTrainer(host string, c *pccl.Communicator, zero bool) (*trainer, error) {
	tr := &trainer{host: host, c: c, st: sharedstate.NewState(), weights: make([]float32, recWeights), counter: make([]uint64, 1)}
	if !zero {
		for i := range tr.weights {
			tr.weights[i] = float32(i%97) - 48
		}
	}
	for _, e := range []*pccl.Entry{
		{Name: "model.weights", DType: pccl.F32, Data: pccl.Bytes(tr.weights)},
		{Name: "train.step", DType: pccl.U64, Data: pccl.Bytes(tr.counter)},
	} {
		if err := tr.st.Add(e); err != nil {
			return nil, err
		}
	}
	return tr, nil
}

// gradient returns the deterministic gradient of the peer at rank for step: small multiples of 1/8,
// so that sums are exact.
func gradient(step uint64, rank int) []float32 {
	r := rand.New(rand.NewPCG(step, uint64(rank)+1))
	g := make([]float32, recWeights)
	for i := range g {
		g[i] = float32(r.IntN(65)-32) / 8
	}
	return g
}

// admit is the membership part of a step: accept waiting peers.
func (tr *trainer) admit(ctx context.Context) error {
	pending, err := tr.c.ArePeersPending(ctx)
	if err != nil {
		return fmt.Errorf("are peers pending: %w", err)
	}
	if pending {
		if err := tr.c.UpdateTopology(ctx); err != nil {
			return fmt.Errorf("update topology: %w", err)
		}
	}
	return nil
}

// train runs the rest of a step after admit: report the step, sync the state, reduce the gradient
// (re-wiring and retrying after a failure), apply the update.
func (tr *trainer) train(ctx context.Context, report bool) (stepReport, error) {
	var rep stepReport
	if report {
		if err := tr.c.ReportStep(tr.step, false); err != nil {
			return rep, fmt.Errorf("report step: %w", err)
		}
	}
	tr.st.Revision++
	res, err := tr.c.SyncSharedState(ctx, tr.st, pccl.SyncOptions{HashWorkers: 2})
	if err != nil {
		return rep, fmt.Errorf("sync: %w", err)
	}
	tr.step = res.ResumeStep
	rep.resume, rep.fetched, rep.synced = res.ResumeStep, res.FetchedBytes, tr.st.Digest(1)
	if tr.counter[0] != tr.step {
		return rep, fmt.Errorf("step counter %d after the sync, resume step %d", tr.counter[0], tr.step)
	}
	var g []float32
	for attempt := 1; ; attempt++ {
		g = gradient(tr.step, tr.c.Rank())
		b := pccl.Bytes(g)
		err := tr.c.AllReduce(ctx, b, b, pccl.Desc{Tag: recTag, Count: len(g), DType: pccl.F32, Op: pccl.Avg})
		if err == nil {
			break
		}
		if !pccl.Retryable(err) || attempt == recAttempts {
			return rep, fmt.Errorf("step %d attempt %d: %w", tr.step, attempt, err)
		}
		if err := tr.c.UpdateTopology(ctx); err != nil && !pccl.Retryable(err) {
			return rep, fmt.Errorf("step %d: re-wire: %w", tr.step, err)
		}
	}
	rep.world = tr.c.WorldSize()
	if err := tr.c.ReportStep(tr.step, true); err != nil {
		return rep, fmt.Errorf("report optimizer step: %w", err)
	}
	for i, v := range g {
		tr.weights[i] = tr.weights[i] - float32(recLR*v)
	}
	tr.step++
	tr.counter[0] = tr.step
	rep.after = tr.st.Digest(1)
	return rep, nil
}

// runStep runs one full training step.
func (tr *trainer) runStep(ctx context.Context) (stepReport, error) {
	if err := tr.admit(ctx); err != nil {
		return stepReport{}, err
	}
	return tr.train(ctx, true)
}

// runRound runs one step on every trainer at once and returns their reports and errors.
func runRound(ctx context.Context, trs []*trainer) ([]stepReport, []error) {
	reps := make([]stepReport, len(trs))
	errs := make([]error, len(trs))
	var wg sync.WaitGroup
	for i, tr := range trs {
		wg.Go(func() { reps[i], errs[i] = tr.runStep(ctx) })
	}
	wg.Wait()
	return reps, errs
}

// requireSameState checks that every report's digest at both points equals the first one's, entry by
// entry, and that every peer completed the step with world peers.
func requireSameState(t *testing.T, when string, reps []stepReport, world int) {
	t.Helper()
	for i, r := range reps {
		if r.world != world {
			t.Fatalf("%s: peer %d reduced in a ring of %d, want %d", when, i, r.world, world)
		}
		if r.resume != reps[0].resume {
			t.Fatalf("%s: peer %d resumes at step %d, peer 0 at %d", when, i, r.resume, reps[0].resume)
		}
		for _, pair := range [][2]sharedstate.Digest{{r.synced, reps[0].synced}, {r.after, reps[0].after}} {
			got, want := pair[0], pair[1]
			if got.Revision != want.Revision || len(got.Entries) != len(want.Entries) {
				t.Fatalf("%s: peer %d holds revision %d with %d entries, peer 0 revision %d with %d",
					when, i, got.Revision, len(got.Entries), want.Revision, len(want.Entries))
			}
			for j, e := range got.Entries {
				if e != want.Entries[j] {
					t.Fatalf("%s: peer %d entry %q is %+v, peer 0 holds %+v", when, i, e.Name, e, want.Entries[j])
				}
			}
		}
	}
}

// bytesFrom sums what host has delivered to every other host so far.
func bytesFrom(net *pccl.Network, host string, others []string) int64 {
	var n int64
	for _, o := range others {
		if o != host {
			n += net.Stats(host, o)
		}
	}
	return n
}

// TestRecoveryWithoutCheckpoint crashes one of four training peers in the middle of a gradient
// all-reduce; the survivors re-wire and finish the step, a replacement with zeroed memory joins, takes
// the weights and the step counter from the shared-state sync, resumes at the same step as everyone
// else, and training goes on with bit-identical state on every peer after every step.
func TestRecoveryWithoutCheckpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, hosts := g.start(ctx, recPeers)
		trs := make([]*trainer, recPeers)
		for i, c := range comms {
			tr, err := newTrainer(hosts[i], c, false)
			if err != nil {
				t.Fatal(err)
			}
			trs[i] = tr
		}
		var newcomer *trainer
		defer func() {
			closeAll(comms)
			if newcomer != nil {
				newcomer.c.Close()
			}
		}()

		for s := range recSteps {
			reps, errs := runRound(ctx, trs)
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("step %d: %v", s, err)
			}
			requireSameState(t, fmt.Sprintf("step %d", s), reps, recPeers)
			if reps[0].resume != uint64(s) {
				t.Fatalf("step %d: resume step %d", s, reps[0].resume)
			}
		}

		// The crash: as soon as every peer has sent part of its gradient, so that each of them runs the
		// commenced all-reduce, the victim's host goes down.
		const victim = 1
		base := make([]int64, len(hosts))
		for i, h := range hosts {
			base[i] = bytesFrom(g.net, h, hosts)
		}
		crashed := make(chan struct{})
		go func() {
			defer close(crashed)
			for ctx.Err() == nil {
				moving := 0
				for i, h := range hosts {
					if bytesFrom(g.net, h, hosts) > base[i] {
						moving++
					}
				}
				if moving == len(hosts) {
					break
				}
				time.Sleep(50 * time.Microsecond)
			}
			g.net.Crash(hosts[victim])
		}()
		reps, errs := runRound(ctx, trs)
		<-crashed
		comms[victim].Close()
		if errs[victim] == nil {
			t.Logf("the victim finished its step before the crash took effect")
		}
		var survivors []*trainer
		var sreps []stepReport
		for i, tr := range trs {
			if i == victim {
				continue
			}
			if errs[i] != nil {
				t.Fatalf("survivor %d: %v", i, errs[i])
			}
			survivors = append(survivors, tr)
			sreps = append(sreps, reps[i])
		}
		// The survivors either re-wired and redid the step among themselves or, if the crash came after the
		// reduction had committed, completed it with the victim; either way all of them alike.
		if w := sreps[0].world; w != recPeers-1 && w != recPeers {
			t.Fatalf("crash step reduced in a ring of %d", w)
		}
		t.Logf("crash step: survivors reduced in a ring of %d; victim: %v", sreps[0].world, errs[victim])
		requireSameState(t, "crash step", sreps, sreps[0].world)
		crashStep := uint64(recSteps)
		for i, tr := range survivors {
			if tr.step != crashStep+1 {
				t.Fatalf("survivor %d at step %d after the crash step, want %d", i, tr.step, crashStep+1)
			}
		}

		// The replacement registers; the survivors admit it at the start of their next step, and it
		// syncs with revision 0 and zeroed memory.
		host := g.host()
		type joined struct {
			tr  *trainer
			err error
		}
		joinc := make(chan joined, 1)
		go func() {
			c, err := g.connect(ctx, host)
			if err != nil {
				joinc <- joined{err: err}
				return
			}
			tr, err := newTrainer(host, c, true)
			if err != nil {
				c.Close()
			}
			joinc <- joined{tr: tr, err: err}
		}()
		for {
			registered := 0
			for _, p := range g.srv.Snapshot().Peers {
				if p.State == master.Registered {
					registered++
				}
			}
			if registered == 1 {
				break
			}
			if ctx.Err() != nil {
				t.Fatal("the replacement did not register")
			}
			time.Sleep(time.Millisecond)
		}
		var newRep stepReport
		var newErr error
		var wg sync.WaitGroup
		wg.Go(func() {
			j := <-joinc
			if j.err != nil {
				newErr = j.err
				return
			}
			newcomer = j.tr
			if got := newcomer.counter[0]; got != 0 {
				newErr = fmt.Errorf("replacement starts with step counter %d", got)
				return
			}
			// A fresh peer knows no step: it reports none before its first sync.
			newRep, newErr = newcomer.train(ctx, false)
		})
		reps, errs = runRound(ctx, survivors)
		wg.Wait()
		if err := errors.Join(append(errs, newErr)...); err != nil {
			t.Fatalf("join step: %v", err)
		}
		all := append(append([]stepReport(nil), reps...), newRep)
		requireSameState(t, "join step", all, recPeers)
		if newRep.fetched != int64(recWeights*4+8) {
			t.Fatalf("replacement fetched %d bytes, want the whole state of %d", newRep.fetched, recWeights*4+8)
		}
		for i, r := range reps {
			if r.fetched != 0 {
				t.Fatalf("survivor %d fetched %d bytes", i, r.fetched)
			}
		}
		if newRep.resume != crashStep+1 {
			t.Fatalf("resume step %d, want %d", newRep.resume, crashStep+1)
		}

		// Training goes on with every peer at the same step and the same state after every step.
		trs = append(survivors, newcomer)
		for s := range recSteps {
			reps, errs := runRound(ctx, trs)
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("step %d after the join: %v", s, err)
			}
			requireSameState(t, fmt.Sprintf("step %d after the join", s), reps, recPeers)
			want := crashStep + 2 + uint64(s)
			for i, tr := range trs {
				if reps[i].resume != want || tr.step != want+1 {
					t.Fatalf("step %d after the join: peer %d resumed at %d, now at %d; want %d, %d",
						s, i, reps[i].resume, tr.step, want, want+1)
				}
			}
		}
	})
}
