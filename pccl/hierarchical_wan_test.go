package pccl_test

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// cancelling returns the inputs of n peers, peer i in site i%sites, whose sum within every site is
// small (a signal of integers in [-8, 8] per peer) while each input is large: pairs of peers of a
// site add +x and -x with |x| up to 1e6 (both exact in float32). It returns the inputs and the exact
// total.
func cancelling(n, sites, count int) ([][]float32, []float32) {
	r := rand.New(rand.NewPCG(uint64(n), 11))
	in := make([][]float32, n)
	want := make([]float32, count)
	for i := range in {
		in[i] = make([]float32, count)
		for j := range in[i] {
			in[i][j] = float32(r.IntN(17) - 8)
			want[j] += in[i][j]
		}
	}
	// Peer i and peer i+sites share a site: one adds x, the other takes it away.
	for i := 0; i+sites < n; i += 2 * sites {
		for s := range sites {
			for j := range count {
				x := float32(r.IntN(2_000_001) - 1_000_000)
				in[i+s][j] += x
				in[i+s+sites][j] -= x
			}
		}
	}
	return in, want
}

// TestHierarchicalQuantizesOnlyTheWAN runs a both-phase 8-bit AllReduce of inputs that cancel within
// each site: the site phases of the hierarchical AllReduce run at full precision, so only the WAN
// phase encodes, and it encodes the small site sums. Every element of every peer is within the error
// of one encoding of their range, and bit-identical on every peer. The same AllReduce on a flat ring
// (the same peers announcing no site) encodes the large inputs on every hop and misses by far more:
// what the test tells apart.
func TestHierarchicalQuantizesOnlyTheWAN(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		const sites, per, count = 2, 4, 20011
		run := func(hier bool) (worst float64) {
			g := newGroup(t, master.Config{})
			comms, _ := g.startSitesWith(ctx, sites, per, func(i int, cfg *pccl.Config) {
				if !hier {
					cfg.Site = ""
				}
			})
			defer closeAll(comms)
			if hier {
				requireHierarchical(t, comms, sites, per)
			}
			in, want := cancelling(len(comms), sites, count)
			errs := each(comms, func(i int, c *pccl.Communicator) error {
				b := pccl.Bytes(in[i])
				return c.AllReduce(ctx, b, b, pccl.Desc{Tag: 9, Count: count, DType: pccl.F32, Op: pccl.Sum, Quant: pccl.MinMaxU8Both})
			})
			for i, err := range errs {
				if err != nil {
					t.Fatalf("peer %d: %v", i, err)
				}
				if !bytes.Equal(pccl.Bytes(in[i]), pccl.Bytes(in[0])) {
					t.Fatalf("peer %d: result differs from peer 0's", i)
				}
			}
			for j := range want {
				worst = max(worst, math.Abs(float64(in[0][j]-want[j])))
			}
			return worst
		}
		// A site sum is at most 4·8 in magnitude, so the WAN phase encodes values within [-32, 32], each of
		// its two encodings (the reduce-scatter hop and the all-gather) off by at most a step of
		// 2·sites·32/255.
		bound := 2 * 2 * float64(sites) * 32 / 255
		hier, flat := run(true), run(false)
		t.Logf("largest error: hierarchical %v, flat ring %v (bound %v)", hier, flat, bound)
		if hier > bound {
			t.Fatalf("hierarchical: largest error %v, want at most %v: the site phases were encoded", hier, bound)
		}
		if flat <= 100*bound {
			t.Fatalf("flat ring: largest error %v: the inputs did not tell the phases apart", flat)
		}
	})
}

// TestHierarchicalPools runs hierarchical AllReduces with several connections per link: the site
// rings take the pool, the WAN rings the pool over the largest site, and both ends of every link
// agree, with sites of one size and of two.
func TestHierarchicalPools(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for _, sizes := range [][]int{{3, 3}, {4, 2}} {
			g := newGroup(t, master.Config{})
			site := func(i int) int {
				if i < sizes[0] {
					return 0
				}
				return 1
			}
			comms, _ := g.startSitesWith(ctx, 2, (sizes[0]+sizes[1])/2, func(i int, cfg *pccl.Config) {
				cfg.PoolSize = 5
				cfg.Site = fmt.Sprintf("site%d", site(i))
			})
			requireSites(t, comms, site, sizes)
			for k, count := range []int{7, 4099, 1 << 17} {
				sumOnEvery(ctx, t, comms, 1, count, k)
			}
			closeAll(comms)
		}
	})
}
