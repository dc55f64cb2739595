package pccl

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// Reconnecting to the master.
//
// When the master connection breaks after this peer was accepted (the master was killed or
// restarted), the peer keeps its state (id, group, epoch, ring, shared state, step) and
// dials the same master address again, with a jittered exponential backoff, until Config.MasterTimeout
// has passed since the break; then it dies with ErrMasterLost as before. Its Hello carries a Resume
// report of what it holds, from which a restarted master rebuilds its view (see pccl/master). If the
// master that answers is the one it lost (the same incarnation: only the connection broke, and that
// master has removed the peer), the peer dies with ErrMasterLost, as it did before reconnection
// existed: its ring and operations are gone, and it must join again as a new peer.
//
// A master can also vanish without breaking the connection: its machine dies, or, over QUIC, its
// process does (no reset comes over UDP, and ICMP errors are ignored after the handshake). So while
// the connection is open but the master has been silent for probeAfter, the peer probes: it dials
// the master's address with the same Hello and report, once per probeAfter. A master of another
// incarnation answering means the old one is gone: the peer gives up the silent connection as if it
// had broken and adopts the probe's. Anything else (no answer, or the same master refusing this
// peer's id because it is live there: a master that is merely paused) drops the probe and changes
// nothing, so a paused master costs nothing but the pause.
//
// What was in flight when the connection broke fails retryably (ErrAborted): collectives (their
// buffers restored), ArePeersPending, OptimizeTopology and a sync. While the peer reconnects, and
// after it until the new master has wired it into a ring (its Topology), new collectives, syncs,
// ArePeersPending and OptimizeTopology fail the same way at once; UpdateTopology waits for that
// Topology, and if the Topology came first (the peer was still in the collective the break aborted),
// the next UpdateTopology returns at once, as it would have on the Topology. A training loop that
// retries after UpdateTopology on a retryable error therefore carries on over a master restart,
// losing at most the operation in flight.

// reconnect is the state of a broken master connection.
type reconnect struct {
	lost      bool      // the connection is gone; dialling
	rejoining bool      // reconnected; the new master's Topology is awaited
	dialing   bool      // a dial is in flight
	since     time.Time // when the connection broke
	next      time.Time // when the next dial is due
	attempt   int
	cause     error
	rng       *rand.Rand // jitter; seeded by the peer id, so scenarios are deterministic

	probing   bool      // a probe dial is in flight (the connection is open, the master silent)
	nextProbe time.Time // when the next probe may go

	// rewired: the new master's Topology came while no UpdateTopology waited for it (the peer was
	// still in the collective the break aborted, say). The next UpdateTopology is the one it answers:
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

// redialedIn: a dial of the master ended. On success conn is the new connection, after its Welcome;
// kicked says the master refused the Hello with a Kick (err holds its reason); probe says the dial
// was a probe (redialAct.probe).
type redialedIn struct {
	conn    net.Conn
	welcome *wire.Welcome
	err     error
	kicked  bool
	probe   bool
}

// Actions of reconnection.
type (
	// redialAct: dial the master and send a Hello with this report (the runtime adds the shared-state
	// revision and digest), then input redialedIn, marked probe if this is a probe.
	redialAct struct {
		resume *wire.Resume
		probe  bool
	}
	// adoptAct: conn is the master connection from now on; start reading it.
	adoptAct struct{ conn net.Conn }
	// dropConnAct: close conn, a dialled connection nobody needs any more.
	dropConnAct struct{ conn net.Conn }
	// closeMasterAct: close the broken master connection, so that its reader ends.
	closeMasterAct struct{}
)

// jitter draws a delay in [d/2, d).
func (r *reconnect) jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(r.rng.Int64N(int64(d/2)+1))
}

// lose handles the end of the master connection: a peer not accepted yet dies with ErrMasterLost; an
// accepted one fails what was in flight retryably and starts reconnecting.
func (m *machine) lose(now time.Time, cause error, emit func(any)) {
	if !m.joined {
		m.die(fmt.Errorf("pccl: connection to the master broke before this peer was accepted (%w: %w); check that the master runs, then connect again", ErrMasterLost, cause), emit)
		return
	}
	if m.rc.lost {
		return
	}
	m.rc.lost, m.rc.rejoining, m.rc.dialing, m.rc.rewired = true, false, false, false
	m.rc.since, m.rc.cause, m.rc.attempt = now, cause, 0
	m.rc.next = now.Add(m.rc.jitter(redialFirst))
	m.writeErr = nil
	emit(closeMasterAct{})
	lost := fmt.Errorf("%w: the master connection broke (%v); reconnecting: call UpdateTopology, then retry", ErrAborted, cause)
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

// reconnecting handles in while the master connection is broken or the new master has not wired this
// peer in yet; it reports whether it did.
func (m *machine) reconnecting(now time.Time, in any, emit func(any)) bool {
	if !m.rc.lost && !m.rc.rejoining {
		return false
	}
	busy := func(call uint64, what string) {
		state := "is being reconnected"
		if m.rc.rejoining {
			state = "restarted and is wiring the ring again"
		}
		emit(replyAct{reply{call: call, err: fmt.Errorf("pccl: %s: %w: the master %s; call UpdateTopology, then retry", what, ErrAborted, state)}})
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
	case stepCall:
		m.lastStep = in.report
		if m.rc.rejoining {
			emit(sendAct{in.report})
		}
		return true
	case redialedIn:
		if in.probe {
			m.probed(now, in, emit)
		} else {
			m.redialed(now, in, emit)
		}
		return true
	}
	if !m.rc.lost {
		return false
	}
	switch in.(type) {
	case tickIn:
		m.redialTick(now, emit)
		return true
	case masterIn, masterLost, writeFailed, wiredIn, measuredIn:
		return true // from the broken connection, or for its master: moot
	}
	return false
}

// redialTick gives up after the master timeout, or starts the next dial when it is due.
func (m *machine) redialTick(now time.Time, emit func(any)) {
	if gone := now.Sub(m.rc.since); gone > m.timeout {
		m.die(fmt.Errorf("%w: no master answered for %v after the connection broke (%v); restart the master and the peers", ErrMasterLost, gone.Round(time.Millisecond), m.rc.cause), emit)
		return
	}
	if m.rc.dialing || now.Before(m.rc.next) {
		return
	}
	m.rc.dialing = true
	m.rc.attempt++
	emit(redialAct{resume: m.resumeReport()})
}

// resumeReport is the Resume report of a Hello to a master that may have restarted.
func (m *machine) resumeReport() *wire.Resume {
	r := &wire.Resume{Incarnation: m.incarnation, Epoch: m.epoch, Ring: slices.Clone(m.ring)}
	if s := m.lastStep; s != nil {
		r.Step, r.HasStep, r.InOptimizer = s.Step, true, s.InOptimizer
	}
	return r
}

// probeAfter is how long the master may be silent on an open connection before the peer probes
// whether another master answers on its address: four heartbeats, at least a second.
func (m *machine) probeAfter() time.Duration { return max(4*m.hbEvery, time.Second) }

// probeTick starts a probe when the master has been silent for probeAfter on an open connection.
func (m *machine) probeTick(now time.Time, emit func(any)) {
	if !m.joined || m.rc.lost || m.rc.probing || now.Sub(m.lastHeard) <= m.probeAfter() || now.Before(m.rc.nextProbe) {
		return
	}
	m.rc.probing = true
	emit(redialAct{resume: m.resumeReport(), probe: true})
}

// probed takes the result of a probe: only a master of another incarnation counts (see the comment
// at the top of this file).
func (m *machine) probed(now time.Time, in redialedIn, emit func(any)) {
	m.rc.probing = false
	m.rc.nextProbe = now.Add(m.probeAfter())
	if in.err != nil || in.welcome == nil || in.welcome.Incarnation == m.incarnation || m.rc.lost {
		if in.conn != nil {
			emit(dropConnAct{in.conn})
		}
		return
	}
	m.lose(now, fmt.Errorf("the master was silent for %v and a restarted one (incarnation %d) answers on its address",
		now.Sub(m.lastHeard).Round(time.Millisecond), in.welcome.Incarnation), emit)
	m.rc.dialing = true
	m.redialed(now, redialedIn{conn: in.conn, welcome: in.welcome}, emit)
}

// redialed takes the result of a dial.
func (m *machine) redialed(now time.Time, in redialedIn, emit func(any)) {
	if !m.rc.lost || !m.rc.dialing {
		if in.conn != nil {
			emit(dropConnAct{in.conn})
		}
		return
	}
	m.rc.dialing = false
	switch {
	case in.kicked:
		m.die(fmt.Errorf("%w on reconnection: %v", ErrKicked, in.err), emit)
	case in.err != nil:
		d := min(redialFirst<<min(m.rc.attempt, 8), redialMax)
		m.rc.next = now.Add(m.rc.jitter(d))
	case in.welcome != nil && in.welcome.Incarnation == m.incarnation:
		// The master did not restart: it dropped this connection and has already removed this peer,
		// aborting what it took part in. Its state is stale; it must join again as a new peer.
		emit(dropConnAct{in.conn})
		m.die(fmt.Errorf("%w: the connection broke (%v) and the master, which did not restart, has removed this peer; connect again as a new peer", ErrMasterLost, m.rc.cause), emit)
	default:
		m.rc.lost, m.rc.rejoining = false, true
		if w := in.welcome; w != nil {
			m.incarnation = w.Incarnation
			if w.HeartbeatInterval > 0 {
				m.hbEvery = time.Duration(w.HeartbeatInterval)
			}
		}
		m.lastHeard, m.nextBeat = now, now
		emit(adoptAct{in.conn})
	}
}
