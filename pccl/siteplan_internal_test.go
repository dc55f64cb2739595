package pccl

import (
	"testing"

	"github.com/concord-ccl/concord/rdma"
)

// TestLevelled: NICs measured within the noise of the median rate take the median's figures; a NIC
// at half the rate and an unmeasured one keep theirs.
func TestLevelled(t *testing.T) {
	const b = 1e-8 // seconds per byte
	cal := rdma.Calibration{
		Alpha: [][]float64{{1e-4, 2e-4, 3e-4}, {4e-4, 5e-4, 0}},
		Beta:  [][]float64{{b, b * 1.08, b / 1.1}, {b * 0.95, b * 2, 0}},
	}
	got := levelled(cal)
	// Measured rates: b/1.1, 0.95b, b, 1.08b, 2b per byte, median b; α 1e-4 to 5e-4, median 3e-4.
	want := rdma.Calibration{
		Alpha: [][]float64{{3e-4, 3e-4, 3e-4}, {3e-4, 5e-4, 0}},
		Beta:  [][]float64{{b, b, b}, {b, b * 2, 0}},
	}
	for i := range want.Beta {
		for j := range want.Beta[i] {
			if got.Beta[i][j] != want.Beta[i][j] || got.Alpha[i][j] != want.Alpha[i][j] {
				t.Fatalf("node %d NIC %d: α %g β %g, want α %g β %g", i, j, got.Alpha[i][j], got.Beta[i][j], want.Alpha[i][j], want.Beta[i][j])
			}
		}
	}
	if cal.Beta[0][1] != b*1.08 {
		t.Fatal("levelled changed its argument")
	}
	if !hasSlowNIC(got) {
		t.Fatal("the NIC at half the rate is not found slow")
	}
	if hasSlowNIC(levelled(rdma.Calibration{Alpha: [][]float64{{1, 1}}, Beta: [][]float64{{b, b * 1.1}}})) {
		t.Fatal("a NIC within the noise is found slow")
	}
}
