// Package hugemem allocates the large buffers of collectives so that the kernel may back them with
// transparent huge pages.
//
// A buffer of hundreds of MiB in 4 KiB pages costs a page fault per 4 KiB on first touch and as much
// again to free when the process exits; on virtual machines each fault is several microseconds, so a
// 256 MiB staging buffer can take a second to fault in, and a killed peer's sockets close only after
// its memory is torn down. With 2 MiB pages both are hundreds of times cheaper. Where transparent huge
// pages are set to "madvise" (a common default), memory gets them only when asked.
package hugemem

// Threshold is the smallest capacity that Make asks huge pages for: a smaller buffer spans too few
// 2 MiB pages for it to matter.
const Threshold = 4 << 20

// pageSize is the size of a transparent huge page on the platforms that have them.
const pageSize = 2 << 20

// Make returns a zeroed byte slice of length n and capacity c (c ≥ n), from the Go heap. When c is at
// least Threshold it asks the kernel to back the 2 MiB-aligned part of the buffer with huge pages
// (Linux; elsewhere, and where the kernel refuses, the buffer is an ordinary one).
func Make(n, c int) []byte {
	b := make([]byte, n, c)
	if c >= Threshold {
		advise(b[:c])
	}
	return b
}
