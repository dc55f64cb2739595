package wanemu_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/netip"
	"time"

	"github.com/concord-ccl/concord/internal/wanemu"
)

// Two sites 100 ms apart on a 1 Gbit/s link where each flow gets at most 100 Mbit/s, and 0.01% of
// packets are lost. A server in site 1 receives what a client in site 0 sends. It needs root, so it
// is compiled but not run.
func Example() {
	tb, err := wanemu.New(wanemu.Config{
		Sites: 2,
		Link: wanemu.Link{
			Delay:        50 * time.Millisecond, // one way: an RTT of 100 ms
			CapacityMbit: 1000,
			FlowMbit:     100,
			Loss:         0.0001,
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tb.Start(); err != nil {
		log.Fatal(err) // wraps wanemu.ErrNotPermitted when not root
	}
	defer tb.Close()

	server := netip.AddrPortFrom(tb.Addr(1), 9000)
	ln, err := tb.Netns(1).Listen("tcp", server.String())
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	done := make(chan int64)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- 0
			return
		}
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		done <- n
	}()

	c, err := tb.Netns(0).Dial(context.Background(), &net.Dialer{}, "tcp", server.String())
	if err != nil {
		log.Fatal(err)
	}
	c.Write(make([]byte, 1<<20))
	c.Close()
	fmt.Println(<-done, "bytes;", tb.Stats(0, 1).Delivered, "packets delivered")
}
