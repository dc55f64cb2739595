package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/concord-ccl/concord/rdma"
)

// pairKey identifies one lane of a connection at its acceptor: the peer, this node's NIC, the peer's
// NIC, class, index and lane.
type pairKey struct {
	peer          rdma.NodeID
	local, remote rdma.NICID
	class         rdma.Class
	index         uint32
	lane          uint8
}

func keyOf(s rdma.ConnSpec, lane int) pairKey {
	return pairKey{s.Peer, s.Local, s.Remote, s.Class, s.Index, uint8(lane)}
}

// Endpoint is a node's access to the tcp fabric: one listening socket per NIC, bound to the NIC's
// address and interface, and a link-state watch on the NICs' interfaces. It implements rdma.Endpoint.
//
// Goroutines: one accept loop per NIC, the link watch, the event loop, and per connection a dialer
// (dialing end, until both lanes are up) and a reader and a writer per lane. Close stops them all.
type Endpoint struct {
	cfg   Config
	nics  []rdma.NIC
	ns    netns.NsHandle // the endpoint's namespace, or -1 for the process's own
	lns   []net.Listener
	addrs []netip.AddrPort
	loop  *loop
	done  chan struct{} // closed by Close: every goroutine returns
	ctx   context.Context
	stop  context.CancelFunc // cancels ctx in Close: dials and handshakes in progress end
	wg    sync.WaitGroup

	mu      sync.Mutex
	peers   map[rdma.NodeID][]netip.AddrPort // guarded by mu
	health  []rdma.Health                    // guarded by mu
	conns   map[*conn]struct{}               // guarded by mu: every connection not yet failed or closed
	pending map[pairKey]*conn                // guarded by mu: accepting connections' lanes still without a socket
	parked  map[pairKey]net.Conn             // guarded by mu: accepted lanes still without a Connect
	regions map[uint64]*rdma.Region          // guarded by mu
	nextKey uint64                           // guarded by mu
	closed  bool                             // guarded by mu

	received atomic.Int64 // chunk data bytes read from every connection

	closeOnce sync.Once
}

var _ rdma.Endpoint = (*Endpoint)(nil)

// Listen opens the endpoint: it enters cfg.NetNS if set, listens on every NIC (bound to the NIC's
// address and, with SO_BINDTODEVICE, to its interface), reads every NIC's link state and starts
// watching it. Events are delivered once Start is called.
func Listen(cfg Config) (*Endpoint, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	e := &Endpoint{
		cfg:     cfg,
		ns:      netns.None(),
		loop:    newLoop(),
		done:    make(chan struct{}),
		peers:   make(map[rdma.NodeID][]netip.AddrPort),
		health:  make([]rdma.Health, len(cfg.NICs)),
		conns:   make(map[*conn]struct{}),
		pending: make(map[pairKey]*conn),
		parked:  make(map[pairKey]net.Conn),
		regions: make(map[uint64]*rdma.Region),
	}
	e.ctx, e.stop = context.WithCancel(context.Background())
	for node, addrs := range cfg.Peers {
		e.peers[node] = append([]netip.AddrPort(nil), addrs...)
	}
	for i, n := range cfg.NICs {
		e.nics = append(e.nics, rdma.NIC{
			ID: rdma.NICID(i), Name: n.Interface, Bandwidth: n.Bandwidth, Distance: n.Distance, NUMANode: n.NUMANode,
		})
	}
	if cfg.NetNS != "" {
		ns, err := netns.GetFromPath(cfg.NetNS)
		if err != nil {
			return nil, fmt.Errorf("tcp: namespace %s: %w", cfg.NetNS, err)
		}
		e.ns = ns
	}
	if err := e.open(); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// open listens on every NIC and starts the accept loops and the link watch.
func (e *Endpoint) open() error {
	for i, n := range e.cfg.NICs {
		lc := net.ListenConfig{
			Control:         e.control(n.Interface),
			KeepAliveConfig: e.keepAlive(),
		}
		var ln net.Listener
		err := e.inNS(func() error {
			var err error
			ln, err = lc.Listen(e.ctx, "tcp", netip.AddrPortFrom(n.Addr, n.Port).String())
			return err
		})
		if err != nil {
			return fmt.Errorf("tcp: nic%d (%s): listen: %w", i, n.Interface, err)
		}
		e.lns = append(e.lns, ln)
		e.addrs = append(e.addrs, ln.Addr().(*net.TCPAddr).AddrPort())
	}
	if err := e.watchLinks(); err != nil {
		return err
	}
	for i, ln := range e.lns {
		e.wg.Add(1)
		go e.accept(rdma.NICID(i), ln)
	}
	return nil
}

// inNS runs fn with its sockets created in the endpoint's namespace: on a fresh OS thread that enters
// the namespace and is never unlocked (the runtime discards it), so no other goroutine runs there.
func (e *Endpoint) inNS(fn func() error) error { return inNamespace(e.ns, e.cfg.NetNS, fn) }

// inNamespace runs fn on a fresh OS thread that enters ns (named path, for errors) and is never
// unlocked, so that the runtime discards it; with netns.None() it runs fn on the calling goroutine.
func inNamespace(ns netns.NsHandle, path string, fn func() error) error {
	if ns == netns.None() {
		return fn()
	}
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is discarded with the namespace it entered
		if err := netns.Set(ns); err != nil {
			ch <- fmt.Errorf("tcp: enter %s: %w", path, err)
			return
		}
		ch <- fn()
	}()
	return <-ch
}

// InNetNS runs fn with its sockets and netlink requests in the network namespace at path (the
// calling goroutine's own when path is empty), as Config.NetNS does for an endpoint.
func InNetNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("tcp: namespace %s: %w", path, err)
	}
	defer ns.Close()
	return inNamespace(ns, path, fn)
}

// ReservePorts gives every NIC of nics whose Port is 0 a port the kernel picks, by listening on the
// NIC's address once, in the namespace at netnsPath (see InNetNS). A node announces its NICs' listen
// addresses before it opens an endpoint on them; Listen then binds the same ports.
func ReservePorts(netnsPath string, nics []NICConfig) error {
	return InNetNS(netnsPath, func() error {
		for i := range nics {
			if nics[i].Port != 0 {
				continue
			}
			ln, err := net.Listen("tcp", netip.AddrPortFrom(nics[i].Addr, 0).String())
			if err != nil {
				return fmt.Errorf("tcp: reserve a port on %s (%s): %w", nics[i].Interface, nics[i].Addr, err)
			}
			nics[i].Port = ln.Addr().(*net.TCPAddr).AddrPort().Port()
			ln.Close()
		}
		return nil
	})
}

// control binds a socket to an interface and sets TCP_USER_TIMEOUT before it connects or listens.
func (e *Endpoint) control(iface string) func(network, address string, c syscall.RawConn) error {
	return func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = setSockOpts(int(fd), iface, e.cfg.UserTimeout)
		})
		if err != nil {
			return err
		}
		return serr
	}
}

func setSockOpts(fd int, iface string, userTimeout time.Duration) error {
	if err := unix.SetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, iface); err != nil {
		return fmt.Errorf("SO_BINDTODEVICE %s: %w", iface, err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(userTimeout.Milliseconds())); err != nil {
		return fmt.Errorf("TCP_USER_TIMEOUT: %w", err)
	}
	return nil
}

func (e *Endpoint) keepAlive() net.KeepAliveConfig {
	return net.KeepAliveConfig{Enable: true, Idle: e.cfg.KeepAlive, Interval: e.cfg.KeepAlive, Count: 3}
}

// ListenAddrs returns the address each NIC listens on, indexed by NICID: what peers put in their
// Config.Peers for this node.
func (e *Endpoint) ListenAddrs() []netip.AddrPort { return append([]netip.AddrPort(nil), e.addrs...) }

// SetPeer sets (or replaces) the listen addresses of node's NICs, indexed by NICID. Connections already
// dialing keep the addresses they started with.
func (e *Endpoint) SetPeer(node rdma.NodeID, addrs []netip.AddrPort) error {
	if node == e.cfg.Node {
		return fmt.Errorf("tcp: SetPeer of this node %d: %w", node, rdma.ErrInvalid)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.peers[node] = append([]netip.AddrPort(nil), addrs...)
	return nil
}

// ReceivedBytes returns how many bytes of chunk data the endpoint has read from its connections since
// it was opened (counted when read, before the Arrived event). It may be called from any goroutine,
// for progress reports.
func (e *Endpoint) ReceivedBytes() int64 { return e.received.Load() }

// Node returns this endpoint's node id.
func (e *Endpoint) Node() rdma.NodeID { return e.cfg.Node }

// NICs returns the local NICs, indexed by NICID. The slice must not be modified.
func (e *Endpoint) NICs() []rdma.NIC { return e.nics }

// Health returns the link state of a local NIC's interface: Healthy when it is up and has a carrier,
// Down otherwise.
func (e *Endpoint) Health(nic rdma.NICID) rdma.Health {
	e.mu.Lock()
	defer e.mu.Unlock()
	if int(nic) >= len(e.health) {
		return rdma.Down
	}
	return e.health[nic]
}

// Register records buf as a region. Sockets need no registration, so this only hands out a key.
func (e *Endpoint) Register(buf []byte) (*rdma.Region, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, rdma.ErrClosed
	}
	e.nextKey++
	r := &rdma.Region{Key: e.nextKey, Bytes: buf}
	e.regions[r.Key] = r
	return r, nil
}

// Deregister forgets a region returned by Register.
func (e *Endpoint) Deregister(r *rdma.Region) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r == nil || e.regions[r.Key] != r {
		return fmt.Errorf("tcp: deregister unknown region: %w", rdma.ErrInvalid)
	}
	delete(e.regions, r.Key)
	return nil
}

// Connect opens the local end of a connection. Of the two nodes, the one with the smaller id dials
// (from its NIC's address, to the peer NIC's listen address, retrying until Config.ConnectTimeout while
// the peer is not listening yet); the other accepts and pairs the socket with this call by its hello.
// A Connect on a NIC that is down fails at once with a ConnDown wrapping rdma.ErrNICDown.
func (e *Endpoint) Connect(spec rdma.ConnSpec) (rdma.Conn, error) {
	if int(spec.Local) >= len(e.nics) || spec.Peer == e.cfg.Node || spec.Class > rdma.ProbeClass {
		return nil, fmt.Errorf("tcp: connect %v: %w", spec, rdma.ErrInvalid)
	}
	dialing := e.cfg.Node < spec.Peer
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, rdma.ErrClosed
	}
	var target netip.AddrPort
	if dialing {
		addrs := e.peers[spec.Peer]
		if int(spec.Remote) >= len(addrs) {
			return nil, fmt.Errorf("tcp: connect %v: no address for the peer's NIC: %w", spec, rdma.ErrInvalid)
		}
		target = addrs[spec.Remote]
	} else {
		for lane := range lanes {
			if _, dup := e.pending[keyOf(spec, lane)]; dup {
				return nil, fmt.Errorf("tcp: connect %v: already connecting: %w", spec, rdma.ErrInvalid)
			}
		}
	}
	c := newConn(e, spec, dialing)
	e.conns[c] = struct{}{}
	if e.health[spec.Local] != rdma.Healthy {
		e.wg.Add(1)
		go func() { // failed outside the call, so the ConnDown is not delivered from inside it
			defer e.wg.Done()
			c.fail(fmt.Errorf("tcp: %v: %w", spec, rdma.ErrNICDown))
		}()
		return c, nil
	}
	if dialing {
		e.wg.Add(1)
		go e.dial(c, target)
		return c, nil
	}
	for lane := range lanes {
		k := keyOf(spec, lane)
		sock, ok := e.parked[k]
		if !ok {
			e.pending[k] = c
			continue
		}
		delete(e.parked, k)
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			c.attach(lane, sock, false)
		}()
	}
	return c, nil
}

// dial connects c's sockets, one lane after the other, retrying while the peer refuses or drops them,
// until ConnectTimeout.
func (e *Endpoint) dial(c *conn, target netip.AddrPort) {
	defer e.wg.Done()
	nic := e.cfg.NICs[c.spec.Local]
	deadline := time.Now().Add(e.cfg.ConnectTimeout)
	backoff := 5 * time.Millisecond
	var last error
	lane := 0
	for time.Now().Before(deadline) {
		sock, err := e.dialOnce(c, lane, nic, target, deadline)
		if err == nil {
			c.attach(lane, sock, true)
			if lane++; lane == lanes {
				return
			}
			continue
		}
		last = err
		if c.isFailed() {
			return
		}
		if e.Health(c.spec.Local) != rdma.Healthy {
			last = fmt.Errorf("%w: %v", rdma.ErrNICDown, err)
			break
		}
		select {
		case <-e.done:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 200*time.Millisecond)
	}
	c.fail(fmt.Errorf("tcp: %v: dial %v: %w", c.spec, target, last))
}

// dialOnce dials lane's socket to target from the NIC, sends the hello and waits for the acceptor's
// helloAck.
func (e *Endpoint) dialOnce(c *conn, lane int, nic NICConfig, target netip.AddrPort, deadline time.Time) (net.Conn, error) {
	d := net.Dialer{
		LocalAddr:       net.TCPAddrFromAddrPort(netip.AddrPortFrom(nic.Addr, 0)),
		Deadline:        deadline,
		Control:         e.control(nic.Interface),
		KeepAliveConfig: e.keepAlive(),
	}
	var sock net.Conn
	err := e.inNS(func() error {
		var err error
		sock, err = d.DialContext(e.ctx, "tcp", target.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	if !c.setDialing(lane, sock) { // closed meanwhile
		sock.Close()
		return nil, rdma.ErrClosed
	}
	defer context.AfterFunc(e.ctx, func() { sock.Close() })() // Close ends the handshake
	sock.SetDeadline(deadline)
	h := hello{Version: version, From: e.cfg.Node, To: c.spec.Peer, FromNIC: c.spec.Local, ToNIC: c.spec.Remote,
		Class: c.spec.Class, Index: c.spec.Index, Lane: uint8(lane)}
	if _, err := sock.Write(appendHello(nil, h)); err != nil {
		sock.Close()
		return nil, err
	}
	var ack [prefixLen]byte
	if _, err := io.ReadFull(sock, ack[:]); err != nil {
		sock.Close()
		return nil, err
	}
	if f, _, err := decodeFrame(ack[:], 0); err != nil || f.Kind != kindHelloAck {
		sock.Close()
		return nil, fmt.Errorf("%w: expected helloAck", errFrame)
	}
	sock.SetDeadline(time.Time{})
	return sock, nil
}

// accept serves one NIC's listener: it reads each socket's hello and pairs it with its Connect.
func (e *Endpoint) accept(nic rdma.NICID, ln net.Listener) {
	defer e.wg.Done()
	for {
		sock, err := ln.Accept()
		if err != nil {
			return // closed by Close
		}
		e.wg.Add(1)
		go e.greet(nic, sock)
	}
}

// greet reads the hello of an accepted socket and pairs it, or parks it until the matching Connect.
func (e *Endpoint) greet(nic rdma.NICID, sock net.Conn) {
	defer e.wg.Done()
	if tc, ok := sock.(*net.TCPConn); ok {
		if rc, err := tc.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) {
				unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(e.cfg.UserTimeout.Milliseconds()))
			})
		}
	}
	sock.SetReadDeadline(time.Now().Add(e.cfg.ConnectTimeout))
	buf := make([]byte, prefixLen+helloLen)
	stop := context.AfterFunc(e.ctx, func() { sock.Close() }) // Close ends the wait for the hello
	_, err := io.ReadFull(sock, buf)
	stop()
	if err != nil {
		sock.Close()
		return
	}
	f, _, err := decodeFrame(buf, 0)
	h := f.Hello
	if err != nil || f.Kind != kindHello || h.Version != version || h.To != e.cfg.Node || h.ToNIC != nic ||
		h.From == e.cfg.Node || int(h.Lane) >= lanes {
		sock.Close()
		return
	}
	sock.SetReadDeadline(time.Time{})
	key := pairKey{peer: h.From, local: h.ToNIC, remote: h.FromNIC, class: h.Class, index: h.Index, lane: h.Lane}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		sock.Close()
		return
	}
	c, ok := e.pending[key]
	if ok {
		delete(e.pending, key)
	} else {
		if old, dup := e.parked[key]; dup {
			old.Close() // a retried dial replaces the earlier socket
		}
		e.parked[key] = sock
	}
	e.mu.Unlock()
	if ok {
		c.attach(int(h.Lane), sock, false)
	}
}

// forget removes c from the endpoint's tables once it failed or closed.
func (e *Endpoint) forget(c *conn) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.conns, c)
	for lane := range lanes {
		if e.pending[keyOf(c.spec, lane)] == c {
			delete(e.pending, keyOf(c.spec, lane))
		}
	}
}

// Start begins delivering events to h, in one event goroutine. It may be called once.
func (e *Endpoint) Start(h func(rdma.Event)) error {
	if h == nil {
		return fmt.Errorf("tcp: Start with a nil handler: %w", rdma.ErrInvalid)
	}
	if !e.loop.start(h) {
		return fmt.Errorf("tcp: Start called twice or after Close: %w", rdma.ErrInvalid)
	}
	return nil
}

// Now returns the wall clock.
func (e *Endpoint) Now() time.Time { return time.Now() }

// AfterFunc runs f in the event context after d.
func (e *Endpoint) AfterFunc(d time.Duration, f func()) rdma.Timer {
	t := &timer{}
	t.t = time.AfterFunc(d, func() {
		e.loop.post(func() {
			if t.state.CompareAndSwap(timerPending, timerFired) {
				f()
			}
		})
	})
	return t
}

// Post runs f in the event context after the events already queued.
func (e *Endpoint) Post(f func()) { e.loop.post(f) }

// Close closes every connection (without ConnDown events), the listeners and the link watch, stops the
// event loop and waits for every goroutine. It is idempotent.
func (e *Endpoint) Close() error {
	e.closeOnce.Do(func() {
		e.mu.Lock()
		e.closed = true
		conns := make([]*conn, 0, len(e.conns))
		for c := range e.conns {
			conns = append(conns, c)
		}
		for _, s := range e.parked {
			s.Close()
		}
		e.parked = nil
		e.mu.Unlock()
		close(e.done)
		e.stop()
		for _, ln := range e.lns {
			ln.Close()
		}
		for _, c := range conns {
			c.Close()
		}
		e.loop.stop()
		e.wg.Wait()
		if e.ns != netns.None() {
			e.ns.Close()
		}
	})
	return nil
}

// errNICDown wraps err as a failure of NIC nic's port when the NIC is down now, since a socket error on
// a NIC whose interface went down is that failure.
func (e *Endpoint) errNICDown(nic rdma.NICID, err error) error {
	if e.Health(nic) != rdma.Healthy && !errors.Is(err, rdma.ErrNICDown) {
		return fmt.Errorf("%w: %w", rdma.ErrNICDown, err)
	}
	return err
}
