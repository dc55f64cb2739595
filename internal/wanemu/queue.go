package wanemu

// eventKind says what an event in the forwarder's queue does when it falls due.
type eventKind uint8

const (
	joinLink eventKind = iota // the packet leaves its flow's shaper and joins the link queue
	deliver                   // the packet reaches the destination site
)

// event is a packet's next step, due at a time on the forwarder's clock.
type event struct {
	at   int64
	seq  uint64 // breaks ties in arrival order, so equal times keep FIFO order
	kind eventKind
	pkt  *packet
}

// eventQueue is a binary min-heap of events ordered by (at, seq): the delay queue of every link
// at once. It is owned by one goroutine.
type eventQueue struct {
	items []event
	seq   uint64
}

func (q *eventQueue) len() int { return len(q.items) }

func (q *eventQueue) less(i, j int) bool {
	a, b := &q.items[i], &q.items[j]
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

// push adds an event due at at.
func (q *eventQueue) push(at int64, kind eventKind, pkt *packet) {
	q.seq++
	q.items = append(q.items, event{at: at, seq: q.seq, kind: kind, pkt: pkt})
	for i := len(q.items) - 1; i > 0; {
		parent := (i - 1) / 2
		if !q.less(i, parent) {
			break
		}
		q.items[i], q.items[parent] = q.items[parent], q.items[i]
		i = parent
	}
}

// next returns the time of the earliest event; the queue must not be empty.
func (q *eventQueue) next() int64 { return q.items[0].at }

// pop removes and returns the earliest event; the queue must not be empty.
func (q *eventQueue) pop() event {
	top := q.items[0]
	last := len(q.items) - 1
	q.items[0] = q.items[last]
	q.items[last] = event{}
	q.items = q.items[:last]
	for i := 0; ; {
		small, l, r := i, 2*i+1, 2*i+2
		if l < last && q.less(l, small) {
			small = l
		}
		if r < last && q.less(r, small) {
			small = r
		}
		if small == i {
			break
		}
		q.items[i], q.items[small] = q.items[small], q.items[i]
		i = small
	}
	return top
}
