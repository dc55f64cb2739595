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

// conn is one end of a connection: a socket bound to a local NIC. Its writer goroutine owns writing to
// the socket, its reader goroutine owns reading; both start when the socket is paired (attach). Fields
// under mu are shared; downSent belongs to the event context.
type conn struct {
	e    *Endpoint
	spec rdma.ConnSpec
	wake chan struct{} // capacity 1: tells the writer there is work or a failure

	mu     sync.Mutex
	sock   net.Conn             // guarded by mu: set once dialed or paired
	ctrl   []byte               // guarded by mu: queued acks, probes and probe replies, sent before chunks
	chunks []rdma.Chunk         // guarded by mu: queued chunks, in order
	probes map[uint64]time.Time // guarded by mu: probes sent and not answered, by id
	err    error                // guarded by mu: why the connection failed; nil while it works
	closed bool                 // guarded by mu: Close was called (no ConnDown then)

	downSent bool // event context only: ConnDown delivered, deliver nothing more
}

var _ rdma.Conn = (*conn)(nil)

func newConn(e *Endpoint, spec rdma.ConnSpec) *conn {
	return &conn{e: e, spec: spec, wake: make(chan struct{}, 1), probes: make(map[uint64]time.Time)}
}

// Spec returns the connection's spec from this end.
func (c *conn) Spec() rdma.ConnSpec { return c.spec }

// Send queues a chunk for the writer.
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
	c.signal()
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
	c.ctrl = appendID(c.ctrl, kindProbe, id)
	c.mu.Unlock()
	c.signal()
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

func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *conn) isFailed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err != nil
}

// setDialing records the socket being dialed, so that a failure meanwhile closes it. It reports false
// when the connection already failed.
func (c *conn) setDialing(sock net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false
	}
	c.sock = sock
	return true
}

// fail records the first failure, closes the socket, drops the queues and reports ConnDown unless the
// connection was closed by its owner or the endpoint.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	sock := c.sock
	c.chunks, c.ctrl, c.probes = nil, nil, nil
	closed := c.closed
	c.mu.Unlock()
	if sock != nil {
		sock.Close()
	}
	c.signal()
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

// attach takes the paired socket, answers the hello on the accepting end, reports ConnUp and starts the
// reader and the writer.
func (c *conn) attach(sock net.Conn, dialed bool) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		sock.Close()
		return
	}
	c.sock = sock
	c.mu.Unlock()
	if !dialed {
		sock.SetWriteDeadline(time.Now().Add(c.e.cfg.ConnectTimeout))
		if _, err := sock.Write(appendPrefix(nil, kindHelloAck, 0)); err != nil {
			c.fail(fmt.Errorf("tcp: %v: helloAck: %w", c.spec, err))
			return
		}
		sock.SetWriteDeadline(time.Time{})
	}
	c.e.loop.post(func() {
		if !c.downSent {
			c.e.loop.handler(rdma.ConnUp{Conn: c})
		}
	})
	c.e.wg.Add(2)
	go c.write(sock)
	go c.read(sock)
}

// deliver queues ev for the handler unless ConnDown was already delivered.
func (c *conn) deliver(ev rdma.Event) {
	c.e.loop.post(func() {
		if !c.downSent {
			c.e.loop.handler(ev)
		}
	})
}

// write sends queued control frames first, then chunks in order, until the connection fails.
func (c *conn) write(sock net.Conn) {
	defer c.e.wg.Done()
	var ctrl []byte
	head := make([]byte, 0, prefixLen+chunkHeadLen)
	for {
		c.mu.Lock()
		for c.err == nil && len(c.ctrl) == 0 && len(c.chunks) == 0 {
			c.mu.Unlock()
			select {
			case <-c.wake:
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
		if len(c.ctrl) > 0 {
			ctrl, c.ctrl = c.ctrl, ctrl[:0]
		} else {
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
			c.fail(fmt.Errorf("tcp: %v: write: %w", c.spec, c.e.errNICDown(c.spec.Local, err)))
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
func (c *conn) read(sock net.Conn) {
	defer c.e.wg.Done()
	prefix := make([]byte, prefixLen)
	body := make([]byte, helloLen)
	free := make(chan []byte, recvBuffers)
	for range recvBuffers {
		free <- nil // allocated on first use, to the size of the first chunk read into it
	}
	for {
		err := c.readFrame(sock, prefix, body, free)
		if err != nil {
			c.fail(fmt.Errorf("tcp: %v: read: %w", c.spec, c.e.errNICDown(c.spec.Local, err)))
			return
		}
	}
}

func (c *conn) readFrame(sock net.Conn, prefix, body []byte, free chan []byte) error {
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
		c.queueCtrl(func(b []byte) []byte { return appendAck(b, f.Tag, f.Seq) })
	case kindAck:
		c.deliver(rdma.Completed{Conn: c, Tag: f.Tag, Seq: f.Seq})
	case kindProbe:
		c.queueCtrl(func(b []byte) []byte { return appendID(b, kindProbeReply, f.ID) })
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

// queueCtrl appends a control frame for the writer, unless the connection failed.
func (c *conn) queueCtrl(add func([]byte) []byte) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.ctrl = add(c.ctrl)
	c.mu.Unlock()
	c.signal()
}
