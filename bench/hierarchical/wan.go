package main

import (
	"net"
	"sync"
	"sync/atomic"

	"github.com/concord-ccl/concord/bench/internal/crashhost"
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
	// crashOnWrite arms peer i of a group of peers to crash at its next write to another peer: that
	// write breaks halfway and the host crashes, from inside the write, so the crash lands in the
	// collective whatever the machine's load. It reports false where the network cannot do that
	// (the caller then crashes the peer itself).
	crashOnWrite(group string, i, peers int) bool
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

func (w *memWAN) crashOnWrite(group string, i, peers int) bool {
	var fired atomic.Bool
	for j := range peers {
		if j == i {
			continue
		}
		w.net.OnWrite(host(group, i), host(group, j), func(wr transport.Write) transport.Fault {
			if !fired.CompareAndSwap(false, true) {
				return transport.Fault{}
			}
			go w.net.Crash(host(group, i)) // on its own goroutine: the hook runs inside the victim's write
			return transport.Fault{Kind: transport.FaultReset, Keep: wr.Size / 2}
		})
	}
	return true
}

func (w *memWAN) drops() uint64 { return 0 }

// nsWAN puts every site in a network namespace of a wanemu testbed: the peers of a site share its
// address and reach one another over the namespace's loopback, and everything between sites crosses
// one emulated WAN link per direction, shared by all flows, with the RTT in the packets' path. The
// master runs in site 0.
type nsWAN struct {
	tb     *wanemu.Testbed
	siteOf func(int) int

	mu    sync.Mutex
	peers map[peerKey]*crashhost.Transport // filled as transports are handed out
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
	return &nsWAN{tb: tb, siteOf: siteOf, peers: map[peerKey]*crashhost.Transport{}}, nil
}

func (w *nsWAN) close() error { return w.tb.Close() }

func (w *nsWAN) transport(group string, i int) (pccl.Transport, string) {
	s := w.siteOf(i)
	t := crashhost.New(w.tb.Netns(s))
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

func (*nsWAN) crashOnWrite(string, int, int) bool { return false }

func (w *nsWAN) crash(group string, i int) {
	w.mu.Lock()
	t := w.peers[peerKey{group, i}]
	w.mu.Unlock()
	t.Crash()
}
