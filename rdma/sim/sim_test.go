package sim_test

import (
	"errors"
	"testing"
	"time"

	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/sim"
)

type recorder struct{ events []rdma.Event }

func (r *recorder) handle(ev rdma.Event) {
	if a, ok := ev.(rdma.Arrived); ok {
		a.Data = append([]byte(nil), a.Data...)
		ev = a
	}
	r.events = append(r.events, ev)
}

func pair(t *testing.T, cfg sim.Config) (*sim.Network, *recorder, *recorder, rdma.Conn, rdma.Conn) {
	t.Helper()
	n := sim.New(cfg)
	nics := []rdma.NIC{{Bandwidth: 1e9}, {Bandwidth: 1e9}}
	a, b := n.AddNode(1, nics), n.AddNode(2, nics)
	ra, rb := &recorder{}, &recorder{}
	if err := a.Start(ra.handle); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(rb.handle); err != nil {
		t.Fatal(err)
	}
	ca, err := a.Connect(rdma.ConnSpec{Peer: 2, Local: 0, Remote: 0})
	if err != nil {
		t.Fatal(err)
	}
	cb, err := b.Connect(rdma.ConnSpec{Peer: 1, Local: 0, Remote: 0})
	if err != nil {
		t.Fatal(err)
	}
	return n, ra, rb, ca, cb
}

func TestOrderAndCompletions(t *testing.T) {
	n, ra, rb, ca, _ := pair(t, sim.Config{Latency: time.Microsecond})
	for i := range 5 {
		if err := ca.Send(rdma.Chunk{Tag: 7, Seq: uint64(i), Data: make([]byte, 1000*(5-i))}); err != nil {
			t.Fatal(err)
		}
	}
	n.Run()
	var seqs, acks []uint64
	for _, ev := range rb.events {
		if a, ok := ev.(rdma.Arrived); ok {
			seqs = append(seqs, a.Seq)
			if len(a.Data) != 1000*(5-int(a.Seq)) || a.Tag != 7 {
				t.Errorf("chunk %d: %d bytes tag %d", a.Seq, len(a.Data), a.Tag)
			}
		}
	}
	for _, ev := range ra.events {
		if c, ok := ev.(rdma.Completed); ok {
			acks = append(acks, c.Seq)
		}
	}
	if len(seqs) != 5 || len(acks) != 5 {
		t.Fatalf("arrived %v, completed %v", seqs, acks)
	}
	for i := range 5 {
		if seqs[i] != uint64(i) || acks[i] != uint64(i) {
			t.Fatalf("out of order: arrived %v, completed %v", seqs, acks)
		}
	}
	// 15 kB at 1 GB/s take 15 µs on the wire, plus latency.
	if n.Now() < 15*time.Microsecond {
		t.Errorf("finished at %v, faster than the NIC's bandwidth allows", n.Now())
	}
}

func TestLocalNICDown(t *testing.T) {
	n, ra, rb, ca, _ := pair(t, sim.Config{})
	n.Run()
	ca.Send(rdma.Chunk{Seq: 1, Data: make([]byte, 100000)})
	n.RunUntil(n.Now() + time.Microsecond)
	n.SetPort(1, 0, false)
	n.Run()
	var down, port bool
	for _, ev := range ra.events {
		switch ev := ev.(type) {
		case rdma.ConnDown:
			down = errors.Is(ev.Err, rdma.ErrNICDown)
		case rdma.PortChanged:
			port = ev.NIC == 0 && ev.Health == rdma.Down
		case rdma.Completed:
			t.Error("a chunk in flight through a failed NIC completed")
		}
	}
	if !down || !port {
		t.Errorf("ConnDown(ErrNICDown) %v, PortChanged %v", down, port)
	}
	for _, ev := range rb.events {
		if _, ok := ev.(rdma.Arrived); ok {
			t.Error("a chunk in flight through a failed NIC arrived")
		}
	}
	if err := ca.Send(rdma.Chunk{}); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("Send on a failed connection: %v", err)
	}
}

func TestRemoteFailureIsSilentAndProbesTell(t *testing.T) {
	n, ra, _, _, _ := pair(t, sim.Config{RetryTimeout: time.Millisecond})
	a := n.Node(1)
	b := n.Node(2)
	pa, _ := a.Connect(rdma.ConnSpec{Peer: 2, Local: 1, Remote: 1, Class: rdma.ProbeClass})
	b.Connect(rdma.ConnSpec{Peer: 1, Local: 1, Remote: 1, Class: rdma.ProbeClass})
	n.Run()
	if err := pa.Probe(1); err != nil {
		t.Fatal(err)
	}
	n.Run()
	n.SetPort(2, 1, false)
	pa.Probe(2)
	n.Run()
	n.SetPort(1, 1, false)
	pa.Probe(3)
	n.Run()
	got := map[uint64]error{}
	for _, ev := range ra.events {
		if p, ok := ev.(rdma.ProbeDone); ok {
			got[p.ID] = p.Err
		}
	}
	if err, ok := got[1]; !ok || err != nil {
		t.Errorf("probe of a healthy NIC: %v %v", ok, err)
	}
	if _, ok := got[2]; ok {
		t.Error("probe of a dead remote NIC was answered")
	}
	if err := got[3]; !errors.Is(err, rdma.ErrNICDown) {
		t.Errorf("probe from a dead local NIC: %v", err)
	}
}

func TestLinkCutAndTrigger(t *testing.T) {
	n, ra, rb, ca, _ := pair(t, sim.Config{RetryTimeout: time.Millisecond})
	n.Inject(sim.Trigger{From: 1, To: 2, NIC: 0, Nth: 2}, sim.Fault{Kind: sim.LinkDown, Node: 1, NIC: 0, Peer: 2, PeerNIC: 0})
	n.Run()
	for i := range 5 {
		ca.Send(rdma.Chunk{Seq: uint64(i), Data: make([]byte, 1000)})
		n.RunUntil(n.Now() + 10*time.Microsecond)
	}
	n.Run()
	var arrived []uint64
	for _, ev := range rb.events {
		if a, ok := ev.(rdma.Arrived); ok {
			arrived = append(arrived, a.Seq)
		}
	}
	if len(arrived) != 2 || arrived[0] != 0 || arrived[1] != 1 {
		t.Errorf("arrived %v, want [0 1]: chunk 2 is lost and the connection delivers nothing after it", arrived)
	}
	var down bool
	for _, ev := range ra.events {
		if _, ok := ev.(rdma.ConnDown); ok {
			down = true
		}
	}
	if !down {
		t.Error("the sender of a broken connection got no ConnDown after the retry timeout")
	}
	if s := n.Struck(); len(s) != 1 {
		t.Errorf("struck %v", s)
	}
}

func TestTimersAndPost(t *testing.T) {
	n := sim.New(sim.Config{})
	e := n.AddNode(1, []rdma.NIC{{}})
	var order []int
	e.AfterFunc(2*time.Millisecond, func() { order = append(order, 2) })
	tm := e.AfterFunc(time.Millisecond, func() { order = append(order, 1) })
	e.Post(func() { order = append(order, 0) })
	if !tm.Stop() || tm.Stop() {
		t.Error("Stop should report true once")
	}
	n.Run()
	if len(order) != 2 || order[0] != 0 || order[1] != 2 || n.Now() != 2*time.Millisecond {
		t.Errorf("order %v at %v", order, n.Now())
	}
}

// TestReceivePortTakesChunksAsTheyCome: a receiving NIC serves chunks in the order their first bytes
// reach it. Node 1 posts ten chunks to node 3 and node 2 posts one at the same instant, all on NICs of
// equal rate: node 2's chunk shares node 3's port with node 1's first one and arrives after two chunk
// times, not after node 1's ten; the port stays busy, so node 1's last chunk still needs eleven.
func TestReceivePortTakesChunksAsTheyCome(t *testing.T) {
	const lat = time.Microsecond
	n := sim.New(sim.Config{Latency: lat})
	nics := []rdma.NIC{{Bandwidth: 1e9}}
	eps := []*sim.Endpoint{n.AddNode(1, nics), n.AddNode(2, nics), n.AddNode(3, nics)}
	arrived := map[[2]uint64]time.Duration{} // (sender, seq) -> virtual time of arrival
	for i, ep := range eps {
		id := uint64(i + 1)
		if err := ep.Start(func(ev rdma.Event) {
			if a, ok := ev.(rdma.Arrived); ok && id == 3 {
				arrived[[2]uint64{uint64(a.Tag), a.Seq}] = n.Now()
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	conn := func(from *sim.Endpoint, to rdma.NodeID) rdma.Conn {
		c, err := from.Connect(rdma.ConnSpec{Peer: to})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c13, c23 := conn(eps[0], 3), conn(eps[1], 3)
	conn(eps[2], 1)
	conn(eps[2], 2)
	n.Run()
	const size = 10_000 // 10 µs at 1 GB/s
	chunk := 10 * time.Microsecond
	t0 := n.Now()
	for i := range 10 {
		if err := c13.Send(rdma.Chunk{Tag: 1, Seq: uint64(i), Data: make([]byte, size)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c23.Send(rdma.Chunk{Tag: 2, Seq: 0, Data: make([]byte, size)}); err != nil {
		t.Fatal(err)
	}
	n.Run()
	if got, want := arrived[[2]uint64{2, 0}]-t0, 2*chunk+lat; got != want {
		t.Errorf("node 2's chunk arrived after %v, want %v", got, want)
	}
	if got, want := arrived[[2]uint64{1, 9}]-t0, 11*chunk+lat; got != want {
		t.Errorf("node 1's last chunk arrived after %v, want %v", got, want)
	}
	if len(arrived) != 11 {
		t.Errorf("%d chunks arrived, want 11", len(arrived))
	}
}
