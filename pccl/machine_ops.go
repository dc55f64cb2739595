package pccl

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// cancel handles a caller that gave up.
func (m *machine) cancel(now time.Time, in cancelCall, emit func(action)) {
	c := in.call
	switch {
	case m.topo.call == c:
		m.topo.call = 0 // the vote stays cast; the next call waits for its answer
	case m.pend.call == c:
		m.pend.call = 0
	case m.opt.call == c:
		m.opt.call = 0 // later rounds are answered without measuring
	case m.sync.call == c:
		m.sync.call = 0 // a plan that comes is declined, a completion dropped
	case m.sync.phase == syncPlanned && m.sync.voter == c:
		// Given up mid-transfer: tell the master now, so that nobody waits for us.
		emit(sendAct{&wire.SyncDone{OK: false, Detail: "the caller gave up on the sync"}})
		m.sync.phase, m.sync.voter = syncDeclined, 0
	case m.joinCall == c:
		m.joinCall = 0
	}
	for _, o := range m.ops {
		if o.call != c {
			continue
		}
		o.why = in.reason
		if o.orphan {
			return // its data path reports, and gets the local abort
		}
		detail := "cancelled"
		if in.reason != nil {
			detail = in.reason.Error()
		}
		switch o.phase {
		case opVoted:
			// Withdraw the vote; the master aborts the others and answers with the verdict.
			o.phase, o.deadline = opWithdrawn, now.Add(m.timeout)
			if o.outcome != nil {
				m.finishOp(o, emit)
				return
			}
			emit(sendAct{&wire.Done{Tag: o.tag, Seq: 0, Code: wire.CodeAborted, Detail: detail}})
		case opRunning:
			// The caller gave up before it took the start: nothing ran here; report out.
			emit(tombstoneAct{o.seq})
			emit(sendAct{&wire.Done{Tag: o.tag, Seq: o.seq, Code: wire.CodeAborted, Detail: detail}})
			o.phase, o.deadline = opReported, now.Add(m.timeout)
			if o.outcome != nil {
				m.finishOp(o, emit)
			}
		}
		return
	}
}

// finishOp gives the caller of o the verdict and forgets o.
func (m *machine) finishOp(o *opState, emit func(action)) {
	what := fmt.Sprintf("pccl: allreduce tag %d", o.tag)
	if o.seq != 0 {
		what = fmt.Sprintf("pccl: allreduce tag %d seq %d", o.tag, o.seq)
	}
	err := outcomeError(what, o.outcome)
	if o.why != nil {
		err = errors.Join(err, o.why)
	}
	delete(m.ops, o.tag)
	emit(replyAct{reply{call: o.call, err: err}})
}

// die records why the communicator cannot go on, answers every waiting call and aborts every data
// operation.
func (m *machine) die(err error, emit func(action)) {
	if m.fatal != nil {
		return
	}
	m.fatal = err
	for _, tag := range slices.Sorted(maps.Keys(m.ops)) {
		o := m.ops[tag]
		e := fmt.Errorf("pccl: allreduce tag %d: %w", o.tag, err)
		if o.phase == opRunning {
			emit(abortAct{o.call, e})
		}
		emit(replyAct{reply{call: o.call, err: e}})
	}
	m.ops = map[uint64]*opState{}
	for _, c := range []uint64{m.joinCall, m.topo.call, m.pend.call, m.opt.call, m.sync.call} {
		if c != 0 {
			emit(replyAct{reply{call: c, err: err}})
		}
	}
	m.joinCall, m.topo.call, m.pend.call, m.opt.call, m.sync.call = 0, 0, 0, 0, 0
	emit(dieAct{err})
}

// hasOp reports whether a collective of call is in flight (its caller waits for the verdict).
func (m *machine) hasOp(call uint64) bool {
	for _, o := range m.ops {
		if o.call == call {
			return true
		}
	}
	return false
}

// kickError is the error of a peer the master kicked.
func kickError(k *wire.Kick) error {
	if k.Final {
		return fmt.Errorf("%w: %w: %s; fix the cause, then connect again", ErrKicked, ErrRefused, k.Reason)
	}
	return fmt.Errorf("%w: %s; this communicator is closed: connect again to rejoin as a new peer", ErrKicked, k.Reason)
}
