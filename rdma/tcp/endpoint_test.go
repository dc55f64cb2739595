package tcp

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/netlab"
	"github.com/concord-ccl/concord/rdma"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitLimit bounds every wait for an event; tests never assert how long anything took.
const waitLimit = 10 * time.Second

// node is one endpoint under test with the events its handler received.
type node struct {
	ep     *Endpoint
	events chan rdma.Event
}

// record is a handler that copies Arrived data (it is lent only for the call) into a channel.
func (n *node) record(ev rdma.Event) {
	if a, ok := ev.(rdma.Arrived); ok {
		a.Data = bytes.Clone(a.Data)
		ev = a
	}
	select {
	case n.events <- ev:
	default:
		panic("test event buffer full")
	}
}

// next waits for the next event that match accepts, skipping others, and fails the test after waitLimit.
func (n *node) next(t *testing.T, what string, match func(rdma.Event) bool) rdma.Event {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		select {
		case ev := <-n.events:
			if match(ev) {
				return ev
			}
		case <-deadline:
			t.Fatalf("node %d: no %s within %v", n.ep.Node(), what, waitLimit)
			return nil
		}
	}
}

// newCluster builds a lab of nodes with nics NICs and one started endpoint per node, every endpoint
// knowing every other's listen addresses. It skips the test without root.
func newCluster(t *testing.T, nodes, nics int) (*netlab.Lab, []*node) {
	t.Helper()
	if err := netlab.Available(); err != nil {
		t.Skipf("netns testbed unavailable: %v (run as root)", err)
	}
	lab, err := netlab.New(netlab.Config{Nodes: nodes, NICs: nics})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lab.Close() })
	var out []*node
	for i, ln := range lab.Nodes() {
		var cfg Config
		cfg.Node = rdma.NodeID(i)
		cfg.NetNS = ln.Path()
		cfg.UserTimeout = 300 * time.Millisecond
		cfg.KeepAlive = 200 * time.Millisecond
		for _, nic := range ln.NICs() {
			cfg.NICs = append(cfg.NICs, NICConfig{Interface: nic.Name, Addr: nic.Addr, NUMANode: -1, Bandwidth: 1e8})
		}
		ep, err := Listen(cfg)
		if err != nil {
			t.Fatal(err)
		}
		n := &node{ep: ep, events: make(chan rdma.Event, 4096)}
		t.Cleanup(func() { ep.Close() }) // runs before lab.Close
		out = append(out, n)
	}
	for _, a := range out {
		for _, b := range out {
			if a != b {
				if err := a.ep.SetPeer(b.ep.Node(), b.ep.ListenAddrs()); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := a.ep.Start(a.record); err != nil {
			t.Fatal(err)
		}
	}
	return lab, out
}

// connect opens the mirrored spec on both nodes and waits for both ConnUp events.
func connect(t *testing.T, a, b *node, spec rdma.ConnSpec) (rdma.Conn, rdma.Conn) {
	t.Helper()
	spec.Peer = b.ep.Node()
	ca, err := a.ep.Connect(spec)
	if err != nil {
		t.Fatal(err)
	}
	mirror := rdma.ConnSpec{Peer: a.ep.Node(), Local: spec.Remote, Remote: spec.Local, Class: spec.Class, Index: spec.Index}
	cb, err := b.ep.Connect(mirror)
	if err != nil {
		t.Fatal(err)
	}
	awaitUp(t, a, ca)
	awaitUp(t, b, cb)
	return ca, cb
}

// awaitUp waits for n's ConnUp of c and fails the test on its ConnDown.
func awaitUp(t *testing.T, n *node, c rdma.Conn) {
	t.Helper()
	n.next(t, "ConnUp for "+c.Spec().String(), func(ev rdma.Event) bool {
		switch ev := ev.(type) {
		case rdma.ConnUp:
			return ev.Conn == c
		case rdma.ConnDown:
			if ev.Conn == c {
				t.Fatalf("node %d: %v: %v", n.ep.Node(), ev.Conn.Spec(), ev.Err)
			}
		}
		return false
	})
}

// laneSocket returns c's socket of the given lane.
func laneSocket(c rdma.Conn, lane int) net.Conn {
	cc := c.(*conn)
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.socks[lane]
}

func isConnDown(c rdma.Conn) func(rdma.Event) bool {
	return func(ev rdma.Event) bool {
		d, ok := ev.(rdma.ConnDown)
		return ok && d.Conn == c
	}
}

func TestChunksAndAcksOnEveryNIC(t *testing.T) {
	const nics, chunks = 2, 4
	_, nodes := newCluster(t, 3, nics)
	expected := make([]int64, len(nodes)) // chunk bytes each node receives
	for r := range nics {
		for i := range nodes {
			a, b := nodes[i], nodes[(i+1)%len(nodes)]
			ca, cb := connect(t, a, b, rdma.ConnSpec{Local: rdma.NICID(r), Remote: rdma.NICID(r)})
			// The sockets are bound to the NICs' addresses at both ends.
			for _, side := range []struct {
				c    rdma.Conn
				node int
				peer int
			}{{ca, i, (i + 1) % len(nodes)}, {cb, (i + 1) % len(nodes), i}} {
				for lane := range lanes {
					sock := laneSocket(side.c, lane)
					if got := sock.LocalAddr().(*net.TCPAddr).AddrPort().Addr(); got != netlab.Addr(side.node, r) {
						t.Errorf("node %d nic%d lane %d: local address %v, want %v", side.node, r, lane, got, netlab.Addr(side.node, r))
					}
					if got := sock.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); got != netlab.Addr(side.peer, r) {
						t.Errorf("node %d nic%d lane %d: remote address %v, want %v", side.node, r, lane, got, netlab.Addr(side.peer, r))
					}
				}
			}
			// Both directions at once; each side checks arrivals in order and completions in order.
			payload := func(from, seq int) []byte {
				return bytes.Repeat([]byte(fmt.Sprintf("n%d-r%d-s%d;", from, r, seq)), 1000*(seq+1))
			}
			for s := range chunks {
				expected[(i+1)%len(nodes)] += int64(len(payload(i, s)))
				expected[i] += int64(len(payload((i+1)%len(nodes), s)))
				if err := ca.Send(rdma.Chunk{Tag: 1, Seq: uint64(s), Data: payload(i, s)}); err != nil {
					t.Fatal(err)
				}
				if err := cb.Send(rdma.Chunk{Tag: 2, Seq: uint64(s), Data: payload((i+1)%len(nodes), s)}); err != nil {
					t.Fatal(err)
				}
			}
			for _, side := range []struct {
				n       *node
				c       rdma.Conn
				fromIdx int
				inTag   uint32
				outTag  uint32
			}{{b, cb, i, 1, 2}, {a, ca, (i + 1) % len(nodes), 2, 1}} {
				arrived, completed := 0, 0
				for arrived < chunks || completed < chunks {
					ev := side.n.next(t, "chunk events", func(ev rdma.Event) bool {
						switch ev := ev.(type) {
						case rdma.Arrived:
							return ev.Conn == side.c
						case rdma.Completed:
							return ev.Conn == side.c
						case rdma.ConnDown:
							if ev.Conn == side.c {
								t.Fatalf("%v: %v", ev.Conn.Spec(), ev.Err)
							}
						}
						return false
					})
					switch ev := ev.(type) {
					case rdma.Arrived:
						if ev.Tag != side.inTag || ev.Seq != uint64(arrived) || !bytes.Equal(ev.Data, payload(side.fromIdx, arrived)) {
							t.Errorf("arrival %d: tag %d seq %d, %d bytes", arrived, ev.Tag, ev.Seq, len(ev.Data))
						}
						arrived++
					case rdma.Completed:
						if ev.Tag != side.outTag || ev.Seq != uint64(completed) {
							t.Errorf("completion %d: tag %d seq %d", completed, ev.Tag, ev.Seq)
						}
						completed++
					}
				}
			}
			ca.Close()
			cb.Close()
		}
	}
	for i, n := range nodes {
		if got := n.ep.ReceivedBytes(); got != expected[i] {
			t.Errorf("node %d: ReceivedBytes %d, want %d", i, got, expected[i])
		}
	}
}

func TestProbesOnDedicatedConnections(t *testing.T) {
	_, nodes := newCluster(t, 2, 2)
	a, b := nodes[0], nodes[1]
	pa, _ := connect(t, a, b, rdma.ConnSpec{Local: 1, Remote: 1, Class: rdma.ProbeClass})
	da, _ := connect(t, a, b, rdma.ConnSpec{Local: 1, Remote: 1, Class: rdma.DataClass})
	for id := uint64(1); id <= 3; id++ {
		if err := pa.Probe(id); err != nil {
			t.Fatal(err)
		}
		ev := a.next(t, "ProbeDone", func(ev rdma.Event) bool { _, ok := ev.(rdma.ProbeDone); return ok }).(rdma.ProbeDone)
		if ev.Conn != pa || ev.ID != id || ev.Err != nil || ev.RTT <= 0 {
			t.Errorf("probe %d: %+v", id, ev)
		}
	}
	if err := pa.Send(rdma.Chunk{}); !errors.Is(err, rdma.ErrWrongClass) {
		t.Errorf("Send on a probe connection: %v, want ErrWrongClass", err)
	}
	if err := da.Probe(1); !errors.Is(err, rdma.ErrWrongClass) {
		t.Errorf("Probe on a data connection: %v, want ErrWrongClass", err)
	}
	pa.Close()
	if err := pa.Probe(9); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Probe after Close: %v, want ErrClosed", err)
	}
}

func TestNICDownIsReportedByLinkStateAndSocketErrors(t *testing.T) {
	lab, nodes := newCluster(t, 2, 2)
	a, b := nodes[0], nodes[1]
	healthy0, _ := connect(t, a, b, rdma.ConnSpec{Local: 0, Remote: 0})
	victimA, victimB := connect(t, a, b, rdma.ConnSpec{Local: 1, Remote: 1})
	probe, _ := connect(t, a, b, rdma.ConnSpec{Local: 1, Remote: 1, Class: rdma.ProbeClass})

	if err := lab.SetNIC(0, 1, false); err != nil {
		t.Fatal(err)
	}
	// The link-state watch: a port event, then the NIC's connections fail with ErrNICDown.
	pc := a.next(t, "PortChanged", func(ev rdma.Event) bool { _, ok := ev.(rdma.PortChanged); return ok }).(rdma.PortChanged)
	if pc.NIC != 1 || pc.Health != rdma.Down {
		t.Errorf("PortChanged %+v, want nic1 down", pc)
	}
	if h := a.ep.Health(1); h != rdma.Down {
		t.Errorf("Health(1) = %v, want down", h)
	}
	down := a.next(t, "ConnDown of nic1", isConnDown(victimA)).(rdma.ConnDown)
	if !errors.Is(down.Err, rdma.ErrNICDown) {
		t.Errorf("ConnDown error %v, want ErrNICDown", down.Err)
	}
	if err := victimA.Send(rdma.Chunk{}); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Send after ConnDown: %v, want ErrClosed", err)
	}
	if err := probe.Probe(5); err != nil {
		t.Fatal(err)
	}
	pd := a.next(t, "ProbeDone", func(ev rdma.Event) bool { _, ok := ev.(rdma.ProbeDone); return ok }).(rdma.ProbeDone)
	if pd.ID != 5 || !errors.Is(pd.Err, rdma.ErrNICDown) {
		t.Errorf("probe on a down NIC: %+v, want ErrNICDown", pd)
	}
	// A new connection on the down NIC fails at once.
	late, err := a.ep.Connect(rdma.ConnSpec{Peer: 1, Local: 1, Remote: 1, Index: 7})
	if err != nil {
		t.Fatal(err)
	}
	if d := a.next(t, "ConnDown of a connect on a down NIC", isConnDown(late)).(rdma.ConnDown); !errors.Is(d.Err, rdma.ErrNICDown) {
		t.Errorf("Connect on a down NIC: %v, want ErrNICDown", d.Err)
	}

	// The far end's NIC is up: it learns from its socket, when sent data stays unacknowledged past
	// TCP_USER_TIMEOUT.
	if err := victimB.Send(rdma.Chunk{Data: make([]byte, 4096)}); err != nil {
		t.Fatal(err)
	}
	farDown := b.next(t, "ConnDown on the far end", isConnDown(victimB)).(rdma.ConnDown)
	if !errors.Is(farDown.Err, syscall.ETIMEDOUT) || errors.Is(farDown.Err, rdma.ErrNICDown) {
		t.Errorf("far end ConnDown %v, want ETIMEDOUT without ErrNICDown", farDown.Err)
	}

	// The other NIC keeps working.
	if err := healthy0.Send(rdma.Chunk{Tag: 3, Seq: 9, Data: []byte("still here")}); err != nil {
		t.Fatal(err)
	}
	a.next(t, "Completed on nic0", func(ev rdma.Event) bool {
		c, ok := ev.(rdma.Completed)
		return ok && c.Conn == healthy0 && c.Seq == 9
	})

	// Back up: a port event, and a new connection on the NIC works.
	if err := lab.SetNIC(0, 1, true); err != nil {
		t.Fatal(err)
	}
	pc = a.next(t, "PortChanged up", func(ev rdma.Event) bool { _, ok := ev.(rdma.PortChanged); return ok }).(rdma.PortChanged)
	if pc.NIC != 1 || pc.Health != rdma.Healthy {
		t.Errorf("PortChanged %+v, want nic1 healthy", pc)
	}
	connect(t, a, b, rdma.ConnSpec{Local: 1, Remote: 1, Index: 1})
}

func TestPortDownIsALinkStateEvent(t *testing.T) {
	lab, nodes := newCluster(t, 2, 1)
	a, b := nodes[0], nodes[1]
	ca, _ := connect(t, a, b, rdma.ConnSpec{})
	if err := lab.SetPort(0, 0, false); err != nil {
		t.Fatal(err)
	}
	pc := a.next(t, "PortChanged", func(ev rdma.Event) bool { _, ok := ev.(rdma.PortChanged); return ok }).(rdma.PortChanged)
	if pc.NIC != 0 || pc.Health != rdma.Down {
		t.Errorf("PortChanged %+v, want nic0 down", pc)
	}
	if d := a.next(t, "ConnDown", isConnDown(ca)).(rdma.ConnDown); !errors.Is(d.Err, rdma.ErrNICDown) {
		t.Errorf("ConnDown %v, want ErrNICDown", d.Err)
	}
}

func TestHostNICsInANamespace(t *testing.T) {
	if err := netlab.Available(); err != nil {
		t.Skipf("netns testbed unavailable: %v (run as root)", err)
	}
	lab, err := netlab.New(netlab.Config{Nodes: 1, NICs: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer lab.Close()
	var nics []NICConfig
	if err := lab.Node(0).Do(func() error {
		var err error
		nics, err = HostNICs()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(nics) != 2 {
		t.Fatalf("HostNICs = %+v, want nic0 and nic1", nics)
	}
	for r, n := range nics {
		if n.Interface != netlab.NICName(r) || n.Addr != netlab.Addr(0, r) || n.NUMANode != -1 || n.Distance != 0 {
			t.Errorf("NIC %d = %+v", r, n)
		}
	}
}

func TestTimersAndPostRunInTheEventContext(t *testing.T) {
	if err := netlab.Available(); err != nil {
		t.Skipf("netns testbed unavailable: %v (run as root)", err)
	}
	_, nodes := newCluster(t, 1, 1)
	ep := nodes[0].ep
	ran := make(chan string, 4)
	stopped := ep.AfterFunc(time.Hour, func() { ran <- "stopped timer" })
	if !stopped.Stop() {
		t.Errorf("Stop of a pending timer = false")
	}
	if stopped.Stop() {
		t.Errorf("second Stop = true")
	}
	fired := ep.AfterFunc(time.Millisecond, func() { ran <- "timer" })
	ep.Post(func() { ran <- "post" })
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case s := <-ran:
			got[s] = true
		case <-time.After(waitLimit):
			t.Fatalf("callbacks ran: %v", got)
		}
	}
	if !got["timer"] || !got["post"] || got["stopped timer"] {
		t.Errorf("callbacks ran: %v", got)
	}
	if fired.Stop() {
		t.Errorf("Stop of a fired timer = true")
	}
}

func TestValidate(t *testing.T) {
	good := NICConfig{Interface: "eth0", Addr: netip.MustParseAddr("198.18.0.1")}
	bad := []Config{
		{},
		{NICs: []NICConfig{{Addr: good.Addr}}},
		{NICs: []NICConfig{{Interface: "eth0"}}},
		{NICs: []NICConfig{{Interface: "a-very-long-interface-name", Addr: good.Addr}}},
		{NICs: []NICConfig{good}, Peers: map[rdma.NodeID][]netip.AddrPort{0: {netip.MustParseAddrPort("198.18.0.2:1")}}},
		{Node: 1, NICs: []NICConfig{good}, Peers: map[rdma.NodeID][]netip.AddrPort{0: {netip.MustParseAddrPort("198.18.0.2:0")}}},
		{NICs: []NICConfig{good}, UserTimeout: -1},
	}
	for i, c := range bad {
		if err := c.Validate(); !errors.Is(err, rdma.ErrInvalid) {
			t.Errorf("case %d: Validate = %v, want ErrInvalid", i, err)
		}
	}
	if err := (Config{NICs: []NICConfig{good}}).Validate(); err != nil {
		t.Errorf("minimal config: %v", err)
	}
}

func TestCloseEndsDialsInProgress(t *testing.T) {
	lab, nodes := newCluster(t, 2, 1)
	a := nodes[0]
	// The peer's port is down: the dial's packets are lost, and it would retry for an hour.
	if err := lab.SetPort(1, 0, false); err != nil {
		t.Fatal(err)
	}
	a.ep.cfg.ConnectTimeout = time.Hour
	c, err := a.ep.Connect(rdma.ConnSpec{Peer: 1})
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	go func() {
		a.ep.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(waitLimit):
		t.Fatalf("Close still waits for the dial after %v", waitLimit)
	}
	if err := c.Send(rdma.Chunk{}); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Send after Close: %v, want ErrClosed", err)
	}
}

// TestChunksCompleteOnArrival holds the receiver's event context and checks that the sender still gets
// a completion for every chunk the receiver can buffer (completions do not wait for the handler), and
// that once the context is free every chunk arrives, in order, with its data.
func TestChunksCompleteOnArrival(t *testing.T) {
	_, nodes := newCluster(t, 2, 1)
	a, b := nodes[0], nodes[1]
	ca, _ := connect(t, a, b, rdma.ConnSpec{Class: rdma.DataClass})
	release := make(chan struct{})
	held := make(chan struct{})
	b.ep.Post(func() {
		close(held)
		<-release
	})
	<-held
	payload := func(seq int) []byte { return bytes.Repeat([]byte{byte(seq + 1)}, 64<<10) }
	for seq := range recvBuffers {
		if err := ca.Send(rdma.Chunk{Tag: 7, Seq: uint64(seq), Data: payload(seq)}); err != nil {
			close(release)
			t.Fatal(err)
		}
	}
	for seq := range recvBuffers {
		ev := a.next(t, fmt.Sprintf("Completed %d while the receiver is busy", seq), func(ev rdma.Event) bool {
			_, ok := ev.(rdma.Completed)
			return ok
		})
		if c := ev.(rdma.Completed); c.Conn != ca || c.Tag != 7 || c.Seq != uint64(seq) {
			close(release)
			t.Fatalf("completion %d: got %v tag %d seq %d", seq, c.Conn.Spec(), c.Tag, c.Seq)
		}
	}
	close(release)
	for seq := range recvBuffers {
		ev := b.next(t, fmt.Sprintf("Arrived %d", seq), func(ev rdma.Event) bool {
			_, ok := ev.(rdma.Arrived)
			return ok
		})
		got := ev.(rdma.Arrived)
		if got.Tag != 7 || got.Seq != uint64(seq) || !bytes.Equal(got.Data, payload(seq)) {
			t.Fatalf("arrival %d: tag %d seq %d, %d bytes starting %v", seq, got.Tag, got.Seq, len(got.Data), got.Data[:1])
		}
	}
}

// TestFrameOnTheWrongLaneFailsTheConnection writes a chunk on the lane that brings the dialer its
// answers: the dialer fails the connection with a malformed-frame error, and the acceptor learns it
// from its socket.
func TestFrameOnTheWrongLaneFailsTheConnection(t *testing.T) {
	_, nodes := newCluster(t, 2, 1)
	a, b := nodes[0], nodes[1]
	ca, cb := connect(t, a, b, rdma.ConnSpec{Class: rdma.DataClass})
	answers := ca.(*conn).out // the dialer's request lane: the acceptor writes only answers on it
	if answers != 0 || cb.(*conn).out != 1 {
		t.Fatalf("request lanes: dialer %d, acceptor %d; want 0 and 1", answers, cb.(*conn).out)
	}
	frame := append(appendChunkHead(nil, 3, 4, 5), "stray"...)
	if _, err := laneSocket(cb, answers).Write(frame); err != nil {
		t.Fatal(err)
	}
	down := a.next(t, "ConnDown after a chunk on the answers lane", isConnDown(ca)).(rdma.ConnDown)
	if !errors.Is(down.Err, errFrame) {
		t.Errorf("dialer's ConnDown: %v, want errFrame", down.Err)
	}
	b.next(t, "the acceptor's ConnDown", isConnDown(cb))
	if err := ca.Send(rdma.Chunk{Data: []byte("x")}); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Send after the failure: %v, want ErrClosed", err)
	}
}

// TestEitherLaneClosingFailsTheConnection closes one socket of a connection under it, each lane in
// turn: both ends report ConnDown, so a connection is never left working on one lane.
func TestEitherLaneClosingFailsTheConnection(t *testing.T) {
	_, nodes := newCluster(t, 2, 1)
	a, b := nodes[0], nodes[1]
	for lane := range lanes {
		ca, cb := connect(t, a, b, rdma.ConnSpec{Class: rdma.DataClass, Index: uint32(lane)})
		laneSocket(cb, lane).Close()
		a.next(t, fmt.Sprintf("the dialer's ConnDown after lane %d closed", lane), isConnDown(ca))
		b.next(t, fmt.Sprintf("the acceptor's ConnDown after lane %d closed", lane), isConnDown(cb))
	}
}

// TestSecondAcceptingConnectIsRefused opens the accepting end of the same spec twice before the dialer
// comes: the second call is refused, and the first still pairs with the dialer's two lanes.
func TestSecondAcceptingConnectIsRefused(t *testing.T) {
	_, nodes := newCluster(t, 2, 1)
	a, b := nodes[0], nodes[1]
	spec := rdma.ConnSpec{Peer: a.ep.Node(), Class: rdma.DataClass}
	cb, err := b.ep.Connect(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ep.Connect(spec); !errors.Is(err, rdma.ErrInvalid) {
		t.Fatalf("second Connect of %v: %v, want ErrInvalid", spec, err)
	}
	ca, err := a.ep.Connect(rdma.ConnSpec{Peer: b.ep.Node(), Class: rdma.DataClass})
	if err != nil {
		t.Fatal(err)
	}
	awaitUp(t, a, ca)
	awaitUp(t, b, cb)
	if err := ca.Send(rdma.Chunk{Tag: 1, Seq: 2, Data: []byte("hello")}); err != nil {
		t.Fatal(err)
	}
	got := b.next(t, "Arrived", func(ev rdma.Event) bool {
		ar, ok := ev.(rdma.Arrived)
		return ok && ar.Conn == cb
	}).(rdma.Arrived)
	if got.Tag != 1 || got.Seq != 2 || string(got.Data) != "hello" {
		t.Errorf("arrived tag %d seq %d %q", got.Tag, got.Seq, got.Data)
	}
}
