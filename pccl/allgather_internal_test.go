package pccl

import (
	"testing"

	"github.com/concord-ccl/concord/rings"
)

// TestGatherPart: a gather's slot is cut into at least gatherParts parts, none under minGatherPart
// bytes and none over the configured part size.
func TestGatherPart(t *testing.T) {
	for _, tc := range []struct{ partBytes, n, want int }{
		{0, 1731840, 216480},                  // a compressed fragment: eight parts
		{4 << 20, 100, minGatherPart},         // a tiny slot: one part of the floor (the slot is smaller)
		{4 << 20, 64 << 20, 4 << 20},          // a large slot: the configured size
		{0, 64 << 20, rings.DefaultPartBytes}, // the default when none is configured
		{32 << 10, 1 << 20, 32 << 10},         // a configured size under the floor wins
		{1 << 20, 8*minGatherPart + 1, 65537}, // rounded up
	} {
		if got := gatherPart(tc.partBytes, tc.n); got != tc.want {
			t.Errorf("gatherPart(%d, %d) = %d, want %d", tc.partBytes, tc.n, got, tc.want)
		}
	}
}
