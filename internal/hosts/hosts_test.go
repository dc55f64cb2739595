package hosts

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func newBed(t *testing.T, cfg Config) *Bed {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("hosts need root: %v", err)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return b
}

// serve listens on host h and echoes one line per connection; it returns the listener's address.
func serve(t *testing.T, h *Host, network string) netip.AddrPort {
	t.Helper()
	var ln net.Listener
	err := h.Do(func() error {
		var err error
		ln, err = net.Listen(network, net.JoinHostPort(h.Addr().String(), "0"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return netip.MustParseAddrPort(ln.Addr().String())
}

// reach dials to from host h within timeout and exchanges a line; nil if it went through.
func reach(h *Host, to netip.AddrPort, timeout time.Duration) error {
	var c net.Conn
	err := h.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", to.String(), timeout)
		return err
	})
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	buf := make([]byte, 5)
	_, err = io.ReadFull(c, buf)
	return err
}

// TestHostsReachEachOther builds three hosts on a bridge: each has its own address and reaches the
// others; a host whose port is cut reaches nobody and is reached by nobody until it is healed.
func TestHostsReachEachOther(t *testing.T) {
	b := newBed(t, Config{Hosts: 3})
	addrs := map[netip.Addr]bool{}
	for i := range b.Len() {
		addrs[b.Host(i).Addr()] = true
	}
	if len(addrs) != 3 {
		t.Fatalf("addresses %v: want three different ones", addrs)
	}
	srv := serve(t, b.Host(0), "tcp")
	for i := 1; i < 3; i++ {
		if err := reach(b.Host(i), srv, 5*time.Second); err != nil {
			t.Fatalf("host %d -> host 0: %v", i, err)
		}
	}
	if err := b.Host(0).Cut(true); err != nil {
		t.Fatal(err)
	}
	if err := reach(b.Host(1), srv, 500*time.Millisecond); err == nil {
		t.Fatal("a cut host is still reached")
	}
	if err := b.Host(0).Cut(false); err != nil {
		t.Fatal(err)
	}
	if err := reach(b.Host(1), srv, 5*time.Second); err != nil {
		t.Fatalf("after the heal: %v", err)
	}
}

// TestBlockAndSplit drops one direction between two hosts (the other still passes, but TCP, which
// needs both, fails), then splits the bed in two groups, then lifts it all.
func TestBlockAndSplit(t *testing.T) {
	b := newBed(t, Config{Hosts: 4})
	srv := serve(t, b.Host(0), "tcp")
	if err := b.Block([]int{1}, []int{0}); err != nil {
		t.Fatal(err)
	}
	if err := reach(b.Host(1), srv, 500*time.Millisecond); err == nil {
		t.Fatal("host 1 reached host 0 through a block of its packets")
	}
	if err := reach(b.Host(2), srv, 5*time.Second); err != nil {
		t.Fatalf("host 2 is blocked too: %v", err)
	}
	// Packets from 0 to 1 still pass: a UDP datagram arrives.
	var pc net.PacketConn
	if err := b.Host(1).Do(func() error {
		var err error
		pc, err = net.ListenPacket("udp", net.JoinHostPort(b.Host(1).Addr().String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if err := b.Host(0).Do(func() error {
		c, err := net.Dial("udp", pc.LocalAddr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("x"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := pc.ReadFrom(make([]byte, 8)); err != nil {
		t.Fatalf("the other direction is blocked too: %v", err)
	}
	if err := b.Unblock(); err != nil {
		t.Fatal(err)
	}
	if err := b.Split([]int{0, 1}, []int{2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := reach(b.Host(1), srv, 5*time.Second); err != nil {
		t.Fatalf("within a half: %v", err)
	}
	if err := reach(b.Host(3), srv, 500*time.Millisecond); err == nil {
		t.Fatal("across the halves: reached")
	}
	if err := b.Unblock(); err != nil {
		t.Fatal(err)
	}
	if err := reach(b.Host(3), srv, 5*time.Second); err != nil {
		t.Fatalf("after the split is lifted: %v", err)
	}
}

// TestNAT puts host 1 behind a NAT: it reaches host 0, which sees its connection come from the
// router's address, and nothing reaches it that it did not start.
func TestNAT(t *testing.T) {
	b := newBed(t, Config{Hosts: 2, NAT: []int{1}})
	h := b.Host(1)
	if h.Addr() == h.Public() {
		t.Fatalf("host behind NAT: address %v is its public one", h.Addr())
	}
	var ln net.Listener
	if err := b.Host(0).Do(func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(b.Host(0).Addr().String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	seen := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			seen <- err.Error()
			return
		}
		seen <- c.RemoteAddr().String()
		c.Close()
	}()
	if err := h.Do(func() error {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}); err != nil {
		t.Fatalf("out through the NAT: %v", err)
	}
	if from := <-seen; !strings.HasPrefix(from, h.Public().String()+":") {
		t.Fatalf("host 0 sees the connection come from %s, want the router's %v", from, h.Public())
	}
	srv := serve(t, h, "tcp")
	pub := netip.AddrPortFrom(h.Public(), srv.Port())
	if err := reach(b.Host(0), pub, 500*time.Millisecond); err == nil {
		t.Fatal("host 0 reached a host behind NAT without a forwarded port")
	}
}

// TestIPv6AndNames gives the hosts IPv6 addresses only and a name for host 0 that a process on host 1
// resolves.
func TestIPv6AndNames(t *testing.T) {
	b := newBed(t, Config{Hosts: 2, IPv6: true, Names: map[string]int{"master.test": 0}})
	if !b.Host(0).Addr().Is6() {
		t.Fatalf("address %v is not IPv6", b.Host(0).Addr())
	}
	srv := serve(t, b.Host(0), "tcp6")
	if err := reach(b.Host(1), srv, 5*time.Second); err != nil {
		t.Fatalf("over IPv6: %v", err)
	}
	cmd := b.Host(1).Command("getent", "hosts", "master.test")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("getent on host 1: %v", err)
	}
	if !strings.HasPrefix(string(out), b.Host(0).Addr().String()) {
		t.Fatalf("master.test resolves to %q on host 1, want %v", out, b.Host(0).Addr())
	}
}

// TestCloseRemovesEverything checks that a closed bed leaves no namespace, no /etc/netns entry and no
// process behind.
func TestCloseRemovesEverything(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("hosts need root: %v", err)
	}
	b, err := New(Config{Hosts: 2, NAT: []int{1}, Names: map[string]int{"a.test": 0}})
	if err != nil {
		t.Fatal(err)
	}
	cmd := b.Host(1).Command("sleep", "60")
	if err := b.Host(1).Start(cmd); err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := range b.Len() {
		names = append(names, b.Host(i).Namespace())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-waited:
	case <-ctx.Done():
		t.Fatal("the process on the host still runs after Close")
	}
	for _, n := range names {
		if _, err := os.Stat(filepath.Join("/var/run/netns", n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("namespace %s left behind", n)
		}
		if _, err := os.Stat(filepath.Join(netnsEtc, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("/etc/netns/%s left behind", n)
		}
	}
}
