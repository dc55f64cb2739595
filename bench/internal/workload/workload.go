// Package workload holds what the peers of Concord's benchmark programs share: float32 fill patterns
// whose exact sums are known, the element-by-element checks against those sums, the result hash that
// peers compare, and the loop that grows a group to its full size.
//
// Values are small integers (0..63), so every sum of up to 2^18 of them is exact in float32 and a
// correct all-reduce gives exactly the expected bits. The pattern is not periodic in the element
// index, so a chunk delivered to the wrong place is caught.
package workload

import (
	"context"
	"fmt"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/concord-ccl/concord/pccl"
)

// pattern returns a pseudo-random value in [0, 64) for element i: a multiplicative hash of i.
func pattern(i int) uint32 { return uint32(uint64(i)*0x9E3779B97F4A7C15>>40) & 63 }

// Value is rank's contribution to element i under Fill.
func Value(rank, i int) float32 { return float32((pattern(i) + uint32(rank)) & 63) }

// Fill sets buf to rank's contribution: buf[i] = Value(rank, i).
func Fill(buf []float32, rank int) {
	for i := range buf {
		buf[i] = float32((pattern(i) + uint32(rank)) & 63)
	}
}

// sums returns, for every pattern value a, the sum over ranks 0..world-1 of (a+rank) mod 64, computed
// with plain integer arithmetic.
func sums(world int) [64]float32 {
	var t [64]float32
	for a := range 64 {
		s := 0
		for r := range world {
			s += (a + r) & 63
		}
		t[a] = float32(s)
	}
	return t
}

// Mismatch describes the first element of a result that differs from the expected sum.
type Mismatch struct {
	Count int     // elements that differ
	Index int     // first differing element
	Got   float32 // its value
	Want  float32 // the expected sum
}

// Error returns a description of the mismatch.
func (m *Mismatch) Error() string {
	return fmt.Sprintf("%d elements differ; first at %d: got %v, want %v", m.Count, m.Index, m.Got, m.Want)
}

// Check compares every element of buf with the sum over ranks 0..world-1 of their Fill values. It
// returns nil if all are equal, else the mismatch.
func Check(buf []float32, world int) *Mismatch {
	t := sums(world)
	var m *Mismatch
	for i, v := range buf {
		if want := t[pattern(i)]; v != want {
			if m == nil {
				m = &Mismatch{Index: i, Got: v, Want: want}
			}
			m.Count++
		}
	}
	return m
}

// FillUniform sets buf to the contribution every peer makes regardless of its rank: Value(0, i). The
// sum over a group is then world·Value(0, i), whichever peers took part.
func FillUniform(buf []float32) { Fill(buf, 0) }

// CheckUniform compares every element of buf with world·Value(0, i). It returns nil if all are equal.
func CheckUniform(buf []float32, world int) *Mismatch {
	var m *Mismatch
	w := uint32(world)
	for i, v := range buf {
		if want := float32(pattern(i) * w); v != want {
			if m == nil {
				m = &Mismatch{Index: i, Got: v, Want: want}
			}
			m.Count++
		}
	}
	return m
}

// Hash returns the xxh3 hash of b, which peers compare to show their results are bit-identical.
func Hash(b []byte) uint64 { return xxh3.Hash(b) }

// Join runs the membership loop of a group being assembled until c's world has n peers: every
// accepted peer asks whether peers are pending and, if so, admits them with UpdateTopology. Every
// member of the group must run it, so that they vote together. It returns ctx's error if the group is
// not complete before ctx ends.
func Join(ctx context.Context, c *pccl.Communicator, n int) error {
	for c.WorldSize() < n {
		pending, err := c.ArePeersPending(ctx)
		if err != nil {
			return fmt.Errorf("join: are peers pending: %w", err)
		}
		if pending {
			if err := c.UpdateTopology(ctx); err != nil {
				return fmt.Errorf("join: update topology: %w", err)
			}
			continue
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("join: %d of %d peers: %w", c.WorldSize(), n, ctx.Err())
		}
	}
	return nil
}
