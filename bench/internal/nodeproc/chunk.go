package nodeproc

import "time"

// Sizing of an intra-site runtime's chunks against the NIC rate, for the benchmarks on the test bed.
const (
	// Window is the runtime's default window (rdma.Config.Window): chunks of one path in flight
	// unacknowledged.
	Window = 2
	// refillSlack is how long the window must keep a NIC busy while the sender's event context gets
	// round to posting the next chunk after a completion: the round trip through the shaped NICs plus
	// the scheduling delay of node processes on a machine with few, shared cores. 20 ms left the
	// NICs idle for about a tenth of a healthy AllReduce of 4 nodes on 2 cores at 400 Mbit/s (1.16–
	// 1.21× the ring bound, against 1.08–1.10× with 40 ms).
	refillSlack = 40 * time.Millisecond
	minChunk    = 256 << 10
	maxChunk    = 4 << 20
)

// ChunkFor returns the chunk size for NICs of mbit Mbit/s: the smallest power of two, at least
// 256 KiB and at most 4 MiB, such that a window of chunks covers refillSlack at the NIC's rate.
// Chunks are acknowledged when they arrive, so a path leaves its NIC idle only when the window drains
// before the next chunk is posted; a larger window would do the same with more chunks, but what a
// failure makes the runtime send again is the window, and the hot-repair target counts it in chunks.
func ChunkFor(mbit int) int {
	need := float64(mbit) * 1e6 / 8 * refillSlack.Seconds() / Window
	c := minChunk
	for float64(c) < need && c < maxChunk {
		c *= 2
	}
	return c
}
