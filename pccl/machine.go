package pccl

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// machine is the peer's protocol state: what it voted for, which collectives it runs, the ring in
// force, how long the master has been silent, and whether the communicator is dead. It does no I/O and
// reads no clock: step takes an input and the current time and returns the actions the runtime must
// carry out, in order (send to the master, reply to an API call, wire links, start or abort a data
// operation, die). Only the run goroutine of a Communicator calls step.
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

// Inputs of the machine.
type (
	// tickIn lets time pass: heartbeats, master silence, verdict deadlines.
	tickIn struct{}
	// masterIn is a message from the master.
	masterIn struct{ msg wire.Message }
	// masterLost: the master connection ended (read error or EOF).
	masterLost struct{ err error }
	// writeFailed: a write to the master failed; the reader may still hold the master's reason.
	writeFailed struct{ err error }
	// wiredIn: the links of a Connect round are open, or failed.
	wiredIn struct {
		epoch  uint64
		failed []uint64
		err    error
	}
	// rendezvousOut: a connection to a peer behind NAT needs the master's rendezvous (rendezvous.go).
	rendezvousOut struct{ msg *wire.Rendezvous }
	// measuredIn: one bandwidth test of an OptimizeTopology is over.
	measuredIn struct {
		round   uint32
		to      uint64
		rate    float64
		latency time.Duration
	}

	// connectCall waits for this peer's admission (the first Topology).
	connectCall struct{ call uint64 }
	// topologyCall is UpdateTopology; rewire asks for new links because one broke, and noAdmit keeps
	// registered peers waiting (Rewire).
	topologyCall struct {
		call    uint64
		rewire  bool
		noAdmit bool
	}
	// pendingCall is ArePeersPending; with leave it is Leave (the peer's last vote).
	pendingCall struct {
		call  uint64
		leave bool
	}
	// optimizeCall is OptimizeTopology.
	optimizeCall struct{ call uint64 }
	// initiateCall starts a collective on tag.
	initiateCall struct {
		call  uint64
		tag   uint64
		desc  wire.Desc
		stats *wire.Contribution // for the master's contribution guard, nil if not computed
	}
	// reportCall: the data path of the collective on tag ended here with done; the call of the
	// initiateCall waits for the verdict.
	reportCall struct {
		call uint64
		tag  uint64
		done *wire.Done
	}
	// syncCall is SyncSharedState's vote.
	syncCall struct {
		call uint64
		vote *wire.VoteSync
	}
	// syncDoneCall: the transfer of the sync voted by call prev is over; call waits for SyncComplete.
	syncDoneCall struct {
		call uint64
		prev uint64
		done *wire.SyncDone
	}
	// stepCall is ReportStep.
	stepCall struct{ report *wire.StepReport }
	// cancelCall: the caller of call gave up (its context ended) for reason.
	cancelCall struct {
		call   uint64
		reason error
	}
	// closeCall is Close.
	closeCall struct{}
)

// Actions of the machine.
type (
	// sendAct: write msg to the master.
	sendAct struct{ msg wire.Message }
	// replyAct answers an API call.
	replyAct struct{ r reply }
	// wireAct: open the links of the ring in m, then input wiredIn.
	wireAct struct{ m *wire.Connect }
	// retireAct: drop incoming links from peers that left ring.
	retireAct struct{ ring []uint64 }
	// abortAct: abort the data path of the collective of call (the master's verdict, or death).
	abortAct struct {
		call uint64
		err  error
	}
	// tombstoneAct: frames of seq are to be read and dropped: nobody here runs it.
	tombstoneAct struct{ seq uint64 }
	// measureAct: run the bandwidth test of round r, then input measuredIn.
	measureAct struct{ r *wire.MeasureRound }
	// dieAct: the communicator is dead for err; wake everyone, close the master connection.
	dieAct struct{ err error }
	// noticeAct: log the master's warning text for the operator.
	noticeAct struct{ text string }
	// callAct: another peer asks to reach this one by rendezvous; open the connection it asks for.
	callAct struct{ call *wire.RendezvousCall }
)

// reply is the answer to an API call. start is set on the first reply to a collective that commenced;
// every other reply is final.
type reply struct {
	call   uint64
	err    error
	answer bool         // ArePeersPending's answer
	msg    wire.Message // SyncPlan or SyncComplete for a sync
	start  *opStart
}

// opStart tells a collective's caller to move the data of seq on the ring of epoch.
type opStart struct {
	seq   uint64
	epoch uint64
	ring  []uint64
	// alone is the master's word that no other collective of the group runs beside this one
	// (wire.Commence.Alone); siteGen is the sequence number of the last collective of this epoch
	// that the master aborted before this one commenced, 0 if none. Every member gets the same two,
	// so they name the same generation of the intra-site fabric (sitetier.go).
	alone   bool
	siteGen uint64
	// siteOff says that the master aborted siteAbortLimit collectives of this epoch already: the
	// site phases leave the intra-site fabric for the site ring's links until the next epoch, so
	// that a fabric that keeps failing (a peer whose NICs are all down while its links work) costs
	// two attempts, not every one.
	siteOff bool
}

// siteAbortLimit is how many aborted collectives of one epoch turn the intra-site fabric off for the
// rest of the epoch (opStart.siteOff).
const siteAbortLimit = 2

func newMachine(id uint64, hbEvery, timeout time.Duration, now time.Time) *machine {
	return &machine{id: id, hbEvery: hbEvery, timeout: timeout, lastHeard: now, nextBeat: now.Add(hbEvery),
		ops: map[uint64]*opState{}, rc: reconnect{rng: rand.New(rand.NewPCG(id, 0x7ec0))}}
}

// step applies one input at time now and returns the actions to carry out, in order.
func (m *machine) step(now time.Time, in any) []any {
	var acts []any
	emit := func(a any) { acts = append(acts, a) }
	m.stepInto(now, in, emit)
	return acts
}

func (m *machine) stepInto(now time.Time, in any, emit func(any)) {
	if m.fatal != nil {
		// A dead communicator answers calls with why it died and ignores everything else.
		if c := callOf(in); c != 0 {
			emit(replyAct{reply{call: c, err: m.fatal}})
		}
		if r, ok := in.(redialedIn); ok && r.conn != nil {
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

// kickError is the error of a peer the master kicked.
func kickError(k *wire.Kick) error {
	if k.Final {
		return fmt.Errorf("%w: %w: %s; fix the cause, then connect again", ErrKicked, ErrRefused, k.Reason)
	}
	return fmt.Errorf("%w: %s; this communicator is closed: connect again to rejoin as a new peer", ErrKicked, k.Reason)
}

// callOf returns the call id an input carries, 0 if none.
func callOf(in any) uint64 {
	switch in := in.(type) {
	case connectCall:
		return in.call
	case topologyCall:
		return in.call
	case pendingCall:
		return in.call
	case optimizeCall:
		return in.call
	case initiateCall:
		return in.call
	case reportCall:
		return in.call
	case syncCall:
		return in.call
	case syncDoneCall:
		return in.call
	}
	return 0
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

func (m *machine) tick(now time.Time, emit func(any)) {
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

func (m *machine) fromMaster(now time.Time, msg wire.Message, emit func(any)) {
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
func (m *machine) commence(now time.Time, msg *wire.Commence, emit func(any)) {
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

// cancel handles a caller that gave up.
func (m *machine) cancel(now time.Time, in cancelCall, emit func(any)) {
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
func (m *machine) finishOp(o *opState, emit func(any)) {
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
func (m *machine) die(err error, emit func(any)) {
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
