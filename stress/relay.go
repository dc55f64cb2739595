package main

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
)

// relay forwards one peer process's connections, byte for byte, and can hold them (black hole) or
// delay them (slow link) for a while: a route failure, which the in-memory network's controls cannot
// give real processes. A master relay forwards every connection of the peer to the master. A link
// relay carries the peer's connections to other peers (its ring links, state transfers and bandwidth
// tests): each names its destination in a first line (see linkDialer), and holes and delays can be
// set per destination, so one ring link fails while the peer still reaches everyone else.
//
// Goroutines: one acceptor, and per connection and direction a reader and a writer. Fields under mu
// are shared between them and the supervisor.
type relay struct {
	ln     net.Listener
	dial   func(addr string) (net.Conn, error) // opens the connection to a destination
	target string                              // the master's address; "" for a link relay
	stop   chan struct{}                       // closed by close
	wg     sync.WaitGroup

	mu        sync.Mutex
	holeUntil time.Time                // writers forward nothing before this instant
	delay     time.Duration            // every chunk is forwarded this long after it was read
	linkHoles map[string]time.Time     // per destination of a link relay: holeUntil
	linkDelay map[string]time.Duration // per destination of a link relay: delay
	conns     map[net.Conn]func()      // open connections -> close both ends
	closed    bool
}

// newRelay listens on a free loopback port and forwards every connection to target, or, with target
// "", to the destination each connection names first (a link relay).
func newRelay(target string) (*relay, error) {
	return newRelayOn(loopback, target)
}

// newRelayOn is newRelay on a host of its own: it listens on the host's address and dials from there.
func newRelayOn(h netHost, target string) (*relay, error) {
	ln, err := h.listen()
	if err != nil {
		return nil, err
	}
	r := &relay{ln: ln, dial: h.dial, target: target, stop: make(chan struct{}), conns: map[net.Conn]func(){},
		linkHoles: map[string]time.Time{}, linkDelay: map[string]time.Duration{}}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// netHost is where a relay runs: loopback in this process's own namespace, or a test bed's host.
type netHost struct {
	listen func() (net.Listener, error)
	dial   func(addr string) (net.Conn, error)
}

// loopback is this process's own loopback.
var loopback = netHost{
	listen: func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") },
	dial:   func(addr string) (net.Conn, error) { return net.DialTimeout("tcp", addr, 5*time.Second) },
}

// maxPreamble bounds the first line of a link relay's connection (the destination address).
const maxPreamble = 256

// holeLink black-holes a link relay's connections to dest, both directions, until until (zero: ends
// the hole).
func (r *relay) holeLink(dest string, until time.Time) {
	r.mu.Lock()
	if until.IsZero() {
		delete(r.linkHoles, dest)
	} else {
		r.linkHoles[dest] = until
	}
	r.mu.Unlock()
}

// slowLink delays every chunk of a link relay's connections to dest by d (0: no delay).
func (r *relay) slowLink(dest string, d time.Duration) {
	r.mu.Lock()
	if d == 0 {
		delete(r.linkDelay, dest)
	} else {
		r.linkDelay[dest] = d
	}
	r.mu.Unlock()
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
	if r == nil {
		return // no link relay: the soak runs over QUIC
	}
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
		r.wg.Add(1)
		go r.open(c)
	}
}

// open connects c to its destination and starts forwarding.
func (r *relay) open(c net.Conn) {
	defer r.wg.Done()
	var once sync.Once
	var m net.Conn // the connection to the destination once dialled; set and read under mu
	closeBoth := func() {
		once.Do(func() {
			r.mu.Lock()
			delete(r.conns, c)
			far := m
			r.mu.Unlock()
			c.Close()
			if far != nil {
				far.Close()
			}
		})
	}
	// Registered at once, so that close ends a connection still reading its preamble or dialling.
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		c.Close()
		return
	}
	r.conns[c] = closeBoth
	r.mu.Unlock()
	dest, link := r.target, ""
	var first []byte // bytes read past the preamble
	if dest == "" {
		var err error
		if dest, first, err = readPreamble(c); err != nil {
			closeBoth()
			return
		}
		link = dest
	}
	far, err := r.dial(dest)
	if err != nil {
		closeBoth()
		return
	}
	r.mu.Lock()
	if r.closed || r.conns[c] == nil {
		r.mu.Unlock()
		far.Close()
		closeBoth()
		return
	}
	m = far
	r.mu.Unlock()
	if len(first) > 0 {
		if _, err := far.Write(first); err != nil {
			closeBoth()
			return
		}
	}
	r.wg.Add(2)
	go r.pipe(c, far, link, closeBoth)
	go r.pipe(far, c, link, closeBoth)
}

// readPreamble reads the destination line a link relay's connection starts with, and any bytes read
// past it.
func readPreamble(c net.Conn) (dest string, rest []byte, err error) {
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.SetReadDeadline(time.Time{})
	br := bufio.NewReaderSize(c, maxPreamble)
	line, err := br.ReadSlice('\n')
	if err != nil {
		return "", nil, fmt.Errorf("link relay preamble: %w", err)
	}
	dest = strings.TrimSpace(string(line))
	if _, _, err := net.SplitHostPort(dest); err != nil {
		return "", nil, fmt.Errorf("link relay preamble %q: %w", dest, err)
	}
	rest = make([]byte, br.Buffered())
	br.Read(rest)
	return dest, rest, nil
}

// chunk is what a reader read, stamped with when.
type chunk struct {
	data []byte
	at   time.Time
}

// pipe forwards src to dst until either ends, then closes both connections (after forwarding what
// was read before the end, so a peer sees the master's last message, such as a kick). link is the
// destination of a link relay's connection ("" for a master relay).
func (r *relay) pipe(src, dst net.Conn, link string, closeBoth func()) {
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
		if !r.wait(ch.at, link) {
			return
		}
		if _, err := dst.Write(ch.data); err != nil {
			return
		}
	}
}

// wait blocks until a chunk read at 'at' on a connection to link ("" for a master relay's) may be
// forwarded; false if the relay closes first.
func (r *relay) wait(at time.Time, link string) bool {
	for {
		r.mu.Lock()
		due := at.Add(r.delay + r.linkDelay[link])
		for _, hole := range []time.Time{r.holeUntil, r.linkHoles[link]} {
			if hole.After(due) {
				due = hole
			}
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
