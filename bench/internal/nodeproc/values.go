package nodeproc

import (
	"math"

	"github.com/concord-ccl/concord/internal/hugemem"
	"github.com/concord-ccl/concord/rings"
)

// The data of the test-bed benches' AllReduce calls: small integers, so float32 sums are exact in
// any reduction order and every node can check every element of its result.

// Buffer returns count zeroed float32 elements in huge pages where the kernel allows them, as a
// trainer's large tensors would be: with 4 KiB pages every pass over a 256 MiB buffer misses the TLB
// on every page.
func Buffer(count int) []float32 { return rings.View[float32](hugemem.Make(4*count, 4*count)) }

// Value is node's input element i.
func Value(node, i int) float32 { return float32((i*7 + node*13) % 1021) }

// Fill sets send to node's input.
func Fill(send []float32, node int) {
	for i := range send {
		send[i] = Value(node, i)
	}
}

// Poison writes NaN into every 1024th element of recv, so that a call that claims success without
// writing its result is caught by Check, without the cost of clearing the whole buffer.
func Poison(recv []float32) {
	for i := 0; i < len(recv); i += 1024 {
		recv[i] = float32(math.NaN())
	}
}

// Check reports whether every element of recv is the sum of the inputs of nodes nodes.
func Check(recv []float32, nodes int) bool {
	for i, v := range recv {
		var want float32
		for n := range nodes {
			want += Value(n, i)
		}
		if v != want {
			return false
		}
	}
	return true
}
