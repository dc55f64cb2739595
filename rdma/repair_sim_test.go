package rdma_test

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/sim"
	"github.com/concord-ccl/concord/rings"
)

// Simulated scenario parameters: 4 nodes × 4 NICs, 64 Ki float32 elements, 4 KiB chunks. Each
// channel's path carries 2 × 3 blocks of 4 chunks: 24 chunks.
const (
	scNodes  = 4
	scNICs   = 4
	scCount  = 64 << 10
	scChunk  = 4096
	scFrames = 24
)

func scConfig() rdma.Config {
	return rdma.Config{ChunkBytes: scChunk, Repair: rdma.RepairConfig{MinAckTimeout: 40 * time.Microsecond,
		ProbeTimeout: 20 * time.Microsecond, StallTimeout: 200 * time.Microsecond, ReprobeMin: 100 * time.Microsecond,
		ReprobeMax: time.Millisecond}}
}

func scInputs() [][]byte { return inputsFor(scNodes) }

func inputsFor(nodes int) [][]byte { return randomInputs(rand.New(rand.NewPCG(7, 8)), nodes, scCount) }

// healthyResult is the AllReduce result without failures.
func healthyResult(t *testing.T) []byte { return healthyResultOf(t, scNodes) }

func healthyResultOf(t *testing.T, nodes int) []byte {
	t.Helper()
	c := newCluster(t, nodes, scNICs, scConfig())
	out, errs := c.allReduce(t, inputsFor(nodes), rings.F32, rings.Sum)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("healthy run, node %d: %v", i, err)
		}
	}
	for i := range out {
		if !bytes.Equal(out[i], out[0]) {
			t.Fatalf("healthy run: node %d differs from node 0", i)
		}
	}
	return out[0]
}

type injection struct {
	t sim.Trigger
	f sim.Fault
}

// report is what a scenario measured: detect runs from the fault until the last affected node knew of
// it (both ends of every affected path), repair from then until the last affected path resumed.
type report struct {
	detect, repair time.Duration
	retransmitted  int64
	paths          int
	failovers      int
}

// runFaulty runs the AllReduce with the injections and checks every element of every node's result
// against want, and the retransmission bound.
func runFaulty(t *testing.T, want []byte, inj ...injection) report {
	t.Helper()
	return runFaultyOn(t, scNodes, want, inj...)
}

func runFaultyOn(t *testing.T, nodes int, want []byte, inj ...injection) report {
	t.Helper()
	c := newCluster(t, nodes, scNICs, scConfig())
	for _, in := range inj {
		c.net.Inject(in.t, in.f)
	}
	out, errs := c.allReduce(t, inputsFor(nodes), rings.F32, rings.Sum)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v\n%v", c.ring[i], err, c.nodes[i].Stats().Notes)
		}
	}
	for i := range out {
		if !bytes.Equal(out[i], want) {
			g, w := rings.View[float32](out[i]), rings.View[float32](want)
			for j := range g {
				if g[j] != w[j] {
					t.Fatalf("node %d element %d: %v, healthy run %v", c.ring[i], j, g[j], w[j])
				}
			}
		}
	}
	var r report
	struck := c.net.Struck()
	var detect, resume time.Duration = -1, -1
	for _, n := range c.nodes {
		s := n.Stats()
		r.retransmitted += s.RetransmittedBytes
		r.paths += len(s.AffectedPaths)
		r.failovers += s.Failovers
		start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		// The last node to learn of the failure, and the last to resume, bound the times from above.
		if !s.FirstDetect.IsZero() {
			detect = max(detect, s.FirstDetect.Sub(start))
		}
		if !s.FirstResume.IsZero() {
			resume = max(resume, s.FirstResume.Sub(start))
		}
	}
	if len(struck) > 0 && detect >= 0 {
		r.detect = detect - struck[0]
		if resume >= 0 {
			r.repair = resume - detect
		}
	}
	// Each failover of a path resends at most the window (2 chunks) of that path.
	if limit := int64(2*scChunk) * int64(max(r.failovers, 1)); r.retransmitted > limit {
		t.Errorf("retransmitted %d bytes in %d failovers, more than 2 chunks each", r.retransmitted, r.failovers)
	}
	return r
}

func (r report) log(t *testing.T, name string) {
	t.Logf("%s: detect %v, repair %v, %d failovers on %d paths, retransmitted %d bytes (chunk %d)",
		name, r.detect, r.repair, r.failovers, r.paths, r.retransmitted, scChunk)
}

func TestFailureAtEveryChunk(t *testing.T) {
	want := healthyResult(t)
	var worst report
	for _, side := range []struct {
		name string
		node rdma.NodeID
	}{{"sender-nic", 1}, {"receiver-nic", 2}} {
		for k := range uint64(scFrames) {
			r := runFaulty(t, want, injection{sim.Trigger{From: 1, To: 2, NIC: 0, Nth: k},
				sim.Fault{Kind: sim.NICDown, Node: side.node, NIC: 0}})
			if r.paths == 0 {
				t.Fatalf("%s at chunk %d: no path failed over", side.name, k)
			}
			worst.detect = max(worst.detect, r.detect)
			worst.repair = max(worst.repair, r.repair)
			worst.retransmitted = max(worst.retransmitted, r.retransmitted)
		}
	}
	t.Logf("NIC failure at every chunk, worst case: detect %v, repair %v, retransmitted %d bytes (chunk %d)",
		worst.detect, worst.repair, worst.retransmitted, scChunk)
}

func TestLinkFailureAtEveryChunk(t *testing.T) {
	want := healthyResult(t)
	var worst report
	for k := range uint64(scFrames) {
		r := runFaulty(t, want, injection{sim.Trigger{From: 1, To: 2, NIC: 0, Nth: k},
			sim.Fault{Kind: sim.LinkDown, Node: 1, NIC: 0, Peer: 2, PeerNIC: 0}})
		if r.paths == 0 {
			t.Fatalf("link at chunk %d: no path failed over", k)
		}
		worst.detect = max(worst.detect, r.detect)
		worst.repair = max(worst.repair, r.repair)
		worst.retransmitted = max(worst.retransmitted, r.retransmitted)
	}
	t.Logf("link failure at every chunk, worst case: detect %v, repair %v, retransmitted %d bytes",
		worst.detect, worst.repair, worst.retransmitted)
}

func TestReverseDirectionFailure(t *testing.T) {
	// Node 2's NIC 0 fails while node 2 sends to node 3: node 2 is the sender of one affected path and
	// the receiver of another (from node 1).
	want := healthyResult(t)
	for _, k := range []uint64{0, 7, 23} {
		runFaulty(t, want, injection{sim.Trigger{From: 2, To: 3, NIC: 0, Nth: k}, sim.Fault{Kind: sim.NICDown, Node: 2, NIC: 0}})
	}
}

func TestTwoSuccessiveFailures(t *testing.T) {
	want := healthyResult(t)
	// NIC 0 of node 1 fails; later the backup it moved to (NIC 1, the nearest) fails too.
	r := runFaulty(t, want,
		injection{sim.Trigger{From: 1, To: 2, NIC: 0, Nth: 3}, sim.Fault{Kind: sim.NICDown, Node: 1, NIC: 0}},
		injection{sim.Trigger{From: 1, To: 2, NIC: 1, Nth: 20}, sim.Fault{Kind: sim.NICDown, Node: 1, NIC: 1}})
	r.log(t, "two successive NIC failures")
	if r.paths < 2 {
		t.Errorf("%d paths failed over, want at least 2", r.paths)
	}
}

func TestFailureDuringFailover(t *testing.T) {
	want := healthyResult(t)
	// Node 2's NIC 0 fails; 3 µs later, while the failover handshake is under way, node 2's NIC 1 (the
	// backup pair's receiving end) fails too.
	r := runFaulty(t, want,
		injection{sim.Trigger{From: 1, To: 2, NIC: 0, Nth: 5}, sim.Fault{Kind: sim.NICDown, Node: 2, NIC: 0}},
		injection{sim.Trigger{From: 1, To: 2, NIC: 0, Nth: 5, Delay: 3 * time.Microsecond}, sim.Fault{Kind: sim.NICDown, Node: 2, NIC: 1}})
	r.log(t, "failure during failover")
}

func TestFlapping(t *testing.T) {
	want := healthyResult(t)
	r := runFaulty(t, want, injection{sim.Trigger{From: 1, To: 2, NIC: 0, Nth: 2},
		sim.Fault{Kind: sim.Flap, Node: 2, NIC: 0, For: 20 * time.Microsecond, Flaps: 3, Period: 60 * time.Microsecond}})
	r.log(t, "flapping")
}

func TestTwoNodesBothDirections(t *testing.T) {
	// With two nodes each link carries data both ways: fail it at every chunk of either direction. There
	// is no third node, so localization blames the link.
	want := healthyResultOf(t, 2)
	for _, dir := range [][2]rdma.NodeID{{1, 2}, {2, 1}} {
		for k := range uint64(16) {
			r := runFaultyOn(t, 2, want, injection{sim.Trigger{From: dir[0], To: dir[1], NIC: 2, Nth: k},
				sim.Fault{Kind: sim.LinkDown, Node: 1, NIC: 2, Peer: 2, PeerNIC: 2}})
			if r.paths == 0 {
				t.Fatalf("%d->%d at chunk %d: no path failed over", dir[0], dir[1], k)
			}
		}
	}
}

func TestDeterministic(t *testing.T) {
	// The same inputs and faults give the same run: the same results, protocol steps and virtual time.
	var notes [2][]string
	var took [2]time.Duration
	for i := range 2 {
		c := newCluster(t, scNodes, scNICs, scConfig())
		c.net.Inject(sim.Trigger{From: 3, To: 4, NIC: 2, Nth: 9}, sim.Fault{Kind: sim.LinkDown, Node: 3, NIC: 2, Peer: 4, PeerNIC: 2})
		c.allReduce(t, scInputs(), rings.F32, rings.Sum)
		took[i] = c.net.Now()
		for _, n := range c.nodes {
			notes[i] = append(notes[i], n.Stats().Notes...)
		}
	}
	if took[0] != took[1] || len(notes[0]) != len(notes[1]) {
		t.Fatalf("runs differ: %v and %v, %d and %d notes", took[0], took[1], len(notes[0]), len(notes[1]))
	}
	for i := range notes[0] {
		if notes[0][i] != notes[1][i] {
			t.Fatalf("note %d differs: %q, %q", i, notes[0][i], notes[1][i])
		}
	}
}
