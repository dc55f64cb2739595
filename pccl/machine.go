package pccl

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// machine is the peer's protocol state: what it voted for, which collectives it runs, the ring in
// force, how long the master has been silent, and whether the communicator is dead. It does no I/O and
// reads no clock: step takes an input and the current time and returns the actions the runtime must
// carry out, in order. Only the run goroutine of a Communicator calls step.
//
// Inputs (machine_input.go):
//   - from the runtime: tickIn (time passes), masterIn (a message from the master), masterLost and
//     writeFailed (the master connection failed), wiredIn (the links of a Connect round are open),
//     rendezvousOut (a rendezvous request for the master), measuredIn (a bandwidth test ended),
//     redialedIn (a dial of the master ended, reconnect.go);
//   - from API calls: connectCall, topologyCall, pendingCall, optimizeCall, initiateCall,
//     reportCall, syncCall, syncDoneCall, stepCall, cancelCall, closeCall.
//
// Actions (machine_action.go): sendAct (write to the master), replyAct (answer a call), wireAct (open
// the links of a ring), retireAct (drop links of peers that left), abortAct (stop a collective's data
// path), tombstoneAct (drop the frames of an operation nobody here runs), measureAct (run a bandwidth
// test), dieAct (the communicator is dead), noticeAct (log the master's warning), callAct (answer a
// rendezvous), redialAct (dial the master again), adoptAct (take a dialled connection as the master
// connection), dropConnAct (close a dialled connection). Connections travel as connIDs: the runtime
// keeps the table.
//
// API calls reach it as inputs carrying a call id; every call that waits gets exactly one final reply
// (an op's call may first get a start reply). A call whose caller gave up is cancelled with
// cancelCall; replies to cancelled calls are not sent, except for collectives, whose caller always
// waits for the master's verdict.
type machine struct {
	id      uint64
	hbEvery time.Duration // heartbeat period, from the master's Welcome
	timeout time.Duration // Config.MasterTimeout

	fatal error // set once; every later call is answered with it

	joined   bool   // the first Topology arrived (Connect may return)
	joinCall uint64 // the Connect call waiting for it, 0 if none

	epoch uint64
	ring  []uint64
	run   wire.RunSize // the whole run, all groups, as of the last Topology

	lastHeard time.Time // last message from the master
	nextBeat  time.Time // when the next heartbeat is due
	beatSeq   uint64

	ops map[uint64]*opState // collectives of this peer by tag
	// lastAbort is the last commenced collective the master aborted (its epoch and sequence number),
	// and how many of that epoch it aborted: opStart.siteGen and opStart.siteOff.
	lastAbort struct{ epoch, seq, count uint64 }

	incarnation uint64           // of the master that accepted this peer (its Welcome)
	lastStep    *wire.StepReport // the last step reported, for a Resume report
	rc          reconnect        // the master connection broke: reconnecting (reconnect.go)

	topo vote // VoteTopology (and VoteOptimize, which ends with a Topology too)
	pend vote // VotePending

	leaving bool // the pending vote out is this peer's last (Leave)
	left    bool // its answer came: the master removed this peer, which only closes now

	opt struct {
		active bool   // a VoteOptimize awaits its Topology
		call   uint64 // the caller measuring, 0 if it gave up
		rounds int
		first  time.Time
		stats  OptimizeStats
	}

	sync struct {
		phase syncPhase
		call  uint64 // the caller waiting for the next sync message, 0 if none
		voter uint64 // the call that voted, while its caller transfers (syncPlanned)
	}
}

// vote is a question to the master that is asked at most once at a time: a call while it is
// outstanding waits for the same answer.
type vote struct {
	outstanding bool
	call        uint64 // the caller waiting for the answer, 0 if none
}

type syncPhase int

const (
	syncIdle     syncPhase = iota
	syncVoted              // VoteSync sent, SyncPlan awaited
	syncPlanned            // the caller transfers; its SyncDone is awaited
	syncReported           // SyncDone sent, SyncComplete awaited
	syncDeclined           // SyncDone sent for a caller that gave up; SyncComplete is dropped
)

type opPhase int

const (
	opVoted     opPhase = iota // Initiate sent, Commence awaited
	opRunning                  // commenced: the caller moves the data
	opReported                 // Done sent, Outcome awaited
	opWithdrawn                // the caller gave up before it started: Done sent, Outcome awaited
)

// opState is one collective of this peer.
type opState struct {
	tag      uint64
	call     uint64 // the caller, who waits for the verdict whatever happens
	phase    opPhase
	seq      uint64
	epoch    uint64
	outcome  *wire.Outcome // the master's verdict, once known
	orphan   bool          // its master is gone: the verdict is the abort given locally, no Done is sent
	why      error         // the caller's reason for giving up, joined to the verdict
	deadline time.Time     // a verdict awaited after this is ErrMasterLost
}

func newMachine(id uint64, hbEvery, timeout time.Duration, now time.Time) *machine {
	return &machine{id: id, hbEvery: hbEvery, timeout: timeout, lastHeard: now, nextBeat: now.Add(hbEvery),
		ops: map[uint64]*opState{}, rc: reconnect{rng: rand.New(rand.NewPCG(id, 0x7ec0))}}
}

// step applies one input at time now and returns the actions to carry out, in order.
func (m *machine) step(now time.Time, in input) []action {
	var acts []action
	emit := func(a action) { acts = append(acts, a) }
	m.stepInto(now, in, emit)
	return acts
}

func (m *machine) stepInto(now time.Time, in input, emit func(action)) {
	if m.fatal != nil {
		// A dead communicator answers calls with why it died and ignores everything else.
		if c := callOf(in); c != 0 {
			emit(replyAct{reply{call: c, err: m.fatal}})
		}
		if r, ok := in.(redialedIn); ok && r.conn != 0 {
			emit(dropConnAct{r.conn})
		}
		return
	}
	if m.reconnecting(now, in, emit) {
		return
	}
	answer := func(r reply) {
		if r.call != 0 {
			emit(replyAct{r})
		}
	}
	send := func(msg wire.Message) { emit(sendAct{msg}) }

	switch in := in.(type) {
	case tickIn:
		m.tick(now, emit)
	case masterIn:
		m.lastHeard = now
		if m.rc.resuming && !m.rc.broken {
			m.rc.resuming = false // heard again on the connection in use: it recovered
		}
		m.fromMaster(now, in.msg, emit)
	case masterLost:
		m.suspect(now, in.err, emit)
		m.rc.broken = true
	case writeFailed:
		m.suspect(now, fmt.Errorf("write: %w", in.err), emit)
	case rendezvousOut:
		send(in.msg)
	case wiredIn:
		rep := &wire.LinksReady{Epoch: in.epoch, OK: in.err == nil}
		if in.err != nil {
			rep.Failed, rep.Detail = in.failed, in.err.Error()
			if cause := errors.Unwrap(in.err); cause != nil && len(in.failed) > 0 {
				rep.Detail = cause.Error() // the master names the link and the address itself
			}
		}
		send(rep)
	case measuredIn:
		send(&wire.MeasureReport{Round: in.round, To: in.to, BytesPerSec: in.rate, LatencyNanos: uint64(in.latency)})
		if m.opt.active && in.round != 0 {
			m.opt.rounds++
			m.opt.stats = OptimizeStats{Rounds: m.opt.rounds, Measure: now.Sub(m.opt.first)}
		}

	case connectCall:
		switch {
		case m.joined:
			answer(reply{call: in.call})
		case m.joinCall != 0:
			answer(reply{call: in.call, err: fmt.Errorf("pccl: connect: %w: another call waits", ErrInvalid)})
		default:
			m.joinCall = in.call
		}
	case topologyCall:
		if err := m.idle("update topology"); err != nil {
			answer(reply{call: in.call, err: err})
			return
		}
		if m.rc.rewired {
			m.rc.rewired = false
			answer(reply{call: in.call})
			return
		}
		m.topo.call = in.call
		if !m.topo.outstanding {
			m.topo.outstanding = true
			send(&wire.VoteTopology{Rewire: in.rewire, NoAdmit: in.noAdmit})
		}
	case pendingCall:
		m.rc.rewired = false
		if m.pend.call != 0 {
			answer(reply{call: in.call, err: fmt.Errorf("pccl: are peers pending: %w: another call waits", ErrInvalid)})
			return
		}
		m.pend.call = in.call
		if in.leave {
			m.leaving = true
		}
		if !m.pend.outstanding {
			m.pend.outstanding = true
			send(&wire.VotePending{Leave: in.leave})
		}
	case optimizeCall:
		m.rc.rewired = false
		if err := m.idle("optimize topology"); err != nil {
			answer(reply{call: in.call, err: err})
			return
		}
		m.topo.outstanding = true
		m.opt.active, m.opt.call, m.opt.rounds, m.opt.first = true, in.call, 0, time.Time{}
		send(&wire.VoteOptimize{})
	case initiateCall:
		m.rc.rewired = false
		what := fmt.Sprintf("pccl: allreduce tag %d", in.tag)
		if m.ops[in.tag] != nil {
			answer(reply{call: in.call, err: fmt.Errorf("%s: %w: tag already in flight on this peer", what, ErrInvalid)})
			return
		}
		m.ops[in.tag] = &opState{tag: in.tag, call: in.call, phase: opVoted}
		send(&wire.Initiate{Tag: in.tag, Desc: in.desc, Stats: in.stats})
	case reportCall:
		o := m.ops[in.tag]
		if o == nil || o.call != in.call || o.phase != opRunning {
			answer(reply{call: in.call, err: fmt.Errorf("pccl: allreduce tag %d: %w: not running", in.tag, ErrInvalid)})
			return
		}
		in.done.Tag, in.done.Seq = o.tag, o.seq
		if !o.orphan {
			send(in.done)
		}
		o.phase, o.deadline = opReported, now.Add(m.timeout)
		if o.outcome != nil {
			m.finishOp(o, emit)
		}
	case syncCall:
		m.rc.rewired = false
		if err := m.idle("sync shared state"); err != nil {
			answer(reply{call: in.call, err: err})
			return
		}
		m.sync.phase, m.sync.call = syncVoted, in.call
		send(in.vote)
	case syncDoneCall:
		if m.sync.phase != syncPlanned || m.sync.voter != in.prev {
			answer(reply{call: in.call, err: fmt.Errorf("%w: the sync was given up", ErrSync)})
			return
		}
		m.sync.phase, m.sync.call, m.sync.voter = syncReported, in.call, 0
		send(in.done)
	case stepCall:
		m.lastStep = in.report
		send(in.report)
	case cancelCall:
		m.cancel(now, in, emit)
	case closeCall:
		if !m.left {
			send(&wire.Bye{})
		}
		m.die(ErrClosed, emit)
	default:
		panic(fmt.Sprintf("pccl: machine input %T", in))
	}
}

// idle returns why a major operation (UpdateTopology, OptimizeTopology, SyncSharedState) cannot
// start: collectives of this peer are in flight, or another major call waits.
func (m *machine) idle(what string) error {
	if n := len(m.ops); n > 0 {
		return fmt.Errorf("pccl: %s: %w: %d", what, ErrBusy, n)
	}
	if m.topo.call != 0 || m.opt.call != 0 || m.sync.call != 0 || m.sync.voter != 0 {
		return fmt.Errorf("pccl: %s: %w: another membership call is running", what, ErrInvalid)
	}
	return nil
}
