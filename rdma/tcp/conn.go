package tcp

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/concord-ccl/concord/rdma"
)

// lanes is how many sockets a connection has: one carries this end's requests (chunks, probes) and
// the other end's answers (acks, probe replies) back, the other the reverse, so that an ack never
// waits behind chunks going the other way (see the package doc). The dialing end's requests go on
// lane 0, the accepting end's on lane 1.
const lanes = 2

// conn is one end of a connection: two sockets (lanes) bound to a local NIC. Per lane, a writer
// goroutine owns writing to its socket and a reader goroutine owns reading; they start when the lane's
// socket is paired (attach), and the connection is up once both are. Fields under mu are shared;
// downSent belongs to the event context.
type conn struct {
	e    *Endpoint
	spec rdma.ConnSpec
	out  int                  // the lane this end's requests go on; its answers go on the other
	wake [lanes]chan struct{} // capacity 1 each: tells a lane's writer there is work or a failure

	mu       sync.Mutex
	socks    [lanes]net.Conn      // guarded by mu: set once dialed or paired
	attached int                  // guarded by mu: lanes paired so far
	probeOut []byte               // guarded by mu: queued probes, sent on the out lane before chunks
	answers  []byte               // guarded by mu: queued acks and probe replies, for the in lane
	chunks   []rdma.Chunk         // guarded by mu: queued chunks, in order
	probes   map[uint64]time.Time // guarded by mu: probes sent and not answered, by id
	err      error                // guarded by mu: why the connection failed; nil while it works
	closed   bool                 // guarded by mu: Close was called (no ConnDown then)

	downSent bool // event context only: ConnDown delivered, deliver nothing more
}

var _ rdma.Conn = (*conn)(nil)

func newConn(e *Endpoint, spec rdma.ConnSpec, dialing bool) *conn {
	c := &conn{e: e, spec: spec, probes: make(map[uint64]time.Time)}
	if !dialing {
		c.out = 1
	}
	for i := range c.wake {
		c.wake[i] = make(chan struct{}, 1)
	}
	return c
}

// Spec returns the connection's spec from this end.
func (c *conn) Spec() rdma.ConnSpec { return c.spec }

// Send queues a chunk for the out lane's writer.
func (c *conn) Send(ch rdma.Chunk) error {
	if c.spec.Class == rdma.ProbeClass {
		return rdma.ErrWrongClass
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return rdma.ErrClosed
	}
	c.chunks = append(c.chunks, ch)
	c.mu.Unlock()
	c.signal(c.out)
	return nil
}

// Probe queues a zero-byte probe, or reports ErrNICDown at once when the local NIC is down.
func (c *conn) Probe(id uint64) error {
	if c.spec.Class != rdma.ProbeClass {
		return rdma.ErrWrongClass
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return rdma.ErrClosed
	}
	if c.err != nil || c.e.Health(c.spec.Local) != rdma.Healthy {
		c.mu.Unlock()
		err := fmt.Errorf("tcp: %v: probe %d: %w", c.spec, id, rdma.ErrNICDown)
		if c.e.Health(c.spec.Local) == rdma.Healthy {
			err = fmt.Errorf("tcp: %v: probe %d: %w", c.spec, id, rdma.ErrClosed)
		}
		c.e.loop.post(func() { c.e.loop.handler(rdma.ProbeDone{Conn: c, ID: id, Err: err}) })
		return nil
	}
	c.probes[id] = time.Now()
	c.probeOut = appendID(c.probeOut, kindProbe, id)
	c.mu.Unlock()
	c.signal(c.out)
	return nil
}

// Close tears the connection down without a ConnDown event.
func (c *conn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.fail(rdma.ErrClosed)
	return nil
}

func (c *conn) signal(lane int) {
	select {
	case c.wake[lane] <- struct{}{}:
	default:
	}
}

func (c *conn) isFailed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err != nil
}

// setDialing records the socket being dialed for lane, so that a failure meanwhile closes it. It
// reports false when the connection already failed.
func (c *conn) setDialing(lane int, sock net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false
	}
	c.socks[lane] = sock
	return true
}

// fail records the first failure, closes the sockets, drops the queues and reports ConnDown unless the
// connection was closed by its owner or the endpoint.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	socks := c.socks
	c.chunks, c.probeOut, c.answers, c.probes = nil, nil, nil, nil
	closed := c.closed
	c.mu.Unlock()
	for lane, sock := range socks {
		if sock != nil {
			sock.Close()
		}
		c.signal(lane)
	}
	c.e.forget(c)
	if !closed {
		c.e.loop.post(func() {
			if !c.downSent {
				c.downSent = true
				c.e.loop.handler(rdma.ConnDown{Conn: c, Err: err})
			}
		})
	}
}

// attach takes lane's paired socket, reports ConnUp once both lanes are attached, answers the hello on
// the accepting end and starts the lane's reader and writer. A writer holds its end's chunks and
// probes back until both lanes are attached, so every Arrived follows ConnUp: the acceptor queues
// ConnUp before its second helloAck leaves, and the dialer starts reading its in lane only after
// queueing its own. A lane's reader starts at once, so that the far end closing a lane while the
// other is still being paired fails the connection rather than leaving it half open.
func (c *conn) attach(lane int, sock net.Conn, dialed bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		sock.Close()
		return
	}
	c.socks[lane] = sock
	c.attached++
	up := c.attached == lanes
	c.mu.Unlock()
	if up {
		c.e.loop.post(func() {
			if !c.downSent {
				c.e.loop.handler(rdma.ConnUp{Conn: c})
			}
		})
		for l := range lanes {
			c.signal(l)
		}
	}
	if !dialed {
		sock.SetWriteDeadline(time.Now().Add(c.e.cfg.ConnectTimeout))
		if _, err := sock.Write(appendPrefix(nil, kindHelloAck, 0)); err != nil {
			c.fail(fmt.Errorf("tcp: %v: lane %d: helloAck: %w", c.spec, lane, err))
			return
		}
		sock.SetWriteDeadline(time.Time{})
	}
	c.e.wg.Add(2)
	go c.write(lane, sock)
	go c.read(lane, sock)
}

// deliver queues ev for the handler unless ConnDown was already delivered.
func (c *conn) deliver(ev rdma.Event) {
	c.e.loop.post(func() {
		if !c.downSent {
			c.e.loop.handler(ev)
		}
	})
}

// hasWork reports whether the out lane's writer (out) or the in lane's has frames to send: the out
// lane's wait until both lanes are attached. Call with mu held.
func (c *conn) hasWork(out bool) bool {
	if out {
		return c.attached == lanes && (len(c.probeOut) > 0 || len(c.chunks) > 0)
	}
	return len(c.answers) > 0
}

// write sends lane's frames until the connection fails: on the out lane queued probes first, then
// chunks in order; on the in lane the queued answers.
func (c *conn) write(lane int, sock net.Conn) {
	defer c.e.wg.Done()
	out := lane == c.out
	var ctrl []byte
	head := make([]byte, 0, prefixLen+chunkHeadLen)
	for {
		c.mu.Lock()
		for c.err == nil && !c.hasWork(out) {
			c.mu.Unlock()
			select {
			case <-c.wake[lane]:
			case <-c.e.done:
				return
			}
			c.mu.Lock()
		}
		if c.err != nil {
			c.mu.Unlock()
			return
		}
		var chunk rdma.Chunk
		hasChunk := false
		switch {
		case !out:
			ctrl, c.answers = c.answers, ctrl[:0]
		case len(c.probeOut) > 0:
			ctrl, c.probeOut = c.probeOut, ctrl[:0]
		default:
			chunk, hasChunk = c.chunks[0], true
			c.chunks[0] = rdma.Chunk{}
			c.chunks = c.chunks[1:]
		}
		c.mu.Unlock()
		var err error
		if hasChunk {
			head = appendChunkHead(head[:0], chunk.Tag, chunk.Seq, len(chunk.Data))
			bufs := net.Buffers{head, chunk.Data}
			_, err = bufs.WriteTo(sock)
		} else {
			_, err = sock.Write(ctrl)
		}
		if err != nil {
			c.fail(fmt.Errorf("tcp: %v: lane %d: write: %w", c.spec, lane, c.e.errNICDown(c.spec.Local, err)))
			return
		}
	}
}

// recvBuffers is how many chunk buffers a connection's reader may fill ahead of the handler. A chunk
// is acknowledged as soon as it has been read whole into one of them (the analogue of an RDMA write
// completing once the data is in the responder's registered memory), so the sender's window measures
// only what is on the wire and in socket buffers, never how long the event context takes to reduce the
// chunks before it. When every buffer waits for the handler the reader stops reading, the socket's
// receive buffer fills and TCP flow control holds the sender back.
const recvBuffers = 4

// read decodes frames until the connection fails. A chunk's data is read into a free buffer of the
// connection's pool, acknowledged at once and delivered as an Arrived event; the buffer returns to the
// pool when the handler has returned from that event.
func (c *conn) read(lane int, sock net.Conn) {
	defer c.e.wg.Done()
	prefix := make([]byte, prefixLen)
	body := make([]byte, helloLen)
	var free chan []byte
	if lane != c.out { // the in lane carries the peer's chunks
		free = make(chan []byte, recvBuffers)
		for range recvBuffers {
			free <- nil // allocated on first use, to the size of the first chunk read into it
		}
	}
	for {
		err := c.readFrame(lane, sock, prefix, body, free)
		if err != nil {
			c.fail(fmt.Errorf("tcp: %v: lane %d: read: %w", c.spec, lane, c.e.errNICDown(c.spec.Local, err)))
			return
		}
	}
}

// laneCarries names what a lane brings in: answers on the out lane, requests on the in lane.
func laneCarries(out bool) string {
	if out {
		return "acks and probe replies"
	}
	return "chunks and probes"
}

// readFrame reads one frame from a lane: answers on the out lane, requests on the in lane.
func (c *conn) readFrame(lane int, sock net.Conn, prefix, body []byte, free chan []byte) error {
	out := lane == c.out
	if _, err := io.ReadFull(sock, prefix); err != nil {
		return err
	}
	size := int64(binary.BigEndian.Uint32(prefix))
	kind := prefix[4]
	n := bodyLen(kind)
	if n < 0 || size-1 < int64(n) || (kind != kindChunk && size-1 != int64(n)) ||
		size-1-int64(n) > int64(c.e.cfg.MaxChunk) {
		return fmt.Errorf("%w: kind %d with length %d", errFrame, kind, size)
	}
	if _, err := io.ReadFull(sock, body[:n]); err != nil {
		return err
	}
	var f frame
	if err := decodeBody(kind, body[:n], &f); err != nil {
		return err
	}
	if answer := kind == kindAck || kind == kindProbeReply; answer != out {
		return fmt.Errorf("%w: kind %d on lane %d, which carries only %s", errFrame, kind, lane, laneCarries(out))
	}
	switch kind {
	case kindChunk:
		if c.spec.Class == rdma.ProbeClass {
			return fmt.Errorf("%w: chunk on a probe connection", errFrame)
		}
		dataLen := int(size - 1 - int64(n))
		var buf []byte
		select {
		case buf = <-free:
		case <-c.e.done:
			return rdma.ErrClosed
		}
		if cap(buf) < dataLen {
			buf = make([]byte, dataLen)
		}
		data := buf[:dataLen]
		if _, err := io.ReadFull(sock, data); err != nil {
			return err
		}
		c.e.received.Add(int64(dataLen))
		// The Arrived event is queued before the ack leaves, so anything the peer does after seeing
		// the ack (a failover request on another connection, say) reaches the event context after it.
		c.e.loop.post(func() {
			if !c.downSent {
				c.e.loop.handler(rdma.Arrived{Conn: c, Tag: f.Tag, Seq: f.Seq, Data: data})
			}
			free <- buf
		})
		c.answer(func(b []byte) []byte { return appendAck(b, f.Tag, f.Seq) })
	case kindAck:
		c.deliver(rdma.Completed{Conn: c, Tag: f.Tag, Seq: f.Seq})
	case kindProbe:
		c.answer(func(b []byte) []byte { return appendID(b, kindProbeReply, f.ID) })
	case kindProbeReply:
		c.mu.Lock()
		sent, ok := c.probes[f.ID]
		delete(c.probes, f.ID)
		c.mu.Unlock()
		if ok {
			c.deliver(rdma.ProbeDone{Conn: c, ID: f.ID, RTT: time.Since(sent)})
		}
	default:
		return fmt.Errorf("%w: unexpected kind %d on an open connection", errFrame, kind)
	}
	return nil
}

// answer appends an answer (an ack or a probe reply) for the in lane's writer, unless the connection
// failed.
func (c *conn) answer(add func([]byte) []byte) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.answers = add(c.answers)
	c.mu.Unlock()
	c.signal(1 - c.out)
}
