package transport

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

func TestTCPName(t *testing.T) {
	if got := NewTCP(TCPConfig{}).Name(); got != "tcp" {
		t.Fatalf("Name = %q, want tcp", got)
	}
}

func TestTCPEchoWithOptions(t *testing.T) {
	tr := NewTCP(TCPConfig{DisableNoDelay: true, ReadBuffer: 256 << 10, WriteBuffer: 256 << 10, KeepAlive: -1})
	c, p := dialAccept(t, conformanceSetup{server: tr, listenAddr: "127.0.0.1:0", client: tr})
	msg := randomBytes(3, 300<<10)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(msg)
		errc <- err
	}()
	got, err := readN(p, len(msg))
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Write: %v", err)
	}
	for i := range msg {
		if got[i] != msg[i] {
			t.Fatalf("byte %d = %d, want %d", i, got[i], msg[i])
		}
	}
}

func TestTCPDialContext(t *testing.T) {
	tr := NewTCP(TCPConfig{})
	l, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	defer l.Close()
	addr := l.Addr().String()

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = tr.Dial(ctx, addr)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial with cancelled ctx: %v, want context.Canceled", err)
	}
	if want := "tcp dial " + addr + ": "; !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error %q does not start with %q", err, want)
	}

	ctx, cancel = context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if _, err := tr.Dial(ctx, addr); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial with expired ctx: %v, want context.DeadlineExceeded", err)
	}
}

func TestTCPDialRefused(t *testing.T) {
	tr := NewTCP(TCPConfig{})
	l, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	addr := l.Addr().String()
	l.Close()
	_, err = tr.Dial(context.Background(), addr)
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("Dial: %v, want ErrRefused", err)
	}
	if want := "tcp dial " + addr + ": connect: "; !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error %q does not start with %q", err, want)
	}
}

func TestTCPListenInUse(t *testing.T) {
	tr := NewTCP(TCPConfig{})
	l, err := tr.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	defer l.Close()
	if _, err := tr.Listen(l.Addr().String()); !errors.Is(err, ErrAddrInUse) {
		t.Fatalf("second Listen: %v, want ErrAddrInUse", err)
	}
}

func TestTCPConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg   TCPConfig
		field string
	}{
		{TCPConfig{ReadBuffer: -1}, "ReadBuffer"},
		{TCPConfig{WriteBuffer: -1}, "WriteBuffer"},
	} {
		err := tc.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("Validate(%+v) = %v, want an error naming %s", tc.cfg, err, tc.field)
		}
		tr := NewTCP(tc.cfg)
		if _, err := tr.Listen("127.0.0.1:0"); err == nil {
			t.Errorf("Listen with %+v succeeded", tc.cfg)
		}
		if _, err := tr.Dial(context.Background(), "127.0.0.1:1"); err == nil || errors.Is(err, ErrRefused) {
			t.Errorf("Dial with %+v = %v, want the validation error", tc.cfg, err)
		}
	}
	if err := (TCPConfig{}).Validate(); err != nil {
		t.Errorf("zero TCPConfig: %v", err)
	}
}

var _ net.Listener = (*tcpListener)(nil)
