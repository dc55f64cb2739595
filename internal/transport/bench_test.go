package transport

import (
	"io"
	"testing"
)

// benchmarkStream measures one-way throughput of 64 KiB writes over a connection.
func benchmarkStream(b *testing.B, s conformanceSetup) { benchmarkStreamOf(b, s, 64<<10) }

// benchmarkStreamOf measures one-way throughput of writes of size bytes over a connection.
func benchmarkStreamOf(b *testing.B, s conformanceSetup, size int) {
	c, p := dialAcceptB(b, s)
	buf := make([]byte, size)
	b.SetBytes(int64(len(buf)))
	done := make(chan error, 1)
	go func() {
		_, err := io.CopyN(io.Discard, p, int64(b.N)*int64(len(buf)))
		done <- err
	}()
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(buf); err != nil {
			b.Fatalf("Write: %v", err)
		}
	}
	if err := <-done; err != nil {
		b.Fatalf("read: %v", err)
	}
}

func BenchmarkStreamMem(b *testing.B) {
	n := NewNetwork()
	benchmarkStream(b, conformanceSetup{server: n.Host("b"), listenAddr: "b:0", client: n.Host("a")})
}

func BenchmarkStreamTCP(b *testing.B) {
	tr := NewTCP(TCPConfig{})
	benchmarkStream(b, conformanceSetup{server: tr, listenAddr: "127.0.0.1:0", client: tr})
}
