package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/concord-ccl/concord/internal/auth"
)

// refusals collects what a listener reports through OnRefused.
type refusals struct {
	mu   sync.Mutex
	errs []error
	got  chan struct{}
}

func newRefusals() *refusals { return &refusals{got: make(chan struct{}, 16)} }

func (r *refusals) add(_ net.Addr, err error) {
	r.mu.Lock()
	r.errs = append(r.errs, err)
	r.mu.Unlock()
	r.got <- struct{}{}
}

// wait returns the next refusal.
func (r *refusals) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-r.got:
	case <-time.After(20 * time.Second):
		t.Fatal("no refusal reported")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.errs[0]
	r.errs = r.errs[1:]
	return err
}

// authKind builds a transport of one authenticated kind.
type authKind struct {
	name string
	make func(secret []byte, onRefused func(net.Addr, error)) Transport
}

var authKinds = []authKind{
	{"tls", func(secret []byte, on func(net.Addr, error)) Transport {
		return NewTLS(TLSConfig{Auth: AuthConfig{Secret: secret}, OnRefused: on})
	}},
	{"quic", func(secret []byte, on func(net.Addr, error)) Transport {
		return NewQUIC(QUICConfig{Auth: AuthConfig{Secret: secret}, OnRefused: on})
	}},
}

// serveOne listens on srv and accepts connections in the background, echoing one line each. The
// listener closes at the end of the test.
func serveOne(t *testing.T, srv Transport) string {
	t.Helper()
	l, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				b := make([]byte, 4)
				if _, err := io.ReadFull(c, b); err == nil {
					c.Write(b)
				}
			}()
		}
	}()
	return l.Addr().String()
}

// checkGood dials addr with the right secret and checks an echo: the listener still serves.
func checkGood(t *testing.T, k authKind, addr string) {
	t.Helper()
	c, err := k.make(testSecret, nil).Dial(context.Background(), addr)
	if err != nil {
		t.Fatalf("Dial with the right secret: %v", err)
	}
	defer c.Close()
	c.Write([]byte("ping"))
	if got, err := readN(c, 4); err != nil || string(got) != "ping" {
		t.Fatalf("echo = %q, %v", got, err)
	}
}

func TestAuthWrongSecret(t *testing.T) {
	for _, k := range authKinds {
		t.Run(k.name, func(t *testing.T) {
			r := newRefusals()
			addr := serveOne(t, k.make(testSecret, r.add))
			other := []byte("another secret of 32 bytes.....!")
			_, err := k.make(other, nil).Dial(context.Background(), addr)
			if !errors.Is(err, ErrAuth) {
				t.Fatalf("Dial with a wrong secret: %v, want ErrAuth", err)
			}
			if err := r.wait(t); !errors.Is(err, ErrAuth) {
				t.Fatalf("listener reported %v, want ErrAuth", err)
			}
			checkGood(t, k, addr)
		})
	}
}

func TestAuthWeakSecret(t *testing.T) {
	for _, k := range authKinds {
		t.Run(k.name, func(t *testing.T) {
			tr := k.make([]byte("short"), nil)
			if _, err := tr.Listen("127.0.0.1:0"); !errors.Is(err, ErrWeakSecret) {
				t.Fatalf("Listen: %v, want ErrWeakSecret", err)
			}
			if _, err := tr.Dial(context.Background(), "127.0.0.1:1"); !errors.Is(err, ErrWeakSecret) {
				t.Fatalf("Dial: %v, want ErrWeakSecret", err)
			}
		})
	}
}

// rawClient completes a TLS (or QUIC) handshake with addr without any secret and returns the stream
// that proofs travel on, and a function that closes everything.
func rawClient(t *testing.T, kind, addr string) (io.ReadWriter, func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if kind == "tls" {
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{tlsProto}, MinVersion: tls.VersionTLS13})
		if err != nil {
			t.Fatalf("tls.Dial: %v", err)
		}
		return c, func() { c.Close() }
	}
	conn, err := quic.DialAddr(ctx, addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{quicStreamProto}}, nil)
	if err != nil {
		t.Fatalf("quic.DialAddr: %v", err)
	}
	st, err := conn.OpenStreamSync(ctx)
	if err != nil {
		t.Fatalf("OpenStreamSync: %v", err)
	}
	return st, func() { conn.CloseWithError(0, "") }
}

func TestAuthNoSecret(t *testing.T) {
	for _, k := range authKinds {
		t.Run(k.name, func(t *testing.T) {
			r := newRefusals()
			addr := serveOne(t, k.make(testSecret, r.add))
			// A client that completes the handshake and sends something that is not a proof.
			rw, closeRaw := rawClient(t, k.name, addr)
			rw.Write(make([]byte, auth.MessageSize))
			if err := r.wait(t); !errors.Is(err, ErrAuth) {
				t.Fatalf("listener reported %v, want ErrAuth", err)
			}
			closeRaw()
			// A client that completes the handshake and hangs up. Over QUIC the client's side of the
			// handshake can finish before the listener's: a client that closes at once may then be
			// gone before quic-go hands its connection over, and there is nothing left to refuse.
			if k.name != "quic" {
				_, closeRaw = rawClient(t, k.name, addr)
				closeRaw()
				if err := r.wait(t); !errors.Is(err, ErrAuth) {
					t.Fatalf("listener reported %v, want ErrAuth", err)
				}
			}
			checkGood(t, k, addr)
		})
	}
}

func TestAuthPlaintextToTLSPort(t *testing.T) {
	r := newRefusals()
	k := authKinds[0]
	addr := serveOne(t, k.make(testSecret, r.add))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	if err := r.wait(t); !errors.Is(err, ErrPlaintext) {
		t.Fatalf("listener reported %v, want ErrPlaintext", err)
	}
	c.Close()
	// The plaintext session machinery is refused too, and says so.
	if _, err := NewTCP(TCPConfig{}).DialSession(context.Background(), addr); !errors.Is(err, ErrRefused) {
		t.Fatalf("tcp DialSession to a TLS port: %v, want ErrRefused", err)
	}
	if err := r.wait(t); !errors.Is(err, ErrPlaintext) {
		t.Fatalf("listener reported %v, want ErrPlaintext", err)
	}
	// A TLS client on a plaintext port learns that it is one.
	pl, err := NewTCP(TCPConfig{}).Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	go func() {
		c, err := pl.Accept()
		if err == nil {
			c.Write([]byte("CNSS plaintext, not TLS"))
			c.Close()
		}
	}()
	if _, err := k.make(testSecret, nil).Dial(context.Background(), pl.Addr().String()); !errors.Is(err, ErrPlaintext) {
		t.Fatalf("TLS Dial to a plaintext port: %v, want ErrPlaintext", err)
	}
	checkGood(t, k, addr)
}

// TestAuthRelayedProof puts an attacker between an honest dialler and an honest listener. It has no
// secret; it terminates the dialler's TLS session itself (the default certificates prove nothing),
// captures the dialler's proof and presents it on its own session to the listener. The proof is bound
// to the first session's exporter, so the listener refuses it, and the dialler refuses the attacker.
func TestAuthRelayedProof(t *testing.T) {
	for _, k := range authKinds {
		t.Run(k.name, func(t *testing.T) {
			r := newRefusals()
			addr := serveOne(t, k.make(testSecret, r.add))

			// The attacker's listener, with a certificate of its own.
			attackerCfg := AuthConfig{Secret: []byte("the attacker has no secret......")}
			proto := tlsProto
			if k.name == "quic" {
				proto = quicStreamProto
			}
			srvTLS, _, err := attackerCfg.TLS(proto)
			if err != nil {
				t.Fatal(err)
			}
			captured := make(chan []byte, 1)
			relayed := make(chan []byte, 1) // what the honest listener answered the attacker
			var attackerAddr string
			var stop func()
			serve := func(rw io.ReadWriter) {
				b, err := readN(rw, auth.MessageSize)
				if err != nil {
					captured <- nil
					return
				}
				captured <- b
				rw.Write(<-relayed)
			}
			if k.name == "tls" {
				ln, err := tls.Listen("tcp", "127.0.0.1:0", srvTLS)
				if err != nil {
					t.Fatal(err)
				}
				attackerAddr = ln.Addr().String()
				done := make(chan struct{})
				go func() {
					defer close(done)
					c, err := ln.Accept()
					if err != nil {
						return
					}
					defer c.Close()
					serve(c)
				}()
				stop = func() { ln.Close(); <-done }
			} else {
				ln, err := quic.ListenAddr("127.0.0.1:0", srvTLS, nil)
				if err != nil {
					t.Fatal(err)
				}
				attackerAddr = ln.Addr().String()
				done := make(chan struct{})
				go func() {
					defer close(done)
					conn, err := ln.Accept(context.Background())
					if err != nil {
						return
					}
					defer conn.CloseWithError(0, "")
					st, err := conn.AcceptStream(context.Background())
					if err != nil {
						return
					}
					serve(st)
					readN(st, 1) // until the dialler gives up
				}()
				stop = func() { ln.Close(); <-done }
			}

			// The honest dialler talks to the attacker.
			dialErr := make(chan error, 1)
			go func() {
				c, err := k.make(testSecret, nil).Dial(context.Background(), attackerAddr)
				if c != nil {
					c.Close()
				}
				dialErr <- err
			}()
			proof := <-captured
			if proof == nil {
				t.Fatal("the attacker captured no proof")
			}
			// The attacker presents the captured proof on its own session with the listener.
			rw, closeRaw := rawClient(t, k.name, addr)
			rw.Write(proof)
			answer, _ := readN(rw, auth.MessageSize)
			closeRaw()
			relayed <- answer
			if err := r.wait(t); !errors.Is(err, ErrAuth) {
				t.Fatalf("listener reported %v for a relayed proof, want ErrAuth", err)
			}
			if err := <-dialErr; !errors.Is(err, ErrAuth) {
				t.Fatalf("honest Dial through the attacker: %v, want ErrAuth", err)
			}
			stop()
			checkGood(t, k, addr)
		})
	}
}

// TestQUICKindsDoNotMix checks that a session dialled to a byte-stream listener, and a byte stream
// dialled to a session listener, are refused, and that both listeners go on serving.
func TestQUICKindsDoNotMix(t *testing.T) {
	tr := NewQUIC(QUICConfig{Auth: AuthConfig{Secret: testSecret}, OnRefused: func(net.Addr, error) {}})
	addr := serveOne(t, tr)
	if _, err := tr.DialSession(context.Background(), addr); !errors.Is(err, ErrRefused) {
		t.Fatalf("DialSession to a byte-stream listener: %v, want ErrRefused", err)
	}
	checkGood(t, authKinds[1], addr)
	sl, err := tr.ListenSession("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	if _, err := tr.Dial(context.Background(), sl.Addr().String()); !errors.Is(err, ErrRefused) {
		t.Fatalf("Dial to a session listener: %v, want ErrRefused", err)
	}
	cs, err := tr.DialSession(context.Background(), sl.Addr().String())
	if err != nil {
		t.Fatalf("DialSession after a refused Dial: %v", err)
	}
	defer cs.Close()
	ss, err := sl.Accept(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	checkStream(t, cs, ss)
}

// TestAuthReplayedTLSHandshake records every byte an honest dialler sends through a transparent relay
// (which therefore succeeds), then replays the recording on a new connection: the listener's new
// handshake does not match the recorded one, so the replay is refused before any proof is accepted.
func TestAuthReplayedTLSHandshake(t *testing.T) {
	r := newRefusals()
	k := authKinds[0]
	addr := serveOne(t, k.make(testSecret, r.add))
	relay, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()
	recorded := make(chan []byte, 1)
	go func() {
		in, err := relay.Accept()
		if err != nil {
			recorded <- nil
			return
		}
		defer in.Close()
		out, err := net.Dial("tcp", addr)
		if err != nil {
			recorded <- nil
			return
		}
		defer out.Close()
		go io.Copy(in, out)
		var rec []byte
		buf := make([]byte, 4096)
		for {
			n, err := in.Read(buf)
			rec = append(rec, buf[:n]...)
			out.Write(buf[:n])
			if err != nil {
				break
			}
		}
		recorded <- rec
	}()
	c, err := k.make(testSecret, nil).Dial(context.Background(), relay.Addr().String())
	if err != nil {
		t.Fatalf("Dial through a transparent relay: %v", err)
	}
	c.Write([]byte("ping"))
	if got, err := readN(c, 4); err != nil || string(got) != "ping" {
		t.Fatalf("echo = %q, %v", got, err)
	}
	c.Close()
	rec := <-recorded
	if len(rec) == 0 {
		t.Fatal("nothing recorded")
	}
	replay, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer replay.Close()
	replay.Write(rec)
	if err := r.wait(t); !errors.Is(err, ErrAuth) {
		t.Fatalf("listener reported %v for a replayed handshake, want ErrAuth", err)
	}
	checkGood(t, k, addr)
}
