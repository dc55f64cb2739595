package tcp

import (
	"sync"
	"sync/atomic"

	"github.com/concord-ccl/concord/rdma"
)

// loop is an endpoint's event context: one goroutine that runs queued functions one at a time. Before
// start it only queues; after stop it drops what is posted.
type loop struct {
	mu      sync.Mutex
	cond    *sync.Cond
	q       []func() // guarded by mu
	started bool     // guarded by mu
	stopped bool     // guarded by mu
	done    chan struct{}

	handler func(rdma.Event) // set by start, read only by the loop goroutine
}

func newLoop() *loop {
	l := &loop{done: make(chan struct{})}
	l.cond = sync.NewCond(&l.mu)
	return l
}

// post queues f to run in the event context. It never blocks.
func (l *loop) post(f func()) {
	l.mu.Lock()
	if !l.stopped {
		l.q = append(l.q, f)
		l.cond.Signal()
	}
	l.mu.Unlock()
}

// emit queues the delivery of ev to the handler.
func (l *loop) emit(ev rdma.Event) { l.post(func() { l.handler(ev) }) }

// start runs the loop goroutine with handler h. It reports false if the loop was started or stopped.
func (l *loop) start(h func(rdma.Event)) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started || l.stopped {
		return false
	}
	l.started = true
	l.handler = h
	go l.run()
	return true
}

func (l *loop) run() {
	defer close(l.done)
	var batch []func()
	for {
		l.mu.Lock()
		for len(l.q) == 0 && !l.stopped {
			l.cond.Wait()
		}
		if l.stopped {
			l.mu.Unlock()
			return
		}
		batch, l.q = l.q, batch[:0]
		l.mu.Unlock()
		for i, f := range batch {
			if l.isStopped() {
				return
			}
			f()
			batch[i] = nil
		}
	}
}

func (l *loop) isStopped() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopped
}

// stop drops what is queued and waits for the function running now, if any, to return.
func (l *loop) stop() {
	l.mu.Lock()
	l.stopped = true
	l.q = nil
	started := l.started
	l.cond.Broadcast()
	l.mu.Unlock()
	if started {
		<-l.done
	}
}

// timer is an rdma.Timer whose callback runs in the event context. state moves from pending to fired
// (in the event context, just before the callback runs) or to stopped, once.
type timer struct {
	state atomic.Int32
	t     interface{ Stop() bool }
}

const (
	timerPending int32 = iota
	timerFired
	timerStopped
)

// Stop cancels the callback if it has not started yet, and reports whether it did.
func (t *timer) Stop() bool {
	if !t.state.CompareAndSwap(timerPending, timerStopped) {
		return false
	}
	t.t.Stop()
	return true
}
