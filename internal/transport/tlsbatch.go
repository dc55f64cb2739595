package transport

import (
	"crypto/tls"
	"net"
	"sync"
)

// crypto/tls seals every record of at most 16 KiB and writes it to the connection under it with a
// write of its own: a 1 MiB frame costs 64 system calls. batchedTLS gathers the records of one Write
// into writes of up to tlsBatchBytes.

// tlsBatchBytes is the most a batch holds before it is written.
const tlsBatchBytes = 256 << 10

// batchConn is the TCP connection under a batchedTLS. While batching (during a batchedTLS.Write),
// what TLS writes is appended to buf and written when buf is full or the Write ends; otherwise (the
// handshake, alerts) it goes straight through. A write error is kept and returned by every later
// write, as TLS does with its own.
type batchConn struct {
	net.Conn
	mu       sync.Mutex
	batching bool
	buf      []byte
	err      error
}

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
	if !b.batching {
		n, err := b.Conn.Write(p)
		b.err = err
		return n, err
	}
	b.buf = append(b.buf, p...)
	if len(b.buf) >= tlsBatchBytes {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// flushLocked writes the batch. b.mu must be held.
func (b *batchConn) flushLocked() error {
	if len(b.buf) > 0 && b.err == nil {
		_, b.err = b.Conn.Write(b.buf)
	}
	b.buf = b.buf[:0]
	return b.err
}

// batch starts gathering writes; end writes what was gathered and stops.
func (b *batchConn) batch() {
	b.mu.Lock()
	b.batching = true
	if b.buf == nil {
		b.buf = make([]byte, 0, tlsBatchBytes+maxTLSRecord)
	}
	b.mu.Unlock()
}

func (b *batchConn) end() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batching = false
	return b.flushLocked()
}

// maxTLSRecord bounds one sealed record: 16 KiB of data and the record's overhead.
const maxTLSRecord = 16<<10 + 256

// batchedTLS is a TLS connection whose Write reaches the network in batches (see batchConn). Writes
// are serialized, as tls.Conn serializes them.
type batchedTLS struct {
	*tls.Conn
	under   *batchConn
	writeMu sync.Mutex
}

func (c *batchedTLS) Write(p []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.under.batch()
	n, err := c.Conn.Write(p)
	if ferr := c.under.end(); err == nil && ferr != nil {
		// TLS took the bytes, but they did not all reach the connection.
		return 0, ferr
	}
	return n, err
}
