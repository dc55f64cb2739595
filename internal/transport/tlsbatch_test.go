package transport

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/concord-ccl/concord/internal/auth"
)

// countingConn counts the writes that reach the connection.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestTLSBatchesRecords writes 1 MiB through a batched TLS connection: the other end reads every byte
// as written, and the 64 records reach the connection under it in batches of tlsBatchBytes, not one
// write each. A write after the connection under it closed fails, and keeps failing.
func TestTLSBatchesRecords(t *testing.T) {
	secret := bytes.Repeat([]byte{7}, 32)
	server, client, err := auth.Config{Secret: secret}.TLS("test")
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	counted := &countingConn{Conn: a}
	under := &batchConn{Conn: counted}
	tc, ts := tls.Client(under, client), tls.Server(b, server)
	var wg sync.WaitGroup
	var serr error
	wg.Go(func() { serr = ts.Handshake() })
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if serr != nil {
		t.Fatal(serr)
	}
	c := &batchedTLS{Conn: tc, under: under}

	msg := make([]byte, 1<<20)
	rand.Read(msg)
	got := make([]byte, len(msg))
	var rerr error
	wg.Go(func() { _, rerr = io.ReadFull(ts, got) })
	before := counted.writes.Load()
	if n, err := c.Write(msg); n != len(msg) || err != nil {
		t.Fatalf("Write: %d, %v; want %d, nil", n, err, len(msg))
	}
	wg.Wait()
	if rerr != nil {
		t.Fatal(rerr)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("the other end read other bytes than were written")
	}
	// 64 records of 16 KiB and their overhead: five batches of up to 256 KiB.
	if w, most := counted.writes.Load()-before, int64(len(msg)/tlsBatchBytes+1); w > most {
		t.Errorf("1 MiB reached the connection in %d writes, want at most %d", w, most)
	}

	b.Close()
	for i := range 2 {
		if n, err := c.Write(msg[:100]); err == nil || n != 0 {
			t.Errorf("write %d after the other end closed: %d, %v; want 0 and an error", i, n, err)
		}
	}
}
