package pccl

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// tick checks the master's silence and the verdicts awaited, sends the heartbeat when due, and
// drives the session's probe and redials (reconnect.go).
func (m *machine) tick(now time.Time, emit func(action)) {
	if silent := now.Sub(m.lastHeard); silent > m.timeout {
		m.die(fmt.Errorf("%w: no answer for %v (Config.MasterTimeout %v); check that the master runs, then connect again", ErrMasterLost, silent.Round(time.Millisecond), m.timeout), emit)
		return
	}
	for _, tag := range slices.Sorted(maps.Keys(m.ops)) {
		o := m.ops[tag]
		if (o.phase == opReported || o.phase == opWithdrawn) && now.After(o.deadline) {
			m.die(fmt.Errorf("%w: no verdict on tag %d after %v", ErrMasterLost, o.tag, m.timeout), emit)
			return
		}
	}
	if !now.Before(m.nextBeat) {
		m.beatSeq++
		m.nextBeat = now.Add(m.hbEvery)
		emit(sendAct{&wire.Heartbeat{Seq: m.beatSeq}})
	}
	m.probeTick(now, emit)
	m.redialTick(now, emit)
}

// fromMaster takes a message of the master.
func (m *machine) fromMaster(now time.Time, msg wire.Message, emit func(action)) {
	send := func(msg wire.Message) { emit(sendAct{msg}) }
	switch msg := msg.(type) {
	case *wire.HeartbeatAck:
	case *wire.Connect:
		emit(wireAct{msg})
	case *wire.Topology:
		m.epoch, m.ring, m.run = msg.Epoch, slices.Clone(msg.Ring), msg.Run
		m.topo.outstanding = false
		m.rc.rewired = m.rc.rejoining && m.topo.call == 0
		m.rc.rejoining = false
		emit(retireAct{slices.Clone(msg.Ring)})
		if !m.joined {
			m.joined = true
			if m.joinCall != 0 {
				emit(replyAct{reply{call: m.joinCall}})
				m.joinCall = 0
			}
		}
		if m.topo.call != 0 {
			emit(replyAct{reply{call: m.topo.call}})
			m.topo.call = 0
		}
		if m.opt.active {
			m.opt.active = false
			if m.opt.call != 0 {
				emit(replyAct{reply{call: m.opt.call}})
				m.opt.call = 0
			}
		}
	case *wire.Pending:
		m.pend.outstanding = false
		m.left = m.leaving // the master has removed this peer
		if m.pend.call != 0 {
			emit(replyAct{reply{call: m.pend.call, answer: msg.Answer}})
			m.pend.call = 0
		}
	case *wire.Commence:
		m.commence(now, msg, emit)
	case *wire.Outcome:
		o := m.ops[msg.Tag]
		if o == nil || (o.seq != 0 && msg.Seq != 0 && o.seq != msg.Seq) {
			return // the verdict on an operation this peer no longer runs
		}
		o.outcome = msg
		if msg.Seq != 0 && o.seq == msg.Seq && msg.Code != wire.CodeOK {
			if m.lastAbort.epoch != o.epoch {
				m.lastAbort.count = 0
			}
			m.lastAbort.epoch, m.lastAbort.seq = o.epoch, msg.Seq
			m.lastAbort.count++
		}
		switch o.phase {
		case opRunning:
			if msg.Code != wire.CodeOK {
				// The caller still reports its Done; stop its data path now.
				emit(abortAct{o.call, outcomeError(fmt.Sprintf("pccl: allreduce tag %d seq %d", o.tag, o.seq), msg)})
			}
		default:
			m.finishOp(o, emit)
		}
	case *wire.MeasureRound:
		if msg.Round == 0 {
			// A bandwidth test the master's diagnosis asked for, beside the collectives.
			emit(measureAct{msg})
			return
		}
		if m.opt.active && m.opt.call != 0 {
			if m.opt.first.IsZero() {
				m.opt.first = now
			}
			emit(measureAct{msg})
			return
		}
		// The caller gave up: answer without measuring, so that nobody waits for us.
		send(&wire.MeasureReport{Round: msg.Round, To: msg.Target.ID})
	case *wire.SyncPlan:
		switch {
		case m.sync.phase == syncVoted && m.sync.call != 0:
			emit(replyAct{reply{call: m.sync.call, msg: msg}})
			if msg.Code == wire.CodeOK {
				m.sync.phase, m.sync.voter = syncPlanned, m.sync.call
			} else {
				m.sync.phase = syncIdle
			}
			m.sync.call = 0
		case m.sync.phase == syncVoted && msg.Code == wire.CodeOK:
			// Nobody waits (the caller gave up): decline the plan so the others are not held up.
			send(&wire.SyncDone{OK: false, Detail: "the caller gave up on the sync"})
			m.sync.phase = syncDeclined
		case m.sync.phase == syncVoted:
			m.sync.phase = syncIdle
		}
	case *wire.SyncComplete:
		switch m.sync.phase {
		case syncReported:
			if m.sync.call != 0 {
				emit(replyAct{reply{call: m.sync.call, msg: msg}})
			}
			m.sync.phase, m.sync.call = syncIdle, 0
		case syncDeclined:
			m.sync.phase = syncIdle
		}
	case *wire.Kick:
		m.die(kickError(msg), emit)
	case *wire.Notice:
		emit(noticeAct{msg.Text})
	case *wire.RendezvousCall:
		emit(callAct{msg})
	default:
		m.die(fmt.Errorf("pccl: master sent unexpected %T", msg), emit)
	}
}

// commence handles the master's go for a collective. A Commence that crossed this peer's withdrawal
// is dropped (the master counts the withdrawal as this peer's Done); one on a ring this peer has not
// seen is answered with a failure.
func (m *machine) commence(now time.Time, msg *wire.Commence, emit func(action)) {
	o := m.ops[msg.Tag]
	if o == nil || o.phase != opVoted {
		emit(tombstoneAct{msg.Seq})
		return
	}
	o.seq, o.epoch = msg.Seq, msg.Epoch
	if msg.Epoch != m.epoch || !slices.Contains(m.ring, m.id) {
		emit(tombstoneAct{msg.Seq})
		emit(sendAct{&wire.Done{Tag: o.tag, Seq: msg.Seq, Code: wire.CodePeerLeft,
			Detail: fmt.Sprintf("ring epoch mismatch: commenced on %d, this peer has %d", msg.Epoch, m.epoch)}})
		o.phase, o.deadline = opReported, now.Add(m.timeout)
		return
	}
	o.phase = opRunning
	st := &opStart{seq: msg.Seq, epoch: msg.Epoch, ring: slices.Clone(m.ring), alone: msg.Alone}
	if m.lastAbort.epoch == msg.Epoch {
		st.siteGen = m.lastAbort.seq
		st.siteOff = m.lastAbort.count >= siteAbortLimit
	}
	emit(replyAct{reply{call: o.call, start: st}})
}
