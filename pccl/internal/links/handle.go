package links

import "sync"

// Handle is the abort switch of one collective's data path, shared by all its streams. The owner flips
// it on the master's failure verdict or on death, the caller's watcher when its context ends; the
// streams read it. Abort may be called from any goroutine.
type Handle struct {
	once    sync.Once
	aborted chan struct{}
	cause   error // written once before aborted is closed
}

// NewHandle returns a switch that is not flipped.
func NewHandle() *Handle { return &Handle{aborted: make(chan struct{})} }

// Abort stops the data path with err; later calls do nothing.
func (h *Handle) Abort(err error) {
	h.once.Do(func() {
		h.cause = err
		close(h.aborted)
	})
}

// Done is closed by the first Abort.
func (h *Handle) Done() <-chan struct{} { return h.aborted }

// Err returns the error of the first Abort, nil before.
func (h *Handle) Err() error {
	select {
	case <-h.aborted:
		return h.cause
	default:
		return nil
	}
}

// Op names one collective's data path: its tag and sequence number, the ring epoch it runs on, and
// its abort switch.
type Op struct {
	Tag, Seq, Epoch uint64
	Handle          *Handle
}
