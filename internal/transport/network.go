package transport

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// inFlightLimit bounds the bytes of one connection direction that were written but not yet read.
	// A writer that would exceed it blocks until the reader catches up, as a TCP sender does once
	// both socket buffers are full.
	inFlightLimit = 4 << 20
	// segmentSize is the largest piece a write is cut into. Pacing and loss apply per piece.
	segmentSize = 64 << 10
	// defaultRetransmit is the extra delay of a lost segment when LinkConfig.Retransmit is 0.
	defaultRetransmit = 200 * time.Millisecond
	// firstEphemeralPort and lastPort bound the ports that port 0 and outgoing connections take.
	firstEphemeralPort = 49152
	lastPort           = 65535
	// lossSeed seeds every link's loss generator, together with a hash of the link's host names.
	lossSeed = 0x636f6e636f7264
)

// LinkConfig describes one directed link between two hosts of a Network. Its zero value is a
// perfect link: no delay, unlimited bandwidth, no loss.
type LinkConfig struct {
	// Latency is the one-way delay added to every segment, and to the close that ends a stream.
	Latency time.Duration
	// Bandwidth is the link's rate in bytes per second; 0 means unlimited. All connections from one
	// host to the other share it: a segment waits until the link has finished sending the previous
	// ones, then takes len/Bandwidth seconds to serialise.
	Bandwidth float64
	// Loss is the probability in [0, 1] that a segment is lost on its first try. A reliable stream
	// never drops bytes: a lost segment arrives Retransmit later than it would have, and so does
	// everything behind it on the same connection, because bytes are delivered in order.
	Loss float64
	// Retransmit is the extra delay of a lost segment; 0 means 200 ms.
	Retransmit time.Duration
	// BlackHole silently discards every byte written while it is set, as a route that fails without
	// telling anyone. Such a gap is permanent for the connection direction it hit: nothing written
	// later on it (and not its close either) is ever delivered, even after Heal, and since lost bytes
	// are never acknowledged the writer blocks once the in-flight limit is reached. Connections
	// opened after the black hole is removed work normally.
	BlackHole bool
}

// Validate reports the first field of c that holds an impossible value.
func (c LinkConfig) Validate() error {
	switch {
	case c.Latency < 0:
		return fmt.Errorf("link config: Latency %v: must not be negative", c.Latency)
	case c.Bandwidth < 0 || c.Bandwidth != c.Bandwidth:
		return fmt.Errorf("link config: Bandwidth %v: must be a non-negative number", c.Bandwidth)
	case !(c.Loss >= 0 && c.Loss <= 1):
		return fmt.Errorf("link config: Loss %v: must lie in [0, 1]", c.Loss)
	case c.Retransmit < 0:
		return fmt.Errorf("link config: Retransmit %v: must not be negative", c.Retransmit)
	}
	return nil
}

// Network is an in-memory network of named hosts for deterministic tests. Each host gets a Transport
// from Host; connections between hosts behave like TCP streams over links whose latency, bandwidth,
// loss and failures the test controls through SetLink, Partition, Heal and Crash.
//
// Network starts no goroutines: delivery times are computed when bytes are written and waited for by
// the reader with the standard timers. (Sessions run a few goroutines of their own, listed in the
// package documentation, which block only on channels and timers.) So a Network created inside a
// testing/synctest bubble runs on the bubble's fake clock, and transfers take exactly the emulated
// time. A Network and everything it hands out must then be used only inside that bubble.
//
// Sessions dialled with DialSession are built from the network's connections, so their streams suffer
// every fault of their links; their datagrams cross the same links, delayed by latency and bandwidth
// and dropped by loss, black holes, partitions and crashes. Write hooks (OnWrite) fail a link or a
// connection at a chosen write.
//
// All methods are safe for concurrent use.
type Network struct {
	mu     sync.Mutex
	hosts  map[string]*host     // guarded by mu
	links  map[linkKey]*link    // guarded by mu; entries live as long as the Network
	ports  map[portKey]*memPort // guarded by mu; datagram ports of open session ends
	healed chan struct{}        // guarded by mu; closed and replaced whenever Heal runs

	linkDefault func(from, to string) LinkConfig // guarded by mu; the config of links not set yet
	holds       map[string]time.Time             // guarded by mu; hosts held (see Hold) until then
}

// linkKey names a directed link.
type linkKey struct{ from, to string }

// host is the Network's record of one named host. All fields are guarded by Network.mu.
type host struct {
	name      string
	listeners map[int]*listener
	conns     map[*conn]struct{} // connection ends whose local address is on this host
	nextPort  int
}

// NewNetwork returns an empty network. Hosts come into being when first named. Segment losses are
// drawn from a pseudo-random generator with a fixed seed per directed link, so a test that writes the
// same segments in the same order sees the same losses.
func NewNetwork() *Network {
	return &Network{
		hosts:  make(map[string]*host),
		links:  make(map[linkKey]*link),
		ports:  make(map[portKey]*memPort),
		healed: make(chan struct{}),
	}
}

// Host returns the Transport of the host called name. Its listeners bind "name:port" (an empty host
// part in Listen means name too), and its outgoing connections come from name. name must be non-empty
// and contain no colon; Host panics otherwise, as that is a mistake in the calling test.
func (n *Network) Host(name string) Transport {
	if name == "" || containsColon(name) {
		panic(fmt.Sprintf("transport: invalid host name %q", name))
	}
	return &hostTransport{n: n, name: name}
}

func containsColon(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			return true
		}
	}
	return false
}

// SetLink sets the directed link from host from to host to. Segments already written keep the timing
// they were given; later ones use c. It does not lift a Partition. SetLink panics if c.Validate fails.
func (n *Network) SetLink(from, to string, c LinkConfig) {
	if err := c.Validate(); err != nil {
		panic(fmt.Sprintf("transport: SetLink %s->%s: %v", from, to, err))
	}
	l := n.link(from, to)
	l.mu.Lock()
	l.cfg = c
	l.mu.Unlock()
}

// SetLinkDefault makes f give the config of every directed link that comes into being from now on
// (a link exists once SetLink, a dial, or any other method names it), so that a network of many hosts
// needs no SetLink for each of their pairs: only the links used are made. Links that exist keep
// theirs. f is called with the network's lock held and must not call its methods; SetLinkDefault
// panics, on the first use, if the config f returns fails Validate. nil restores the perfect link.
func (n *Network) SetLinkDefault(f func(from, to string) LinkConfig) {
	n.mu.Lock()
	n.linkDefault = f
	n.mu.Unlock()
}

// Hold freezes host until then as a SIGSTOP freezes a process, seen from the network: every byte
// written to the host or by it before then, on a connection or as a datagram, arrives no earlier
// than then, in order, and nothing is lost. Connections are still accepted meanwhile, as a stopped
// process's kernel accepts them. A later Hold replaces the time; a time in the past ends the hold
// for what is written from then on.
func (n *Network) Hold(host string, until time.Time) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.holds == nil {
		n.holds = map[string]time.Time{}
	}
	n.holds[host] = until
	for k, l := range n.links {
		if k.from == host || k.to == host {
			l.mu.Lock()
			l.holdUntil = n.holdLocked(k.from, k.to)
			l.mu.Unlock()
		}
	}
}

// holdLocked returns the later hold of the two ends of a link.
func (n *Network) holdLocked(from, to string) time.Time {
	a, b := n.holds[from], n.holds[to]
	if b.After(a) {
		return b
	}
	return a
}

// Partition cuts hosts a and b apart: bytes written in either direction are black-holed (see
// LinkConfig.BlackHole) and new dials between them hang until Heal or until the dial's context ends.
func (n *Network) Partition(a, b string) {
	for _, l := range []*link{n.link(a, b), n.link(b, a)} {
		l.mu.Lock()
		l.partitioned = true
		l.mu.Unlock()
	}
}

// Heal undoes Partition between a and b and clears BlackHole on both directed links; other link
// settings stay. Hanging dials between them then connect. Bytes already lost stay lost: connection
// directions that lost bytes never deliver again (see LinkConfig.BlackHole).
func (n *Network) Heal(a, b string) {
	for _, l := range []*link{n.link(a, b), n.link(b, a)} {
		l.mu.Lock()
		l.partitioned = false
		l.cfg.BlackHole = false
		l.mu.Unlock()
	}
	n.mu.Lock()
	close(n.healed)
	n.healed = make(chan struct{})
	n.mu.Unlock()
}

// Crash kills host as a SIGKILL would: every connection with an end on the host fails at once on both
// ends (reads and writes return an error wrapping ErrReset, like a TCP RST), buffered data is
// discarded, and the host's listeners close. Sessions with an end on the host fail with ErrReset on
// both ends, and datagrams on their way to the host are lost. The host may listen and dial again afterwards, like a
// restarted process.
func (n *Network) Crash(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h, ok := n.hosts[name]
	if !ok {
		return
	}
	for port, l := range h.listeners {
		delete(h.listeners, port)
		for _, c := range l.shut() {
			n.dropLocked(c)
		}
	}
	for c := range h.conns {
		c.reset()
		n.dropLocked(c)
		n.dropLocked(c.peer)
	}
	for k, p := range n.ports {
		if k.addr.host == name {
			delete(n.ports, k)
			p.shut()
		}
	}
}

// Stats returns the number of bytes that readers on host to have read from connections from host from
// so far, session preambles and control frames included, and of the datagrams they received.
func (n *Network) Stats(from, to string) (bytes int64) {
	return n.link(from, to).delivered.Load()
}

// link returns the directed link from -> to, creating it on first use.
func (n *Network) link(from, to string) *link {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.linkLocked(from, to)
}

func (n *Network) linkLocked(from, to string) *link {
	k := linkKey{from, to}
	l, ok := n.links[k]
	if !ok {
		h := fnv.New64a()
		h.Write([]byte(from))
		h.Write([]byte{0})
		h.Write([]byte(to))
		l = &link{from: from, to: to, rng: rand.New(rand.NewPCG(lossSeed, h.Sum64()))}
		if n.linkDefault != nil {
			c := n.linkDefault(from, to)
			if err := c.Validate(); err != nil {
				panic(fmt.Sprintf("transport: link default %s->%s: %v", from, to, err))
			}
			l.cfg = c
		}
		l.holdUntil = n.holdLocked(from, to)
		n.links[k] = l
	}
	return l
}

// hostLocked returns the record of the named host, creating it on first use.
func (n *Network) hostLocked(name string) *host {
	h, ok := n.hosts[name]
	if !ok {
		h = &host{
			name:      name,
			listeners: make(map[int]*listener),
			conns:     make(map[*conn]struct{}),
			nextPort:  firstEphemeralPort,
		}
		n.hosts[name] = h
	}
	return h
}

// ephemeralPortLocked picks a port of h that no listener holds.
func (h *host) ephemeralPortLocked() (int, error) {
	for range lastPort - firstEphemeralPort + 1 {
		p := h.nextPort
		h.nextPort++
		if h.nextPort > lastPort {
			h.nextPort = firstEphemeralPort
		}
		if _, used := h.listeners[p]; !used {
			return p, nil
		}
	}
	return 0, ErrAddrInUse
}

// dropLocked forgets the connection end c.
func (n *Network) dropLocked(c *conn) {
	if h, ok := n.hosts[c.local.host]; ok {
		delete(h.conns, c)
	}
}

// forget removes a closed connection end from its host's records.
func (n *Network) forget(c *conn) {
	n.mu.Lock()
	n.dropLocked(c)
	n.mu.Unlock()
}

// listen binds a listener to port of host name.
func (n *Network) listen(name string, port int) (*listener, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := n.hostLocked(name)
	if port == 0 {
		p, err := h.ephemeralPortLocked()
		if err != nil {
			return nil, err
		}
		port = p
	} else if _, used := h.listeners[port]; used {
		return nil, ErrAddrInUse
	}
	l := newListener(n, memAddr{host: name, port: port})
	h.listeners[port] = l
	return l, nil
}

// unlisten removes l from its host if it is still registered there.
func (n *Network) unlisten(l *listener) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if h, ok := n.hosts[l.addr.host]; ok && h.listeners[l.addr.port] == l {
		delete(h.listeners, l.addr.port)
	}
}

// tryDial makes one attempt to connect from host from to to:port. It returns the client end, or a
// channel to wait on when the hosts are partitioned, or an error.
func (n *Network) tryDial(from, to string, port int) (*conn, <-chan struct{}, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ab, ba := n.linkLocked(from, to), n.linkLocked(to, from)
	if ab.isPartitioned() || ba.isPartitioned() {
		return nil, n.healed, nil
	}
	var l *listener
	if h, ok := n.hosts[to]; ok {
		l = h.listeners[port]
	}
	if l == nil {
		return nil, nil, ErrRefused
	}
	src := n.hostLocked(from)
	localPort, err := src.ephemeralPortLocked()
	if err != nil {
		return nil, nil, err
	}
	client, server := newConnPair(n, memAddr{host: from, port: localPort}, l.addr, ab, ba)
	if !l.enqueue(server) {
		return nil, nil, ErrRefused
	}
	src.conns[client] = struct{}{}
	n.hostLocked(to).conns[server] = struct{}{}
	return client, nil, nil
}

// link is the state of one directed link. All connections from one host to another share it.
type link struct {
	from, to  string
	delivered atomic.Int64 // bytes read by receivers so far

	hookMu sync.Mutex        // serialises write hooks, so that they see writes one at a time
	hook   func(Write) Fault // guarded by hookMu; nil when none is set
	bytes  int64             // guarded by hookMu; application bytes handed to the link so far
	writes int64             // guarded by hookMu; application writes handed to the link so far

	mu          sync.Mutex
	cfg         LinkConfig // guarded by mu
	partitioned bool       // guarded by mu
	busyUntil   time.Time  // guarded by mu; when the link finishes serialising what it was given
	holdUntil   time.Time  // guarded by mu; nothing written before it arrives before it (Hold)
	rng         *rand.Rand // guarded by mu
}

func (l *link) isPartitioned() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.partitioned
}

// schedule accounts for a segment of size bytes handed to the link at now. It returns when the segment
// reaches the other end, or dropped when the link black-holes it. An unreliable segment (a datagram)
// that the loss draw hits is dropped too, instead of arriving Retransmit later.
func (l *link) schedule(size int, now time.Time, unreliable bool) (at time.Time, dropped bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cfg.BlackHole || l.partitioned {
		return time.Time{}, true
	}
	sent := now
	if l.cfg.Bandwidth > 0 {
		if l.busyUntil.After(sent) {
			sent = l.busyUntil
		}
		sent = sent.Add(time.Duration(float64(size) / l.cfg.Bandwidth * float64(time.Second)))
		l.busyUntil = sent
	}
	at = sent.Add(l.cfg.Latency)
	if at.Before(l.holdUntil) {
		at = l.holdUntil
	}
	if l.cfg.Loss > 0 && l.rng.Float64() < l.cfg.Loss {
		if unreliable {
			return time.Time{}, true
		}
		rt := l.cfg.Retransmit
		if rt == 0 {
			rt = defaultRetransmit
		}
		at = at.Add(rt)
	}
	return at, false
}

// hostTransport is the Transport of one host of a Network.
type hostTransport struct {
	n    *Network
	name string
}

// Name returns "mem".
func (t *hostTransport) Name() string { return "mem" }

// Listen binds a listener to addr, whose host part must be empty or the host's own name.
func (t *hostTransport) Listen(addr string) (net.Listener, error) {
	h, port, err := splitMemAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("mem listen %s: %w", addr, err)
	}
	if h != "" && h != t.name {
		return nil, fmt.Errorf("mem listen %s: host %s: %w", addr, t.name, ErrAddrNotAvail)
	}
	l, err := t.n.listen(t.name, port)
	if err != nil {
		return nil, fmt.Errorf("mem listen %s: %w", addr, err)
	}
	return l, nil
}

// Dial connects to addr. It fails at once with ErrRefused when nobody listens there, and hangs while
// the two hosts are partitioned, until Heal or until ctx ends.
func (t *hostTransport) Dial(ctx context.Context, addr string) (net.Conn, error) {
	h, port, err := splitMemAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("mem dial %s: %w", addr, err)
	}
	if h == "" {
		h = t.name
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("mem dial %s: %w", addr, err)
		}
		c, wait, err := t.n.tryDial(t.name, h, port)
		if err != nil {
			return nil, fmt.Errorf("mem dial %s: %w", addr, err)
		}
		if c != nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
		case <-wait:
		}
	}
}

// ListenSession starts accepting sessions on addr, as Listen does for connections; the two share the
// host's ports.
func (t *hostTransport) ListenSession(addr string) (SessionListener, error) {
	l, err := t.Listen(addr)
	if err != nil {
		return nil, err
	}
	return listenSession(l, t.sessionNet()), nil
}

// DialSession opens a session to addr. Its control connection and streams are connections of the
// network, dialled as Dial does; its datagrams cross the same links.
func (t *hostTransport) DialSession(ctx context.Context, addr string) (Session, error) {
	return dialSession(ctx, t.sessionNet(), addr)
}

func (t *hostTransport) sessionNet() sessionNet {
	return sessionNet{name: "mem", dial: t.Dial, datagrams: t.n.openPort}
}

// splitMemAddr parses "host:port".
func splitMemAddr(addr string) (string, int, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > lastPort {
		return "", 0, fmt.Errorf("invalid port %q", p)
	}
	return h, port, nil
}

// memAddr is the address of an endpoint on a Network.
type memAddr struct {
	host string
	port int
}

// Network returns "mem".
func (a memAddr) Network() string { return "mem" }

// String returns "host:port".
func (a memAddr) String() string { return net.JoinHostPort(a.host, strconv.Itoa(a.port)) }
