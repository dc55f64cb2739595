package pccl

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// Reconnecting to the master.
//
// The control connection to the master carries a session (wire/session.go): both ends number the
// frames they send and keep those the other has not acknowledged. When the connection fails (a read or
// write error) or the master falls silent on it for probeAfter, an accepted peer resumes the session:
// it dials the master's address again, with a jittered exponential backoff, and asks for its session.
// Nothing is failed meanwhile: calls go on, what they send waits in the session, and what either side
// missed is sent again once a master answers. A master that was cut off, paused or partitioned away
// therefore costs its peers nothing but the time it was unreachable, as long as that stays under
// Config.MasterTimeout; after that silence the peer dies with ErrMasterLost.
//
// The answer to a resumption tells what happened to the master:
//   - the same master, which kept the session: the session moves to the new connection (adoptAct with
//     the master's count of our frames), and the old connection is given up;
//   - a master that does not know the session and belongs to the same incarnation: it removed this
//     peer (it was silent past the master's patience, or on the wrong side of a partition); it answers
//     the peer's report with a Kick, and the peer dies with ErrKicked, free to join again as a
//     newcomer (Rejoinable);
//   - a master of another incarnation: it restarted. The peer keeps its state (id, group, epoch, ring,
//     shared state, step) and the Hello it sent carries a Resume report of it, from which the restarted
//     master rebuilds its view (see pccl/master). What was in flight fails retryably (ErrAborted):
//     collectives (their buffers restored), ArePeersPending, OptimizeTopology and a sync. Until the new
//     master has wired this peer into a ring (its Topology), new collectives, syncs, ArePeersPending and
//     OptimizeTopology fail the same way at once; UpdateTopology waits for that Topology, and if the
//     Topology came first (the peer was still in the collective the restart aborted), the next
//     UpdateTopology returns at once, as it would have on the Topology. A training loop that retries
//     after UpdateTopology on a retryable error therefore carries on over a master restart, losing at
//     most the operation in flight.
//
// A resumption that succeeds is always taken, even when the old connection came back to life while it
// was being dialled: the master moved the session already.

// reconnect is the state of resuming the session or rejoining a restarted master.
type reconnect struct {
	resuming bool      // the connection failed or the master fell silent: the session is being resumed
	dialing  bool      // a dial is in flight
	since    time.Time // when resuming began
	next     time.Time // when the next dial is due
	attempt  int
	cause    error
	broken   bool       // the connection in use failed (not only silent): nothing more comes on it
	rng      *rand.Rand // jitter; seeded by the peer id, so scenarios are deterministic

	rejoining bool // the master restarted; its Topology is awaited

	// rewired: the new master's Topology came while no UpdateTopology waited for it (the peer was
	// still in the collective the restart aborted, say). The next UpdateTopology is the one it answers:
	// it returns at once, as every other peer's returned on the Topology, instead of casting a vote
	// that the others, already past it, would never join. Any other group call first clears it.
	rewired bool
}

// Backoff of the dials: the first within redialFirst, then doubling up to redialMax, each drawn in
// [d/2, d).
const (
	redialFirst = 50 * time.Millisecond
	redialMax   = 400 * time.Millisecond
)

// jitter draws a delay in [d/2, d).
func (r *reconnect) jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(r.rng.Int64N(int64(d/2)+1))
}

// suspect handles a failed master connection (a read or write error) or a master silent for
// probeAfter: a peer not accepted yet dies with ErrMasterLost; an accepted one resumes its session.
func (m *machine) suspect(now time.Time, cause error, emit func(action)) {
	if !m.joined {
		m.die(fmt.Errorf("pccl: connection to the master broke before this peer was accepted (%w: %w); check that the master runs, then connect again", ErrMasterLost, cause), emit)
		return
	}
	if m.rc.resuming {
		return
	}
	m.rc.resuming, m.rc.since, m.rc.cause, m.rc.attempt, m.rc.broken = true, now, cause, 0, false
	m.rc.next = now
	m.redialTick(now, emit)
}

// restarted handles a master of another incarnation: what was in flight fails retryably, and the
// peer waits for the new master to wire it in (rejoining).
func (m *machine) restarted(now time.Time, inc uint64, emit func(action)) {
	m.rc.rejoining, m.rc.rewired = true, false
	lost := fmt.Errorf("%w: the master restarted (incarnation %d after %d; %v); call UpdateTopology, then retry",
		ErrAborted, inc, m.incarnation, m.rc.cause)
	for _, tag := range slices.Sorted(maps.Keys(m.ops)) {
		o := m.ops[tag]
		verdict := &wire.Outcome{Tag: o.tag, Seq: o.seq, Code: wire.CodeAborted, Detail: lost.Error()}
		if o.phase == opRunning {
			// Its caller still reports; stop its data path, and give it the local verdict then.
			o.orphan, o.outcome = true, verdict
			emit(abortAct{o.call, fmt.Errorf("pccl: allreduce tag %d seq %d: %w", o.tag, o.seq, lost)})
			continue
		}
		o.outcome = verdict
		m.finishOp(o, emit)
	}
	m.topo.outstanding = false // the call, if any, waits for the new master's Topology
	if m.pend.call != 0 {
		emit(replyAct{reply{call: m.pend.call, err: fmt.Errorf("pccl: are peers pending: %w", lost)}})
	}
	m.pend = vote{}
	if m.opt.active && m.opt.call != 0 {
		emit(replyAct{reply{call: m.opt.call, err: fmt.Errorf("pccl: optimize topology: %w", lost)}})
	}
	m.opt.active, m.opt.call = false, 0
	if m.sync.call != 0 {
		emit(replyAct{reply{call: m.sync.call, err: fmt.Errorf("pccl: sync shared state: %w", lost)}})
	}
	m.sync.phase, m.sync.call, m.sync.voter = syncIdle, 0, 0
}

// reconnecting handles in while the session is resumed or the restarted master has not wired this
// peer in yet; it reports whether it did.
func (m *machine) reconnecting(now time.Time, in input, emit func(action)) bool {
	if r, ok := in.(redialedIn); ok {
		m.redialed(now, r, emit)
		return true
	}
	if !m.rc.rejoining {
		return false
	}
	busy := func(call uint64, what string) {
		emit(replyAct{reply{call: call, err: fmt.Errorf("pccl: %s: %w: the master restarted and is wiring the ring again; call UpdateTopology, then retry", what, ErrAborted)}})
	}
	switch in := in.(type) {
	case initiateCall:
		busy(in.call, fmt.Sprintf("allreduce tag %d", in.tag))
		return true
	case pendingCall:
		busy(in.call, "are peers pending")
		return true
	case optimizeCall:
		busy(in.call, "optimize topology")
		return true
	case syncCall:
		busy(in.call, "sync shared state")
		return true
	case topologyCall:
		if err := m.idle("update topology"); err != nil {
			emit(replyAct{reply{call: in.call, err: err}})
		} else {
			m.topo.call = in.call // answered by the Topology that wires this peer in again
		}
		return true
	}
	return false
}

// redialTick gives up after the master timeout, or starts the next dial when it is due.
func (m *machine) redialTick(now time.Time, emit func(action)) {
	if !m.rc.resuming {
		return
	}
	if gone := now.Sub(m.lastHeard); gone > m.timeout {
		m.die(fmt.Errorf("%w: no master answered for %v (%v); restart the master and the peers", ErrMasterLost, gone.Round(time.Millisecond), m.rc.cause), emit)
		return
	}
	if m.rc.dialing || now.Before(m.rc.next) {
		return
	}
	m.rc.dialing = true
	m.rc.attempt++
	emit(redialAct{resume: m.resumeReport()})
}

// redialed takes the result of a dial.
func (m *machine) redialed(now time.Time, in redialedIn, emit func(action)) {
	m.rc.dialing = false
	switch {
	case in.resumed:
		// Taken even if the old connection recovered meanwhile: the master moved the session.
		m.rc.resuming, m.rc.attempt, m.rc.broken = false, 0, false
		m.lastHeard = now
		emit(adoptAct{conn: in.conn, resumed: true, masterRecv: in.masterRecv, masterNext: in.masterNext})
	case !m.rc.resuming:
		if in.conn != 0 {
			emit(dropConnAct{in.conn}) // the connection recovered before a restarted master answered
		}
	case in.kicked:
		m.die(fmt.Errorf("%w on reconnection: %v", ErrKicked, in.err), emit)
	case in.err != nil:
		d := min(redialFirst<<min(m.rc.attempt, 8), redialMax)
		m.rc.next = now.Add(m.rc.jitter(d))
	case in.welcome != nil && in.welcome.Incarnation == m.incarnation:
		// The same master, which neither knows the session nor refused the report: it cannot tell this
		// peer's state from a newcomer's. Join again as a new peer.
		emit(dropConnAct{in.conn})
		m.die(fmt.Errorf("%w: the master lost this peer's session (%v); connect again as a new peer", ErrMasterLost, m.rc.cause), emit)
	default:
		inc := uint64(0)
		if w := in.welcome; w != nil {
			inc = w.Incarnation
		}
		m.restarted(now, inc, emit)
		m.rc.resuming, m.rc.broken = false, false
		if w := in.welcome; w != nil {
			m.incarnation = w.Incarnation
			if w.HeartbeatInterval > 0 {
				m.hbEvery = time.Duration(w.HeartbeatInterval)
			}
		}
		m.lastHeard, m.nextBeat = now, now
		emit(adoptAct{conn: in.conn, session: in.session})
	}
}

// resumeReport is the Resume report of a Hello to a master that may have restarted.
func (m *machine) resumeReport() *wire.Resume {
	r := &wire.Resume{Incarnation: m.incarnation, Epoch: m.epoch, Ring: slices.Clone(m.ring)}
	if s := m.lastStep; s != nil {
		r.Step, r.HasStep, r.InOptimizer = s.Step, true, s.InOptimizer
	}
	return r
}

// probeAfter is how long the master may be silent on an open connection before the peer resumes its
// session on a new one: four heartbeats, at least a second.
func (m *machine) probeAfter() time.Duration { return max(4*m.hbEvery, time.Second) }

// probeTick starts resuming the session when the master has been silent for probeAfter on an open
// connection, and stops when it is heard again before a new connection was taken.
func (m *machine) probeTick(now time.Time, emit func(action)) {
	silent := now.Sub(m.lastHeard)
	if !m.joined || m.rc.rejoining {
		return
	}
	if !m.rc.resuming && silent > m.probeAfter() {
		m.suspect(now, fmt.Errorf("the master was silent for %v", silent.Round(time.Millisecond)), emit)
	}
}
