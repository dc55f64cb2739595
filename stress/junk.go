package main

import (
	"io"
	"math/rand/v2"
	"net"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// junkPeerPerFault is how many connections one junk fault opens to peers' own ports.
const junkPeerPerFault = 40

// junkTarget is a peer's port that junk is sent to, with the ids a hello to it names.
type junkTarget struct {
	addr string // where the peer accepts ring links, state transfers, bandwidth tests and calls
	id   uint64 // the peer's id (its session)
	pred uint64 // its ring predecessor's id, 0 when unknown
}

// junkTargets returns the healthy peers whose ports are known, each with its ring predecessor.
func (s *soak) junkTargets() []junkTarget {
	var out []junkTarget
	pred := map[uint64]uint64{}
	for i, id := range s.ring {
		pred[s.ring[(i+1)%len(s.ring)]] = id
	}
	for _, p := range s.order {
		if p.healthy() && p.addr != "" {
			out = append(out, junkTarget{addr: p.addr, id: p.sess, pred: pred[p.sess]})
		}
	}
	return out
}

// junkPeers opens junkPeerPerFault connections to peers' own ports (the listener that takes ring
// links, state transfers, bandwidth tests and rendezvous calls) that a stranger, a broken client or an
// eavesdropper would: bytes without a handshake, a handshake of another version, frames that do not
// decode and oversized frames on the link, state, call and bench kinds, a first message that is not a
// LinkHello, LinkHellos with another run token (unauthenticated), and a handshake followed by silence.
// With replay it also sends the LinkHello a peer's predecessor sends it, as an eavesdropper on a
// plaintext link would replay it. None may disturb the run.
func (s *soak) junkPeers(seed uint64, dial func(string) (net.Conn, error), replay bool) {
	targets := s.junkTargets()
	if len(targets) == 0 {
		return
	}
	cases := 11
	if replay {
		cases++
	}
	s.junkWG.Add(1)
	go func() {
		defer s.junkWG.Done()
		rng := rand.New(rand.NewPCG(seed, 0x9e))
		for i := range junkPeerPerFault {
			t := targets[rng.IntN(len(targets))]
			c, err := dial(t.addr)
			if err != nil {
				continue
			}
			s.junkPeerConns.Add(1)
			c.SetDeadline(time.Now().Add(500 * time.Millisecond))
			hs := func(kind uint8) []byte {
				return wire.AppendHandshake(nil, wire.Handshake{Version: wire.Version, Kind: kind})
			}
			var payload []byte
			switch i % cases {
			case 0:
				payload = make([]byte, 64)
				for k := range payload {
					payload[k] = byte(rng.Uint32())
				}
			case 1:
				payload = wire.AppendHandshake(nil, wire.Handshake{Version: wire.Version + 1, Kind: wire.KindData})
			case 2:
				payload = append(hs(wire.KindData), 0, 0, 0, 3, 1, 0xff, 0xff)
			case 3:
				payload = append(hs(wire.KindData), 0x7f, 0xff, 0xff, 0xff, 1)
			case 4:
				payload = wire.AppendFrame(hs(wire.KindData), &wire.VotePending{})
			case 5:
				payload = wire.AppendFrame(hs(wire.KindData), &wire.LinkHello{Token: "not the run's", From: t.pred, To: t.id})
			case 6:
				payload = append(hs(wire.KindState), 0x7f, 0xff, 0xff, 0xff, 1)
			case 7:
				payload = append(hs(wire.KindState), 0, 0, 0, 3, 1, 0xff, 0xff)
			case 8:
				payload = append(hs(wire.KindCall), 0x7f, 0xff, 0xff, 0xff, 1)
			case 9:
				payload = append(hs(wire.KindBench), 0x7f, 0xff, 0xff, 0xff, 1)
			case 10:
				payload = hs(wire.KindData)
			case 11:
				// The run's token (the soak runs without one) and a live link's ends.
				if t.pred == 0 {
					c.Close()
					continue
				}
				payload = wire.AppendFrame(hs(wire.KindData), &wire.LinkHello{From: t.pred, To: t.id})
			}
			c.Write(payload)
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
}
