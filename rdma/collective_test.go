package rdma_test

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/sim"
	"github.com/concord-ccl/concord/rings"
)

// runAll starts one operation per node and runs the network until all are done.
func (c *cluster) runAll(t testing.TB, start func(i int, n *rdma.Node, done func(error)) error) {
	t.Helper()
	c.runAllWithin(t, 100*time.Millisecond, start)
}

// runAllWithin is runAll with a limit of virtual time other than 100 ms.
func (c *cluster) runAllWithin(t testing.TB, within time.Duration, start func(i int, n *rdma.Node, done func(error)) error) {
	t.Helper()
	errs := make([]error, len(c.nodes))
	done := make([]bool, len(c.nodes))
	for i, n := range c.nodes {
		if err := start(i, n, func(err error) { errs[i], done[i] = err, true }); err != nil {
			t.Fatal(err)
		}
	}
	limit := c.net.Now() + within
	c.net.RunWhile(func() bool {
		for _, d := range done {
			if !d {
				return c.net.Now() <= limit
			}
		}
		return false
	})
	for i := range c.nodes {
		if !done[i] {
			t.Fatalf("node %d did not finish", c.ring[i])
		}
		if errs[i] != nil {
			t.Fatalf("node %d: %v", c.ring[i], errs[i])
		}
	}
}

// bothBuffers are the configurations the collective tests run under: the default (a scratch buffer,
// the result written on success) and Config.Direct (work in the result buffer).
func bothBuffers() []rdma.Config { return []rdma.Config{scConfig(), directConfig()} }

func TestAllGather(t *testing.T) {
	for _, cfg := range bothBuffers() {
		for _, fault := range []bool{false, true} {
			c := newCluster(t, 5, 3, cfg)
			if fault {
				c.net.Inject(sim.Trigger{From: 3, To: 4, NIC: 1, Nth: 2}, sim.Fault{Kind: sim.NICDown, Node: 4, NIC: 1})
			}
			in := randomInputs(rand.New(rand.NewPCG(3, 4)), 5, 6000)
			out := make([][]byte, 5)
			c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
				out[i] = make([]byte, 5*len(in[i]))
				return n.StartAllGather(in[i], out[i], rings.F32, done)
			})
			want := bytes.Join(in, nil)
			for i := range out {
				if !bytes.Equal(out[i], want) {
					t.Fatalf("direct %v, fault %v: node %d: result differs", cfg.Direct, fault, c.ring[i])
				}
			}
		}
	}
}

func TestReduceScatter(t *testing.T) {
	for _, fault := range []bool{false, true} {
		c := newCluster(t, 4, 4, scConfig())
		if fault {
			c.net.Inject(sim.Trigger{From: 2, To: 3, NIC: 2, Nth: 1}, sim.Fault{Kind: sim.LinkDown, Node: 2, NIC: 2, Peer: 3, PeerNIC: 2})
		}
		const count = 5000
		rng := rand.New(rand.NewPCG(5, 6))
		in := make([][]byte, 4)
		for i := range in {
			v := make([]int32, 4*count)
			for j := range v {
				v[j] = int32(rng.IntN(1000)) - 500
			}
			in[i] = rings.Bytes(v)
		}
		out := make([][]byte, 4)
		c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
			out[i] = make([]byte, count*4)
			return n.StartReduceScatter(in[i], out[i], rings.I32, rings.Sum, done)
		})
		for r := range out {
			got := rings.View[int32](out[r])
			for j := range got {
				var want int32
				for i := range in {
					want += rings.View[int32](in[i])[r*count+j]
				}
				if got[j] != want {
					t.Fatalf("fault %v: node %d element %d: %d, want %d", fault, c.ring[r], j, got[j], want)
				}
			}
		}
	}
}

func TestBroadcast(t *testing.T) {
	for _, cfg := range bothBuffers() {
		for _, fault := range []bool{false, true} {
			c := newCluster(t, 4, 2, cfg)
			if fault {
				c.net.Inject(sim.Trigger{From: 4, To: 1, NIC: 0, Nth: 3}, sim.Fault{Kind: sim.NICDown, Node: 4, NIC: 0})
			}
			src := randomInputs(rand.New(rand.NewPCG(9, 9)), 1, 20000)[0]
			bufs := make([][]byte, 4)
			c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
				bufs[i] = make([]byte, len(src))
				if c.ring[i] == 3 {
					copy(bufs[i], src)
				}
				return n.StartBroadcast(bufs[i], rings.F32, 3, done)
			})
			for i := range bufs {
				if !bytes.Equal(bufs[i], src) {
					t.Fatalf("direct %v, fault %v: node %d: result differs", cfg.Direct, fault, c.ring[i])
				}
			}
		}
	}
}

func TestSendRecv(t *testing.T) {
	for _, cfg := range bothBuffers() {
		for _, fault := range []bool{false, true} {
			c := newCluster(t, 6, 4, cfg)
			if fault {
				c.net.Inject(sim.Trigger{From: 1, To: 4, NIC: 3, Nth: 2}, sim.Fault{Kind: sim.NICDown, Node: 1, NIC: 3})
			}
			src := randomInputs(rand.New(rand.NewPCG(1, 1)), 1, 30000)[0]
			kept := slices.Clone(src)
			got := make([]byte, len(src))
			c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
				switch c.ring[i] {
				case 1:
					return n.StartSend(src, 4, done)
				case 4:
					return n.StartRecv(got, 1, done)
				}
				done(nil)
				return nil
			})
			if !bytes.Equal(got, kept) || !bytes.Equal(src, kept) {
				t.Fatalf("direct %v, fault %v: received data differs or the sent buffer changed", cfg.Direct, fault)
			}
			if !fault {
				// A healthy transfer fills every NIC, in proportion to bandwidth (equal here).
				for nic := range 4 {
					if b := c.net.Node(1).SentBytes(rdma.NICID(nic)); b != uint64(len(src))/4 {
						t.Errorf("NIC %d sent %d bytes, want %d", nic, b, len(src)/4)
					}
				}
			}
			// Nodes that took no part in the transfer and nodes that did still agree on the collective
			// that follows: every path numbers its own operations.
			out := make([][]byte, len(c.nodes))
			c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
				out[i] = make([]byte, 8*1000)
				v := make([]int64, 1000)
				for j := range v {
					v[j] = int64(i + j)
				}
				return n.StartAllReduce(rings.Bytes(v), out[i], rings.I64, rings.Sum, done)
			})
			for i := range out {
				for j, x := range rings.View[int64](out[i]) {
					if want := int64(15 + 6*j); x != want {
						t.Fatalf("direct %v, fault %v: AllReduce after Send/Recv: node %d element %d: %d, want %d", cfg.Direct, fault, i, j, x, want)
					}
				}
			}
		}
	}
}

func TestHealthyUsesAllNICs(t *testing.T) {
	c := newCluster(t, 4, 4, scConfig())
	_, errs := c.allReduce(t, scInputs(), rings.F32, rings.Sum)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Ring AllReduce sends 2(W-1)/W of the buffer per node, a quarter on each NIC.
	want := uint64(scCount*4) * 2 * 3 / 4 / 4
	for i, id := range c.ring {
		nicBytes := c.nodes[i].Stats().NICBytes
		for nic := range 4 {
			if b := c.net.Node(id).SentBytes(rdma.NICID(nic)); b != want {
				t.Errorf("node %d NIC %d sent %d bytes, want %d", id, nic, b, want)
			}
			// The node's own count of the data it posted, beside what the network carried.
			if b := nicBytes[nic]; uint64(b) != want {
				t.Errorf("node %d NIC %d: Stats().NICBytes %d, want %d", id, nic, b, want)
			}
		}
	}
}

func TestHealedNICTakenBack(t *testing.T) {
	want := healthyResult(t)
	c := newCluster(t, scNodes, scNICs, scConfig())
	// Node 2's NIC 0 fails for 300 µs during the first operation.
	c.net.Inject(sim.Trigger{From: 1, To: 2, NIC: 0, Nth: 4}, sim.Fault{Kind: sim.NICDown, Node: 2, NIC: 0, For: 300 * time.Microsecond})
	out, errs := c.allReduce(t, scInputs(), rings.F32, rings.Sum)
	for i := range out {
		if errs[i] != nil || !bytes.Equal(out[i], want) {
			t.Fatalf("first operation, node %d: %v or wrong result", c.ring[i], errs[i])
		}
	}
	// Let the re-probes find the NIC back.
	c.net.RunUntil(c.net.Now() + 10*time.Millisecond)
	for _, n := range c.nodes {
		if h := n.Repair().Health(rdma.NICRef{Node: 2, NIC: 0}); h != rdma.Healthy {
			t.Fatalf("node's view of 2.nic0 is %v after healing", h)
		}
	}
	before := c.net.Node(2).SentBytes(0)
	out, errs = c.allReduce(t, scInputs(), rings.F32, rings.Sum)
	for i := range out {
		if errs[i] != nil || !bytes.Equal(out[i], want) {
			t.Fatalf("second operation, node %d: %v or wrong result", c.ring[i], errs[i])
		}
	}
	if c.net.Node(2).SentBytes(0) == before {
		t.Error("the healed NIC carried nothing in the next operation")
	}
}

func TestThousandNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("large simulation")
	}
	// 1024 nodes × 8 NICs: an AllReduce of 64 elements (a ring of 2046 steps on 8 channels) and a
	// broadcast of 64 KiB.
	const nodes, nics, count = 1024, 8, 64
	c := newCluster(t, nodes, nics, rdma.Config{ChunkBytes: 1024})
	in := make([][]byte, nodes)
	for i := range in {
		v := make([]int64, count)
		for j := range v {
			v[j] = int64(i*31 + j)
		}
		in[i] = rings.Bytes(v)
	}
	out := make([][]byte, nodes)
	c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
		out[i] = make([]byte, len(in[i]))
		return n.StartAllReduce(in[i], out[i], rings.I64, rings.Sum, done)
	})
	for i := range out {
		got := rings.View[int64](out[i])
		for j := range got {
			want := int64(31*nodes*(nodes-1)/2 + nodes*j)
			if got[j] != want {
				t.Fatalf("node %d element %d: %d, want %d", i, j, got[j], want)
			}
		}
	}
	src := randomInputs(rand.New(rand.NewPCG(2, 2)), 1, 4<<10)[0]
	c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
		out[i] = make([]byte, len(src))
		if i == 0 {
			copy(out[i], src)
		}
		return n.StartBroadcast(out[i], rings.F32, c.ring[0], done)
	})
	for i := range out {
		if !bytes.Equal(out[i], src) {
			t.Fatalf("broadcast: node %d differs", i)
		}
	}
	t.Logf("%d nodes × %d NICs: done at %v virtual", nodes, nics, c.net.Now())
}

func TestRingBound(t *testing.T) {
	// Virtual time is deterministic, so the healthy run's duration can be compared with the ring bound:
	// 2(W-1)/W of the buffer through each node's four NICs.
	const count = 1 << 20
	in := randomInputs(rand.New(rand.NewPCG(1, 1)), 4, count)
	bytesPerNode, nodeBandwidth := float64(2*3*count*4/4), 4*12.5e9
	ideal := time.Duration(bytesPerNode / nodeBandwidth * float64(time.Second))
	var healthy time.Duration
	for _, fail := range []bool{false, true} {
		c := newCluster(t, 4, 4, rdma.Config{ChunkBytes: 64 << 10})
		if fail {
			c.net.Inject(sim.Trigger{From: 1, To: 2, NIC: 0, Nth: 3}, sim.Fault{Kind: sim.NICDown, Node: 1, NIC: 0})
		}
		start := c.net.Now()
		_, errs := c.allReduce(t, in, rings.F32, rings.Sum)
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		took := c.net.Now() - start
		if !fail {
			healthy = took
			if took > ideal*105/100 {
				t.Errorf("healthy AllReduce took %v, more than 1.05 × the ring bound %v", took, ideal)
			}
			continue
		}
		// Hot repair alone: the backup NIC carries two channels' share, so the run slows down.
		t.Logf("healthy %v (%.3f × bound %v); with a NIC failed early, hot repair only: %v (%.2f × healthy)",
			healthy, float64(healthy)/float64(ideal), ideal, took, float64(took)/float64(healthy))
	}
}

// TestConsecutiveAllReduces runs several AllReduces on one cluster, which reuses its working buffers
// between calls: healthy, with a failover, healthy again, then a smaller one. Every result equals the
// result of a fresh cluster, bit for bit.
func TestConsecutiveAllReduces(t *testing.T) {
	want := healthyResult(t)
	half := scInputs()
	for i := range half {
		half[i] = half[i][:len(half[i])/2]
	}
	fresh := newCluster(t, scNodes, scNICs, scConfig())
	wantHalf, errs := fresh.allReduce(t, half, rings.F32, rings.Sum)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("fresh half-size run, node %d: %v", i, err)
		}
	}

	c := newCluster(t, scNodes, scNICs, scConfig())
	for step, fault := range []bool{false, true, false} {
		if fault {
			c.net.Inject(sim.Trigger{From: 1, To: 2, NIC: 1, Nth: 3}, sim.Fault{Kind: sim.NICDown, Node: 2, NIC: 1})
		}
		out, errs := c.allReduce(t, scInputs(), rings.F32, rings.Sum)
		for i := range out {
			if errs[i] != nil {
				t.Fatalf("operation %d (fault %v), node %d: %v", step, fault, c.ring[i], errs[i])
			}
			if !bytes.Equal(out[i], want) {
				t.Fatalf("operation %d (fault %v), node %d: result differs from a fresh cluster's", step, fault, c.ring[i])
			}
		}
		if fault {
			if c.failovers() == 0 {
				t.Fatalf("operation %d: the fault caused no failover", step)
			}
		}
	}
	out, errs := c.allReduce(t, half, rings.F32, rings.Sum)
	for i := range out {
		if errs[i] != nil {
			t.Fatalf("half-size operation, node %d: %v", c.ring[i], errs[i])
		}
		if !bytes.Equal(out[i], wantHalf[0]) {
			t.Fatalf("half-size operation, node %d: result differs from a fresh cluster's", c.ring[i])
		}
	}
}

// TestAllReduceOfManyPages runs AllReduces whose input spans many pages of the lazy copy into the
// working buffer, with a partial last page, twice on one cluster, and checks every element.
func TestAllReduceOfManyPages(t *testing.T) {
	const count = 100_003
	c := newCluster(t, 4, 4, rdma.Config{ChunkBytes: 16 << 10})
	for round := range 2 {
		in := make([][]byte, 4)
		for i := range in {
			v := make([]float32, count)
			for j := range v {
				v[j] = float32((j*7+i*13+round)%1021) - 500
			}
			in[i] = rings.Bytes(v)
		}
		out, errs := c.allReduce(t, in, rings.F32, rings.Sum)
		for i := range out {
			if errs[i] != nil {
				t.Fatalf("round %d, node %d: %v", round, i, errs[i])
			}
			got := rings.View[float32](out[i])
			for j := range got {
				var want float32
				for k := range in {
					want += float32((j*7+k*13+round)%1021) - 500
				}
				if got[j] != want {
					t.Fatalf("round %d, node %d, element %d: got %v, want %v", round, i, j, got[j], want)
				}
			}
		}
	}
}
