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

// checkNAT warns when peer p advertises an IP address other than the one its connection comes from.
func (m *Machine) checkNAT(p *peer) {
	adv, ok := hostIP(p.hello.Addr)
	seen, ok2 := hostIP(p.observed)
	if !ok || !ok2 || seen.IsLoopback() || adv == seen {
		return
	}
	text := fmt.Sprintf("the master sees this peer's connection come from %s, not from its advertised address %s: it is probably behind NAT, and ring neighbours dial %s; if they cannot reach it, set --advertise to an address they can (and forward the port)",
		seen, p.hello.Addr, p.hello.Addr)
	m.gnote(p.group, "nat", p.id, "advertises %s, connects from %s", p.hello.Addr, p.observed)
	m.send(p.id, &wire.Notice{Text: text})
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
