package sim

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/concord-ccl/concord/internal/simhook"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/sharedstate"
	"github.com/concord-ccl/concord/stress/invariant"
)

// Sizes of one step: the shared state and the three concurrent AllReduces, as in the real soak.
const (
	stateLen = 8192 // int64 elements: 64 KiB
	f32Len   = 4096 // tag 1: F32 sum
	i64Len   = 2048 // tag 2: I64 sum
	i32Len   = 4096 // tag 3: I32 max
	tagF32   = 1
	tagI64   = 2
	tagI32   = 3
)

// event is what a simulated peer reports to the supervisor; the fields are those of the real soak's
// peer lines.
type event struct {
	kind     string // connected, synced, started, step, aborted, wrong, sync_failed, session_end, error
	at       time.Time
	proc     *proc
	sess     uint64 // the communicator's id: a peer that rejoins is a new session
	world    int
	rev      uint64
	hash     uint64    // synced: hash of the state
	fetched  int       // synced: entries received
	fresh    bool      // synced: the session's first sync after joining a group
	started  time.Time // step: when its collectives started
	ring     []uint64
	ops      int    // step: collectives completed
	restored bool   // aborted: every failed buffer unchanged
	errKind  string // aborted, session_end: which error
	leak     bool   // session_end: goroutines of the session still running after Close
	detail   string
}

// breakMode is a planted bug: the way every peer, or the master, misbehaves, so that a run shows the
// soak notices (Options.Break).
type breakMode string

const (
	// breakNone plants nothing.
	breakNone breakMode = ""
	// breakStaleUpdate makes every peer apply the state update after a failed step, from the
	// restored buffers, as the real soak's --break stale-update does.
	breakStaleUpdate breakMode = "stale-update"
	// breakHearsSilent plants simhook.HearsSilent in every master: judging a group's silence, it
	// counts every peer as heard, so that on the minority side of a partition it kicks the silent
	// majority after HeartbeatTimeout instead of waiting PartitionTimeout for the cut to heal.
	breakHearsSilent breakMode = simhook.HearsSilent
)

// plantedBug says where a planted bug lives.
type plantedBug struct {
	// master: the bug is in the master's code, which checks simhook.Planted on the context of
	// Serve (the cluster starts every master with the run's planted bugs in it). Otherwise it is
	// in the soak's peer loop (session.run), which checks peerParams.brk.
	master bool
	about  string
	// caughtAs are the invariants whose violation shows the bug: the first violation of a run
	// must be one of them.
	caughtAs []string
	// classes are the fault classes its runs deal (Options.Classes); nil deals every class. A bug
	// that only a few faults can show is run with those, and with faults that churn the pool
	// around them, so that ten minutes hold enough of them.
	classes []string
}

// plantedBugs are the bugs Options.Break can plant, by name; TestPlantedBugCaught runs each. A bug
// of the master's has master set: the master's code that it breaks misbehaves when
// simhook.Planted(ctx, name) holds for the context Serve was given (hears-silent, in its tick).
var plantedBugs = map[breakMode]plantedBug{
	breakStaleUpdate: {about: "peers apply the state update of a failed step",
		caughtAs: []string{invariant.Diverged, invariant.TwoHashes}},
	breakHearsSilent: {master: true, about: "the master counts silent peers as heard, so a partition never holds its kicks back",
		caughtAs: []string{invariant.PartitionKick}, classes: []string{"partition", "kill", "leave", "clock-jump", "junk"}},
}

// proc is one simulated peer process: a host of its own on the network, running sessions (Connect,
// the training-like loop, Close) until it is told to leave or is killed. Its goroutine owns the
// session; the supervisor owns the fields below the line.
type proc struct {
	name    string // its host
	label   string // unique among the processes of a run (a restart reuses the host)
	site    int
	tr      *procTransport
	offset  atomic.Int64 // the wall clock's error in nanoseconds (clock jumps)
	rng     *rand.Rand   // owned by the process goroutine: session ids
	firstID uint64       // the id of the first session (same-identity restarts pass the old one)
	ctx     context.Context
	leave   context.CancelFunc // ends the process (after its session's Close)
	done    chan struct{}      // closed when the process goroutine has returned

	// Owned by the supervisor.
	sess         uint64    // the session in the group, 0 if none or doomed by a fault
	lastSess     uint64    // the last session id it reported
	connecting   uint64    // the id of the session it last started to connect
	doomedAt     time.Time // the last fault that doomed the session; a session that connected before is doomed too
	established  bool      // the session holds the state (it synced)
	stoppedUntil time.Time // held (SIGSTOP) until then
	holedUntil   time.Time // master link black-holed or cut one way until then
	slowUntil    time.Time // master link slowed until then
	cutOff       bool      // on the far side of a partition from the master
	leaveAt      time.Time // told to leave at
	killed       bool
	killedAt     time.Time
	exited       bool
}

// gone reports whether the process is dead or on its way out.
func (p *proc) gone() bool { return p.exited || p.killed || !p.leaveAt.IsZero() }

// healthy reports whether the process is in the group and neither frozen nor cut off.
func (p *proc) healthy() bool {
	return !p.gone() && p.sess != 0 && p.stoppedUntil.IsZero() && p.holedUntil.IsZero() && !p.cutOff
}

// peerParams is what every simulated peer runs with.
type peerParams struct {
	cfg      pccl.Config // Master, Transport, ListenAddr, ID and Site are filled in per session
	step     time.Duration
	optimize uint64 // OptimizeTopology after steps at revisions divisible by this; 0 never
	brk      breakMode
	events   chan<- event
	leakWait time.Duration // how long a session's goroutines may take to end after Close
	// begun is set once a revision was accepted: from then on a new session holds no state of the
	// run, even one that finds itself alone in the group (the first to reach a restarted master).
	begun *atomic.Bool
	// holdJoins is a virtual Unix time in nanoseconds before which no session connects: the
	// supervisor sets it at a master restart (see restartSettle).
	holdJoins *atomic.Int64
}

// run is the process: sessions until ctx ends. A session that ends because the peer was kicked or
// lost the master is followed by a new one (a clean rejoin), as in the real soak.
func (p *proc) run(pp peerParams) {
	defer close(p.done)
	id := p.firstID
	for n := 0; p.ctx.Err() == nil; n++ {
		if id == 0 {
			id = p.rng.Uint64()>>16 | 1
		}
		if wait := time.Until(time.Unix(0, pp.holdJoins.Load())); wait > 0 {
			sleepCtx(p.ctx, wait)
		}
		key := p.label + "/" + strconv.Itoa(n)
		var (
			sess    uint64
			err     error
			started bool
		)
		finished := make(chan struct{})
		go pprof.Do(p.ctx, pprof.Labels(labelSession, key), func(ctx context.Context) {
			defer close(finished)
			sess, started, err = p.session(ctx, pp, id)
		})
		<-finished
		id = 0
		if !started {
			sleepCtx(p.ctx, 100*time.Millisecond)
			continue
		}
		leak, left := goroutinesLeft(key, pp.leakWait)
		ev := event{kind: "session_end", sess: sess, errKind: errorKind(err), leak: leak}
		if err != nil {
			ev.detail = err.Error()
		}
		if leak {
			ev.detail = fmt.Sprintf("%d goroutines of the session after Close; %s", left, ev.detail)
		}
		p.emit(pp, ev)
	}
}

func (p *proc) emit(pp peerParams, ev event) {
	ev.proc = p
	if ev.at.IsZero() {
		ev.at = time.Now()
	}
	pp.events <- ev
}

// session connects with identity id, runs the loop and closes. started is false when Connect failed.
func (p *proc) session(ctx context.Context, pp peerParams, id uint64) (uint64, bool, error) {
	cfg := pp.cfg
	cfg.ID = id
	cfg.Transport = p.tr
	cfg.ListenAddr = p.name + ":0"
	hooked := simhook.WithWallOffset(ctx, func() time.Duration { return time.Duration(p.offset.Load()) })
	// The master may hold the session as a registered newcomer long before Connect returns.
	p.emit(pp, event{kind: "connecting", sess: id})
	comm, err := pccl.Connect(hooked, cfg)
	if err != nil {
		return 0, false, err
	}
	p.emit(pp, event{kind: "connected", sess: comm.ID(), world: comm.WorldSize()})
	s := &session{comm: comm, pp: pp, p: p}
	err = s.run(ctx)
	comm.Close()
	return comm.ID(), true, err
}

// session is one membership of the group, from Connect to Close. One goroutine runs it.
type session struct {
	comm *pccl.Communicator
	pp   peerParams
	p    *proc

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

// check compares the buffer of tag with the exact reduction over ring at revision rev (or, with ring
// nil, with this peer's own contributions: what a failed call must leave). It returns a description
// of the first wrong element, or "".
func (s *session) check(tag int, rev uint64, ring []uint64) string {
	if ring == nil {
		ring = []uint64{s.comm.ID()}
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
		s.params[i] = s.params[i]*3 + int64(s.f32[i%f32Len]) + s.i64[i%i64Len] + int64(s.i32[i%i32Len]) + int64(rev)
	}
}

func (s *session) emit(ev event) { s.p.emit(s.pp, ev) }

// run is the training-like loop of the real soak: pending check, sync, three concurrent AllReduces
// checked element by element, the update, and an OptimizeTopology now and then. It returns the error
// that ended the session.
func (s *session) run(ctx context.Context) error {
	c := s.comm
	s.params = make([]int64, stateLen)
	s.f32, s.i64, s.i32 = make([]float32, f32Len), make([]int64, i64Len), make([]int32, i32Len)
	s.st = sharedstate.NewState()
	if err := s.st.Add(&sharedstate.Entry{Name: "params", DType: pccl.I64, Data: pccl.Bytes(s.params)}); err != nil {
		return err
	}
	id := c.ID()
	fresh := c.WorldSize() > 1 || s.pp.begun.Load() // joined a running run: adopt its state first
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
			sleepCtx(ctx, time.Until(last.Add(s.pp.step)))
			pending, err := c.ArePeersPending(ctx)
			if err != nil {
				if !pccl.Retryable(err) {
					return err
				}
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
			s.emit(event{kind: "sync_failed", sess: id, detail: err.Error()})
			if err := rewire(err); err != nil {
				return err
			}
			continue
		}
		rev := res.Revision
		s.emit(event{kind: "synced", sess: id, rev: rev, hash: sharedstate.Hash(pccl.Bytes(s.params)), fetched: len(res.Fetched), fresh: fresh})
		fresh = false

		s.fill(rev)
		started := time.Now()
		s.emit(event{kind: "started", at: started, sess: id, rev: rev})
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
					s.emit(event{kind: "wrong", sess: id, rev: rev, ring: ring, detail: d})
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
			s.emit(event{kind: "step", sess: id, rev: rev, started: started, world: len(ring), ring: ring, ops: ok})
			if s.pp.optimize > 0 && rev%s.pp.optimize == 0 {
				t0 := time.Now()
				err := c.OptimizeTopology(ctx)
				s.emit(event{kind: "optimized", sess: id, rev: rev, started: t0, detail: fmt.Sprint(err)})
				if err != nil {
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
		if s.pp.brk == breakStaleUpdate {
			s.update(rev)
		}
		s.emit(event{kind: "aborted", sess: id, rev: rev, ops: ok, restored: restored, errKind: errorKind(first),
			detail: strings.TrimSuffix(first.Error()+"; "+detail, "; ")})
		if !pccl.Retryable(first) {
			if sessionOver(first) {
				return first
			}
			s.emit(event{kind: "error", sess: id, rev: rev, detail: "unexpected: " + first.Error()})
			return first
		}
		if err := rewire(first); err != nil {
			return err
		}
	}
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
		{errDead, "dead"},
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

// goroutinesLeft waits up to limit for the goroutines labelled with session key to end, and reports
// whether some were still running then, and how many.
func goroutinesLeft(key string, limit time.Duration) (bool, int) {
	deadline := time.Now().Add(limit)
	for {
		n := countLabelled(labelSession, key)
		if n == 0 {
			return false, 0
		}
		if !time.Now().Before(deadline) {
			return true, n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// countLabelled counts the goroutines whose pprof label key has value, from the goroutine profile.
func countLabelled(key, value string) int {
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
		return -1
	}
	want := strconv.Quote(key) + ":" + strconv.Quote(value)
	n, count := 0, 0
	sc := bufio.NewScanner(&b)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if c, _, ok := strings.Cut(line, " @ "); ok {
			count, _ = strconv.Atoi(c)
			continue
		}
		if strings.HasPrefix(line, "# labels: ") && strings.Contains(line, want) {
			n += count
		}
	}
	return n
}
