package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/concord-ccl/concord/bench/internal/watch"
	"github.com/concord-ccl/concord/bench/internal/workload"
	supervise "github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/sharedstate"
)

// Environment of the peer role of the recovery mode.
const (
	envMaster = "CONCORD_SCALE_MASTER"
	envParams = "CONCORD_SCALE_PARAMS"
	// envFounder, set to 1, marks the peers started with the group: they hold the shared state's
	// content from the start; a newcomer starts with zeros.
	envFounder = "CONCORD_SCALE_FOUNDER"
	rolePeer   = "peer"
	tagData    = 1
	stateName  = "weights"
)

// roles are the roles this program runs as a child.
var roles = map[string]func() int{rolePeer: peerMain}

// peerParams is what every peer is told, as JSON in envParams.
type peerParams struct {
	Bytes      int           `json:"bytes"`       // AllReduce buffer
	StateBytes int           `json:"state_bytes"` // shared state, synced before every AllReduce
	Lifetime   time.Duration `json:"lifetime"`    // the peer gives up after this long
}

// peerEvent is every line a peer prints. Times are wall-clock Unix nanoseconds: all processes share
// the machine's clock, so the parent compares them with its own.
type peerEvent struct {
	// Event is "connected", "topology" (an UpdateTopology returned), "synced", "op_started",
	// "op_done", "failed" (a call returned an error), "exit" or "error".
	Event string `json:"event"`
	T     int64  `json:"t"`            // when the event happened (the end of a call)
	T0    int64  `json:"t0,omitempty"` // the start of the call
	Seq   int    `json:"seq,omitempty"`
	World int    `json:"world"`
	Stage string `json:"stage,omitempty"` // failed: the call that failed
	Kind  string `json:"kind,omitempty"`  // failed, exit: which sentinel error
	OK    bool   `json:"ok,omitempty"`    // op_done: every element right
	Bytes int64  `json:"bytes,omitempty"` // synced: bytes fetched
	Gone  int64  `json:"gone,omitempty"`  // failed: first far-end close seen since the call began, 0 if none
	Links uint64 `json:"links,omitempty"` // op_done, failed: data connections opened so far
}

func emit(ev peerEvent) {
	if ev.T == 0 {
		ev.T = time.Now().UnixNano()
	}
	supervise.Emit(ev)
}

// errorKind names the sentinel error err wraps.
func errorKind(err error) string {
	for _, k := range []struct {
		err  error
		name string
	}{
		{pccl.ErrPeerLeft, "ErrPeerLeft"}, {pccl.ErrAborted, "ErrAborted"}, {pccl.ErrTooFewPeers, "ErrTooFewPeers"},
		{pccl.ErrKicked, "ErrKicked"}, {pccl.ErrClosed, "ErrClosed"}, {pccl.ErrMasterLost, "ErrMasterLost"},
		{pccl.ErrSync, "ErrSync"}, {pccl.ErrBusy, "ErrBusy"}, {context.DeadlineExceeded, "deadline"},
	} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return "other"
}

// peerMain is the peer role: a training loop that admits pending peers, syncs a small shared state
// and all-reduces, and recovers from failures. Every call's end is reported with its start.
func peerMain() int {
	var p peerParams
	if err := json.Unmarshal([]byte(os.Getenv(envParams)), &p); err != nil {
		emit(peerEvent{Event: "error", Kind: fmt.Sprintf("%s: %v", envParams, err)})
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.Lifetime)
	defer cancel()
	cfg := pccl.LAN()
	cfg.Master = os.Getenv(envMaster)
	cfg.Logger = supervise.Logger()
	watched := watch.New(pccl.NewTCP(pccl.TCPConfig{}))
	cfg.Transport = watched
	t0 := time.Now()
	comm, err := pccl.Connect(ctx, cfg)
	if err != nil {
		emit(peerEvent{Event: "exit", Kind: errorKind(err)})
		return 1
	}
	defer comm.Close()
	emit(peerEvent{Event: "connected", T0: t0.UnixNano(), World: comm.WorldSize()})

	// The shared state: founders hold the same content; a newcomer starts with zeros and fetches it.
	st := sharedstate.NewState()
	weights := make([]float32, p.StateBytes/4)
	if os.Getenv(envFounder) != "" {
		workload.FillUniform(weights)
	}
	data := pccl.Bytes(weights)
	if err := st.Add(&sharedstate.Entry{Name: stateName, DType: pccl.F32, Data: data}); err != nil {
		emit(peerEvent{Event: "error", Kind: err.Error()})
		return 1
	}
	synced := false

	count := p.Bytes / 4
	buf := make([]float32, count)
	b := pccl.Bytes(buf)
	desc := pccl.Desc{Tag: tagData, Count: count, DType: pccl.F32, Op: pccl.Sum}
	failed := func(stage string, t0 time.Time, err error) bool {
		emit(peerEvent{Event: "failed", T0: t0.UnixNano(), Stage: stage, Kind: errorKind(err), World: comm.WorldSize(),
			Gone: watched.Gone(), Links: comm.Stats().LinksOpened})
		if !pccl.Retryable(err) {
			emit(peerEvent{Event: "exit", Kind: errorKind(err)})
			return false
		}
		if errors.Is(err, pccl.ErrTooFewPeers) {
			time.Sleep(20 * time.Millisecond)
		}
		return true
	}
	topology := func() error {
		t0 := time.Now()
		err := comm.UpdateTopology(ctx)
		if err == nil {
			emit(peerEvent{Event: "topology", T0: t0.UnixNano(), World: comm.WorldSize()})
		}
		return err
	}
	mustUpdate := false
	for seq := 1; ; seq++ {
		// A call that fails is followed by an UpdateTopology, which drops the departed peer and
		// re-wires its neighbours; every peer then comes back through ArePeersPending.
		watched.Reset()
		if mustUpdate {
			t0 := time.Now()
			if err := topology(); err != nil {
				if !failed("topology", t0, err) {
					return 0
				}
				continue
			}
			mustUpdate = false
		}
		t0 = time.Now()
		pending, err := comm.ArePeersPending(ctx)
		if err == nil && pending {
			// Everyone asks again after an admission, so every member reaches the sync together.
			if err = topology(); err == nil {
				continue
			}
		}
		if err != nil {
			mustUpdate = true
			if !failed("pending", t0, err) {
				return 0
			}
			continue
		}
		t0 = time.Now()
		if synced {
			st.Revision++
		}
		res, err := comm.SyncSharedState(ctx, st, pccl.SyncOptions{})
		if err != nil {
			mustUpdate = true
			if !failed("sync", t0, err) {
				return 0
			}
			continue
		}
		synced = true
		emit(peerEvent{Event: "synced", T0: t0.UnixNano(), Bytes: res.FetchedBytes, World: comm.WorldSize()})

		workload.FillUniform(buf)
		world := comm.WorldSize()
		t0 = time.Now()
		emit(peerEvent{Event: "op_started", T: t0.UnixNano(), Seq: seq, World: world})
		err = comm.AllReduce(ctx, b, b, desc)
		if err != nil {
			mustUpdate = true
			if !failed("allreduce", t0, err) {
				return 0
			}
			continue
		}
		ev := peerEvent{Event: "op_done", T0: t0.UnixNano(), Seq: seq, World: world, OK: true, Links: comm.Stats().LinksOpened}
		ev.T = time.Now().UnixNano()
		if m := workload.CheckUniform(buf, world); m != nil {
			ev.OK = false
		}
		supervise.Emit(ev)
	}
}
