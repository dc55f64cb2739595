package transport

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestTCPLocalPath checks which socket a dial gets: the unix twin of a listener in this network
// namespace, named after its exact address or, for a wildcard listener, after its port; TCP when
// either end turns the local path off; and the TCP side of a listener keeps serving TCP diallers.
func TestTCPLocalPath(t *testing.T) {
	if !localSupported {
		t.Skip("no abstract unix sockets on this system")
	}
	local, tcp := NewTCP(TCPConfig{}), NewTCP(TCPConfig{DisableLocal: true})
	for _, tc := range []struct {
		name           string
		server, client Transport
		listen         string
		dialHost       string
		wantUnix       bool
	}{
		{"exact address", local, local, "127.0.0.1:0", "127.0.0.1", true},
		{"wildcard listener", local, local, "0.0.0.0:0", "127.0.0.1", true},
		{"wildcard listener and address", local, local, "0.0.0.0:0", "0.0.0.0", true},
		{"dialler without the local path", local, tcp, "127.0.0.1:0", "127.0.0.1", false},
		{"listener without the local path", tcp, local, "127.0.0.1:0", "127.0.0.1", false},
		{"another loopback address", local, local, "127.0.0.1:0", "127.0.0.2", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := tc.server.Listen(tc.listen)
			if err != nil {
				t.Fatalf("Listen: %v", err)
			}
			defer l.Close()
			port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
			addr := net.JoinHostPort(tc.dialHost, port)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := tc.client.Dial(ctx, addr)
			if tc.dialHost == "127.0.0.2" {
				// Nothing listens on 127.0.0.2, so the exact name does not exist and the
				// wildcard name is not tried for an exact listener: TCP refuses.
				if !errors.Is(err, ErrRefused) {
					t.Fatalf("Dial %s: %v, want ErrRefused", addr, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Dial %s: %v", addr, err)
			}
			defer c.Close()
			a, err := l.Accept()
			if err != nil {
				t.Fatalf("Accept: %v", err)
			}
			defer a.Close()
			_, dialledUnix := c.(*net.UnixConn)
			_, acceptedUnix := a.(*net.UnixConn)
			if dialledUnix != tc.wantUnix || acceptedUnix != tc.wantUnix {
				t.Fatalf("dialled %T, accepted %T; want unix sockets: %v", c, a, tc.wantUnix)
			}
			if l.Addr().(*net.TCPAddr).Port == 0 {
				t.Fatalf("listener address %v", l.Addr())
			}
			msg := []byte("through " + tc.name)
			if _, err := c.Write(msg); err != nil {
				t.Fatalf("Write: %v", err)
			}
			got, err := readN(a, len(msg))
			if err != nil || string(got) != string(msg) {
				t.Fatalf("read %q, %v; want %q", got, err, msg)
			}
		})
	}
}

// TestTCPLocalClosed checks that closing a listener closes its twin: a later dial is refused as TCP
// refuses it, Accept returns net.ErrClosed, and the name is free for a new listener on the address.
func TestTCPLocalClosed(t *testing.T) {
	tr := NewTCP(TCPConfig{})
	l, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	addr := l.Addr().String()
	accepted := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		accepted <- err
	}()
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-accepted; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := tr.Dial(context.Background(), addr); !errors.Is(err, ErrRefused) {
		t.Fatalf("Dial after Close: %v, want ErrRefused", err)
	}
	l2, err := tr.Listen(addr)
	if err != nil {
		t.Fatalf("Listen again on %s: %v", addr, err)
	}
	defer l2.Close()
	c, err := tr.Dial(context.Background(), addr)
	if err != nil {
		t.Fatalf("Dial the new listener: %v", err)
	}
	defer c.Close()
	if _, ok := c.(*net.UnixConn); localSupported && !ok {
		t.Fatalf("dialled %T, want the new listener's unix socket", c)
	}
}

// TestTCPLocalUnaccepted checks that a connection the twin accepted but nobody took is closed with
// the listener, so that its dialler sees the end of the stream instead of hanging.
func TestTCPLocalUnaccepted(t *testing.T) {
	tr := NewTCP(TCPConfig{})
	l, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	c, err := tr.Dial(context.Background(), l.Addr().String())
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c.Close()
	l.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read from a connection its listener dropped: %v, want end of stream or reset", err)
	}
}

// TestSelectTCPKeepsTCP checks that SelectTCP hands its TCP settings to tcp and tls: with the local
// path off, a tcp dial on this host is a TCP connection.
func TestSelectTCPKeepsTCP(t *testing.T) {
	tr, err := SelectTCP("tcp", AuthConfig{}, TCPConfig{DisableLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	l, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	defer l.Close()
	c, err := tr.Dial(context.Background(), l.Addr().String())
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c.Close()
	if _, ok := c.(*net.TCPConn); !ok {
		t.Fatalf("dialled %T, want a TCP connection", c)
	}
	tl, err := SelectTCP("tls", AuthConfig{Secret: testSecret}, TCPConfig{DisableLocal: true})
	if err != nil {
		t.Fatal(err)
	}
	if !tl.(*tlsTransport).tcp.cfg.DisableLocal {
		t.Fatal("tls transport lost TCPConfig.DisableLocal")
	}
}
