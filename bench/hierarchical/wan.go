package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/internal/wanemu"
	"github.com/concord-ccl/concord/pccl"
)

// wan is where a group's master and peers talk to one another: the in-memory network, or the sites'
// network namespaces joined by the wanemu forwarder. A group is named by a prefix ("flat", "hier"),
// so that two groups on one wan keep apart.
type wan interface {
	// transport returns peer i's transport and the address it listens on for links.
	transport(group string, i int) (pccl.Transport, string)
	// master returns a listener for the group's master and the address peers dial.
	master(group string) (net.Listener, string, error)
	// bytes is the number of bytes sent so far between hosts of different sites, by any group.
	bytes(group string, peers int) int64
	// drops is the number of packets dropped so far between sites (always 0 on the in-memory
	// network, which does not drop).
	drops() uint64
	// crash makes peer i of the group die as a host does: its connections break and it can make no
	// new ones.
	crash(group string, i int)
}

// memWAN is the in-memory network: every ordered pair of hosts is a link of its own, shaped at the
// WAN rate between sites and at a peer's NICs together inside one.
type memWAN struct {
	net    *pccl.Network
	siteOf func(int) int
}

func newMemWAN(sites, peers int, siteOf func(int) int, sh shape, nics int) *memWAN {
	w := &memWAN{net: pccl.NewNetwork(), siteOf: siteOf}
	for _, prefix := range []string{"flat", "hier"} {
		for i := range peers {
			for j := range peers {
				if i == j {
					continue
				}
				lc := pccl.LinkConfig{Bandwidth: sh.nic * float64(nics), Latency: sh.lanRTT / 2}
				if siteOf(i) != siteOf(j) {
					lc = pccl.LinkConfig{Bandwidth: sh.wan, Latency: sh.wanRTT / 2}
				}
				w.net.SetLink(host(prefix, i), host(prefix, j), lc)
			}
		}
	}
	return w
}

func (w *memWAN) transport(group string, i int) (pccl.Transport, string) {
	return w.net.Host(host(group, i)), host(group, i) + ":9000"
}

func (w *memWAN) master(group string) (net.Listener, string, error) {
	addr := group + "-master:7000"
	ln, err := w.net.Host(group + "-master").Listen(addr)
	return ln, addr, err
}

func (w *memWAN) bytes(group string, peers int) int64 {
	var sum int64
	for i := range peers {
		for j := range peers {
			if w.siteOf(i) != w.siteOf(j) {
				sum += w.net.Stats(host(group, i), host(group, j))
			}
		}
	}
	return sum
}

func (w *memWAN) crash(group string, i int) { w.net.Crash(host(group, i)) }

func (w *memWAN) drops() uint64 { return 0 }

// nsWAN puts every site in a network namespace of a wanemu testbed: the peers of a site share its
// address and reach one another over the namespace's loopback, and everything between sites crosses
// one emulated WAN link per direction, shared by all flows, with the RTT in the packets' path. The
// master runs in site 0.
type nsWAN struct {
	tb     *wanemu.Testbed
	siteOf func(int) int

	mu    sync.Mutex
	peers map[peerKey]*crashable // filled as transports are handed out
}

// peerKey names peer i of a group.
type peerKey struct {
	group string
	i     int
}

func newNSWAN(sites int, siteOf func(int) int, sh shape, flowMbit float64) (*nsWAN, error) {
	tb, err := wanemu.New(wanemu.Config{Sites: sites, Offload: true, NamePrefix: "chier", Link: wanemu.Link{
		Delay: sh.wanRTT / 2, CapacityMbit: sh.wan * 8 / 1e6, FlowMbit: flowMbit}})
	if err != nil {
		return nil, err
	}
	if err := tb.Start(); err != nil {
		return nil, err
	}
	return &nsWAN{tb: tb, siteOf: siteOf, peers: map[peerKey]*crashable{}}, nil
}

func (w *nsWAN) close() error { return w.tb.Close() }

func (w *nsWAN) transport(group string, i int) (pccl.Transport, string) {
	s := w.siteOf(i)
	t := &crashable{ns: w.tb.Netns(s), inner: pccl.NewTCP(pccl.TCPConfig{})}
	w.mu.Lock()
	w.peers[peerKey{group, i}] = t
	w.mu.Unlock()
	return t, w.tb.Addr(s).String() + ":0"
}

func (w *nsWAN) master(group string) (net.Listener, string, error) {
	ln, err := w.tb.Netns(0).Listen("tcp", w.tb.Addr(0).String()+":0")
	if err != nil {
		return nil, "", err
	}
	return ln, ln.Addr().String(), nil
}

func (w *nsWAN) bytes(string, int) int64 {
	return int64(w.between(func(st wanemu.LinkStats) uint64 { return st.Bytes }))
}

func (w *nsWAN) drops() uint64 {
	return w.between(func(st wanemu.LinkStats) uint64 { return st.LossDrops + st.FlowQueueDrops + st.QueueDrops })
}

// between sums f over the counters of every link between two sites.
func (w *nsWAN) between(f func(wanemu.LinkStats) uint64) uint64 {
	var sum uint64
	for s := range w.tb.Sites() {
		for d := range w.tb.Sites() {
			if s != d {
				sum += f(w.tb.Stats(s, d))
			}
		}
	}
	return sum
}

func (w *nsWAN) crash(group string, i int) {
	w.mu.Lock()
	t := w.peers[peerKey{group, i}]
	w.mu.Unlock()
	t.crash()
}

// crashable is a TCP transport whose sockets are made inside a network namespace, and which can die
// as a host does: crash resets every connection it made or accepted, closes its listeners, and fails
// every later Listen and Dial. It has no sessions (the communicator does not use them).
type crashable struct {
	ns    *wanemu.Netns
	inner pccl.Transport

	mu      sync.Mutex
	crashed bool
	conns   []net.Conn
	lns     []net.Listener
}

// errCrashed is what a crashed transport's Listen and Dial return.
var errCrashed = fmt.Errorf("host crashed: %w", syscall.ENETUNREACH)

func (t *crashable) Name() string { return "tcp" }

func (t *crashable) Listen(addr string) (net.Listener, error) {
	var ln net.Listener
	err := t.ns.Do(func() (err error) {
		ln, err = t.inner.Listen(addr)
		return err
	})
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.crashed {
		ln.Close()
		return nil, errCrashed
	}
	t.lns = append(t.lns, ln)
	return &crashListener{Listener: ln, t: t}, nil
}

func (t *crashable) Dial(ctx context.Context, addr string) (net.Conn, error) {
	var c net.Conn
	err := t.ns.Do(func() (err error) {
		c, err = t.inner.Dial(ctx, addr)
		return err
	})
	if err != nil {
		return nil, err
	}
	return t.track(c)
}

func (t *crashable) ListenSession(string) (transport.SessionListener, error) {
	return nil, errors.New("the bench's namespaced transport has no sessions")
}

func (t *crashable) DialSession(context.Context, string) (transport.Session, error) {
	return nil, errors.New("the bench's namespaced transport has no sessions")
}

// track records c so that a crash resets it; after a crash it resets c at once.
func (t *crashable) track(c net.Conn) (net.Conn, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.crashed {
		reset(c)
		return nil, errCrashed
	}
	t.conns = append(t.conns, c)
	return c, nil
}

func (t *crashable) crash() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.crashed = true
	for _, ln := range t.lns {
		ln.Close()
	}
	for _, c := range t.conns {
		reset(c)
	}
	t.lns, t.conns = nil, nil
}

// reset closes c with an RST, as the kernel of a host whose process died with unread data does. A
// connection inside the site (the TCP transport's unix socket) just closes, as on a process's death.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

type crashListener struct {
	net.Listener
	t *crashable
}

func (l *crashListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.t.track(c)
}
