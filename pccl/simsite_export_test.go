package pccl

import (
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/sim"
)

// SimSite is an intra-site fabric on the sim provider, for tests of the tier without namespaces: one
// simulated network whose virtual time follows the wall clock (a goroutine runs its events as their
// time comes, and runs the tests' requests between them), and a sim node for each generation of each
// peer's fabric. Faults strike at a chosen chunk, so a test knows they hit a collective mid-flight.
type SimSite struct {
	net   *sim.Network
	nics  int
	bw    float64         // bytes per second per NIC
	rails map[int]float64 // NICs of another rate, on every node: bytes per second by NIC index
	start time.Time
	tasks chan func()
	quit  chan struct{}
	done  chan struct{}

	// Owned by the loop: each peer's node of its newest generation and that node's ring successor;
	// the nodes a peer has opened.
	node, succ map[int]rdma.NodeID
	opened     map[rdma.NodeID]bool
}

// NewSimSite starts a simulated fabric whose nodes have nics NICs of mbit Mbit/s each; it stops when
// the test ends, after the communicators started later have closed.
func NewSimSite(t testing.TB, nics int, mbit float64) *SimSite {
	s := &SimSite{net: sim.New(sim.Config{Latency: 10 * time.Microsecond}), nics: nics, bw: mbit * 1e6 / 8, start: time.Now(),
		tasks: make(chan func()), quit: make(chan struct{}), done: make(chan struct{}),
		node: map[int]rdma.NodeID{}, succ: map[int]rdma.NodeID{}, opened: map[rdma.NodeID]bool{}}
	go s.loop()
	t.Cleanup(func() {
		close(s.quit)
		<-s.done
	})
	return s
}

// loop runs the network. Virtual time is the wall-clock time since the start less the time the loop
// spent running events: one goroutine runs every node's handlers, reductions included, one after the
// other, and that must not pass as time on the wire (where a node's handlers run beside the others'),
// or a loaded test machine would see acknowledgements late enough to look like failures.
func (s *SimSite) loop() {
	defer close(s.done)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	var busy time.Duration
	for {
		select {
		case <-s.quit:
			return
		case f := <-s.tasks:
			f()
		case <-tick.C:
		}
		t0 := time.Now()
		s.net.RunUntil(max(s.net.Now(), t0.Sub(s.start)-busy))
		busy += time.Since(t0)
	}
}

// do runs f in the loop and waits for it; it reports false, without running f, once the loop stopped.
func (s *SimSite) do(f func()) bool {
	ran := make(chan struct{})
	select {
	case s.tasks <- func() { f(); close(ran) }:
		<-ran
		return true
	case <-s.done:
		return false
	}
}

// OnSimSite gives peer i of a group s.nics NICs on s.
func OnSimSite(s *SimSite) func(i int, cfg *Config) {
	return func(i int, cfg *Config) {
		cfg.NICs = nil
		for r := range s.nics {
			cfg.NICs = append(cfg.NICs, fmt.Sprintf("sim%d", r))
		}
		cfg.siteProvider = &simPeer{s: s, index: i}
	}
}

// SlowRail gives NIC nic of every node opened after this call mbit Mbit/s instead of the site's rate.
func (s *SimSite) SlowRail(nic int, mbit float64) {
	s.do(func() {
		if s.rails == nil {
			s.rails = map[int]float64{}
		}
		s.rails[nic] = mbit * 1e6 / 8
	})
}

// FailNIC takes NIC nic of peer's newest fabric node down when that node posts its nth data chunk
// (from 0) on the NIC to its ring successor after this call.
func (s *SimSite) FailNIC(peer, nic int, nth uint64) error {
	return s.arm(peer, nic, nth, func(node, succ rdma.NodeID) sim.Fault {
		return sim.Fault{Kind: sim.NICDown, Node: node, NIC: rdma.NICID(nic)}
	})
}

// CutLink cuts the link between NIC nic of peer's newest fabric node and the same NIC of its ring
// successor when the node posts its nth data chunk on it after this call; both ports stay up.
func (s *SimSite) CutLink(peer, nic int, nth uint64) error {
	return s.arm(peer, nic, nth, func(node, succ rdma.NodeID) sim.Fault {
		return sim.Fault{Kind: sim.LinkDown, Node: node, NIC: rdma.NICID(nic), Peer: succ, PeerNIC: rdma.NICID(nic)}
	})
}

func (s *SimSite) arm(peer, nic int, nth uint64, fault func(node, succ rdma.NodeID) sim.Fault) error {
	var err error
	ok := s.do(func() {
		node, open := s.node[peer]
		if !open {
			err = fmt.Errorf("peer %d has no fabric node", peer)
			return
		}
		s.net.Inject(sim.Trigger{From: node, To: s.succ[peer], NIC: rdma.NICID(nic), Nth: nth}, fault(node, s.succ[peer]))
	})
	if !ok {
		return errors.New("the sim site stopped")
	}
	return err
}

// DownAll takes every NIC of peer's newest fabric node down now, as when the machine dies.
func (s *SimSite) DownAll(peer int) {
	s.do(func() {
		if node, open := s.node[peer]; open {
			for r := range s.nics {
				s.net.Apply(sim.Fault{Kind: sim.NICDown, Node: node, NIC: rdma.NICID(r)})
			}
		}
	})
}

// Struck returns how many faults have struck.
func (s *SimSite) Struck() int {
	n := 0
	s.do(func() { n = len(s.net.Struck()) })
	return n
}

// simPeer is one peer's provider on a SimSite.
type simPeer struct {
	s     *SimSite
	index int
}

// addrs announces one made-up address per NIC: sim nodes find each other by node id.
func (p *simPeer) addrs() []string {
	var out []string
	for r := range p.s.nics {
		out = append(out, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 250, byte(p.index), byte(r)}), 1).String())
	}
	return out
}

func (p *simPeer) open(node rdma.NodeID, ring []rdma.NodeID, _ map[rdma.NodeID][]netip.AddrPort, cfg rdma.Config) (*rdma.Node, fabricEndpoint, error) {
	var (
		n   *rdma.Node
		ep  *simEndpoint
		err error
	)
	ok := p.s.do(func() {
		if p.s.opened[node] {
			err = fmt.Errorf("sim node %d is open already", node)
			return
		}
		// A connection pairs with a node that exists: the ring's nodes are added by whichever of
		// them opens first.
		for _, id := range ring {
			if p.s.net.Node(id) == nil {
				nics := make([]rdma.NIC, p.s.nics)
				for r := range nics {
					nics[r] = rdma.NIC{Bandwidth: p.s.bw, NUMANode: -1}
					if bw, ok := p.s.rails[r]; ok {
						nics[r].Bandwidth = bw
					}
				}
				p.s.net.AddNode(id, nics)
			}
		}
		p.s.opened[node] = true
		ep = &simEndpoint{Endpoint: p.s.net.Node(node), s: p.s}
		if n, err = rdma.NewNode(ep, ring, cfg); err != nil {
			ep.Endpoint.Close()
			return
		}
		for i, id := range ring {
			if id == node {
				p.s.node[p.index], p.s.succ[p.index] = node, ring[(i+1)%len(ring)]
			}
		}
	})
	if !ok {
		return nil, nil, errors.New("the sim site stopped")
	}
	if err != nil {
		return nil, nil, err
	}
	return n, ep, nil
}

// simEndpoint is a sim endpoint driven by its SimSite's loop: the node calls it in the loop, the tier
// closes it from outside.
type simEndpoint struct {
	*sim.Endpoint
	s        *SimSite
	received atomic.Int64
}

func (e *simEndpoint) Start(h func(rdma.Event)) error {
	return e.Endpoint.Start(func(ev rdma.Event) {
		if a, ok := ev.(rdma.Arrived); ok {
			e.received.Add(int64(len(a.Data)))
		}
		h(ev)
	})
}

// Close closes the endpoint in the loop, so that no event of it runs afterwards.
func (e *simEndpoint) Close() error {
	if !e.s.do(func() { e.Endpoint.Close() }) {
		e.Endpoint.Close() // the loop stopped: nothing runs the network any more
	}
	return nil
}

func (e *simEndpoint) ReceivedBytes() int64 { return e.received.Load() }

// SiteCalibrationForTest returns the bandwidth in bytes per second of every NIC of every node of the
// table c's intra-site tier last calibrated, node by node in site ring order (nil if none).
func SiteCalibrationForTest(c *Communicator) [][]float64 {
	t := c.site
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([][]float64, len(t.cal.table.Beta))
	for i, row := range t.cal.table.Beta {
		for _, b := range row {
			out[i] = append(out[i], 1/b)
		}
	}
	return out
}
