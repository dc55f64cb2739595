package diloco

import "github.com/concord-ccl/concord/pccl"

// runAsync is the loop of async DiLoCo. The all-reduce of the pseudo-gradient
// of outer step t runs in the background during the inner steps of step t+1
// and is applied at the end of step t+1, one step late.
//
// The shared state is synced only when the membership changed, because a
// sync cannot overlap the all-reduce in flight. When peers are pending, the
// loop first waits for that all-reduce (its result is kept for the end of the
// step), admits them and syncs: the newcomers receive the global parameters
// of step t. Everybody then runs the inner steps from those parameters, so
// the newcomers' pseudo-gradients fit those of the others. At the end of the
// step the old peers apply the late result the newcomers missed, and a
// second sync, receive-only for the newcomers, hands them the advanced outer
// state. The all-reduce started next includes the newcomers' contributions.
//
// A background all-reduce that fails is retried with the same buffers after
// UpdateTopology. If that update admitted newcomers (they could not take part
// in a reduce of a step they missed) or left fewer than MinWorld peers, the
// late result is dropped and the step goes back to its sync, where the
// newcomers enter; inner steps already done are kept.
func (t *trainer) runAsync() error {
	prev := make([]float32, NumParams) // pseudo-gradient in flight, then its average
	cur := make([]float32, NumParams)  // this step's pseudo-gradient
	desc := pccl.Desc{Tag: tagReduce, Count: NumParams, DType: pccl.F32, Op: pccl.Avg}
	var req *pccl.Request // all-reduce of prev in flight, or nil
	havePrev := false     // prev holds the average of the previous step
	joined := t.newcomer  // peers were admitted since the last completed step
	innerDone := false    // this step's inner steps are done
	skipVote := true      // where a newcomer enters: its admission was the vote

	// settle waits for the all-reduce in flight and retries it after failures.
	// It reports whether prev holds the average, and whether a retry's
	// topology update admitted newcomers.
	settle := func() (ok, admitted bool, err error) {
		if req == nil {
			return havePrev, false, nil
		}
		err = req.Wait()
		req = nil
		for err != nil {
			retry, joined, rerr := t.recover(err)
			if rerr != nil || !retry {
				return false, joined, rerr
			}
			t.sum.BytesReduced += int64(4 * NumParams)
			err = t.comm.AllReduce(t.ctx, pccl.Bytes(prev), pccl.Bytes(prev), desc)
		}
		t.reducedBy = t.comm.Ring()
		return true, false, nil
	}

	for {
		if !skipVote && t.leaving() {
			// The others take part in the all-reduce in flight: finish it before leaving.
			if _, _, err := settle(); err != nil {
				return err
			}
			return t.leave()
		}
		if !skipVote {
			pending, err := t.comm.ArePeersPending(t.ctx)
			if err != nil {
				return err
			}
			if pending {
				ok, admitted, err := settle()
				if err != nil {
					return err
				}
				havePrev = ok
				joined = joined || admitted
				if !admitted {
					j, err := t.updateTopology()
					if err != nil {
						return err
					}
					joined = joined || j
				}
			}
		}
		skipVote = false
		if t.comm.WorldSize() < t.cfg.MinWorld {
			if _, _, err := settle(); err != nil {
				return err
			}
			havePrev = false
			if err := t.wait(); err != nil {
				return err
			}
			continue
		}
		if joined {
			if retry, err := t.sync(pccl.EnforcePopular); retry || err != nil {
				if err != nil {
					return err
				}
				continue
			}
			if !innerDone {
				copy(t.model.Params, t.params)
			}
		}
		if t.done() {
			// The last pseudo-gradient is still in flight: apply it.
			ok, _, err := settle()
			if err != nil {
				return err
			}
			if ok {
				t.outer.Step(t.params, prev)
			}
			return nil
		}
		if !innerDone {
			if err := t.position(); err != nil {
				return err
			}
			t.stepLoss = t.innerSteps(true)
			innerDone = true
		}
		ok, admitted, err := settle()
		if err != nil {
			return err
		}
		havePrev = ok
		if !ok && (admitted || t.comm.WorldSize() < t.cfg.MinWorld) {
			joined = joined || admitted
			t.sum.Dropped++
			skipVote = true
			continue
		}
		PseudoGradient(cur, t.params, t.model.Params)
		var reduced []uint64
		if havePrev {
			t.outer.Step(t.params, prev)
			reduced = t.reducedBy
		}
		havePrev = false
		t.advance()
		if joined {
			// The newcomers adopt the outer state they missed.
			if retry, err := t.sync(pccl.EnforcePopular); retry || err != nil {
				if err != nil {
					return err
				}
				// This step's pseudo-gradient is not reduced; the next step
				// syncs again (joined stays set) and trains afresh.
				innerDone = false
				continue
			}
		}
		joined, innerDone, t.newcomer = false, false, false
		t.completed(reduced)
		copy(t.model.Params, t.params)
		prev, cur = cur, prev
		t.sum.BytesReduced += int64(4 * NumParams)
		req = t.comm.AllReduceAsync(t.ctx, pccl.Bytes(prev), pccl.Bytes(prev), desc)
	}
}
