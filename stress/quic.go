package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	randv2 "math/rand/v2"
	"net"
	"os"
	"time"

	"github.com/concord-ccl/concord/internal/auth"
	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/internal/wire"
)

// The soak over QUIC (--transport quic). The master and every peer run QUIC with a run secret drawn
// for the run, which the children get in CONCORD_TRANSPORT and CONCORD_SECRET as the commands do.
// Each peer reaches the master through a UDP relay (black hole and slow faults); ring links go
// straight, so the ring-link faults are not dealt. A killed master sends no reset over UDP (and QUIC
// ignores ICMP errors after the handshake): its peers find the restarted one by probing its address
// once it has been silent (pccl/reconnect.go). Junk faults speak UDP and QUIC to the master.

// transportEnv returns the environment that makes every child talk transport name with secret.
func transportEnv(name string, secret []byte) []string {
	if name != "quic" {
		return nil
	}
	return []string{"CONCORD_TRANSPORT=quic", "CONCORD_SECRET=" + string(secret)}
}

// newSecret draws a run secret: 32 random bytes, hex-encoded.
func newSecret() []byte {
	b := make([]byte, 32)
	rand.Read(b)
	return []byte(hex.EncodeToString(b))
}

// peerTransport returns the transport a soak peer's environment names (QUIC), or nil for TCP.
func peerTransport() (transport.Transport, error) {
	if os.Getenv("CONCORD_TRANSPORT") != "quic" {
		return nil, nil
	}
	secret, err := auth.LoadSecret(os.Getenv("CONCORD_SECRET"), "")
	if err != nil {
		return nil, err
	}
	// A closed connection lingers until its far end closes too, or Linger has passed: shorter than
	// the 3 s in which a closed communicator's goroutines must be gone.
	return transport.NewQUIC(transport.QUICConfig{Auth: transport.AuthConfig{Secret: secret}, Linger: soakLinger}), nil
}

// soakLinger is the QUIC Linger of the soak's peers.
const soakLinger = time.Second

// junkQUIC sends the master, over UDP, what strangers and broken clients would: datagrams that are
// not QUIC, QUIC handshakes without the run secret, and QUIC connections that pass the handshake and
// then send bytes that are no handshake of Concord's, or a Hello with another run token; and the same
// to peers' own ports, with junkPeers's payloads over QUIC connections with the run secret. None may
// disturb the run.
func (s *soak) junkQUIC(seed uint64) {
	wrong := append([]byte(nil), s.secret...)
	wrong[0] ^= 1
	right, errR := transport.Select("quic", transport.AuthConfig{Secret: s.secret})
	stranger, errS := transport.Select("quic", transport.AuthConfig{Secret: wrong})
	if errR != nil || errS != nil {
		return
	}
	targets := s.junkTargets()
	s.junkPeers(seed^0x5eed, func(a string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return right.Dial(ctx, a)
	})
	s.junkWG.Add(1)
	go func() {
		defer s.junkWG.Done()
		rng := randv2.New(randv2.NewPCG(seed, 0x1c))
		for i := range junkPerFault {
			addr := s.master
			if i%4 < 2 && (i/4)%2 == 1 && len(targets) > 0 { // every other datagram and stranger: at a peer's port
				addr = targets[rng.IntN(len(targets))].addr
				s.junkPeerConns.Add(1)
			}
			switch i % 4 {
			case 0:
				c, err := net.Dial("udp", addr)
				if err != nil {
					continue
				}
				b := make([]byte, 1200)
				for k := range b {
					b[k] = byte(rng.Uint32())
				}
				c.Write(b)
				c.Close()
			case 1:
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				if c, err := stranger.Dial(ctx, addr); err == nil {
					c.Close() // refused later, on the proof; the master drops it
				}
				cancel()
			default:
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				c, err := right.Dial(ctx, addr)
				cancel()
				if err != nil {
					continue
				}
				c.SetDeadline(time.Now().Add(500 * time.Millisecond))
				var payload []byte
				if i%4 == 2 {
					payload = make([]byte, 64)
					for k := range payload {
						payload[k] = byte(rng.Uint32())
					}
				} else {
					hs := wire.AppendHandshake(nil, wire.Handshake{Version: wire.Version, Kind: wire.KindControl})
					payload = wire.AppendFrame(hs, &wire.Hello{Token: "not the run's", Addr: "127.0.0.1:1"})
				}
				c.Write(payload)
				io.Copy(io.Discard, c)
				c.Close()
			}
		}
	}()
}
