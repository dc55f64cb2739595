package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/concord-ccl/concord/bench/internal/measure"
	supervise "github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/pccl/master"
)

// targetRecoveryRatio is the limit abort_p50_ratio and resume_p50_ratio are compared to: recovery
// at the largest group may take at most this many times as long as at the smallest.
const targetRecoveryRatio = 1.2

// peersResult is the JSON result of the recovery mode.
type peersResult struct {
	Mode           string      `json:"mode"`
	Note           string      `json:"note"`
	LoadBefore     string      `json:"loadavg_before"` // /proc/loadavg when the run began
	LoadAfter      string      `json:"loadavg_after"`
	BufferBytes    int         `json:"buffer_bytes"`
	StateBytes     int         `json:"state_bytes"`
	Kills          int         `json:"kills_per_size"`
	Sizes          []peersSize `json:"sizes"`
	AbortP50Ratio  float64     `json:"abort_p50_ratio"`
	ResumeP50Ratio float64     `json:"resume_p50_ratio"`
	RatioOf        string      `json:"ratio_of"`
	RatioLimit     float64     `json:"ratio_limit"`
	RatiosOK       bool        `json:"ratios_ok"`
	// Cores is the number of CPUs every process shares. With more peer processes than cores, each
	// peer gets a smaller share of a CPU as the group grows, so even the steady-state AllReduce slows
	// down with the number of peers; the ratios below take that out.
	Cores int `json:"cores"`
	// The same ratios for the parts: the detection after the victim's sockets closed, and the
	// protocol part of resuming (from a survivor's error to the start of its next AllReduce).
	AbortAfterGoneP50Ratio float64 `json:"abort_after_gone_p50_ratio"`
	ResumeProtocolP50Ratio float64 `json:"resume_protocol_p50_ratio"`
	// AbortOverOpRatio and ResumeOverOpRatio are the p50 in units of the steady-state AllReduce at
	// the same size (op_ms_median), at the largest size over at the smallest: whether recovery grows
	// faster with the number of peers than the machine's own pace does.
	AbortOverOpRatio  float64 `json:"abort_over_op_p50_ratio"`
	ResumeOverOpRatio float64 `json:"resume_over_op_p50_ratio"`
}

// dist is a set of samples in milliseconds with its nearest-rank percentiles (with fewer than 100
// samples p99 is the maximum).
type dist struct {
	P50     float64   `json:"p50"`
	P99     float64   `json:"p99"`
	Samples []float64 `json:"samples"`
}

func (d *dist) add(ms float64) { d.Samples = append(d.Samples, ms) }

func (d *dist) finish() {
	if len(d.Samples) > 0 {
		d.P50, d.P99 = measure.Percentile(d.Samples, 50), measure.Percentile(d.Samples, 99)
	}
}

// peersSize is the measurement at one number of peers. Every figure is in milliseconds.
type peersSize struct {
	Peers   int `json:"peers"`
	Samples int `json:"kills"` // kill rounds measured
	// Abort: from SIGKILL until every survivor's call returned an error (or, for a survivor between
	// calls, until its UpdateTopology dropped the victim).
	Abort dist `json:"abort_ms"`
	// AbortAfterGone: from the first far-end close a survivor saw (the kernel closing the victim's
	// sockets) to the last survivor's error: the part of Abort that is Concord's detection.
	AbortAfterGone dist `json:"abort_after_gone_ms"`
	// Resume: from SIGKILL until every survivor completed an AllReduce it began after its error.
	Resume dist `json:"resume_ms"`
	// ResumeProtocol: per kill, the longest time a survivor took from its error to the start of that
	// AllReduce: UpdateTopology (the master's decision and the wiring round), the pending vote and
	// the shared-state vote. ResumeData: the longest duration of that AllReduce itself.
	ResumeProtocol dist `json:"resume_protocol_ms"`
	ResumeData     dist `json:"resume_data_ms"`
	// FailedStage counts the calls survivors were in when the kill reached them.
	FailedStage map[string]int `json:"failed_stage"`
	// NewcomerStart: from spawning the replacement until it began to connect (process start-up).
	NewcomerStart dist `json:"newcomer_start_ms"`
	// Admit: from the newcomer's Connect until every member's UpdateTopology admitted it
	// (the vote and the wiring round: protocol); a member whose admitting call failed after the
	// topology changed counts from its first call that reported the whole group.
	Admit dist `json:"admit_ms"`
	// NewcomerSync: the newcomer's first SyncSharedState, which fetches the shared state (the vote
	// and the data transfer), and the bytes it fetched.
	NewcomerSync      dist  `json:"newcomer_sync_ms"`
	NewcomerSyncBytes int64 `json:"newcomer_sync_bytes"`
	// JoinResume: from the newcomer's Connect until every peer completed an AllReduce over
	// the whole group.
	JoinResume dist `json:"join_resume_ms"`
	// OpMs is the median duration of an AllReduce over the whole group in steady state.
	OpMs    float64 `json:"op_ms_median"`
	Failure string  `json:"failure,omitempty"`
}

// peerTrack is what the parent knows of one peer from its lines.
type peerTrack struct {
	proc     *supervise.Proc
	victim   bool
	events   []peerEvent
	exited   bool
	exitKind string
}

// last returns the last event of kind at or after t, and whether there is one.
func (p *peerTrack) last(kind string, t int64) (peerEvent, bool) {
	for i := len(p.events) - 1; i >= 0; i-- {
		if e := p.events[i]; e.Event == kind && e.T >= t {
			return e, true
		}
	}
	return peerEvent{}, false
}

// first returns the first event at or after t that match says is one, and whether there is one.
func (p *peerTrack) first(t int64, match func(peerEvent) bool) (peerEvent, bool) {
	for _, e := range p.events {
		if e.T >= t && match(e) {
			return e, true
		}
	}
	return peerEvent{}, false
}

// peersBench measures one size. It is used by one goroutine.
type peersBench struct {
	c       *supervise.Cluster
	n       int
	rng     *rand.Rand
	env     []string
	spawned int
	peers   map[*supervise.Proc]*peerTrack
	opMs    []float64
	res     peersSize
}

func (b *peersBench) spawn(founder bool) (*peerTrack, error) {
	env := b.env
	if founder {
		env = append(env[:len(env):len(env)], envFounder+"=1")
	}
	p, err := b.c.Spawn(supervise.Spec{Role: rolePeer, Name: fmt.Sprintf("peer-%d", b.spawned), Env: env})
	if err != nil {
		return nil, err
	}
	b.spawned++
	t := &peerTrack{proc: p}
	b.peers[p] = t
	return t, nil
}

// live returns the peers that are neither victims nor exited, in spawn order.
func (b *peersBench) live() []*peerTrack {
	var out []*peerTrack
	for _, p := range b.c.Procs() {
		if t := b.peers[p]; t != nil && !t.victim && !t.exited {
			out = append(out, t)
		}
	}
	return out
}

func (b *peersBench) handle(l supervise.Line) error {
	t := b.peers[l.Proc]
	if t == nil {
		return nil // the master
	}
	var ev peerEvent
	if err := l.Decode(&ev); err != nil || ev.Event == "" {
		return nil
	}
	t.events = append(t.events, ev)
	switch ev.Event {
	case "op_done":
		if !ev.OK {
			return fmt.Errorf("%s: wrong AllReduce result at world %d", l.Proc.Name(), ev.World)
		}
		if ev.World == b.n {
			b.opMs = append(b.opMs, float64(ev.T-ev.T0)/1e6)
		}
	case "exit", "error":
		t.exited, t.exitKind = true, ev.Kind
		if !t.victim {
			return fmt.Errorf("%s left unexpectedly: %s %s", l.Proc.Name(), ev.Event, ev.Kind)
		}
	}
	return nil
}

// until processes lines until cond holds, for at most limit; what names the wait in errors.
func (b *peersBench) until(ctx context.Context, limit time.Duration, what string, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case l, ok := <-b.c.Lines():
			if !ok {
				return errors.New("cluster closed")
			}
			if err := b.handle(l); err != nil {
				return err
			}
		case <-tick.C:
			for _, t := range b.live() {
				select {
				case <-t.proc.Done():
					return fmt.Errorf("while waiting for %s: %s exited with status %d", what, t.proc.Name(), t.proc.ExitCode())
				default:
				}
			}
		case <-ctx.Done():
			return fmt.Errorf("hang: %s did not happen within %v (%w); %s", what, limit, ctx.Err(), b.describe())
		}
	}
	return nil
}

// describe names each live peer's last event, for hang reports.
func (b *peersBench) describe() string {
	var parts []string
	for _, p := range b.live() {
		last := "nothing"
		if len(p.events) > 0 {
			e := p.events[len(p.events)-1]
			last = fmt.Sprintf("%s (world %d, stage %q, kind %q)", e.Event, e.World, e.Stage, e.Kind)
		}
		parts = append(parts, p.proc.Name()+": "+last)
	}
	return "last events: " + strings.Join(parts, "; ")
}

// drain takes in every line already read.
func (b *peersBench) drain() error {
	for {
		select {
		case l, ok := <-b.c.Lines():
			if !ok {
				return errors.New("cluster closed")
			}
			if err := b.handle(l); err != nil {
				return err
			}
		default:
			return nil
		}
	}
}

// allDoneSince waits until every live peer completed an AllReduce over the whole group after t.
func (b *peersBench) allDoneSince(ctx context.Context, limit time.Duration, t int64, what string) error {
	return b.until(ctx, limit, what, func() bool {
		live := b.live()
		if len(live) != b.n {
			return false
		}
		for _, p := range live {
			if _, ok := p.first(t, func(e peerEvent) bool { return e.Event == "op_done" && e.World == b.n && e.T0 >= t }); !ok {
				return false
			}
		}
		return true
	})
}

// waitFor scales a wait with the number of peers: a loaded machine serves 64 processes slowly.
func (b *peersBench) waitFor(base time.Duration) time.Duration {
	return base + time.Duration(b.n)*time.Second
}

// kill runs one kill round and the admission of the replacement.
func (b *peersBench) kill(ctx context.Context) error {
	if err := b.allDoneSince(ctx, b.waitFor(30*time.Second), time.Now().UnixNano(), "the whole group completing an AllReduce"); err != nil {
		return err
	}
	// Strike while AllReduce calls are in flight: after the next op_started, within the expected
	// duration of a call.
	t := time.Now().UnixNano()
	if err := b.until(ctx, b.waitFor(30*time.Second), "an AllReduce starting", func() bool {
		for _, p := range b.live() {
			if _, ok := p.last("op_started", t); ok {
				return true
			}
		}
		return false
	}); err != nil {
		return err
	}
	est := measure.Median(b.opMs[max(0, len(b.opMs)-4*b.n):])
	time.Sleep(time.Duration((0.1 + 0.5*b.rng.Float64()) * est * float64(time.Millisecond)))
	live := b.live()
	victim := live[b.rng.IntN(len(live))]
	tk := time.Now().UnixNano()
	if err := victim.proc.Kill(); err != nil {
		return err
	}
	victim.victim = true
	survivors := b.live()

	// Every survivor learns of the death: a call fails, or an UpdateTopology drops the victim.
	hit := func(p *peerTrack) (peerEvent, bool) {
		return p.first(tk, func(e peerEvent) bool {
			return e.Event == "failed" || (e.Event == "topology" && e.World < b.n)
		})
	}
	if err := b.until(ctx, b.waitFor(30*time.Second), "every survivor noticing the kill of "+victim.proc.Name(), func() bool {
		for _, p := range survivors {
			if _, ok := hit(p); !ok {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	var last, gone int64 = 0, math.MaxInt64
	for _, p := range survivors {
		e, _ := hit(p)
		last = max(last, e.T)
		if e.Gone >= tk {
			gone = min(gone, e.Gone)
		}
		stage := e.Stage
		if e.Event == "topology" {
			stage = "between calls"
		}
		b.res.FailedStage[stage]++
	}
	b.res.Abort.add(float64(last-tk) / 1e6)
	if gone != math.MaxInt64 {
		b.res.AbortAfterGone.add(float64(last-gone) / 1e6)
	}

	// Every survivor completes an AllReduce it began after noticing.
	resumed := func(p *peerTrack) (peerEvent, bool) {
		h, _ := hit(p)
		return p.first(h.T, func(e peerEvent) bool { return e.Event == "op_done" && e.T0 >= h.T && e.World == b.n-1 })
	}
	if err := b.until(ctx, b.waitFor(60*time.Second), "every survivor completing an AllReduce after the kill", func() bool {
		for _, p := range survivors {
			if _, ok := resumed(p); !ok {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	var done, protocol, data int64
	for _, p := range survivors {
		h, _ := hit(p)
		e, _ := resumed(p)
		done = max(done, e.T)
		protocol, data = max(protocol, e.T0-h.T), max(data, e.T-e.T0)
	}
	b.res.Resume.add(float64(done-tk) / 1e6)
	b.res.ResumeProtocol.add(float64(protocol) / 1e6)
	b.res.ResumeData.add(float64(data) / 1e6)
	b.res.Samples++
	progress := fmt.Sprintf("n=%d kill %d: %s; aborted after %.1f ms, resumed after %.1f ms (protocol %.1f ms, data %.1f ms)",
		b.n, b.res.Samples, victim.proc.Name(), float64(last-tk)/1e6, float64(done-tk)/1e6, float64(protocol)/1e6, float64(data)/1e6)

	// A replacement joins: admitted by the members' UpdateTopology, then it fetches the state.
	ts := time.Now().UnixNano()
	nc, err := b.spawn(false)
	if err != nil {
		return err
	}
	if err := b.until(ctx, b.waitFor(30*time.Second), nc.proc.Name()+" connecting", func() bool {
		_, ok := nc.last("connected", 0)
		return ok
	}); err != nil {
		return err
	}
	conn, _ := nc.last("connected", 0)
	tc := conn.T0 // Connect returns once the newcomer is admitted: measure from its Hello
	if err := b.allDoneSince(ctx, b.waitFor(60*time.Second), tc, "the replacement admitted and an AllReduce over the whole group"); err != nil {
		return err
	}
	var admitted, joined int64
	for _, p := range b.live() {
		if p != nc {
			// The first report of the whole group: normally the UpdateTopology that admitted the
			// newcomer, else the call that followed it.
			e, _ := p.first(tc, func(e peerEvent) bool { return e.World == b.n && e.Event != "op_started" })
			admitted = max(admitted, e.T)
		}
		e, _ := p.first(tc, func(e peerEvent) bool { return e.Event == "op_done" && e.World == b.n })
		joined = max(joined, e.T)
	}
	sync, ok := nc.first(0, func(e peerEvent) bool { return e.Event == "synced" })
	if !ok {
		return fmt.Errorf("%s completed an AllReduce without a sync", nc.proc.Name())
	}
	b.res.NewcomerStart.add(float64(tc-ts) / 1e6)
	b.res.Admit.add(float64(admitted-tc) / 1e6)
	b.res.NewcomerSync.add(float64(sync.T-sync.T0) / 1e6)
	b.res.NewcomerSyncBytes = sync.Bytes
	b.res.JoinResume.add(float64(joined-tc) / 1e6)
	fmt.Fprintf(os.Stderr, "%s; newcomer admitted after %.1f ms, synced %d bytes in %.1f ms, whole group done after %.1f ms\n",
		progress, float64(admitted-tc)/1e6, sync.Bytes, float64(sync.T-sync.T0)/1e6, float64(joined-tc)/1e6)
	return nil
}

// measureSize starts a master and n peers, runs kill rounds until kills are measured or budget is
// spent (at least one round is always tried), and stops every process.
func measureSize(ctx context.Context, n, kills int, budget time.Duration, o peersOptions, stderr io.Writer) peersSize {
	b := &peersBench{n: n, rng: rand.New(rand.NewPCG(uint64(n), 0x5ca1e)), peers: map[*supervise.Proc]*peerTrack{},
		res: peersSize{Peers: n, FailedStage: map[string]int{}}}
	b.c = supervise.New(supervise.Config{Stderr: stderr})
	err := b.measure(ctx, kills, budget, o)
	if cerr := b.c.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		b.res.Failure = err.Error()
	}
	for _, d := range []*dist{&b.res.Abort, &b.res.AbortAfterGone, &b.res.Resume, &b.res.ResumeProtocol, &b.res.ResumeData,
		&b.res.NewcomerStart, &b.res.Admit, &b.res.NewcomerSync, &b.res.JoinResume} {
		d.finish()
	}
	if len(b.opMs) > 0 {
		b.res.OpMs = measure.Median(b.opMs)
	}
	return b.res
}

func (b *peersBench) measure(ctx context.Context, kills int, budget time.Duration, o peersOptions) error {
	_, addr, err := b.c.StartMaster(ctx, master.LAN())
	if err != nil {
		return fmt.Errorf("master: %w", err)
	}
	js, _ := json.Marshal(peerParams{Bytes: o.bytes, StateBytes: o.stateBytes, Lifetime: o.timeout + time.Minute})
	b.env = []string{envMaster + "=" + addr, envParams + "=" + string(js)}
	for range b.n {
		if _, err := b.spawn(true); err != nil {
			return err
		}
	}
	if err := b.allDoneSince(ctx, b.waitFor(60*time.Second), 0, fmt.Sprintf("all %d peers completing an AllReduce", b.n)); err != nil {
		return err
	}
	deadline := time.Now().Add(budget)
	for i := 0; i < kills && (i == 0 || time.Now().Before(deadline)); i++ {
		if err := b.kill(ctx); err != nil {
			return fmt.Errorf("kill round %d: %w", i+1, err)
		}
	}
	return nil
}

// peersOptions are the recovery mode's parameters.
type peersOptions struct {
	bytes, stateBytes int
	kills             int
	budget            time.Duration // per size
	timeout           time.Duration
}

// recovery runs the recovery mode over sizes.
func recovery(ctx context.Context, sizes []int, o peersOptions, stderr io.Writer) peersResult {
	res := peersResult{Mode: "peers", BufferBytes: o.bytes, StateBytes: o.stateBytes, Kills: o.kills,
		RatioLimit: targetRecoveryRatio, LoadBefore: loadavg(), Cores: runtime.NumCPU(),
		Note: "real peer processes on loopback on a machine shared with other work; absolute times are noisy, " +
			"the ratios compare sizes measured in the same run. Protocol parts come from the peers' own timestamps."}
	for _, n := range sizes {
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(stderr, "scale: %d peers\n", n)
		res.Sizes = append(res.Sizes, measureSize(ctx, n, o.kills, o.budget, o, stderr))
	}
	res.LoadAfter = loadavg()
	if len(res.Sizes) > 0 {
		first, last := res.Sizes[0], res.Sizes[len(res.Sizes)-1]
		res.RatioOf = fmt.Sprintf("p50 at %d peers over p50 at %d peers", last.Peers, first.Peers)
		if first.Abort.P50 > 0 {
			res.AbortP50Ratio = last.Abort.P50 / first.Abort.P50
		}
		if first.Resume.P50 > 0 {
			res.ResumeP50Ratio = last.Resume.P50 / first.Resume.P50
		}
		ratio := func(a, b float64) float64 {
			if b <= 0 {
				return 0
			}
			return a / b
		}
		res.AbortAfterGoneP50Ratio = ratio(last.AbortAfterGone.P50, first.AbortAfterGone.P50)
		res.ResumeProtocolP50Ratio = ratio(last.ResumeProtocol.P50, first.ResumeProtocol.P50)
		res.AbortOverOpRatio = ratio(ratio(last.Abort.P50, last.OpMs), ratio(first.Abort.P50, first.OpMs))
		res.ResumeOverOpRatio = ratio(ratio(last.Resume.P50, last.OpMs), ratio(first.Resume.P50, first.OpMs))
		res.RatiosOK = res.AbortP50Ratio > 0 && res.ResumeP50Ratio > 0 &&
			res.AbortP50Ratio <= targetRecoveryRatio && res.ResumeP50Ratio <= targetRecoveryRatio
		for _, s := range res.Sizes {
			if s.Failure != "" {
				res.RatiosOK = false
			}
		}
	}
	return res
}

// loadavg returns the first three fields of /proc/loadavg, or "" where there is none.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
