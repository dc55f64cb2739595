package main

import (
	"errors"
	"net"
	"sync"
	"time"
)

// udpRelay is a peer's relay to a master that serves QUIC: it forwards datagrams between the peer
// and the master, one socket towards the master per peer address (each QUIC connection of the peer
// dials from its own port), and can drop them (black hole) or delay them (slow route) for a while.
// Unlike the TCP relay, a black hole loses what it drops: QUIC retransmits it.
//
// Goroutines: one reader of the listening socket, and one reader per socket towards the master.
// Fields under mu are shared between them and the supervisor.
type udpRelay struct {
	ln     *net.UDPConn
	target *net.UDPAddr
	wg     sync.WaitGroup

	mu        sync.Mutex
	holeUntil time.Time
	delay     time.Duration
	ups       map[string]*net.UDPConn // peer address -> socket towards the master
	closed    bool
}

// udpRelayIdle is how long a socket towards the master lives without traffic: a connection the peer
// gave up (its master restarted) leaves its socket behind.
const udpRelayIdle = 30 * time.Second

// newUDPRelay listens on a free loopback UDP port and forwards every datagram to target.
func newUDPRelay(target string) (*udpRelay, error) {
	ta, err := net.ResolveUDPAddr("udp", target)
	if err != nil {
		return nil, err
	}
	ln, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	r := &udpRelay{ln: ln, target: ta, ups: map[string]*net.UDPConn{}}
	r.wg.Add(1)
	go r.read()
	return r, nil
}

func (r *udpRelay) addr() string { return r.ln.LocalAddr().String() }

// blackhole drops every datagram, both ways, until until (zero: ends the hole).
func (r *udpRelay) blackhole(until time.Time) {
	r.mu.Lock()
	r.holeUntil = until
	r.mu.Unlock()
}

// setDelay delays every datagram, both ways, by d (0: no delay).
func (r *udpRelay) setDelay(d time.Duration) {
	r.mu.Lock()
	r.delay = d
	r.mu.Unlock()
}

// pass decides the fate of one datagram: dropped, or sent after the returned delay.
func (r *udpRelay) pass() (bool, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || time.Now().Before(r.holeUntil) {
		return false, 0
	}
	return true, r.delay
}

// send writes b with write after the relay's delay, unless it is dropped; b is the caller's to reuse.
func (r *udpRelay) send(b []byte, write func([]byte)) {
	ok, d := r.pass()
	switch {
	case !ok:
	case d == 0:
		write(b)
	default:
		b = append([]byte(nil), b...)
		time.AfterFunc(d, func() { write(b) })
	}
}

// read forwards the peer's datagrams towards the master.
func (r *udpRelay) read() {
	defer r.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, from, err := r.ln.ReadFromUDP(buf)
		if err != nil {
			return // closed
		}
		up := r.upstream(from)
		if up == nil {
			continue
		}
		r.send(buf[:n], func(b []byte) { up.Write(b) })
	}
}

// upstream returns the socket towards the master for the peer address from, opening it (and its
// reader) on the first datagram; nil once the relay is closed.
func (r *udpRelay) upstream(from *net.UDPAddr) *net.UDPConn {
	key := from.String()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	if up := r.ups[key]; up != nil {
		return up
	}
	up, err := net.DialUDP("udp", nil, r.target)
	if err != nil {
		return nil
	}
	r.ups[key] = up
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			up.SetReadDeadline(time.Now().Add(udpRelayIdle))
			n, err := up.Read(buf)
			if err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					r.mu.Lock()
					delete(r.ups, key)
					r.mu.Unlock()
					up.Close()
					return
				}
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue // e.g. ICMP port unreachable while the master restarts
			}
			r.send(buf[:n], func(b []byte) { r.ln.WriteToUDP(b, from) })
		}
	}()
	return up
}

// close stops forwarding and closes every socket.
func (r *udpRelay) close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	for _, up := range r.ups {
		up.Close()
	}
	r.mu.Unlock()
	r.ln.Close()
	r.wg.Wait()
}
