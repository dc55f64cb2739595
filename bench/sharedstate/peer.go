package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/pprof"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/sharedstate"
)

// Environment of the peer role.
const (
	rolePeer   = "peer"
	envMaster  = "CONCORD_BENCH_MASTER"
	envParams  = "CONCORD_BENCH_PARAMS"
	hashWorker = 2 // goroutines hashing, in every process
)

// params is what every peer is told, as JSON in envParams.
type params struct {
	Bytes    int           `json:"bytes"`    // state size
	Entries  int           `json:"entries"`  // number of f32 entries the state is cut into
	Zero     bool          `json:"zero"`     // start with zeroed state (a newcomer) instead of the common fill
	Warm     bool          `json:"warm"`     // pass the state through the kernel once before it is used (kernelWarm)
	Lifetime time.Duration `json:"lifetime"` // the peer gives up after this long
}

// command is what the parent sends a peer, one JSON line each.
type command struct {
	Cmd      string `json:"cmd"`                // "admit", "sync", "digest", "zero"
	StartNs  int64  `json:"start_ns,omitempty"` // wall-clock instant to start at, Unix nanoseconds
	Revision uint64 `json:"revision,omitempty"` // sync: the state's revision for this sync
	Version  uint64 `json:"version,omitempty"`  // sync: Version every entry carries (0: re-hash each time)
	Compress bool   `json:"compress,omitempty"` // sync: ask donors to zstd-compress
	Profile  string `json:"profile,omitempty"`  // sync: write a CPU profile of the call to this file
}

// peerEvent is every line a peer prints. Times are wall-clock Unix nanoseconds: every process shares
// the machine's clock.
type peerEvent struct {
	Event   string `json:"event"` // "ready", "connected", "admitted", "synced", "digest", "zeroed", "error"
	ID      uint64 `json:"id,omitempty"`
	World   int    `json:"world,omitempty"`
	StartNs int64  `json:"start_ns,omitempty"` // when the call began
	EndNs   int64  `json:"end_ns,omitempty"`   // when it returned
	// synced: what the sync fetched, and when its first and last fetched range had fully arrived.
	Fetched      int64  `json:"fetched,omitempty"`
	FirstRangeNs int64  `json:"first_range_ns,omitempty"`
	LastRangeNs  int64  `json:"last_range_ns,omitempty"`
	Revision     uint64 `json:"revision,omitempty"`
	Digest       string `json:"digest,omitempty"` // digest: hash over every entry's freshly computed hash
	Usage        *usage `json:"usage,omitempty"`  // synced: what the process used during the call
	Detail       string `json:"detail,omitempty"`
}

func emit(ev peerEvent) { cluster.Emit(ev) }

func fail(format string, args ...any) int {
	emit(peerEvent{Event: "error", Detail: fmt.Sprintf(format, args...)})
	return 1
}

// entryName returns the name of entry i; zero-padded so that the names sort in index order.
func entryName(i int) string { return fmt.Sprintf("layer%03d.weight", i) }

// newState allocates the state: entries f32 entries over bytes bytes in all (the last one takes the
// remainder). Every byte is written, so no page is faulted in later: the common fill is a
// deterministic function of the entry and the element index, small values like a model's weights; a
// newcomer's entries are zeros.
func newState(p params) (*sharedstate.State, error) {
	st := sharedstate.NewState()
	per := p.Bytes / p.Entries / 4 * 4
	for i := range p.Entries {
		n := per
		if i == p.Entries-1 {
			n = p.Bytes - per*(p.Entries-1)
		}
		data := make([]byte, n)
		if p.Zero {
			for j := 0; j < len(data); j += 4096 {
				data[j] = 0
			}
		} else {
			fillEntry(data, uint32(i))
		}
		if p.Warm {
			if err := kernelWarm(data); err != nil {
				return nil, err
			}
		}
		if err := st.Add(&sharedstate.Entry{Name: entryName(i), DType: pccl.F32, Data: data}); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// fillEntry writes uniform floats in [-1/16, 1/16) drawn from a xorshift stream seeded by seed.
func fillEntry(data []byte, seed uint32) {
	x := seed*2654435761 + 0x9e3779b9
	for j := 0; j+4 <= len(data); j += 4 {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		v := float32(int32(x>>8)-(1<<23)) / (1 << 27)
		binary.LittleEndian.PutUint32(data[j:], math.Float32bits(v))
	}
}

// stateDigest re-hashes every entry (whatever their Version says) and returns the hash of the list of
// entry hashes, in hex.
func stateDigest(st *sharedstate.State) string {
	datas := make([][]byte, len(st.Entries))
	for i, e := range st.Entries {
		datas[i] = e.Data
	}
	var list []byte
	for _, h := range sharedstate.HashAll(datas, hashWorker) {
		list = binary.LittleEndian.AppendUint64(list, h)
	}
	return strconv.FormatUint(sharedstate.Hash(list), 16)
}

// waitUntil sleeps until the wall-clock instant ns (Unix nanoseconds), if it lies ahead.
func waitUntil(ns int64) {
	if d := time.Until(time.Unix(0, ns)); d > 0 {
		time.Sleep(d)
	}
}

// peerMain is the peer role: it builds its state, joins the run and then does what the parent's
// commands say, one at a time.
func peerMain() int {
	var p params
	if err := json.Unmarshal([]byte(os.Getenv(envParams)), &p); err != nil {
		return fail("%s: %v", envParams, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.Lifetime)
	defer cancel()
	st, err := newState(p)
	if err != nil {
		return fail("state: %v", err)
	}
	emit(peerEvent{Event: "ready"})
	cfg := pccl.LAN()
	cfg.Master = os.Getenv(envMaster)
	cfg.Logger = cluster.Logger()
	comm, err := pccl.Connect(ctx, cfg)
	if err != nil {
		return fail("connect: %v", err)
	}
	defer comm.Close()
	emit(peerEvent{Event: "connected", ID: comm.ID(), World: comm.WorldSize(), EndNs: time.Now().UnixNano()})
	for {
		var raw json.RawMessage
		select {
		case raw = <-cluster.Inbox():
		case <-ctx.Done():
			return fail("lifetime of %v over", p.Lifetime)
		}
		var cmd command
		if err := json.Unmarshal(raw, &cmd); err != nil {
			return fail("command %q: %v", raw, err)
		}
		if cmd.Cmd == "exit" {
			return 0
		}
		ev, err := runCommand(ctx, comm, st, cmd)
		if err != nil {
			return fail("%s: %v", cmd.Cmd, err)
		}
		emit(ev)
	}
}

// runCommand carries out one command and returns the event that reports it.
func runCommand(ctx context.Context, comm *pccl.Communicator, st *sharedstate.State, cmd command) (peerEvent, error) {
	waitUntil(cmd.StartNs)
	switch cmd.Cmd {
	case "admit":
		t0 := time.Now()
		pending, err := comm.ArePeersPending(ctx)
		if err == nil && pending {
			err = comm.UpdateTopology(ctx)
		}
		return peerEvent{Event: "admitted", World: comm.WorldSize(), StartNs: t0.UnixNano(), EndNs: time.Now().UnixNano()}, err
	case "sync":
		st.Revision = cmd.Revision
		for _, e := range st.Entries {
			e.Version = cmd.Version
		}
		var first, last atomic.Int64
		opt := pccl.SyncOptions{HashWorkers: hashWorker, Compress: cmd.Compress, Progress: func(done, total int64) {
			now := time.Now().UnixNano()
			first.CompareAndSwap(0, now)
			last.Store(now)
		}}
		if cmd.Profile != "" {
			f, err := os.Create(cmd.Profile)
			if err != nil {
				return peerEvent{}, err
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return peerEvent{}, err
			}
		}
		u0, t0 := selfUsage(), time.Now()
		res, err := comm.SyncSharedState(ctx, st, opt)
		t1, u1 := time.Now(), selfUsage()
		if cmd.Profile != "" {
			pprof.StopCPUProfile()
		}
		if err != nil {
			return peerEvent{}, err
		}
		return peerEvent{Event: "synced", StartNs: t0.UnixNano(), EndNs: t1.UnixNano(), Fetched: res.FetchedBytes,
			FirstRangeNs: first.Load(), LastRangeNs: last.Load(), Revision: res.Revision, World: comm.WorldSize(),
			Usage: &usage{UserSeconds: u1.UserSeconds - u0.UserSeconds, SysSeconds: u1.SysSeconds - u0.SysSeconds,
				MinorFaults: u1.MinorFaults - u0.MinorFaults}}, nil
	case "digest":
		return peerEvent{Event: "digest", Digest: stateDigest(st), Revision: st.Revision}, nil
	case "zero":
		// The state of a newcomer again, in the same buffers: the next sync fetches all of it.
		for _, e := range st.Entries {
			clear(e.Data)
		}
		return peerEvent{Event: "zeroed"}, nil
	}
	return peerEvent{}, errors.New("unknown command")
}
