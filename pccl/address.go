package pccl

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Addresses of a peer's link listener.
//
// A peer listens for links from its ring predecessor and tells the master an address to dial it at;
// the master hands that address to the predecessor. Across machines the address must be one the
// neighbours can reach, which a wildcard listener (0.0.0.0, [::]) is not: a neighbour that dials
// 0.0.0.0 reaches itself. So by default a peer advertises the address its own traffic to the master
// leaves from (its route to the master), with the port its listener got; on one host that is
// loopback. AdvertiseAddr overrides it; a host without a port takes the listener's port.

// defaultListen is the listen address when Config.ListenAddr is empty: the address of the route to
// the master, any port; every interface (":0") when the master's address cannot be resolved to an
// IP address, as on the in-memory network.
func defaultListen(master string) string {
	ip, err := routeTo(master)
	if err != nil {
		return ":0"
	}
	return net.JoinHostPort(ip.String(), "0")
}

// routeTo returns the local address the kernel sends from towards master (host:port). It sends
// nothing: a UDP socket is connected, which only chooses the route. A DNS name is resolved first.
func routeTo(master string) (netip.Addr, error) {
	u, err := net.Dial("udp", master)
	if err != nil {
		return netip.Addr{}, err
	}
	defer u.Close()
	ua, ok := u.LocalAddr().(*net.UDPAddr)
	if !ok {
		return netip.Addr{}, fmt.Errorf("no IP route to %s", master)
	}
	ip, ok := netip.AddrFromSlice(ua.IP)
	if !ok {
		return netip.Addr{}, fmt.Errorf("no IP route to %s", master)
	}
	return ip.Unmap(), nil
}

// advertised returns the address neighbours dial to reach a listener bound at bound: advertise if it
// has a port; advertise's host with bound's port if it has none; bound itself unless it is a
// wildcard; and for a wildcard, the address of the route to the master with bound's port.
func advertised(advertise string, bound net.Addr, master string) (string, error) {
	port, isIP := boundPort(bound)
	if advertise != "" {
		host, hasPort, err := splitAdvertise(advertise)
		if err != nil {
			return "", fmt.Errorf("%w: Config.AdvertiseAddr %q: %v", ErrInvalid, advertise, err)
		}
		if hasPort {
			return advertise, nil
		}
		if !isIP {
			return "", fmt.Errorf("%w: Config.AdvertiseAddr %q has no port, and the listener's address %s has none to lend it",
				ErrInvalid, advertise, bound)
		}
		return net.JoinHostPort(host, strconv.Itoa(port)), nil
	}
	if !isIP || !wildcard(bound) {
		return bound.String(), nil
	}
	ip, err := routeTo(master)
	if err != nil {
		return "", fmt.Errorf("pccl: the link listener %s is a wildcard and the route to the master %s is unknown (%v): set Config.AdvertiseAddr (--advertise) to an address neighbours can reach",
			bound, master, err)
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(port)), nil
}

// boundPort returns the port of a TCP or UDP address, and whether bound is one.
func boundPort(bound net.Addr) (int, bool) {
	switch a := bound.(type) {
	case *net.TCPAddr:
		return a.Port, true
	case *net.UDPAddr:
		return a.Port, true
	}
	return 0, false
}

// wildcard reports whether a TCP or UDP address is unspecified (0.0.0.0 or [::]).
func wildcard(bound net.Addr) bool {
	switch a := bound.(type) {
	case *net.TCPAddr:
		return a.IP == nil || a.IP.IsUnspecified()
	case *net.UDPAddr:
		return a.IP == nil || a.IP.IsUnspecified()
	}
	return false
}

// splitAdvertise splits an advertised address into its host and whether it names a port: "h:p",
// "[v6]:p", or a bare host ("h", "v6", "[v6]").
func splitAdvertise(s string) (host string, hasPort bool, err error) {
	if h, p, err := net.SplitHostPort(s); err == nil {
		if h == "" {
			return "", false, fmt.Errorf("no host")
		}
		if _, err := strconv.ParseUint(p, 10, 16); err != nil {
			return "", false, fmt.Errorf("port %q", p)
		}
		return h, true, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.String(), false, nil
	}
	if inner, ok := strings.CutPrefix(s, "["); ok {
		if inner, ok := strings.CutSuffix(inner, "]"); ok {
			if _, err := netip.ParseAddr(inner); err == nil {
				return inner, false, nil
			}
		}
		return "", false, fmt.Errorf("not host:port, an IP address or a host name")
	}
	if s == "" || strings.ContainsAny(s, ":/ ") {
		return "", false, fmt.Errorf("not host:port, an IP address or a host name")
	}
	return s, false, nil
}
