package wire

import "fmt"

// Rendezvous: reaching a peer that cannot be dialled.
//
// A peer behind NAT, with no port forwarded, cannot accept connections, but it can open them. A peer
// that must reach one (a ring link, a state transfer, a bandwidth test) asks the master, on its
// control session, for a rendezvous of one of three modes, under a random key; the master passes the
// request to the target on the target's session, and the connection that results is handed, at the
// target, to its ordinary listener's code, as if it had been accepted:
//
//   - RendezvousReverse: the asker can be dialled, so the target dials the asker's address back
//     (KindCall) and sends CallHello with the key; the asker then speaks first, as the dialler would.
//   - RendezvousPunch (QUIC): both are behind NAT. The target sends a few datagrams from its listening
//     socket to the asker's public address, opening its NAT for the asker's packets, while the asker
//     does the same and then dials the target's public address from its listening socket.
//   - RendezvousRelay: nothing else works. Both dial the master's address (KindRelay) and send
//     CallHello with the key; the master joins the two connections byte for byte.
//
//	asker                        master                       target
//	Rendezvous (mode, key, target) ->
//	                                  RendezvousCall (mode, key, asker, addr) ->
//	          <------------ (reverse) KindCall + CallHello (key) -------------
//	   (punch) datagrams -> public <-> public <- datagrams; asker dials target's public address
//	(relay) KindRelay + CallHello -> joined <- KindRelay + CallHello (relay)

// Rendezvous modes.
const (
	RendezvousReverse uint8 = 1
	RendezvousPunch   uint8 = 2
	RendezvousRelay   uint8 = 3
	rendezvousMax           = RendezvousRelay
)

// RendezvousKey names one rendezvous at both ends and at the master's relay.
type RendezvousKey [16]byte

// Rendezvous asks the master to have peer Peer reach this peer by Mode, under Key.
type Rendezvous struct {
	Mode uint8
	Key  RendezvousKey
	Peer uint64
}

func (m *Rendezvous) Append(b []byte) []byte {
	b = append(b, m.Mode)
	b = append(b, m.Key[:]...)
	return appendU64(b, m.Peer)
}

func (m *Rendezvous) decode(d *decoder) {
	m.Mode = d.rendezvousMode()
	copy(m.Key[:], d.take(len(m.Key), "rendezvous key"))
	m.Peer = d.u64("peer")
}

// RendezvousCall passes a Rendezvous to its target: peer Peer, at Addr (reverse) or Public (punch),
// asks to be reached by Mode under Key.
type RendezvousCall struct {
	Mode   uint8
	Key    RendezvousKey
	Peer   uint64
	Addr   string
	Public string
}

func (m *RendezvousCall) Append(b []byte) []byte {
	b = append(b, m.Mode)
	b = append(b, m.Key[:]...)
	b = appendU64(b, m.Peer)
	b = appendString(b, m.Addr)
	return appendString(b, m.Public)
}

func (m *RendezvousCall) decode(d *decoder) {
	m.Mode = d.rendezvousMode()
	copy(m.Key[:], d.take(len(m.Key), "rendezvous key"))
	m.Peer, m.Addr, m.Public = d.u64("peer"), d.str("addr"), d.str("public")
}

// CallHello opens a connection of a rendezvous: a target's call back to the asker (KindCall), or
// either end's connection to the master's relay (KindRelay).
type CallHello struct {
	Token string
	Key   RendezvousKey
}

func (m *CallHello) Append(b []byte) []byte {
	b = appendString(b, m.Token)
	return append(b, m.Key[:]...)
}

func (m *CallHello) decode(d *decoder) {
	m.Token = d.str("token")
	copy(m.Key[:], d.take(len(m.Key), "rendezvous key"))
}

func (d *decoder) rendezvousMode() uint8 {
	v := d.u8("rendezvous mode")
	if v == 0 || v > rendezvousMax {
		d.fail(fmt.Sprintf("rendezvous mode %d", v))
	}
	return v
}

func (*Rendezvous) Type() Type     { return TypeRendezvous }
func (*RendezvousCall) Type() Type { return TypeRendezvousCall }
func (*CallHello) Type() Type      { return TypeCallHello }
