package tcp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/concord-ccl/concord/rdma"
)

// NICConfig describes one local NIC: a network interface with its own address.
type NICConfig struct {
	// Interface is the interface name (for example "eth2"). Sockets of this NIC are bound to it with
	// SO_BINDTODEVICE, and its link state is the NIC's health. Required.
	Interface string
	// Addr is the interface's address; sockets of this NIC are bound to it. Required.
	Addr netip.Addr
	// Port is the port the NIC listens on (0: one the kernel picks; see Endpoint.ListenAddrs).
	Port uint16
	// Bandwidth is the NIC's rate in bytes per second, in each direction (0: unknown).
	Bandwidth float64
	// Distance is the NUMA/PCIe distance from the process to the NIC (0: nearest).
	Distance int
	// NUMANode is the NUMA node of the NIC, -1 when unknown. HostNICs fills it from sysfs.
	NUMANode int
}

// Config configures an Endpoint. Node and NICs are required; every other field has a working zero
// value.
type Config struct {
	// Node is this endpoint's node id.
	Node rdma.NodeID
	// NICs are the local NICs, indexed by rdma.NICID. From HostNICs or written by hand.
	NICs []NICConfig
	// Peers maps every other node to the listen address of each of its NICs, indexed by NICID. Peers can
	// also be added later with Endpoint.SetPeer (before Connect names them).
	Peers map[rdma.NodeID][]netip.AddrPort
	// NetNS is the path of the network namespace the endpoint's sockets and link watch live in (for
	// example /var/run/netns/x); empty means the calling process's namespace.
	NetNS string
	// UserTimeout is TCP_USER_TIMEOUT: how long sent data may stay unacknowledged before the kernel
	// fails the socket (default 2s). A NIC taken down resets nothing, so without it a dead socket lives
	// for about 15 minutes; runtimes keep their own, shorter deadlines anyway.
	UserTimeout time.Duration
	// KeepAlive is the idle time before keepalive probes, and their interval (default 1s; 3 probes).
	KeepAlive time.Duration
	// ConnectTimeout bounds how long Connect keeps dialing a peer that does not answer yet (default 10s).
	ConnectTimeout time.Duration
	// MaxChunk is the largest chunk accepted from a peer, in bytes (default 64 MiB).
	MaxChunk int
}

// Defaults of Config.
const (
	DefaultUserTimeout    = 2 * time.Second
	DefaultKeepAlive      = time.Second
	DefaultConnectTimeout = 10 * time.Second
	DefaultMaxChunk       = 64 << 20
)

func (c Config) withDefaults() Config {
	if c.UserTimeout == 0 {
		c.UserTimeout = DefaultUserTimeout
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = DefaultKeepAlive
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = DefaultConnectTimeout
	}
	if c.MaxChunk == 0 {
		c.MaxChunk = DefaultMaxChunk
	}
	return c
}

// Validate names the first invalid field.
func (c Config) Validate() error {
	if len(c.NICs) == 0 {
		return fmt.Errorf("tcp: Config.NICs is empty: %w", rdma.ErrInvalid)
	}
	if len(c.NICs) > 1<<16 {
		return fmt.Errorf("tcp: Config.NICs has %d entries: %w", len(c.NICs), rdma.ErrInvalid)
	}
	for i, n := range c.NICs {
		if n.Interface == "" || len(n.Interface) >= 16 {
			return fmt.Errorf("tcp: Config.NICs[%d].Interface %q: %w", i, n.Interface, rdma.ErrInvalid)
		}
		if !n.Addr.IsValid() {
			return fmt.Errorf("tcp: Config.NICs[%d].Addr is not set: %w", i, rdma.ErrInvalid)
		}
		if n.Bandwidth < 0 {
			return fmt.Errorf("tcp: Config.NICs[%d].Bandwidth %v: %w", i, n.Bandwidth, rdma.ErrInvalid)
		}
	}
	for node, addrs := range c.Peers {
		if node == c.Node {
			return fmt.Errorf("tcp: Config.Peers names this node %d: %w", node, rdma.ErrInvalid)
		}
		for i, a := range addrs {
			if !a.IsValid() || a.Port() == 0 {
				return fmt.Errorf("tcp: Config.Peers[%d][%d] = %v: %w", node, i, a, rdma.ErrInvalid)
			}
		}
	}
	switch {
	case c.UserTimeout < 0:
		return fmt.Errorf("tcp: Config.UserTimeout %v: %w", c.UserTimeout, rdma.ErrInvalid)
	case c.KeepAlive < 0:
		return fmt.Errorf("tcp: Config.KeepAlive %v: %w", c.KeepAlive, rdma.ErrInvalid)
	case c.ConnectTimeout < 0:
		return fmt.Errorf("tcp: Config.ConnectTimeout %v: %w", c.ConnectTimeout, rdma.ErrInvalid)
	case c.MaxChunk < 0:
		return fmt.Errorf("tcp: Config.MaxChunk %d: %w", c.MaxChunk, rdma.ErrInvalid)
	}
	return nil
}

// HostNICs describes the named interfaces of the current network namespace (all that are not loopback
// and have an IPv4 address, in name order, when names is empty): each one's first IPv4 address, its
// speed from /sys/class/net/<name>/speed where the driver reports one, and its NUMA node from
// /sys/class/net/<name>/device/numa_node where present (-1 otherwise); sysfs is read only when it
// shows the same interface (same index), since it may belong to another namespace. Distance is 0 for NICs on the
// lowest NUMA node seen (or of unknown node) and 1 for the others. Ports are 0. A name may also be an
// address of the interface (for example "10.1.0.2").
func HostNICs(names ...string) ([]NICConfig, error) {
	links, err := netlink.LinkList()
	if errors.Is(err, netlink.ErrDumpInterrupted) {
		links, err = netlink.LinkList()
	}
	if err != nil {
		return nil, fmt.Errorf("tcp: list interfaces: %w", err)
	}
	byName := make(map[string]netlink.Link, len(links))
	for _, l := range links {
		byName[l.Attrs().Name] = l
	}
	if len(names) == 0 {
		for _, l := range links {
			if l.Attrs().Flags&net.FlagLoopback == 0 {
				names = append(names, l.Attrs().Name)
			}
		}
	}
	var nics []NICConfig
	for _, name := range names {
		l, ok := byName[name]
		if !ok {
			l, ok = linkWithAddr(links, name)
		}
		if !ok {
			return nil, fmt.Errorf("tcp: interface %q: not found", name)
		}
		name = l.Attrs().Name
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return nil, fmt.Errorf("tcp: addresses of %s: %w", name, err)
		}
		if len(addrs) == 0 {
			continue
		}
		a, _ := netip.AddrFromSlice(addrs[0].IP.To4())
		nic := NICConfig{Interface: name, Addr: a, NUMANode: -1}
		// sysfs shows the interfaces of the namespace it was mounted in, which need not be this one
		// (a process that entered a namespace without remounting it): trust it only when the
		// interface index there matches.
		dir := filepath.Join("/sys/class/net", name)
		if int(sysfsInt(filepath.Join(dir, "ifindex"), -1)) == l.Attrs().Index {
			nic.Bandwidth = sysfsInt(filepath.Join(dir, "speed"), 0) * 1e6 / 8
			nic.NUMANode = int(sysfsInt(filepath.Join(dir, "device/numa_node"), -1))
		}
		nics = append(nics, nic)
	}
	if len(nics) == 0 {
		return nil, fmt.Errorf("tcp: no interface with an IPv4 address among %v", names)
	}
	nearest := -1
	for _, n := range nics {
		if n.NUMANode >= 0 && (nearest < 0 || n.NUMANode < nearest) {
			nearest = n.NUMANode
		}
	}
	for i := range nics {
		if nics[i].NUMANode >= 0 && nics[i].NUMANode != nearest {
			nics[i].Distance = 1
		}
	}
	return nics, nil
}

// linkWithAddr returns the link among links that has the address s, if s is an IP address.
func linkWithAddr(links []netlink.Link, s string) (netlink.Link, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return nil, false
	}
	for _, l := range links {
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			continue
		}
		for _, la := range addrs {
			if b, ok := netip.AddrFromSlice(la.IP); ok && b.Unmap() == a.Unmap() {
				return l, true
			}
		}
	}
	return nil, false
}

// sysfsInt reads one integer from a sysfs file, or returns def when the file is missing, unreadable or
// negative (a virtual interface reports speed -1).
func sysfsInt(path string, def float64) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return def
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	if err != nil || v < 0 {
		return def
	}
	return v
}
