package measure

import (
	"sync"
	"time"

	"github.com/concord-ccl/concord/rings"
)

// AddRate returns the aggregate rate, in bytes of output per second, at which threads
// goroutines fold float32 buffers with rings.Accumulate(F32, Sum), each over its own pair of
// bytes-sized buffers (dst += src). After one untimed warm-up pass it times trials rounds of one pass
// per goroutine and returns the best round's rate: a ceiling is what the machine can do, and on a
// shared machine slower rounds measure the neighbours.
func AddRate(bytes, threads, trials int) float64 {
	bytes -= bytes % 4
	if bytes <= 0 || threads <= 0 || trials <= 0 {
		return 0
	}
	type pair struct{ dst, src []byte }
	pairs := make([]pair, threads)
	for i := range pairs {
		dst, src := make([]float32, bytes/4), make([]float32, bytes/4)
		for j := range src {
			src[j] = 1 // touches every page, and keeps the sums small and normal
		}
		pairs[i] = pair{rings.Bytes(dst), rings.Bytes(src)}
	}
	run := func() time.Duration {
		var wg sync.WaitGroup
		start := time.Now()
		for _, p := range pairs {
			wg.Go(func() { rings.Accumulate(rings.F32, rings.Sum, p.dst, p.src) })
		}
		wg.Wait()
		return time.Since(start)
	}
	run()
	best := run()
	for range trials - 1 {
		best = min(best, run())
	}
	return float64(threads) * float64(bytes) / best.Seconds()
}
