package pccl_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// TestAuthenticatedTransports runs a group of three over real loopback sockets on each transport
// pccl builds (NewTLS, NewQUIC, and SelectTransport by name): every peer's AllReduce result is checked
// element by element, and a peer with another secret is refused with ErrAuth, the group untouched.
// It runs in real time: the kernel's sockets and the handshakes are what is under test.
func TestAuthenticatedTransports(t *testing.T) {
	secret := make([]byte, 32)
	rand.Read(secret)
	other := make([]byte, 32)
	rand.Read(other)
	auth, wrong := pccl.AuthConfig{Secret: secret}, pccl.AuthConfig{Secret: other}
	// No linger: a closed QUIC connection ends at once, so nothing is left for the leak check.
	quic := func(a pccl.AuthConfig) pccl.Transport { return pccl.NewQUIC(pccl.QUICConfig{Auth: a, Linger: -1}) }
	tls := func(a pccl.AuthConfig) pccl.Transport { return pccl.NewTLS(pccl.TLSConfig{Auth: a}) }
	byName := func(a pccl.AuthConfig) pccl.Transport {
		tr, err := pccl.SelectTransport("tls", a)
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	// The master's end, which reports the connections it refuses.
	quicMaster := func(refused func(net.Addr, error)) pccl.Transport {
		return pccl.NewQUIC(pccl.QUICConfig{Auth: auth, Linger: -1, OnRefused: refused})
	}
	tlsMaster := func(refused func(net.Addr, error)) pccl.Transport {
		return pccl.NewTLS(pccl.TLSConfig{Auth: auth, OnRefused: refused})
	}
	for _, tc := range []struct {
		name   string
		make   func(pccl.AuthConfig) pccl.Transport
		master func(func(net.Addr, error)) pccl.Transport
	}{{"tls", tls, tlsMaster}, {"quic", quic, quicMaster}, {"select-tls", byName, tlsMaster}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			refused := make(chan error, 8)
			ln, err := tc.master(func(_ net.Addr, err error) { refused <- err }).Listen("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := master.NewServer(master.ServerConfig{Config: master.LAN()})
			mctx, stop := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- srv.Serve(mctx, ln) }()
			defer func() {
				stop()
				if err := <-served; err != nil {
					t.Errorf("master: %v", err)
				}
			}()
			tr := tc.make(auth)
			cfg := pccl.Config{Master: ln.Addr().String(), ListenAddr: "127.0.0.1:0", Transport: tr}
			comms := connectAll(ctx, t, srv, 3, cfg)
			defer closeAll(comms)
			const count = 5000
			bufs := make([][]float32, len(comms))
			want := make([]float32, count)
			for i, c := range comms {
				bufs[i] = fill(count, c.ID())
				for j, v := range bufs[i] {
					want[j] += v
				}
			}
			errs := each(comms, func(i int, c *pccl.Communicator) error {
				return c.AllReduce(ctx, pccl.Bytes(bufs[i]), pccl.Bytes(bufs[i]), pccl.Desc{Tag: 1, Count: count, DType: pccl.F32, Op: pccl.Sum})
			})
			for i, err := range errs {
				if err != nil {
					t.Fatalf("peer %d: %v", i, err)
				}
				for j := range want {
					if bufs[i][j] != want[j] {
						t.Fatalf("peer %d element %d: %v, want %v", i, j, bufs[i][j], want[j])
					}
				}
			}
			bad := cfg
			bad.Transport = tc.make(wrong)
			if c, err := pccl.Connect(ctx, bad); !errors.Is(err, pccl.ErrAuth) || !errors.Is(err, pccl.ErrMasterLost) {
				if c != nil {
					c.Close()
				}
				t.Fatalf("a peer with another secret: %v, want ErrAuth and ErrMasterLost", err)
			}
			select {
			case err := <-refused:
				if !errors.Is(err, pccl.ErrAuth) {
					t.Fatalf("the master refused the stranger with %v, want ErrAuth", err)
				}
			case <-ctx.Done():
				t.Fatal("the master never refused the stranger")
			}
			if n := len(srv.Snapshot().Peers); n != len(comms) {
				t.Fatalf("the master holds %d peers after the stranger, want %d", n, len(comms))
			}
		})
	}
	if _, err := pccl.SelectTransport("tls", pccl.AuthConfig{Secret: []byte("short")}); !errors.Is(err, pccl.ErrWeakSecret) {
		t.Fatalf("a short secret: %v, want ErrWeakSecret", err)
	}
	if _, err := pccl.SelectTransport("udp", auth); err == nil {
		t.Fatal("transport udp accepted")
	}
}

// connectAll connects n peers of cfg to the master served by srv: the first is accepted alone, the
// others together at its UpdateTopology.
func connectAll(ctx context.Context, t *testing.T, srv *master.Server, n int, cfg pccl.Config) []*pccl.Communicator {
	t.Helper()
	comms := make([]*pccl.Communicator, n)
	var err error
	if comms[0], err = pccl.Connect(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, n)
	for i := 1; i < n; i++ {
		go func() {
			var err error
			comms[i], err = pccl.Connect(ctx, cfg)
			errs <- err
		}()
	}
	for len(srv.Snapshot().Peers) < n {
		select {
		case <-ctx.Done():
			t.Fatal("the peers did not register")
		case <-time.After(5 * time.Millisecond): // polls the master's table: real sockets, real time
		}
	}
	if err := comms[0].UpdateTopology(ctx); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < n; i++ {
		if err := <-errs; err != nil {
			closeAll(comms)
			t.Fatal(fmt.Errorf("connect: %w", err))
		}
	}
	return comms
}
