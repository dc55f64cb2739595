package rings

import (
	"math/bits"
	"sync"

	"github.com/concord-ccl/concord/internal/hugemem"
)

// DefaultMaxIdleBytes is the idle capacity a BufferPool keeps when MaxIdleBytes is zero, or the
// pool's peak working set where that is larger.
const DefaultMaxIdleBytes = 1 << 30

// BufferPool recycles staging buffers across operations. Buffers come in power-of-two capacity
// classes, so one buffer serves any length up to its class; large ones ask for huge pages (see
// internal/hugemem). Idle buffers are kept (not left to the garbage collector) up to MaxIdleBytes of
// capacity in total; beyond that, Put drops them.
//
// By default (MaxIdleBytes zero) the bound is 1 GiB or the pool's working set, whichever is larger:
// the most capacity its callers have held at once. A training loop asks for the same buffers at every
// step, and a buffer dropped is one the next step allocates and faults in again: the backup of an
// in-place AllReduce of a 2 GiB gradient, say, or the buffers of several peers in one process. So a
// pool keeps as much as it has been seen to need, and memory beyond that is never kept.
//
// The zero value is ready to use. A BufferPool is safe for concurrent use; it must not be copied after
// first use.
type BufferPool struct {
	// MaxIdleBytes bounds the total capacity of the idle buffers kept, in bytes. Zero means the
	// larger of DefaultMaxIdleBytes (1 GiB) and the pool's working set; a negative value keeps none.
	MaxIdleBytes int

	mu    sync.Mutex
	idle  [64][][]byte // idle[k] holds buffers of capacity 1<<k; guarded by mu
	bytes int          // total capacity in idle; guarded by mu
	held  int          // capacity handed out by Get and not put back yet; guarded by mu
	peak  int          // the most held at once: the working set; guarded by mu
}

// Get returns a buffer of length n. Its contents are arbitrary. The caller owns it until it passes it
// to Put.
func (p *BufferPool) Get(n int) []byte {
	if n <= 0 {
		return nil
	}
	k := bits.Len(uint(n - 1))
	p.mu.Lock()
	p.held += 1 << k
	p.peak = max(p.peak, p.held)
	if free := p.idle[k]; len(free) > 0 {
		b := free[len(free)-1]
		free[len(free)-1] = nil
		p.idle[k] = free[:len(free)-1]
		p.bytes -= cap(b)
		p.mu.Unlock()
		return b[:n]
	}
	p.mu.Unlock()
	return hugemem.Make(n, 1<<k)
}

// Put hands b back for reuse. The caller must not use b afterwards. A buffer whose capacity is not a
// power of two, or that would take the idle total over the bound (see BufferPool), is dropped.
func (p *BufferPool) Put(b []byte) {
	c := cap(b)
	if c == 0 || c&(c-1) != 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held = max(p.held-c, 0) // a buffer that did not come from Get counts as nothing held
	limit := p.MaxIdleBytes
	if limit == 0 {
		limit = max(DefaultMaxIdleBytes, p.peak)
	}
	if p.bytes+c > limit {
		return
	}
	k := bits.Len(uint(c - 1))
	p.idle[k] = append(p.idle[k], b[:0])
	p.bytes += c
}

// Idle returns the capacity of the idle buffers the pool keeps, in bytes.
func (p *BufferPool) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes
}

// defaultPool serves every AllReduce whose Options name no pool.
var defaultPool BufferPool
