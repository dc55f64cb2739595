package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	supervise "github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl/master"
)

func TestMain(m *testing.M) {
	supervise.Main(roles)
	os.Exit(m.Run())
}

// TestSimulatedProtocol drives the master with 50 simulated peers and checks the protocol's outcomes,
// not timings: every peer accepted into one ring, every collective completed with every peer's Done
// counted and an Outcome ok for each, a death mid-collective aborted for every survivor and repaired
// by one wiring round, and a silent peer declared gone by the heartbeat deadline.
func TestSimulatedProtocol(t *testing.T) {
	const n = 50
	c := newCluster()
	c.join("hello", n, false)
	c.link("links_ready")
	c.updateTopology()
	s := c.m.Snapshot(c.now)
	if len(s.Ring) != n || len(s.Peers) != n {
		t.Fatalf("after the admission: ring of %d, %d peers; want %d and %d", len(s.Ring), len(s.Peers), n, n)
	}
	for _, p := range s.Peers {
		if p.State != master.Accepted {
			t.Fatalf("peer %d is %v, want accepted", p.ID, p.State)
		}
	}
	for _, p := range c.peers {
		if !p.accepted || p.id != master.PeerID(p.conn) {
			t.Fatalf("connection %d: accepted %v id %d, want accepted under id %d", p.conn, p.accepted, p.id, p.conn)
		}
	}

	for i := range 3 {
		c.cycle(uint64(i + 1))
	}
	s = c.m.Snapshot(c.now)
	if c.tally.outcomes[wire.CodeOK] != 3*n || c.tally.commences != 3*n || s.Counters.OpsDone != 3 || len(s.Ops) != 0 {
		t.Fatalf("3 collectives of %d peers: %d Outcome ok, %d Commence, OpsDone %d, %d ops left; want %d, %d, 3, 0",
			n, c.tally.outcomes[wire.CodeOK], c.tally.commences, s.Counters.OpsDone, len(s.Ops), 3*n, 3*n)
	}
	if c.tally.pending != 3*n || c.tally.syncCompletes != 3*n || s.Counters.Syncs != 3 {
		t.Fatalf("3 cycles: %d Pending, %d SyncComplete, Syncs %d; want %d, %d, 3", c.tally.pending, c.tally.syncCompletes, s.Counters.Syncs, 3*n, 3*n)
	}
	if c.tally.acks != 3*n || c.tally.kicks != 0 {
		t.Fatalf("3 heartbeat rounds: %d acks, %d kicks; want %d and none", c.tally.acks, c.tally.kicks, 3*n)
	}

	// Death mid-collective.
	c.batch("initiate", c.each(true, func(*simPeer) wire.Message { return &wire.Initiate{Tag: 9, Desc: wire.Desc{Count: 8}} }))
	victim := c.peers[n/2]
	epoch := c.m.Snapshot(c.now).Epoch
	c.kill("death", victim)
	if got := c.tally.outcomes[wire.CodePeerLeft]; got != n-1 {
		t.Fatalf("death: %d survivors told CodePeerLeft, want %d", got, n-1)
	}
	c.batch("done", c.each(true, func(p *simPeer) wire.Message {
		return &wire.Done{Tag: 9, Seq: p.seq, Code: wire.CodePeerLeft}
	}))
	changed := c.tally.changed
	c.updateTopology()
	s = c.m.Snapshot(c.now)
	if c.tally.changed-changed != n-1 || len(s.Ring) != n-1 || slices.Contains(s.Ring, victim.id) {
		t.Fatalf("after the death: %d changed Topology, ring %v; want %d and no peer %d", c.tally.changed-changed, s.Ring, n-1, victim.id)
	}
	if s.Epoch != epoch+1 || s.Counters.OpsAborted != 1 || len(s.Ops) != 0 {
		t.Fatalf("after the death: epoch %d (was %d), OpsAborted %d, %d ops left; want one epoch more, 1, 0", s.Epoch, epoch, s.Counters.OpsAborted, len(s.Ops))
	}
	ok := c.tally.outcomes[wire.CodeOK]
	c.collective(1)
	if got := c.tally.outcomes[wire.CodeOK] - ok; got != n-1 {
		t.Fatalf("collective on the repaired ring: %d Outcome ok, want %d", got, n-1)
	}

	// A peer goes silent: the others' heartbeats keep them, the silent one is kicked by a tick.
	silent := c.live()[0]
	timeouts := c.m.Snapshot(c.now).Counters.Timeouts
	for range 8 {
		c.now = c.now.Add(heartbeatInterval)
		var ins []master.Input
		for _, p := range c.live() {
			if p != silent {
				ins = append(ins, master.Received{Conn: p.conn, Msg: &wire.Heartbeat{Seq: 1}})
			}
		}
		ins = append(ins, master.Tick{})
		c.batch("heartbeat", ins)
	}
	s = c.m.Snapshot(c.now)
	if !silent.gone || s.Counters.Timeouts != timeouts+1 || len(s.Peers) != n-2 {
		t.Fatalf("silent peer: gone %v, Timeouts %d (was %d), %d peers; want gone, one more, %d", silent.gone, s.Counters.Timeouts, timeouts, len(s.Peers), n-2)
	}
}

// TestRunSimulatedChecks runs the measurement at a small size and checks that every protocol check
// passed and every figure was filled in.
func TestRunSimulatedChecks(t *testing.T) {
	r, err := runSimulated(50, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Checks.ok() {
		t.Fatalf("checks %+v", r.Checks)
	}
	if r.Events == 0 || r.NsPer <= 0 || len(r.PerKind) != len(steadyKinds) {
		t.Fatalf("events %d ns/event %v kinds %d, want events, a cost and %d kinds", r.Events, r.NsPer, len(r.PerKind), len(steadyKinds))
	}
}

// TestRunPrintsJSON checks the command line: the last line on stdout is the JSON result with the
// ratio and its limit.
func TestRunPrintsJSON(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"--simulated", "60", "--cycles", "2", "--sockets", "0"}, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var res simulatedResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Sizes) != 1 || res.Sizes[0].Peers != 60 || res.RatioLimit != targetEventCostRatio || res.EventCostRatio != 1 {
		t.Fatalf("result %+v", res)
	}
}

func TestParse(t *testing.T) {
	var stderr bytes.Buffer
	o, err := parse([]string{"--peers", "4,8, 16", "--simulated", "100"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(o.peers, []int{4, 8, 16}) || o.simulated != 100 {
		t.Fatalf("options %+v", o)
	}
	for _, bad := range [][]string{{}, {"--peers", "4,x"}, {"--peers", "2"}, {"--peers", "4", "--size", "3"}, {"--peers", "4", "--kills", "0"}, {"--simulated", "-1"}} {
		if _, err := parse(bad, &stderr); err == nil {
			t.Errorf("parse(%q) accepted", bad)
		}
	}
	if got := sizesUpTo(10000); !slices.Equal(got, []int{100, 1000, 10000}) {
		t.Errorf("sizesUpTo(10000) = %v", got)
	}
	if got := sizesUpTo(2500); !slices.Equal(got, []int{100, 1000, 2500}) {
		t.Errorf("sizesUpTo(2500) = %v", got)
	}
}

// TestLoopback serves a few simulated peers over loopback through the real server and checks that
// every stage completed, and that nothing is left running.
func TestLoopback(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := loopbackSize(ctx, 12, 2)
	if err != nil {
		t.Fatal(err)
	}
	if s.Peers != 12 || s.AdmitMs <= 0 || s.CollectiveMs <= 0 || s.HeartbeatMs <= 0 || s.EventsPerSec <= 0 {
		t.Fatalf("result %+v", s)
	}
}

// TestRecoveryPeers runs the recovery mode with three peer processes and one kill: every figure of
// the round is measured, the newcomer fetched the whole shared state, and nothing is left running.
func TestRecoveryPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts peer processes")
	}
	defer goleak.VerifyNone(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	o := peersOptions{bytes: 64 << 10, stateBytes: 256 << 10, kills: 1, budget: time.Minute, timeout: 2 * time.Minute}
	res := recovery(ctx, []int{3}, o, &stderr)
	if len(res.Sizes) != 1 {
		t.Fatalf("%d sizes, want 1", len(res.Sizes))
	}
	s := res.Sizes[0]
	if s.Failure != "" {
		t.Fatalf("failure: %s\n%s", s.Failure, stderr.String())
	}
	if s.Peers != 3 || s.Samples != 1 {
		t.Fatalf("peers %d, kills %d; want 3 and 1", s.Peers, s.Samples)
	}
	for name, d := range map[string]dist{"abort": s.Abort, "resume": s.Resume, "resume_protocol": s.ResumeProtocol,
		"resume_data": s.ResumeData, "admit": s.Admit, "newcomer_sync": s.NewcomerSync, "join_resume": s.JoinResume} {
		if len(d.Samples) != 1 || d.P50 <= 0 || d.P99 != d.P50 {
			t.Errorf("%s: %+v, want one positive sample", name, d)
		}
	}
	if s.NewcomerSyncBytes != int64(o.stateBytes) {
		t.Errorf("newcomer fetched %d bytes, want %d", s.NewcomerSyncBytes, o.stateBytes)
	}
	stages := 0
	for _, n := range s.FailedStage {
		stages += n
	}
	if stages != 2 {
		t.Errorf("failed stages %v, want the two survivors counted", s.FailedStage)
	}
	if res.AbortP50Ratio != 1 || res.ResumeP50Ratio != 1 || res.RatioLimit != targetRecoveryRatio {
		t.Errorf("ratios %v %v limit %v; want 1, 1 with one size", res.AbortP50Ratio, res.ResumeP50Ratio, res.RatioLimit)
	}
}

// TestVirtualRecovery runs the virtual mode at 4 and 5 peers, two kill rounds each: every round
// gives samples, the ratios are against the smallest size, and the master's CPU is measured.
func TestVirtualRecovery(t *testing.T) {
	o := options{bytes: 16 << 10, stateBytes: 64 << 10, kills: 2, seed: 3}
	res := runVirtualScale([]int{4, 5}, o, t.Logf)
	for _, s := range res.Sizes {
		if s.Failure != "" {
			t.Fatalf("%d peers: %s", s.Peers, s.Failure)
		}
		if s.Rounds == 0 || len(s.Rewired.Samples) != s.Rounds || len(s.Admit.Samples) != o.kills || len(s.Join.Samples) != o.kills {
			t.Fatalf("%d peers: %d rounds, samples %d rewired, %d admit, %d join", s.Peers, s.Rounds, len(s.Rewired.Samples),
				len(s.Admit.Samples), len(s.Join.Samples))
		}
		if s.Rewired.P50 <= 0 || s.Resume.P50 < s.Rewired.P50 {
			t.Fatalf("%d peers: rewired p50 %.1f ms, resume p50 %.1f ms: want 0 < rewired <= resume", s.Peers, s.Rewired.P50, s.Resume.P50)
		}
		if s.MasterIdleCPUMsPerS < 0 {
			t.Fatalf("%d peers: no CPU profile of the master", s.Peers)
		}
	}
	if res.Sizes[0].RewiredP50Ratio != 1 {
		t.Fatalf("the smallest size's ratio is %v, want 1", res.Sizes[0].RewiredP50Ratio)
	}
}
