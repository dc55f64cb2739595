package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/concord-ccl/concord/bench/internal/hostbed"
	"github.com/concord-ccl/concord/bench/internal/watch"
	"github.com/concord-ccl/concord/bench/internal/workload"
	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/internal/hugemem"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/rings"
)

// Environment of the peer role.
const (
	envMaster = "CONCORD_BENCH_MASTER"
	envParams = "CONCORD_BENCH_PARAMS"
	rolePeer  = "peer"
	tagData   = 1
)

// params is what every peer is told, as JSON in envParams.
type params struct {
	Bytes    int           `json:"bytes"`
	Lifetime time.Duration `json:"lifetime"` // the peer gives up after this long
}

// peerEvent is every line a peer prints. T is wall-clock Unix nanoseconds: all processes share the
// machine's clock, so the parent compares it with its own.
type peerEvent struct {
	Event    string  `json:"event"` // "connected", "op_started", "op_done", "aborted", "checked", "left", "exit", "error"
	T        int64   `json:"t"`
	Seq      int     `json:"seq,omitempty"` // this peer's attempt number
	Rank     int     `json:"rank"`
	World    int     `json:"world"`
	Seconds  float64 `json:"seconds,omitempty"`  // op_done: duration of the call
	OK       bool    `json:"ok,omitempty"`       // op_done: every element right
	Restored bool    `json:"restored,omitempty"` // checked: the failed call's buffer holds the contribution again
	Kind     string  `json:"kind,omitempty"`     // aborted, exit: which sentinel error
	Links    uint64  `json:"links,omitempty"`    // op_done, aborted: data connections opened so far
	Gone     int64   `json:"gone,omitempty"`     // aborted: first far-end close this peer saw during the call (Unix ns), 0 if none
	Detail   string  `json:"detail,omitempty"`
	Netns    string  `json:"netns,omitempty"` // connected: the peer's network namespace (which host it runs on)
	// op_started: when the membership step before the call was first answered "pending" (0 if it
	// was not) and when it ended, the group ready for the call (Unix ns).
	Pending int64 `json:"pending_t,omitempty"`
	Ready   int64 `json:"ready_t,omitempty"`
}

func emit(ev peerEvent) {
	ev.T = time.Now().UnixNano()
	cluster.Emit(ev)
}

// errorKind names the sentinel error err wraps.
func errorKind(err error) string {
	for _, k := range []struct {
		err  error
		name string
	}{
		{pccl.ErrPeerLeft, "ErrPeerLeft"}, {pccl.ErrAborted, "ErrAborted"}, {pccl.ErrTooFewPeers, "ErrTooFewPeers"},
		{pccl.ErrKicked, "ErrKicked"}, {pccl.ErrClosed, "ErrClosed"}, {pccl.ErrMasterLost, "ErrMasterLost"},
		{pccl.ErrDescriptorMismatch, "ErrDescriptorMismatch"}, {pccl.ErrBusy, "ErrBusy"},
		{context.DeadlineExceeded, "deadline"},
	} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return "other"
}

// leaveTimeout bounds a graceful leave: how long the peer waits for the master's answer.
const leaveTimeout = 30 * time.Second

// peerMain is the peer role: a training loop that only all-reduces, and recovers from failures. On
// SIGTERM it leaves the group at its next membership step (Communicator.Leave in place of
// ArePeersPending), as a spot instance does on its preemption notice, and exits 0.
func peerMain() int {
	var p params
	if err := json.Unmarshal([]byte(os.Getenv(envParams)), &p); err != nil {
		emit(peerEvent{Event: "error", Detail: fmt.Sprintf("%s: %v", envParams, err)})
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.Lifetime)
	defer cancel()
	// term is done once SIGTERM has come.
	term, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cfg := pccl.LAN()
	cfg.Master = os.Getenv(envMaster)
	cfg.Logger = cluster.Logger()
	watched := watch.New(pccl.NewTCP(pccl.TCPConfig{}))
	cfg.Transport = watched
	comm, err := pccl.Connect(ctx, cfg)
	if err != nil {
		emit(peerEvent{Event: "error", Kind: errorKind(err), Detail: "connect: " + err.Error()})
		return 1
	}
	defer comm.Close()
	netns, _ := hostbed.Netns()
	emit(peerEvent{Event: "connected", Rank: comm.Rank(), World: comm.WorldSize(), Netns: netns})

	count := p.Bytes / 4
	// Two buffers, each holding this peer's contribution whenever no call runs on it (in huge pages
	// where the kernel has them, like the staging buffers). A failed call must leave its buffer as it
	// was. The retry runs on the other buffer, which holds the same bytes, and the failed call's
	// buffer is hashed only once the retry has ended: the check, a pass over the whole buffer, then
	// does not take the cores from the recovery that the rounds time. A buffer found restored is
	// the spare again; one that is not is filled anew.
	cur, spare := hugemem.Make(4*count, 4*count), hugemem.Make(4*count, 4*count)
	workload.FillUniform(rings.View[float32](cur))
	workload.FillUniform(rings.View[float32](spare))
	want := workload.Hash(cur) // FillUniform gives every call the same contribution
	desc := pccl.Desc{Tag: tagData, Count: count, DType: pccl.F32, Op: pccl.Sum}
	fill := false
	// unchecked is the buffer of the last failed call (seq failedSeq) while it waits for its check;
	// then spare is nil. due says that the retry has ended.
	var unchecked []byte
	failedSeq, due := 0, false
	// pendingAt is when the current membership step was first answered "pending".
	var pendingAt int64
	check := func() {
		due = false
		if unchecked == nil {
			return
		}
		ok := workload.Hash(unchecked) == want
		emit(peerEvent{Event: "checked", Seq: failedSeq, Restored: ok})
		if !ok {
			workload.FillUniform(rings.View[float32](unchecked))
		}
		spare, unchecked = unchecked, nil
	}
	// recoverFrom handles a failed call: it returns false, with the event to report, when the peer must
	// leave.
	recoverFrom := func(err error) (peerEvent, bool) {
		if !pccl.Retryable(err) {
			return peerEvent{Event: "exit", Kind: errorKind(err), Detail: err.Error()}, false
		}
		if errors.Is(err, pccl.ErrTooFewPeers) {
			time.Sleep(50 * time.Millisecond)
		}
		if err := comm.UpdateTopology(ctx); err != nil && !pccl.Retryable(err) {
			return peerEvent{Event: "exit", Kind: errorKind(err), Detail: "update topology: " + err.Error()}, false
		}
		return peerEvent{}, true
	}
	for seq := 1; ; seq++ {
		// The membership step. Every member asks first, so that the answer is a vote of the whole
		// group; after any UpdateTopology everyone comes back here (a newcomer starts here too). A
		// peer told to go leaves here, where the others vote: they re-wire without it, and nobody's
		// call fails.
		if term.Err() != nil {
			lctx, lcancel := context.WithTimeout(ctx, leaveTimeout)
			err := comm.Leave(lctx)
			lcancel()
			if err != nil {
				emit(peerEvent{Event: "exit", Seq: seq, Kind: errorKind(err), Detail: "leave: " + err.Error()})
				return 1
			}
			emit(peerEvent{Event: "left", Seq: seq})
			return 0
		}
		pending, err := comm.ArePeersPending(ctx)
		ready := time.Now().UnixNano()
		if err == nil && pending {
			if pendingAt == 0 {
				pendingAt = ready
			}
			if err = comm.UpdateTopology(ctx); err == nil {
				continue
			}
		}
		if err != nil {
			exit, ok := recoverFrom(err)
			if !ok {
				check()
				emit(exit)
				return 0
			}
			continue
		}
		if due {
			// The retry has ended here, and everywhere else too (every member asked): the failed
			// call's buffer can be checked without slowing anyone's call.
			check()
		}
		if fill {
			workload.FillUniform(rings.View[float32](cur))
			fill = false
		}
		rank, world := comm.Rank(), comm.WorldSize()
		watched.Reset()
		emit(peerEvent{Event: "op_started", Seq: seq, Rank: rank, World: world, Pending: pendingAt, Ready: ready})
		pendingAt = 0
		t0 := time.Now()
		err = comm.AllReduce(ctx, cur, cur, desc)
		if err == nil {
			ev := peerEvent{Event: "op_done", Seq: seq, Rank: rank, World: world, Seconds: time.Since(t0).Seconds(), OK: true,
				Links: comm.Stats().LinksOpened}
			ev.T = time.Now().UnixNano()
			if m := workload.CheckUniform(rings.View[float32](cur), world); m != nil {
				ev.OK, ev.Detail = false, m.Error()
			}
			cluster.Emit(ev)
			fill, due = true, unchecked != nil
			continue
		}
		ev := peerEvent{Event: "aborted", Seq: seq, Rank: rank, World: world, Kind: errorKind(err), Detail: err.Error(),
			Links: comm.Stats().LinksOpened, Gone: watched.Gone()}
		ev.T = time.Now().UnixNano()
		cluster.Emit(ev)
		check() // the retry failed too: the buffer of the call before it becomes the spare
		cur, spare, unchecked, failedSeq = spare, nil, cur, seq
		exit, ok := recoverFrom(err)
		if !ok {
			check()
			emit(exit)
			return 0
		}
	}
}
