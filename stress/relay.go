package main

import (
	"net"
	"sync"
	"time"
)

// relay forwards one peer process's connections to the master, byte for byte, and can hold them
// (black hole) or delay them (slow link) for a while: a route failure between that peer and the
// master, which the in-memory network's controls cannot give real processes.
//
// Goroutines: one acceptor, and per connection and direction a reader and a writer. Fields under mu
// are shared between them and the supervisor.
type relay struct {
	ln     net.Listener
	target string
	stop   chan struct{} // closed by close
	wg     sync.WaitGroup

	mu        sync.Mutex
	holeUntil time.Time           // writers forward nothing before this instant
	delay     time.Duration       // every chunk is forwarded this long after it was read
	conns     map[net.Conn]func() // open connections -> close both ends
	closed    bool
}

// newRelay listens on a free loopback port and forwards every connection to target.
func newRelay(target string) (*relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay{ln: ln, target: target, stop: make(chan struct{}), conns: map[net.Conn]func(){}}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// addr is where the peer dials the master.
func (r *relay) addr() string { return r.ln.Addr().String() }

// blackhole stops forwarding in both directions until until; bytes wait and flow again afterwards.
func (r *relay) blackhole(until time.Time) {
	r.mu.Lock()
	r.holeUntil = until
	r.mu.Unlock()
}

// setDelay makes every chunk wait d before it is forwarded (0: no delay).
func (r *relay) setDelay(d time.Duration) {
	r.mu.Lock()
	r.delay = d
	r.mu.Unlock()
}

// close stops accepting, closes every connection and waits for every goroutine. It is idempotent.
func (r *relay) close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	close(r.stop)
	var closers []func()
	for _, f := range r.conns {
		closers = append(closers, f)
	}
	r.mu.Unlock()
	r.ln.Close()
	for _, f := range closers {
		f()
	}
	r.wg.Wait()
}

func (r *relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		m, err := net.DialTimeout("tcp", r.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		var once sync.Once
		closeBoth := func() {
			once.Do(func() {
				c.Close()
				m.Close()
				r.mu.Lock()
				delete(r.conns, c)
				r.mu.Unlock()
			})
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			closeBoth()
			return
		}
		r.conns[c] = closeBoth
		r.mu.Unlock()
		r.wg.Add(2)
		go r.pipe(c, m, closeBoth)
		go r.pipe(m, c, closeBoth)
	}
}

// chunk is what a reader read, stamped with when.
type chunk struct {
	data []byte
	at   time.Time
}

// pipe forwards src to dst until either ends, then closes both connections (after forwarding what
// was read before the end, so a peer sees the master's last message, such as a kick).
func (r *relay) pipe(src, dst net.Conn, closeBoth func()) {
	defer r.wg.Done()
	q := make(chan chunk, 1024)
	gone := make(chan struct{}) // closed when the writer stops
	defer close(gone)
	r.wg.Add(1)
	go func() { // reader: owns src's read side
		defer r.wg.Done()
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case q <- chunk{data: buf[:n], at: time.Now()}:
				case <-gone:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer closeBoth()
	for ch := range q {
		if !r.wait(ch.at) {
			return
		}
		if _, err := dst.Write(ch.data); err != nil {
			return
		}
	}
}

// wait blocks until a chunk read at 'at' may be forwarded; false if the relay closes first.
func (r *relay) wait(at time.Time) bool {
	for {
		r.mu.Lock()
		due := at.Add(r.delay)
		if r.holeUntil.After(due) {
			due = r.holeUntil
		}
		r.mu.Unlock()
		d := time.Until(due)
		if d <= 0 {
			return true
		}
		t := time.NewTimer(min(d, 50*time.Millisecond)) // re-read: the hole or delay may change
		select {
		case <-t.C:
		case <-r.stop:
			t.Stop()
			return false
		}
	}
}
