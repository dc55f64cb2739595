package rdma_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/sim"
	"github.com/concord-ccl/concord/rings"
)

// cluster is a simulated group of nodes running the intra-site runtime.
type cluster struct {
	net   *sim.Network
	ring  []rdma.NodeID
	nodes []*rdma.Node
}

func newCluster(t testing.TB, nodes, nics int, cfg rdma.Config) *cluster {
	t.Helper()
	desc := make([]rdma.NIC, nics)
	for i := range desc {
		desc[i] = rdma.NIC{Bandwidth: 12.5e9, Distance: i / 2, NUMANode: i / 4}
	}
	return newClusterOf(t, nodes, desc, 2*time.Microsecond, cfg)
}

// newClusterOf is newCluster with every node's NICs as desc and the given link latency.
func newClusterOf(t testing.TB, nodes int, desc []rdma.NIC, latency time.Duration, cfg rdma.Config) *cluster {
	t.Helper()
	c := &cluster{net: sim.New(sim.Config{Latency: latency})}
	for i := range nodes {
		c.ring = append(c.ring, rdma.NodeID(i+1))
	}
	for _, id := range c.ring {
		c.net.AddNode(id, desc)
	}
	for _, id := range c.ring {
		n, err := rdma.NewNode(c.net.Node(id), c.ring, cfg)
		if err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, n)
	}
	c.net.Run()
	return c
}

// failovers returns the failovers of every node of the cluster so far.
func (c *cluster) failovers() int {
	n := 0
	for _, node := range c.nodes {
		n += node.Stats().Failovers
	}
	return n
}

// allReduce runs one AllReduce of inputs[i] on node i and returns the results and errors.
func (c *cluster) allReduce(t testing.TB, inputs [][]byte, dt rings.DType, op rings.Op) ([][]byte, []error) {
	t.Helper()
	out := make([][]byte, len(c.nodes))
	errs := make([]error, len(c.nodes))
	done := make([]bool, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = make([]byte, len(inputs[i]))
		if err := n.StartAllReduce(inputs[i], out[i], dt, op, func(err error) { errs[i], done[i] = err, true }); err != nil {
			t.Fatal(err)
		}
	}
	limit := c.net.Now() + 100*time.Millisecond
	c.net.RunWhile(func() bool {
		if c.net.Now() > limit {
			return false
		}
		for _, d := range done {
			if !d {
				return true
			}
		}
		return false
	})
	for i, d := range done {
		if !d {
			errs[i] = fmt.Errorf("node %d did not finish", c.ring[i])
		}
	}
	return out, errs
}

func randomInputs(rng *rand.Rand, nodes, count int) [][]byte {
	in := make([][]byte, nodes)
	for i := range in {
		v := make([]float32, count)
		for j := range v {
			v[j] = float32(rng.NormFloat64())
		}
		in[i] = rings.Bytes(v)
	}
	return in
}

func TestAllReduceHealthy(t *testing.T) {
	c := newCluster(t, 4, 4, rdma.Config{ChunkBytes: 4096})
	inputs := randomInputs(rand.New(rand.NewPCG(1, 2)), 4, 10000)
	out, errs := c.allReduce(t, inputs, rings.F32, rings.Sum)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
	want := rings.View[float32](out[0])
	for i := range out {
		got := rings.View[float32](out[i])
		for j := range got {
			if got[j] != want[j] {
				t.Fatalf("node %d element %d: %v != %v", i, j, got[j], want[j])
			}
		}
	}
	ref := make([]float64, 10000)
	for _, in := range inputs {
		for j, v := range rings.View[float32](in) {
			ref[j] += float64(v)
		}
	}
	for j := range ref {
		if d := float64(want[j]) - ref[j]; d > 1e-3 || d < -1e-3 {
			t.Fatalf("element %d: %v, reference %v", j, want[j], ref[j])
		}
	}
	t.Logf("virtual time %v", c.net.Now())
}
