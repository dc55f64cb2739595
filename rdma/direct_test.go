package rdma_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/sim"
	"github.com/concord-ccl/concord/rings"
)

func directConfig() rdma.Config {
	cfg := scConfig()
	cfg.Direct = true
	return cfg
}

// TestDirectAllReduce runs AllReduces that work in the caller's result buffer (Config.Direct), out of
// place and in place, healthy and with a NIC failing mid-call, several in a row on one cluster. Every
// result equals the staged run's bit for bit, and an input passed separately is never written.
func TestDirectAllReduce(t *testing.T) {
	want := healthyResult(t)
	for _, inPlace := range []bool{false, true} {
		c := newCluster(t, scNodes, scNICs, directConfig())
		for step, fault := range []bool{false, true, false, true} {
			if fault {
				c.net.Inject(sim.Trigger{From: 1, To: 2, NIC: 1, Nth: uint64(3 + step)}, sim.Fault{Kind: sim.NICDown, Node: 2, NIC: 1})
			}
			inputs := scInputs()
			kept := make([][]byte, len(inputs))
			for i := range inputs {
				kept[i] = slices.Clone(inputs[i])
			}
			out := make([][]byte, scNodes)
			c.runAll(t, func(i int, n *rdma.Node, done func(error)) error {
				out[i] = make([]byte, len(inputs[i]))
				send := inputs[i]
				if inPlace {
					send = out[i]
					copy(send, inputs[i])
				}
				return n.StartAllReduce(send, out[i], rings.F32, rings.Sum, done)
			})
			for i := range out {
				if !bytes.Equal(out[i], want) {
					t.Fatalf("in place %v, call %d (fault %v), node %d: result differs from the staged run's", inPlace, step, fault, c.ring[i])
				}
				if !bytes.Equal(inputs[i], kept[i]) {
					t.Fatalf("in place %v, call %d, node %d: the separate input was written", inPlace, step, c.ring[i])
				}
			}
			if fault {
				// The injected fault must have been taken, or this call tested nothing.
				if c.failovers() == 0 {
					t.Fatalf("in place %v, call %d: the fault caused no failover", inPlace, step)
				}
			}
			// Heal the NIC for the next call.
			c.net.SetPort(c.ring[1], 1, true)
			c.net.Run()
		}
	}
}

// TestDirectRefusesOverlap: with Config.Direct, an input and a result that overlap without being the
// same slice are refused with ErrInvalid before anything starts, and a valid call runs afterwards.
func TestDirectRefusesOverlap(t *testing.T) {
	c := newCluster(t, 2, 2, directConfig())
	buf := make([]byte, 8192)
	err := c.nodes[0].StartAllReduce(buf[:4096], buf[1024:5120], rings.F32, rings.Sum, func(error) {})
	if !errors.Is(err, rdma.ErrInvalid) {
		t.Fatalf("overlapping AllReduce: got %v, want ErrInvalid", err)
	}
	err = c.nodes[0].StartAllGather(buf[:2048], buf[1024:5120], rings.F32, func(error) {})
	if !errors.Is(err, rdma.ErrInvalid) {
		t.Fatalf("overlapping AllGather: got %v, want ErrInvalid", err)
	}
	in := randomInputs(rand.New(rand.NewPCG(2, 2)), 2, 1000)
	out, errs := c.allReduce(t, in, rings.F32, rings.Sum)
	for i := range out {
		if errs[i] != nil {
			t.Fatalf("node %d after the refusals: %v", i, errs[i])
		}
		for j, v := range rings.View[float32](out[i]) {
			if w := rings.View[float32](in[0])[j] + rings.View[float32](in[1])[j]; v != w {
				t.Fatalf("node %d element %d: %v, want %v", i, j, v, w)
			}
		}
	}
}

// TestDirectPlannedAllReduce runs every planned strategy with Config.Direct, out of place and in
// place, and requires the same bytes on every node as the staged run of the same plan.
func TestDirectPlannedAllReduce(t *testing.T) {
	inputs := integerInputs(rand.New(rand.NewPCG(6, 1)), stNodes, stCount)
	for _, tc := range stCases {
		want, _, _ := runPlanned(t, tc.st, tc.down, inputs)
		for _, inPlace := range []bool{false, true} {
			cfg := rdma.Config{ChunkBytes: 64 << 10, Window: 4, Direct: true}
			kept := make([][]byte, len(inputs))
			for i := range inputs {
				kept[i] = slices.Clone(inputs[i])
			}
			out, _, _ := runPlannedWith(t, cfg, inPlace, tc.st, tc.down, inputs)
			for i := range out {
				if !bytes.Equal(out[i], want[i]) {
					t.Fatalf("%s, in place %v: node %d differs from the staged run", tc.name, inPlace, i)
				}
				if !bytes.Equal(inputs[i], kept[i]) {
					t.Fatalf("%s: node %d's input was written", tc.name, i)
				}
			}
		}
	}
}

// TestAllReduceFoldsWholePagesFromTheInput runs ring AllReduces whose chunks cover many of the
// working buffer's fill pages whole (the fold then reads the input straight from it, and an all-gather
// chunk overwrites an uncopied page without copying it) and others in part, staged and with
// Config.Direct, healthy and with a NIC failing mid-call. Every element is the exact sum, and the
// inputs are never written.
func TestAllReduceFoldsWholePagesFromTheInput(t *testing.T) {
	const nodes, count = 4, 3<<18 + 7*1024 + 3 // about 3 MiB of float32: channels off page boundaries
	inputs := integerInputs(rand.New(rand.NewPCG(3, 9)), nodes, count)
	kept := make([][]byte, nodes)
	for i := range inputs {
		kept[i] = slices.Clone(inputs[i])
	}
	want := make([]float32, count)
	for _, in := range inputs {
		for j, v := range rings.View[float32](in) {
			want[j] += v
		}
	}
	for _, direct := range []bool{false, true} {
		for _, fault := range []bool{false, true} {
			cfg := scConfig()
			cfg.ChunkBytes, cfg.Direct = 192<<10, direct
			c := newCluster(t, nodes, scNICs, cfg)
			if fault {
				c.net.Inject(sim.Trigger{From: 1, To: 2, NIC: 1, Nth: 2}, sim.Fault{Kind: sim.NICDown, Node: 2, NIC: 1})
			}
			out, errs := c.allReduce(t, inputs, rings.F32, rings.Sum)
			if fault && c.failovers() == 0 {
				t.Fatalf("direct %v: the fault caused no failover", direct)
			}
			for i := range out {
				if errs[i] != nil {
					t.Fatalf("direct %v, fault %v: node %d: %v", direct, fault, i, errs[i])
				}
				for j, v := range rings.View[float32](out[i]) {
					if v != want[j] {
						t.Fatalf("direct %v, fault %v: node %d element %d: %v, want %v", direct, fault, i, j, v, want[j])
					}
				}
				if !bytes.Equal(inputs[i], kept[i]) {
					t.Fatalf("direct %v, fault %v: node %d's input was written", direct, fault, i)
				}
			}
		}
	}
}
