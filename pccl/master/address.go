package master

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/concord-ccl/concord/internal/wire"
)

// Addresses and reachability.
//
// A peer advertises the address its ring predecessor dials (Hello.Addr). The master sees where the
// peer's own connection comes from (Opened). When the two hosts differ, the peer is probably behind
// NAT and its neighbours may not reach the address it advertises: the master notes it and tells the
// peer in one line. When a neighbour cannot dial an advertised address while wiring, the owner is told
// which address failed, from where and why.

// maxPendingRemotes bounds the remote addresses kept for connections that have not sent a Hello yet.
const maxPendingRemotes = 1 << 16

// checkNAT reports whether others can dial peer p's advertised address: yes unless its connection
// comes from another IP address than it advertises (NAT) and the operator did not publish that
// address (Hello.Published: a forwarded port).
func (m *Machine) checkNAT(p *peer) bool {
	adv, ok := hostIP(p.hello.Addr)
	seen, ok2 := hostIP(p.observed)
	if !ok || !ok2 || seen.IsLoopback() || adv == seen {
		return true
	}
	return p.hello.Published
}

// noteNAT tells an operator, in the events and in one line to the peer, that peer p connects from
// another address than it advertises: behind NAT, reached by rendezvous; or, with a published
// address, trusted to be reachable there.
func (m *Machine) noteNAT(p *peer) {
	adv, ok := hostIP(p.hello.Addr)
	seen, ok2 := hostIP(p.observed)
	if !ok || !ok2 || seen.IsLoopback() || adv == seen {
		return
	}
	m.gnote(p.group, "nat", p.id, "advertises %s, connects from %s, reachable there: %v", p.hello.Addr, p.observed, p.inbound)
	text := fmt.Sprintf("the master sees this peer's connection come from %s, not from its advertised address %s: it is behind NAT; ring neighbours reach it by rendezvous (a call back, a punched QUIC path, or the master's relay), which costs more than a direct link; to be dialled directly, forward a port and set --advertise to the public address",
		seen, p.hello.Addr)
	if p.inbound {
		text = fmt.Sprintf("the master sees this peer's connection come from %s, not from its published address %s: neighbours dial %s, as --advertise says",
			seen, p.hello.Addr, p.hello.Addr)
	}
	m.send(p.id, &wire.Notice{Text: text})
}

// info is what others are told of peer p: its addresses and site.
func (m *Machine) info(p *peer) wire.PeerInfo {
	return wire.PeerInfo{ID: p.id, Addr: p.hello.Addr, Site: p.hello.Site, NICs: p.hello.NICs, Public: p.observed, Inbound: p.inbound}
}

// reachPenalty is the factor by which the ring solve prices a link a -> b that neither end can accept
// (both behind NAT): it needs a punched path or the master's relay, so rings avoid it where they can.
func (m *Machine) reachPenalty(a, b PeerID) float64 {
	p, q := m.peers[a], m.peers[b]
	if p != nil && q != nil && !p.inbound && !q.inbound {
		return relayPenalty
	}
	return 1
}

// relayPenalty is reachPenalty's factor.
const relayPenalty = 8

// rendezvous passes peer p's request to be reached by another peer on to that peer.
func (m *Machine) rendezvous(p *peer, r *wire.Rendezvous) {
	q := m.peers[r.Peer]
	if q == nil || q == p {
		return // gone: the asker's wait ends in its timeout
	}
	m.counters.Rendezvous++
	m.send(q.id, &wire.RendezvousCall{Mode: r.Mode, Key: r.Key, Peer: p.id, Addr: p.hello.Addr, Public: p.observed})
}

// hostIP returns the IP address of a "host:port" address, if its host is one.
func hostIP(addr string) (netip.Addr, bool) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}

// host returns the host part of "host:port" (the whole string if it has no port).
func host(addr string) string {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return ap.Addr().Unmap().String()
	}
	if i := strings.LastIndexByte(addr, ':'); i > 0 {
		return strings.Trim(addr[:i], "[]")
	}
	return addr
}

// unreachable is the one line that tells the owner of an advertised address that from could not dial
// it while wiring, with the dialer's error.
func (m *Machine) unreachable(from, to PeerID, detail string) string {
	src := fmt.Sprintf("peer %d", from)
	if f := m.peers[from]; f != nil && f.observed != "" {
		src = fmt.Sprintf("peer %d (at %s)", from, host(f.observed))
	}
	addr := "?"
	if t := m.peers[to]; t != nil {
		addr = t.hello.Addr
	}
	if detail == "" {
		detail = "no detail"
	}
	return fmt.Sprintf("%s could not dial this peer's advertised address %s: %s; set --advertise (CONCORD_ADVERTISE) to an address ring neighbours can reach",
		src, addr, detail)
}

// removals remembers why the last maxRemovals removed peers went, for a peer that comes back to ask.
type removals struct {
	why_  map[PeerID]string
	order []PeerID
}

// maxRemovals bounds the removals remembered.
const maxRemovals = 1024

func (r *removals) add(id PeerID, why string) {
	if r.why_ == nil {
		r.why_ = map[PeerID]string{}
	}
	if _, ok := r.why_[id]; !ok {
		r.order = append(r.order, id)
	}
	r.why_[id] = why
	if len(r.order) > maxRemovals {
		delete(r.why_, r.order[0])
		r.order = r.order[1:]
	}
}

// why says why peer id was removed, if it is remembered.
func (r *removals) why(id PeerID) string {
	if w, ok := r.why_[id]; ok {
		return w
	}
	return "the reason is no longer known"
}
