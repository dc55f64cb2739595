package rdma_test

import (
	"errors"
	"fmt"
	"math"
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
	descs := make([][]rdma.NIC, nodes)
	for i := range descs {
		descs[i] = desc
	}
	return newClusterEach(t, descs, latency, cfg)
}

// newClusterEach is newClusterOf with node i's NICs as descs[i].
func newClusterEach(t testing.TB, descs [][]rdma.NIC, latency time.Duration, cfg rdma.Config) *cluster {
	t.Helper()
	c := &cluster{net: sim.New(sim.Config{Latency: latency})}
	for i := range descs {
		c.ring = append(c.ring, rdma.NodeID(i+1))
	}
	for i, id := range c.ring {
		c.net.AddNode(id, descs[i])
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

// TestNICsDeclaringDifferentBandwidths: the nodes' NICs declare different bandwidths (one came up at
// half speed, one reports none), which must not make the nodes cut the message differently: the
// AllReduce is exact and bit-identical on every node, split evenly by default and by
// Config.ChannelWeights when every node passes the same.
func TestNICsDeclaringDifferentBandwidths(t *testing.T) {
	descs := [][]rdma.NIC{
		{{Bandwidth: 12.5e9}, {Bandwidth: 12.5e9}},
		{{Bandwidth: 12.5e9}, {Bandwidth: 6.25e9}},
		{{Bandwidth: 0}, {Bandwidth: 12.5e9}},
	}
	const count = 10007
	inputs := integerInputs(rand.New(rand.NewPCG(3, 4)), len(descs), count)
	want := make([]float32, count)
	for _, in := range inputs {
		for j, v := range rings.View[float32](in) {
			want[j] += v
		}
	}
	for _, w := range [][]float64{nil, {3, 1}} {
		c := newClusterEach(t, descs, 2*time.Microsecond, rdma.Config{ChunkBytes: 4096, ChannelWeights: w})
		out, errs := c.allReduce(t, inputs, rings.F32, rings.Sum)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("weights %v: node %d: %v", w, i, err)
			}
			for j, v := range rings.View[float32](out[i]) {
				if v != want[j] {
					t.Fatalf("weights %v: node %d element %d: %v, want %v", w, i, j, v, want[j])
				}
			}
		}
	}
}

// TestChannelWeightsInvalid: weights that are negative, not finite, all zero or not one per NIC are
// rejected with ErrInvalid.
func TestChannelWeightsInvalid(t *testing.T) {
	for _, w := range [][]float64{{-1, 1}, {math.NaN(), 1}, {math.Inf(1), 1}, {0, 0}, {}, {math.MaxFloat64, math.MaxFloat64}} {
		if err := (rdma.Config{ChannelWeights: w}).Validate(); !errors.Is(err, rdma.ErrInvalid) {
			t.Errorf("Validate with ChannelWeights %v: %v, want ErrInvalid", w, err)
		}
	}
	net := sim.New(sim.Config{})
	net.AddNode(1, []rdma.NIC{{Bandwidth: 1e9}, {Bandwidth: 1e9}})
	net.AddNode(2, []rdma.NIC{{Bandwidth: 1e9}, {Bandwidth: 1e9}})
	if _, err := rdma.NewNode(net.Node(1), []rdma.NodeID{1, 2}, rdma.Config{ChannelWeights: []float64{1, 1, 1}}); !errors.Is(err, rdma.ErrInvalid) {
		t.Errorf("NewNode with 3 weights for 2 NICs: %v, want ErrInvalid", err)
	}
}
