package transport

import (
	"net"
	"sync"
	"time"
)

// maxQueuedDatagrams bounds the datagrams a session end of the in-memory network holds for
// ReceiveDatagram; more are dropped, as a full UDP socket buffer drops them.
const maxQueuedDatagrams = 1024

// portKey names the datagram port of one session end: its control connection's local address and the
// session id (both ends of a session on one host differ by address).
type portKey struct {
	addr memAddr
	id   sessionID
}

// memPort is the datagram path of one session end on a Network. A datagram is timed by the link when it
// is sent, exactly as a stream segment is, and waits in the receiving port's queue until it is due.
type memPort struct {
	n         *Network
	key       portKey
	peer      portKey
	out, in   *link // local host -> peer host, and back
	sentSoFar int64 // guarded by sendMu; bytes sent so far, for write hooks
	sendMu    sync.Mutex

	mu      sync.Mutex
	queue   []datagram    // guarded by mu; in order of arrival time
	closed  bool          // guarded by mu
	changed chan struct{} // guarded by mu; closed and replaced when queue or closed change
}

// datagram is a datagram on its way and the moment it arrives.
type datagram struct {
	data []byte
	at   time.Time
}

// openPort registers the datagram port of the session end whose control connection is ctrl, a
// connection of n.
func (n *Network) openPort(id sessionID, ctrl net.Conn) datagramPort {
	c := ctrl.(*conn)
	p := &memPort{
		n:       n,
		key:     portKey{addr: c.local, id: id},
		peer:    portKey{addr: c.remote, id: id},
		changed: make(chan struct{}),
	}
	n.mu.Lock()
	p.out = n.linkLocked(c.local.host, c.remote.host)
	p.in = n.linkLocked(c.remote.host, c.local.host)
	n.ports[p.key] = p
	n.mu.Unlock()
	return p
}

// send sends a copy of b to the peer's port. The write hook, black holes, partitions and loss drop it;
// latency and bandwidth delay it.
func (p *memPort) send(b []byte) {
	p.sendMu.Lock()
	offset := p.sentSoFar
	p.sentSoFar += int64(len(b))
	p.sendMu.Unlock()
	switch f := p.out.cross(offset, len(b), true); f.Kind {
	case FaultNone:
	case FaultBlackHole:
		p.out.blackHole()
		return
	case FaultPartition:
		p.n.Partition(p.key.addr.host, p.peer.addr.host)
		return
	default:
		return
	}
	at, dropped := p.out.schedule(len(b), time.Now(), true)
	if dropped {
		return
	}
	p.n.mu.Lock()
	dst := p.n.ports[p.peer]
	p.n.mu.Unlock()
	if dst != nil {
		dst.push(datagram{data: append([]byte(nil), b...), at: at})
	}
}

// push queues d in order of arrival time, unless the port is closed or full.
func (p *memPort) push(d datagram) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.queue) >= maxQueuedDatagrams {
		return
	}
	i := len(p.queue)
	for i > 0 && p.queue[i-1].at.After(d.at) {
		i--
	}
	p.queue = append(p.queue, datagram{})
	copy(p.queue[i+1:], p.queue[i:])
	p.queue[i] = d
	close(p.changed)
	p.changed = make(chan struct{})
}

// take removes and returns the first datagram due at now.
func (p *memPort) take(now time.Time) ([]byte, time.Time, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) == 0 {
		return nil, time.Time{}, p.changed
	}
	if d := p.queue[0]; d.at.After(now) {
		return nil, d.at, p.changed
	}
	d := p.queue[0]
	p.queue[0] = datagram{}
	p.queue = p.queue[1:]
	p.in.delivered.Add(int64(len(d.data)))
	return d.data, time.Time{}, nil
}

// close unregisters the port and drops what it holds.
func (p *memPort) close() {
	p.n.mu.Lock()
	if p.n.ports[p.key] == p {
		delete(p.n.ports, p.key)
	}
	p.n.mu.Unlock()
	p.shut()
}

// shut drops what the port holds and every later datagram.
func (p *memPort) shut() {
	p.mu.Lock()
	p.closed = true
	p.queue = nil
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}
