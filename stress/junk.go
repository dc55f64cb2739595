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

// peerJunkCases is how many kinds of junk junkPayload makes, the replayed hello aside.
const peerJunkCases = 11

// junkPayload returns the bytes of junk case k (below peerJunkCases) for target t: bytes without a
// handshake, a handshake of another version, frames that do not decode and oversized frames on the
// link, state, call and bench kinds, a first message that is not a LinkHello, a LinkHello with
// another run token, and a handshake followed by silence. Case peerJunkCases is the replayed hello:
// the LinkHello t's ring predecessor sent it, with the run's token (the soak runs without one); nil
// when the predecessor is unknown.
func junkPayload(k int, t junkTarget, rng *rand.Rand) []byte {
	hs := func(kind uint8) []byte {
		return wire.AppendHandshake(nil, wire.Handshake{Version: wire.Version, Kind: kind})
	}
	switch k {
	case 0:
		b := make([]byte, 64)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	case 1:
		return wire.AppendHandshake(nil, wire.Handshake{Version: wire.Version + 1, Kind: wire.KindData})
	case 2:
		return append(hs(wire.KindData), 0, 0, 0, 3, 1, 0xff, 0xff)
	case 3:
		return append(hs(wire.KindData), 0x7f, 0xff, 0xff, 0xff, 1)
	case 4:
		return wire.AppendFrame(hs(wire.KindData), &wire.VotePending{})
	case 5:
		return wire.AppendFrame(hs(wire.KindData), &wire.LinkHello{Token: "not the run's", From: t.pred, To: t.id})
	case 6:
		return append(hs(wire.KindState), 0x7f, 0xff, 0xff, 0xff, 1)
	case 7:
		return append(hs(wire.KindState), 0, 0, 0, 3, 1, 0xff, 0xff)
	case 8:
		return append(hs(wire.KindCall), 0x7f, 0xff, 0xff, 0xff, 1)
	case 9:
		return append(hs(wire.KindBench), 0x7f, 0xff, 0xff, 0xff, 1)
	case 10:
		return hs(wire.KindData)
	}
	if t.pred == 0 {
		return nil
	}
	return wire.AppendFrame(hs(wire.KindData), &wire.LinkHello{From: t.pred, To: t.id})
}

// sendJunk writes payload on c and reads until the far end closes or the deadline passes.
func sendJunk(c net.Conn, payload []byte, wait time.Duration) {
	c.SetDeadline(time.Now().Add(wait))
	c.Write(payload)
	io.Copy(io.Discard, c)
	c.Close()
}

// junkPeers opens junkPeerPerFault connections to peers' own ports (the listener that takes ring
// links, state transfers, bandwidth tests and rendezvous calls) with junkPayload's cases, as a
// stranger, a broken client or an eavesdropper replaying a live link's hello would. None may disturb
// the run.
func (s *soak) junkPeers(seed uint64, dial func(string) (net.Conn, error)) {
	targets := s.junkTargets()
	if len(targets) == 0 {
		return
	}
	cases := peerJunkCases + 1 // and the replayed hello
	s.junkWG.Add(1)
	go func() {
		defer s.junkWG.Done()
		rng := rand.New(rand.NewPCG(seed, 0x9e))
		for i := range junkPeerPerFault {
			t := targets[rng.IntN(len(targets))]
			payload := junkPayload(i%cases, t, rng)
			if payload == nil {
				continue
			}
			c, err := dial(t.addr)
			if err != nil {
				continue
			}
			s.junkPeerConns.Add(1)
			sendJunk(c, payload, 500*time.Millisecond)
		}
	}()
}
