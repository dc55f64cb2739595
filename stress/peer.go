package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/sharedstate"
)

// Environment of the peer role.
const (
	rolePeer = "peer"
	envPeer  = "CONCORD_STRESS_PEER"
	// envBreak makes the peer misbehave the way a bug would, so that a run can show the soak notices.
	// "stale-update": after a failed step, apply the state update anyway, from the restored buffers.
	envBreak = "CONCORD_STRESS_BREAK"
)

// Sizes of one step: the shared state and the three concurrent AllReduces (16 KiB each).
const (
	stateLen  = 8192 // int64 elements: 64 KiB
	f32Len    = 4096 // tag 1: F32 sum
	i64Len    = 2048 // tag 2: I64 sum
	i32Len    = 4096 // tag 3: I32 max
	tagF32    = 1
	tagI64    = 2
	tagI32    = 3
	stepEvery = 100 * time.Millisecond
)

// peerParams is what the supervisor tells every peer, as JSON in envPeer.
type peerParams struct {
	Master        string        `json:"master"`         // the address of this peer's relay to the master
	LinkRelay     string        `json:"link_relay"`     // the address of this peer's relay to other peers
	Progress      time.Duration `json:"progress"`       // pccl.Config.ProgressTimeout
	Lifetime      time.Duration `json:"lifetime"`       // hard bound on the process's life
	OptimizeEvery uint64        `json:"optimize_every"` // OptimizeTopology after steps at revisions divisible by this; 0 never
	Gossip        string        `json:"gossip"`         // the master's gossip address to join (pccl.Config.GossipJoin); "" none
	Begun         bool          `json:"begun"`          // the run had accepted a revision when the peer started
}

// peerEvent is every line a peer prints. T is wall-clock Unix nanoseconds: all processes share the
// machine's clock. Sess is the communicator's id: a peer that rejoins is a new session.
type peerEvent struct {
	Event    string   `json:"event"` // connected, synced, started, step, aborted, wrong, sync_failed, session_end, error
	T        int64    `json:"t"`
	Sess     uint64   `json:"sess,omitempty"`
	Rev      uint64   `json:"rev,omitempty"`
	Hash     string   `json:"hash,omitempty"`    // synced: hash of the state
	Fetched  int      `json:"fetched,omitempty"` // synced: entries received
	Fresh    bool     `json:"fresh,omitempty"`   // synced: the session's first sync after joining a group
	Started  int64    `json:"started,omitempty"` // step: when its collectives started
	World    int      `json:"world,omitempty"`
	Ring     []uint64 `json:"ring,omitempty"`
	Addr     string   `json:"addr,omitempty"`     // connected: where the session's neighbours dial it
	Ops      int      `json:"ops,omitempty"`      // step: collectives completed
	Restored bool     `json:"restored,omitempty"` // aborted: every failed buffer unchanged
	Kind     string   `json:"kind,omitempty"`     // aborted, session_end: which error
	Leak     bool     `json:"leak,omitempty"`     // session_end: goroutines above the baseline after Close
	Detail   string   `json:"detail,omitempty"`
}

func emitEvent(ev peerEvent) {
	if ev.T == 0 {
		ev.T = time.Now().UnixNano()
	}
	cluster.Emit(ev)
}

// leaveGrace is how long a peer told to leave lets its calls end by their context before it closes
// its communicator.
const leaveGrace = 2 * time.Second

// peerCommand is what the supervisor sends a peer on stdin.
type peerCommand struct {
	// "leave": close the communicator and exit; "begun": the run accepted its first revision, so
	// every later session of this peer joins a run whose state it lacks.
	Cmd string `json:"cmd"`
}

// errorKind names the sentinel error err wraps.
func errorKind(err error) string {
	for _, k := range []struct {
		err  error
		name string
	}{
		{pccl.ErrPeerLeft, "peer_left"}, {pccl.ErrAborted, "aborted"}, {pccl.ErrTooFewPeers, "too_few_peers"},
		{pccl.ErrKicked, "kicked"}, {pccl.ErrClosed, "closed"}, {pccl.ErrMasterLost, "master_lost"},
		{pccl.ErrDescriptorMismatch, "mismatch"}, {pccl.ErrBusy, "busy"}, {pccl.ErrSync, "sync"},
		{pccl.ErrInvalid, "invalid"}, {context.Canceled, "canceled"}, {context.DeadlineExceeded, "deadline"},
	} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return "other"
}

// sessionOver reports whether err ends this membership (the peer then rejoins as a new one).
func sessionOver(err error) bool {
	return errors.Is(err, pccl.ErrKicked) || errors.Is(err, pccl.ErrMasterLost) || errors.Is(err, pccl.ErrClosed) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// peerMain is the peer role: training-like sessions until told to leave. A session that ends because
// the peer was kicked or lost the master is followed by a new one (a clean rejoin).
func peerMain() int {
	var p peerParams
	if err := json.Unmarshal([]byte(os.Getenv(envPeer)), &p); err != nil {
		emitEvent(peerEvent{Event: "error", Detail: fmt.Sprintf("%s: %v", envPeer, err)})
		return 1
	}
	life, cancelLife := context.WithTimeout(context.Background(), p.Lifetime)
	defer cancelLife()
	ctx, leave := context.WithCancel(life)
	defer leave()
	begun := new(atomic.Bool)
	begun.Store(p.Begun)
	go func() {
		for raw := range cluster.Inbox() {
			var c peerCommand
			if json.Unmarshal(raw, &c) != nil {
				continue
			}
			switch c.Cmd {
			case "leave":
				leave()
			case "begun":
				begun.Store(true)
			}
		}
	}()
	brk := os.Getenv(envBreak)
	for ctx.Err() == nil {
		baseline := runtime.NumGoroutine()
		tr := &linkDialer{Transport: pccl.NewTCP(pccl.TCPConfig{}), relay: p.LinkRelay, master: p.Master}
		var trans pccl.Transport = tr
		if q, err := peerTransport(); err != nil {
			emitEvent(peerEvent{Event: "error", Detail: fmt.Sprintf("transport: %v", err)})
			return 1
		} else if q != nil {
			// Straight to the other peers: no link relay over QUIC. The listener is still recorded,
			// for the junk sent to this peer's port.
			tr = &linkDialer{Transport: q, master: p.Master}
			trans = tr
		}
		cfg := pccl.Config{Master: p.Master, Logger: cluster.Logger(), Transport: trans, ProgressTimeout: p.Progress}
		if p.Gossip != "" {
			cfg.GossipJoin = p.Gossip
			cfg.Gossip = pccl.GossipLAN()
			cfg.Gossip.BindAddr = net.JoinHostPort(localIPFor(p.Gossip), "0")
		}
		comm, err := pccl.Connect(ctx, cfg)
		if err != nil {
			if ctx.Err() == nil {
				time.Sleep(100 * time.Millisecond)
			}
			continue
		}
		emitEvent(peerEvent{Event: "connected", Sess: comm.ID(), World: comm.WorldSize(), Addr: tr.listening()})
		// Told to leave while the master cannot be reached, the session's calls wait for its verdict:
		// the communicator is closed after leaveGrace, which fails them at once.
		stop := comm.CloseAfter(ctx, leaveGrace)
		s := &session{comm: comm, p: p, brk: brk, begun: begun}
		err = s.run(ctx)
		stop()
		comm.Close()
		leak, n := goroutinesAbove(baseline, 3*time.Second)
		ev := peerEvent{Event: "session_end", Sess: comm.ID(), Kind: errorKind(err), Leak: leak}
		if err != nil {
			ev.Detail = err.Error()
		}
		if leak {
			ev.Detail = fmt.Sprintf("%d goroutines after Close, %d before Connect; %s", n, baseline, ev.Detail)
		}
		emitEvent(ev)
	}
	return 0
}

// localIPFor returns this host's address on the route to addr (its gossip member binds there, where
// the master's reaches it), or loopback.
func localIPFor(addr string) string {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return "127.0.0.1"
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).IP.String()
}

// goroutinesAbove waits up to limit for the goroutine count to come back to baseline and reports
// whether it stayed above, with the last count.
func goroutinesAbove(baseline int, limit time.Duration) (bool, int) {
	deadline := time.Now().Add(limit)
	for {
		n := runtime.NumGoroutine()
		if n <= baseline {
			return false, n
		}
		if time.Now().After(deadline) {
			return true, n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// session is one membership of the group, from Connect to Close. One goroutine runs it.
type session struct {
	comm *pccl.Communicator
	p    peerParams
	brk  string
	// begun is set once the run accepted a revision: from then on a new session holds none of the
	// run's state, even one that finds itself alone in the group (the first to reach a restarted
	// master, before the run's peers report to it).
	begun *atomic.Bool

	params []int64 // the shared state (entry "params")
	st     *pccl.State
	f32    []float32
	i64    []int64
	i32    []int32
}

// Contributions of peer id at revision rev: small integers, so that every sum is exact.
func contribF32(id, rev uint64, i int) float32 {
	return float32((id*31 + rev*7 + uint64(i)) % 1024)
}

func contribI64(id, rev uint64, i int) int64 {
	return int64((id*0x9e3779b97f4a7c15 ^ rev*0xbf58476d1ce4e5b9 ^ uint64(i)*0x94d049bb133111eb) >> 24)
}

func contribI32(id, rev uint64, i int) int32 {
	return int32((id*131 + rev*17 + uint64(i)*7) % 100003)
}

// fill writes this peer's contributions for revision rev.
func (s *session) fill(rev uint64) {
	id := s.comm.ID()
	for i := range s.f32 {
		s.f32[i] = contribF32(id, rev, i)
	}
	for i := range s.i64 {
		s.i64[i] = contribI64(id, rev, i)
	}
	for i := range s.i32 {
		s.i32[i] = contribI32(id, rev, i)
	}
}

// check compares the buffer of tag with the exact reduction over ring at revision rev (or, with
// ring nil, with this peer's own contributions: what a failed call must leave). It returns a
// description of the first wrong element, or "".
func (s *session) check(tag int, rev uint64, ring []uint64) string {
	own := []uint64{s.comm.ID()}
	if ring == nil {
		ring = own
	}
	switch tag {
	case tagF32:
		for i, v := range s.f32 {
			var want float32
			for _, id := range ring {
				want += contribF32(id, rev, i)
			}
			if v != want {
				return fmt.Sprintf("tag %d element %d: %v, want %v (ring %v)", tag, i, v, want, ring)
			}
		}
	case tagI64:
		for i, v := range s.i64 {
			var want int64
			for _, id := range ring {
				want += contribI64(id, rev, i)
			}
			if v != want {
				return fmt.Sprintf("tag %d element %d: %d, want %d (ring %v)", tag, i, v, want, ring)
			}
		}
	case tagI32:
		for i, v := range s.i32 {
			want := int32(-1 << 31)
			for _, id := range ring {
				want = max(want, contribI32(id, rev, i))
			}
			if v != want {
				return fmt.Sprintf("tag %d element %d: %d, want %d (ring %v)", tag, i, v, want, ring)
			}
		}
	}
	return ""
}

// update advances the shared state from the reduced results of revision rev: the same on every peer
// that holds the same results.
func (s *session) update(rev uint64) {
	for i := range s.params {
		x := s.params[i]*3 + int64(s.f32[i%f32Len]) + s.i64[i%i64Len] + int64(s.i32[i%i32Len]) + int64(rev)
		s.params[i] = x
	}
}

func (s *session) stateHash() string {
	return strconv.FormatUint(sharedstate.Hash(pccl.Bytes(s.params)), 16)
}

// run is the training-like loop. It returns the error that ended the session (nil never: the loop
// runs until the session ends).
func (s *session) run(ctx context.Context) error {
	c := s.comm
	s.params = make([]int64, stateLen)
	s.f32, s.i64, s.i32 = make([]float32, f32Len), make([]int64, i64Len), make([]int32, i32Len)
	s.st = sharedstate.NewState()
	if err := s.st.Add(&sharedstate.Entry{Name: "params", DType: pccl.I64, Data: pccl.Bytes(s.params)}); err != nil {
		return err
	}
	id := c.ID()
	fresh := c.WorldSize() > 1 || s.begun.Load() // joined a running run: adopt its state first
	// A newcomer enters the loop at the sync, where the peers that admitted it are headed; so does
	// every peer right after an UpdateTopology or OptimizeTopology (either may have admitted someone).
	atSync := fresh
	var last time.Time
	rewire := func(err error) error {
		if errors.Is(err, pccl.ErrTooFewPeers) {
			sleepCtx(ctx, 50*time.Millisecond)
		}
		if err := c.UpdateTopology(ctx); err != nil {
			return err
		}
		atSync = true
		return nil
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !atSync {
			sleepCtx(ctx, time.Until(last.Add(stepEvery)))
			pending, err := c.ArePeersPending(ctx)
			if err != nil {
				if !pccl.Retryable(err) {
					return err
				}
				// The master restarted under this peer: wait until it is wired in again.
				if err := rewire(err); err != nil {
					return err
				}
				continue
			}
			if pending {
				if err := c.UpdateTopology(ctx); err != nil {
					return err
				}
			}
		}
		atSync = false
		if c.WorldSize() < 2 {
			// Alone: wait for a peer to join.
			sleepCtx(ctx, 50*time.Millisecond)
			if err := c.UpdateTopology(ctx); err != nil {
				return err
			}
			atSync = true
			continue
		}
		last = time.Now()
		s.st.Revision++
		strategy := pccl.EnforcePopular
		if fresh {
			strategy = pccl.ReceiveOnly
		}
		res, err := c.SyncSharedState(ctx, s.st, pccl.SyncOptions{Strategy: strategy, HashWorkers: 1})
		if err != nil {
			s.st.Revision-- // not accepted: the next sync proposes the same revision
			if !errors.Is(err, pccl.ErrSync) && !pccl.Retryable(err) {
				return err
			}
			emitEvent(peerEvent{Event: "sync_failed", Sess: id, Detail: err.Error()})
			if err := rewire(err); err != nil {
				return err
			}
			continue
		}
		rev := res.Revision
		emitEvent(peerEvent{Event: "synced", Sess: id, Rev: rev, Hash: s.stateHash(), Fetched: len(res.Fetched), Fresh: fresh})
		fresh = false
		s.begun.Store(true)

		s.fill(rev)
		started := time.Now()
		emitEvent(peerEvent{Event: "started", T: started.UnixNano(), Sess: id, Rev: rev})
		reqs := []*pccl.Request{
			c.AllReduceAsync(ctx, pccl.Bytes(s.f32), pccl.Bytes(s.f32), pccl.Desc{Tag: tagF32, Count: f32Len, DType: pccl.F32, Op: pccl.Sum}),
			c.AllReduceAsync(ctx, pccl.Bytes(s.i64), pccl.Bytes(s.i64), pccl.Desc{Tag: tagI64, Count: i64Len, DType: pccl.I64, Op: pccl.Sum}),
			c.AllReduceAsync(ctx, pccl.Bytes(s.i32), pccl.Bytes(s.i32), pccl.Desc{Tag: tagI32, Count: i32Len, DType: pccl.I32, Op: pccl.Max}),
		}
		ring := c.Ring() // the ring only changes in UpdateTopology and OptimizeTopology
		var first error
		restored, ok := true, 0
		detail := ""
		for k, r := range reqs {
			tag := k + 1
			err := r.Wait()
			if err == nil {
				ok++
				if d := s.check(tag, rev, ring); d != "" {
					emitEvent(peerEvent{Event: "wrong", Sess: id, Rev: rev, Ring: ring, Detail: d})
				}
				continue
			}
			if first == nil {
				first = err
			}
			if d := s.check(tag, rev, nil); d != "" {
				restored, detail = false, d
			}
		}
		if first == nil {
			s.update(rev)
			emitEvent(peerEvent{Event: "step", Sess: id, Rev: rev, Started: started.UnixNano(), World: len(ring), Ring: ring, Ops: ok})
			if s.p.OptimizeEvery > 0 && rev%s.p.OptimizeEvery == 0 {
				if err := c.OptimizeTopology(ctx); err != nil {
					if !pccl.Retryable(err) {
						return err
					}
					if err := rewire(err); err != nil {
						return err
					}
				}
				atSync = true
			}
			continue
		}
		if s.brk == "stale-update" {
			s.update(rev)
		}
		emitEvent(peerEvent{Event: "aborted", Sess: id, Rev: rev, Ops: ok, Restored: restored, Kind: errorKind(first),
			Detail: strings.TrimSuffix(first.Error()+"; "+detail, "; ")})
		if !pccl.Retryable(first) {
			if sessionOver(first) {
				return first
			}
			emitEvent(peerEvent{Event: "error", Sess: id, Rev: rev, Detail: "unexpected: " + first.Error()})
			return first
		}
		if err := rewire(first); err != nil {
			return err
		}
	}
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// linkDialer is a soak peer's Transport: connections to other peers leave through the supervisor's
// link relay for this peer, each announcing its destination in a first line, so that the supervisor
// can black-hole or slow the route to one neighbour while the peer still reaches the master and
// everyone else. The connection to the master goes straight to its own relay.
type linkDialer struct {
	pccl.Transport
	relay, master string

	mu   sync.Mutex
	addr string // the address of the last listener opened
}

// Listen records the address the communicator's neighbours will dial.
func (t *linkDialer) Listen(addr string) (net.Listener, error) {
	ln, err := t.Transport.Listen(addr)
	if err == nil {
		t.mu.Lock()
		t.addr = ln.Addr().String()
		t.mu.Unlock()
	}
	return ln, err
}

func (t *linkDialer) listening() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.addr
}

// Dial connects to addr through the link relay, unless addr is the master's.
func (t *linkDialer) Dial(ctx context.Context, addr string) (net.Conn, error) {
	if t.relay == "" || addr == t.master {
		return t.Transport.Dial(ctx, addr)
	}
	c, err := t.Transport.Dial(ctx, t.relay)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetWriteDeadline(dl)
	}
	if _, err := io.WriteString(c, addr+"\n"); err != nil {
		c.Close()
		return nil, fmt.Errorf("link relay: %w", err)
	}
	c.SetWriteDeadline(time.Time{})
	return c, nil
}
