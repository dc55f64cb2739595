package wanemu

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/transport"
)

// TestOffloadCarriesQUICBatchesWhole moves a QUIC stream between two sites: quic-go sends its
// packets in segmentation-offload batches, and with offload the forwarder carries each batch whole,
// so the link's packets average well above quic-go's packet size.
func TestOffloadCarriesQUICBatchesWhole(t *testing.T) {
	const total = 32 << 20
	tb := startTestbed(t, Config{Sites: 2, Offload: true, Link: Link{Delay: 2 * time.Millisecond, CapacityMbit: 2000}})
	tr := transport.NewQUIC(transport.QUICConfig{Auth: transport.AuthConfig{Secret: make([]byte, 32)}})
	var ln net.Listener
	err := tb.Netns(1).Do(func() (err error) {
		ln, err = tr.Listen(netip.AddrPortFrom(tb.Addr(1), 0).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		got <- n
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var c net.Conn
	if err := tb.Netns(0).Do(func() (err error) { c, err = tr.Dial(ctx, ln.Addr().String()); return err }); err != nil {
		t.Fatal(err)
	}
	before := tb.Stats(0, 1)
	t0 := time.Now()
	buf := make([]byte, 1<<20)
	for sent := 0; sent < total; sent += len(buf) {
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	if n := <-got; n != total {
		t.Fatalf("received %d bytes, want %d", n, total)
	}
	s := tb.Stats(0, 1)
	packets, bytes := s.Packets-before.Packets, s.Bytes-before.Bytes
	t.Logf("%d bytes in %v: %d packets of %.0f bytes on average", total, time.Since(t0), packets, float64(bytes)/float64(packets))
	if mean := float64(bytes) / float64(packets); mean < 3000 {
		t.Fatalf("packets average %.0f bytes: quic-go's batches did not pass whole", mean)
	}
}
