package transport

import (
	"errors"
	"net"
	"sync"
	"time"
)

// acceptRetry is how long an accept loop waits after a transient Accept failure, such as running out
// of file descriptors, before it tries again.
const acceptRetry = 10 * time.Millisecond

// acceptHandshakes is the accept loop of a byte-stream listener whose connections each need a
// handshake before they are handed on (the session listener's preamble; TLS and the proof of the run
// secret). It owns ln's Accept and runs handshake(c) in a goroutine of its own per connection, which
// owns c from then on; at most cap(slots) handshakes run at once, and further connections wait in
// the kernel's backlog. wg counts the handshake goroutines. admit, when not nil, sees each connection
// before its handshake starts and may refuse it because the listener is closing: c is then closed
// and the loop returns. The loop returns when quit is closed or ln is.
func acceptHandshakes(ln net.Listener, slots chan struct{}, quit <-chan struct{}, wg *sync.WaitGroup, admit func(net.Conn) bool, handshake func(net.Conn)) {
	for {
		select {
		case slots <- struct{}{}:
		case <-quit:
			return
		}
		c, err := ln.Accept()
		if err != nil {
			<-slots
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t := time.NewTimer(acceptRetry)
			select {
			case <-t.C:
			case <-quit:
				t.Stop()
				return
			}
			continue
		}
		if admit != nil && !admit(c) {
			<-slots
			c.Close()
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			handshake(c)
		}()
	}
}
