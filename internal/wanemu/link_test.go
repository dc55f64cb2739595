package wanemu

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

func TestLinkValidateNamesTheBadField(t *testing.T) {
	cases := []struct {
		l     Link
		field string
	}{
		{Link{Delay: -1}, "Delay"},
		{Link{CapacityMbit: -1}, "CapacityMbit"},
		{Link{CapacityMbit: math.NaN()}, "CapacityMbit"},
		{Link{FlowMbit: math.Inf(1)}, "FlowMbit"},
		{Link{Loss: 1}, "Loss"},
		{Link{Loss: math.NaN()}, "Loss"},
		{Link{QueueBytes: -1}, "QueueBytes"},
		{Link{FlowQueueBytes: -1}, "FlowQueueBytes"},
	}
	for _, c := range cases {
		err := c.l.Validate()
		if err == nil || !strings.Contains(err.Error(), "Link."+c.field+" ") {
			t.Errorf("Validate(%+v) = %v, want an error naming Link.%s", c.l, err, c.field)
		}
	}
	if err := (Link{Delay: time.Millisecond, CapacityMbit: 1, FlowMbit: 1, Loss: 0.5}).Validate(); err != nil {
		t.Errorf("Validate of a good link: %v", err)
	}
}

func TestConfigValidateNamesTheBadField(t *testing.T) {
	cases := []struct {
		c    Config
		want string
	}{
		{Config{Sites: -1}, "Config.Sites"},
		{Config{MTU: 100}, "Config.MTU"},
		{Config{Link: Link{Loss: 2}}, "Config.Link.Loss"},
		{Config{Links: map[[2]int]Link{{0, 2}: {}}}, "Config.Links[0→2]"},
		{Config{Links: map[[2]int]Link{{0, 1}: {Delay: -1}}}, "Config.Links[0→1].Delay"},
		{Config{NamePrefix: "a-b"}, "Config.NamePrefix"},
	}
	for _, c := range cases {
		if err := c.c.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", c.c, err, c.want)
		}
	}
	if _, err := New(Config{}); err != nil {
		t.Errorf("New of the zero Config: %v", err)
	}
}

func TestLinkDefaultsQueueToOneBDP(t *testing.T) {
	l := Link{Delay: 50 * time.Millisecond, CapacityMbit: 1000, FlowMbit: 100}.resolve(1500)
	if want := 12_500_000; l.QueueBytes != want {
		t.Errorf("QueueBytes = %d, want one BDP %d", l.QueueBytes, want)
	}
	if want := 1_250_000; l.FlowQueueBytes != want {
		t.Errorf("FlowQueueBytes = %d, want one BDP %d", l.FlowQueueBytes, want)
	}
	small := Link{Delay: time.Millisecond, CapacityMbit: 1}.resolve(1500)
	if want := minQueuePackets * 1500; small.QueueBytes != want || small.FlowQueueBytes != want {
		t.Errorf("queues %d and %d, want the floor %d", small.QueueBytes, small.FlowQueueBytes, want)
	}
}

func TestBucketPacesABacklogAtItsRate(t *testing.T) {
	const size = 1000
	b := newBucket(8, 1000) // 1 byte per microsecond; burst max(2000 bytes, 1 ms = 1000 bytes)
	var departures []int64
	for range 10 {
		departures = append(departures, b.depart(0, size))
	}
	// The burst lets two packets go at once; the rest leave one per millisecond.
	want := []int64{0, 0, 1 * ms, 2 * ms, 3 * ms, 4 * ms, 5 * ms, 6 * ms, 7 * ms, 8 * ms}
	for i := range want {
		if departures[i] != want[i] {
			t.Fatalf("departures %v, want %v", departures, want)
		}
	}
	if got := b.backlog(0); got != 8*size {
		t.Errorf("backlog at 0 = %v bytes, want %d", got, 8*size)
	}
	if got := b.backlog(100 * ms); got != 0 {
		t.Errorf("backlog once drained = %v, want 0", got)
	}
	if !b.idle(100 * ms) {
		t.Errorf("bucket not idle once drained")
	}
	// After an idle spell the burst is available again, and no more.
	if a, c, d := b.depart(100*ms, size), b.depart(100*ms, size), b.depart(100*ms, size); a != 100*ms || c != 100*ms || d != 101*ms {
		t.Errorf("after idle: departures %d %d %d, want 100 ms, 100 ms, 101 ms", a, c, d)
	}
}

func TestBucketKeepsFIFOOrderForMixedSizes(t *testing.T) {
	b := newBucket(8, 1500)
	last := int64(0)
	rng := rand.New(rand.NewPCG(1, 2))
	now := int64(0)
	for range 1000 {
		now += rng.Int64N(2 * ms)
		at := b.depart(now, 40+rng.IntN(1460))
		if at < last || at < now {
			t.Fatalf("departure %d before the previous %d or the arrival %d", at, last, now)
		}
		last = at
	}
}

func unlimitedCounters() *linkCounters { return &linkCounters{} }

func TestPathCapacityAndDelay(t *testing.T) {
	// 12 Mbit/s is 1500 bytes per millisecond; a 10 ms delay.
	p := newPath(Link{Delay: 10 * time.Millisecond, CapacityMbit: 12, QueueBytes: 100 * 1500}, 1500, 1, 0, unlimitedCounters())
	key := flowKey{proto: protoTCP, sport: 1, dport: 2}
	var delivered []int64
	for range 50 {
		at, v := p.arrive(0, key, 1500)
		if v != pass || at != 0 {
			t.Fatalf("arrive = %d, %v; want 0, pass", at, v)
		}
		d, v := p.transmit(at, 1500)
		if v != pass {
			t.Fatalf("transmit dropped a packet within the queue limit")
		}
		delivered = append(delivered, d)
	}
	if delivered[0] != 10*ms {
		t.Errorf("first packet delivered at %d, want the delay 10 ms", delivered[0])
	}
	// 50 packets of one millisecond each, two of them in the burst: the last leaves at 48 ms.
	if got, want := delivered[49], 10*ms+48*ms; got != want {
		t.Errorf("last packet delivered at %v, want %v", time.Duration(got), time.Duration(want))
	}
	for i := 1; i < len(delivered); i++ {
		if delivered[i] < delivered[i-1] {
			t.Fatalf("packet %d delivered before packet %d", i, i-1)
		}
	}
}

func TestPathDropsTailWhenTheLinkQueueIsFull(t *testing.T) {
	c := unlimitedCounters()
	p := newPath(Link{CapacityMbit: 12, QueueBytes: 10 * 1500}, 1500, 1, 0, c)
	passed := 0
	for range 100 {
		if _, v := p.transmit(0, 1500); v == pass {
			passed++
		} else if v != dropLinkQueue {
			t.Fatalf("verdict %v, want dropLinkQueue", v)
		}
	}
	// The burst of two packets, then ten queued.
	if passed != 12 {
		t.Errorf("%d packets passed at once, want 12: a burst of 2 and a queue of 10", passed)
	}
	if got := c.snapshot().QueueDrops; got != 88 {
		t.Errorf("QueueDrops = %d, want 88", got)
	}
	// Once the queue has drained, packets pass again.
	if _, v := p.transmit(100*ms, 1500); v != pass {
		t.Errorf("packet after the queue drained: %v, want pass", v)
	}
}

func TestPathCapsEachFlowSeparately(t *testing.T) {
	c := unlimitedCounters()
	// Flows capped at 12 Mbit/s (1500 bytes per millisecond) on an unlimited link.
	p := newPath(Link{FlowMbit: 12, FlowQueueBytes: 1000 * 1500}, 1500, 1, 0, c)
	a := flowKey{proto: protoTCP, sport: 1, dport: 9}
	b := flowKey{proto: protoTCP, sport: 2, dport: 9}
	var lastA, lastB int64
	for range 100 {
		lastA, _ = p.arrive(0, a, 1500)
		lastB, _ = p.arrive(0, b, 1500)
	}
	// Each flow's 100 packets take 98 ms after its two-packet burst, however many flows there are.
	if lastA != 98*ms || lastB != 98*ms {
		t.Errorf("last packets join the link at %v and %v, want 98ms each", time.Duration(lastA), time.Duration(lastB))
	}
	if got := c.snapshot(); got.Packets != 200 || got.Bytes != 300_000 || got.FlowQueueDrops != 0 {
		t.Errorf("counters %+v, want 200 packets of 300000 bytes and no drops", got)
	}
}

func TestPathCapFlowOverridesTheLinkCap(t *testing.T) {
	c := unlimitedCounters()
	// Flows capped at 12 Mbit/s (1500 bytes per millisecond); flow a at 3 (one packet per 4 ms).
	p := newPath(Link{FlowMbit: 12, FlowQueueBytes: 1000 * 1500}, 1500, 1, 0, c)
	a := flowKey{proto: protoTCP, sport: 1, dport: 9}
	b := flowKey{proto: protoTCP, sport: 2, dport: 9}
	p.capFlow(a, 3)
	var lastA, lastB int64
	for range 50 {
		lastA, _ = p.arrive(0, a, 1500)
		lastB, _ = p.arrive(0, b, 1500)
	}
	// a's burst is still two packets; its other 48 leave 4 ms apart (its queue, 64 packets by
	// default, holds them). b keeps the link's cap.
	if lastA != 192*ms || lastB != 48*ms {
		t.Errorf("last packets join the link at %v and %v, want 192ms and 48ms", time.Duration(lastA), time.Duration(lastB))
	}
	// The override outlives a change of the link, and 0 gives the flow the link's cap back.
	p.configure(Link{FlowMbit: 24})
	if got, _ := p.arrive(time.Second.Nanoseconds(), a, 1500); got != time.Second.Nanoseconds() {
		t.Fatalf("first packet after idling joins at %v, want at once", time.Duration(got))
	}
	if p.flowRate(a) != 3 {
		t.Errorf("flow a's cap after configure is %v Mbit/s, want its own 3", p.flowRate(a))
	}
	p.capFlow(a, 0)
	if p.flowRate(a) != 24 {
		t.Errorf("flow a's cap after removing the override is %v Mbit/s, want the link's 24", p.flowRate(a))
	}
	// On a link without a per-flow cap, only the capped flow is shaped.
	q := newPath(Link{}, 1500, 1, 0, unlimitedCounters())
	q.capFlow(a, 12)
	for range 10 {
		lastA, _ = q.arrive(0, a, 1500)
		lastB, _ = q.arrive(0, b, 1500)
	}
	if lastA != 8*ms || lastB != 0 {
		t.Errorf("on an uncapped link the last packets join at %v and %v, want 8ms and 0", time.Duration(lastA), time.Duration(lastB))
	}
}

func TestPathDropsTailWhenAFlowQueueIsFull(t *testing.T) {
	c := unlimitedCounters()
	p := newPath(Link{FlowMbit: 12, FlowQueueBytes: 5 * 1500}, 1500, 1, 0, c)
	a := flowKey{proto: protoUDP, sport: 1}
	b := flowKey{proto: protoUDP, sport: 2}
	for range 20 {
		p.arrive(0, a, 1500)
	}
	if got := c.snapshot().FlowQueueDrops; got != 13 {
		t.Errorf("FlowQueueDrops = %d, want 13: a burst of 2 and a queue of 5 out of 20", got)
	}
	// Another flow has a queue of its own.
	if _, v := p.arrive(0, b, 1500); v != pass {
		t.Errorf("first packet of another flow: %v, want pass", v)
	}
}

func TestPathForgetsIdleFlows(t *testing.T) {
	p := newPath(Link{FlowMbit: 12}, 1500, 1, 0, unlimitedCounters())
	for i := range flowSweepEvery - 1 {
		p.arrive(0, flowKey{sport: uint16(i)}, 100)
	}
	if len(p.flows) != flowSweepEvery-1 {
		t.Fatalf("%d flows tracked, want %d", len(p.flows), flowSweepEvery-1)
	}
	p.arrive(time.Second.Nanoseconds(), flowKey{sport: 65535}, 100)
	if len(p.flows) != 1 {
		t.Errorf("%d flows tracked after a sweep at an idle time, want only the new one", len(p.flows))
	}
}

func TestPathLossRateAndSeed(t *testing.T) {
	const n, loss = 100_000, 0.1
	run := func(seed uint64) []bool {
		c := unlimitedCounters()
		p := newPath(Link{Loss: loss}, 1500, seed, 3, c)
		dropped := make([]bool, n)
		for i := range n {
			_, v := p.arrive(int64(i), flowKey{}, 100)
			dropped[i] = v == dropLoss
		}
		if got := c.snapshot().LossDrops; got != uint64(count(dropped)) {
			t.Errorf("LossDrops = %d, want %d", got, count(dropped))
		}
		return dropped
	}
	a, b, other := run(42), run(42), run(43)
	mean, sd := n*loss, math.Sqrt(n*loss*(1-loss))
	if got := float64(count(a)); math.Abs(got-mean) > 5*sd {
		t.Errorf("%v of %d packets lost, want %.0f ± %.0f", got, n, mean, 5*sd)
	}
	same := true
	for i := range a {
		if a[i] != b[i] {
			same = false
			break
		}
	}
	if !same {
		t.Errorf("the same seed dropped different packets")
	}
	if count(other) == count(a) {
		differs := false
		for i := range a {
			differs = differs || a[i] != other[i]
		}
		if !differs {
			t.Errorf("another seed dropped exactly the same packets")
		}
	}
}

func count(xs []bool) int {
	n := 0
	for _, x := range xs {
		if x {
			n++
		}
	}
	return n
}

func TestEventQueuePopsInTimeThenArrivalOrder(t *testing.T) {
	var q eventQueue
	rng := rand.New(rand.NewPCG(5, 6))
	pkts := make([]*packet, 500)
	for i := range pkts {
		pkts[i] = &packet{from: i}
		q.push(rng.Int64N(50), deliver, pkts[i])
	}
	prev := event{at: -1}
	for q.len() > 0 {
		ev := q.pop()
		if ev.at < prev.at || ev.at == prev.at && ev.pkt.from < prev.pkt.from {
			t.Fatalf("popped (%d, packet %d) after (%d, packet %d)", ev.at, ev.pkt.from, prev.at, prev.pkt.from)
		}
		prev = ev
	}
}
