package sharedstate

import (
	"sync"
	"time"
)

// MeasureHashGBps hashes a buffer of size bytes with HashParallel on workers goroutines, rounds times
// after one warm-up pass, and returns the best throughput in GB/s (1e9 bytes per second). It reads the
// wall clock and is meant for benchmark programs, not for the library's own paths.
func MeasureHashGBps(size, workers, rounds int) float64 {
	buf := patterned(size)
	HashParallel(buf, workers)
	return best(size, rounds, func() { HashParallel(buf, workers) })
}

// MeasureMemcpyGBps copies a buffer of size bytes into another one, split into workers contiguous
// parts copied in parallel (workers < 1 counts as 1), rounds times after one warm-up pass, and returns
// the best throughput in GB/s of bytes copied (1e9 bytes per second). It is the reference the hash
// throughput is compared to.
func MeasureMemcpyGBps(size, workers, rounds int) float64 {
	src, dst := patterned(size), make([]byte, size)
	cp := func() { parallelCopy(dst, src, workers) }
	cp()
	return best(size, rounds, cp)
}

// parallelCopy copies src into dst (of equal length) in workers contiguous parts, one goroutine each
// (workers < 1 counts as 1).
func parallelCopy(dst, src []byte, workers int) {
	if workers <= 1 {
		copy(dst, src)
		return
	}
	part := (len(src) + workers - 1) / workers
	var wg sync.WaitGroup
	for lo := 0; lo < len(src); lo += part {
		hi := min(lo+part, len(src))
		wg.Go(func() { copy(dst[lo:hi], src[lo:hi]) })
	}
	wg.Wait()
}

// patterned returns size bytes of a fixed non-zero pattern, touched so that no page fault is timed.
func patterned(size int) []byte {
	b := make([]byte, size)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

// best runs f rounds times (at least once) and returns size bytes over the fastest run, in GB/s.
func best(size, rounds int, f func()) float64 {
	var fastest time.Duration
	for i := range max(rounds, 1) {
		t0 := time.Now()
		f()
		if d := time.Since(t0); i == 0 || d < fastest {
			fastest = d
		}
	}
	if fastest <= 0 {
		fastest = time.Nanosecond
	}
	return float64(size) / fastest.Seconds() / 1e9
}
