package cluster

import "sync"

// feed is an unbounded queue of values with a channel at its output, so that a slow or absent reader
// never blocks the goroutine that reads a child's stdout (and so never blocks the child).
//
// push and close may be called from any goroutine; one pump goroutine owns the delivery to out. The
// mutex guards queue and closed.
type feed[T any] struct {
	out    chan T
	wake   chan struct{} // capacity 1: a push or close happened
	stop   <-chan struct{}
	done   chan struct{} // closed when the pump has returned
	mu     sync.Mutex
	queue  []T
	closed bool
}

// newFeed starts a feed whose pump runs until close has been called and everything queued has been
// delivered, or until stop is closed (then undelivered values are dropped and out is closed).
func newFeed[T any](stop <-chan struct{}) *feed[T] {
	f := &feed[T]{out: make(chan T), wake: make(chan struct{}, 1), stop: stop, done: make(chan struct{})}
	go f.pump()
	return f
}

// push queues v for delivery. It never blocks. Values pushed after close are dropped.
func (f *feed[T]) push(v T) {
	f.mu.Lock()
	if !f.closed {
		f.queue = append(f.queue, v)
	}
	f.mu.Unlock()
	f.poke()
}

// close ends the feed: out is closed once every queued value has been delivered.
func (f *feed[T]) close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.poke()
}

func (f *feed[T]) poke() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *feed[T]) pump() {
	defer close(f.done)
	defer close(f.out)
	for {
		f.mu.Lock()
		var head T
		have := len(f.queue) > 0
		if have {
			head = f.queue[0]
		}
		closed := f.closed
		f.mu.Unlock()
		if !have {
			if closed {
				return
			}
			select {
			case <-f.wake:
			case <-f.stop:
				return
			}
			continue
		}
		select {
		case f.out <- head:
			f.mu.Lock()
			var zero T
			f.queue[0] = zero
			f.queue = f.queue[1:]
			f.mu.Unlock()
		case <-f.stop:
			return
		}
	}
}
