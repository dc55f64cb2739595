package nodeproc

import "testing"

func TestChunkForCoversTheRefillSlack(t *testing.T) {
	for _, tc := range []struct{ mbit, want int }{
		{10, 256 << 10},  // a window of the smallest chunk covers the slack
		{100, 256 << 10}, // 250 kB per chunk needed
		{400, 1 << 20},   // 1 MB per chunk needed
		{1000, 4 << 20},  // 2.5 MB per chunk needed
		{100000, 4 << 20},
	} {
		if got := ChunkFor(tc.mbit); got != tc.want {
			t.Errorf("ChunkFor(%d) = %d, want %d", tc.mbit, got, tc.want)
		}
	}
}
