package netlab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DefaultPrefix starts the name of every namespace a lab creates unless Config.Prefix says otherwise.
const DefaultPrefix = "cnd-"

// Limits of the address plan: one /24 per rail, addresses .1 to .253 for nodes.
const (
	MaxNodes = 253
	MaxNICs  = 256
)

// MaxGSOBytes is the largest GSOMaxBytes: the kernel's limit for a packet passed on whole.
const MaxGSOBytes = 524280

// ErrGSO is returned by New when the kernel refuses Config.GSOMaxBytes.
var ErrGSO = errors.New("netlab: the kernel refused the GSO size (above 64 KiB it needs Linux 6.3 or later)")

// ErrNotPermitted is returned by New when this process may not create namespaces (not root).
var ErrNotPermitted = errors.New("netlab: creating network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)")

// Config describes a lab. The zero value is one node with one NIC and no rate limit.
type Config struct {
	// Nodes is the number of node namespaces (default 1, at most MaxNodes).
	Nodes int
	// NICs is the number of NICs per node, which is also the number of rails (default 1, at most MaxNICs).
	NICs int
	// NICMbit limits each NIC's rate in megabits per second, in each direction, with HTB (0: no limit).
	NICMbit int
	// MTU of every NIC and bridge port in bytes (default 1500).
	MTU int
	// GSOMaxBytes is the largest TCP packet a NIC or bridge port passes on whole, before or instead of
	// cutting it to the MTU (generic segmentation and receive offload; 0: the kernel's default,
	// 64 KiB). Veth pairs never cut it, so the larger it is, the fewer packets the kernel handles
	// per byte: above 65536 (BIG TCP, at most MaxGSOBytes) a lab on a few cores spends much less CPU
	// moving its traffic. It needs Linux 6.3 or later; where the kernel refuses it, New fails with
	// ErrGSO.
	GSOMaxBytes int
	// Prefix starts every namespace name (default DefaultPrefix). Sweep removes leftovers by it.
	Prefix string
	// IPv6 gives the NICs IPv6 addresses only (see Addr6) instead of IPv4 ones, for IPv6-only
	// networks. Shaping classifies IPv6 packets as bulk.
	IPv6 bool
}

func (c Config) withDefaults() Config {
	if c.Nodes == 0 {
		c.Nodes = 1
	}
	if c.NICs == 0 {
		c.NICs = 1
	}
	if c.MTU == 0 {
		c.MTU = 1500
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	return c
}

// Validate reports the first field that is out of range.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Nodes < 1 || c.Nodes > MaxNodes:
		return fmt.Errorf("netlab: Nodes = %d, want 1..%d", c.Nodes, MaxNodes)
	case c.NICs < 1 || c.NICs > MaxNICs:
		return fmt.Errorf("netlab: NICs = %d, want 1..%d", c.NICs, MaxNICs)
	case c.NICMbit < 0:
		return fmt.Errorf("netlab: NICMbit = %d, want >= 0", c.NICMbit)
	case c.MTU < 576 || c.MTU > 65535:
		return fmt.Errorf("netlab: MTU = %d, want 576..65535", c.MTU)
	case c.GSOMaxBytes != 0 && (c.GSOMaxBytes < c.MTU || c.GSOMaxBytes > MaxGSOBytes):
		return fmt.Errorf("netlab: GSOMaxBytes = %d, want 0 or MTU..%d", c.GSOMaxBytes, MaxGSOBytes)
	case len(c.Prefix) > 12:
		return fmt.Errorf("netlab: Prefix %q longer than 12 bytes", c.Prefix)
	}
	return nil
}

// Addr is the address of node n's NIC on rail r: 198.18.r.(n+1), in the subnet 198.18.r.0/24.
func Addr(node, rail int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 18, byte(rail), byte(node + 1)})
}

// Addr6 is the IPv6 address of node n's NIC on rail r in an IPv6 lab: 2001:2:0:r::(n+1), in the
// subnet 2001:2:0:r::/64 of the benchmarking range 2001:2::/48.
func Addr6(node, rail int) netip.Addr {
	var a [16]byte
	a[0], a[1], a[3] = 0x20, 0x01, 0x02
	a[6], a[7] = byte(rail>>8), byte(rail)
	a[14], a[15] = byte((node+1)>>8), byte(node+1)
	return netip.AddrFrom16(a)
}

// RailPrefix is the subnet of rail r.
func RailPrefix(rail int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(rail), 0}), 24)
}

// NICName is the interface name of a node's NIC on rail r, inside the node's namespace.
func NICName(rail int) string { return fmt.Sprintf("nic%d", rail) }

// portName is the hub-side end of node n's NIC on rail r.
func portName(node, rail int) string { return fmt.Sprintf("p%d-%d", node, rail) }

// bridgeName is the hub's bridge of rail r.
func bridgeName(rail int) string { return fmt.Sprintf("br%d", rail) }

// labSeq makes lab names unique within a process.
var labSeq atomic.Uint64

// Lab is a set of node namespaces wired by one bridge per rail. Its methods may be called
// concurrently. Close removes everything it created.
type Lab struct {
	cfg   Config
	name  string // prefix + pid + sequence number, the start of every namespace name
	hub   *Node  // holds the bridges and the hub ends of the veth pairs
	nodes []*Node
	extra []*Node // namespaces added with AddNode

	closeOnce sync.Once
	closeErr  error
}

// Available reports whether this process can build a lab, and if not, why.
func Available() error {
	if os.Geteuid() != 0 {
		return ErrNotPermitted
	}
	return nil
}

// New sweeps leftovers of dead processes (see Sweep), then builds a lab. On error nothing it created
// is left behind.
func New(cfg Config) (*Lab, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := Available(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	// Leftovers that cannot be removed (a dead process's, hidden under another tool's mount of the
	// namespace directory) are not this lab's concern: their names never collide with its own.
	Sweep(cfg.Prefix)
	l := &Lab{cfg: cfg, name: fmt.Sprintf("%s%d-%d", cfg.Prefix, os.Getpid(), labSeq.Add(1))}
	if err := l.build(); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// build creates the hub with its bridges, then every node and its NICs.
func (l *Lab) build() error {
	hub, err := newNode(l.name+"-h", -1)
	if err != nil {
		return err
	}
	l.hub = hub
	h, err := netlink.NewHandleAt(hub.ns)
	if err != nil {
		return fmt.Errorf("netlab: netlink in hub: %w", err)
	}
	defer h.Close()
	for r := range l.cfg.NICs {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: bridgeName(r), MTU: l.cfg.MTU}}
		if err := h.LinkAdd(br); err != nil {
			return fmt.Errorf("netlab: bridge %s: %w", br.Name, err)
		}
		if err := h.LinkSetUp(br); err != nil {
			return fmt.Errorf("netlab: bridge %s up: %w", br.Name, err)
		}
	}
	for n := range l.cfg.Nodes {
		node, err := newNode(fmt.Sprintf("%s-n%d", l.name, n), n)
		if err != nil {
			return err
		}
		l.nodes = append(l.nodes, node)
		if err := l.wire(h, node); err != nil {
			return err
		}
	}
	return nil
}

// wire gives node its NICs: one veth pair per rail, the hub end on the rail's bridge.
func (l *Lab) wire(hub *netlink.Handle, node *Node) error {
	nh, err := netlink.NewHandleAt(node.ns)
	if err != nil {
		return fmt.Errorf("netlab: netlink in %s: %w", node.name, err)
	}
	defer nh.Close()
	lo, err := nh.LinkByName("lo")
	if err == nil {
		err = nh.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("netlab: %s: loopback: %w", node.name, err)
	}
	for r := range l.cfg.NICs {
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: portName(node.index, r), MTU: l.cfg.MTU, TxQLen: 1000},
			PeerName:      NICName(r),
			PeerNamespace: netlink.NsFd(node.ns),
		}
		if err := hub.LinkAdd(veth); err != nil {
			return fmt.Errorf("netlab: %s: veth %s: %w", node.name, veth.Name, err)
		}
		port, err := hub.LinkByName(veth.Name)
		if err != nil {
			return fmt.Errorf("netlab: %s: %w", veth.Name, err)
		}
		br, err := hub.LinkByName(bridgeName(r))
		if err != nil {
			return fmt.Errorf("netlab: %s: %w", bridgeName(r), err)
		}
		if err := hub.LinkSetMaster(port, br); err != nil {
			return fmt.Errorf("netlab: %s on %s: %w", veth.Name, bridgeName(r), err)
		}
		nic, err := nh.LinkByName(NICName(r))
		if err != nil {
			return fmt.Errorf("netlab: %s: %s: %w", node.name, NICName(r), err)
		}
		if err := nh.LinkSetTxQLen(nic, 1000); err != nil {
			return fmt.Errorf("netlab: %s: %s: %w", node.name, NICName(r), err)
		}
		ip := Addr(node.index, r)
		addr := &netlink.Addr{IPNet: prefixIPNet(netip.PrefixFrom(ip, 24))}
		if l.cfg.IPv6 {
			// No duplicate address detection: the address works at once, not after a second.
			ip = Addr6(node.index, r)
			addr = &netlink.Addr{IPNet: prefixIPNet(netip.PrefixFrom(ip, 64)), Flags: unix.IFA_F_NODAD}
		}
		if err := nh.AddrAdd(nic, addr); err != nil {
			return fmt.Errorf("netlab: %s: address of %s: %w", node.name, NICName(r), err)
		}
		if l.cfg.NICMbit > 0 {
			rate := uint64(l.cfg.NICMbit) * 1_000_000
			if err := shape(nh, nic, rate); err != nil {
				return fmt.Errorf("netlab: %s: %s: %w", node.name, NICName(r), err)
			}
			if err := shape(hub, port, rate); err != nil {
				return fmt.Errorf("netlab: %s: %w", veth.Name, err)
			}
		}
		if g := l.cfg.GSOMaxBytes; g > 0 {
			if err := setGSO(nh, nic, g); err != nil {
				return fmt.Errorf("netlab: %s: %s: %w", node.name, NICName(r), err)
			}
			if err := setGSO(hub, port, g); err != nil {
				return fmt.Errorf("netlab: %s: %w", veth.Name, err)
			}
		}
		if err := hub.LinkSetUp(port); err != nil {
			return fmt.Errorf("netlab: %s up: %w", veth.Name, err)
		}
		if err := nh.LinkSetUp(nic); err != nil {
			return fmt.Errorf("netlab: %s: %s up: %w", node.name, NICName(r), err)
		}
		node.nics = append(node.nics, NIC{Rail: r, Name: NICName(r), Addr: ip})
	}
	return nil
}

// setGSO lets link pass TCP packets of up to size bytes on whole, in both directions, over IPv4 (the
// lab's protocol) and IPv6. The IPv4 limits go first: a kernel without BIG TCP for IPv4 refuses them
// before anything changed.
func setGSO(h *netlink.Handle, link netlink.Link, size int) error {
	for _, set := range []func(netlink.Link, int) error{h.LinkSetGSOIPv4MaxSize, h.LinkSetGROIPv4MaxSize,
		h.LinkSetGSOMaxSize, h.LinkSetGROMaxSize} {
		if err := set(link, size); err != nil {
			return fmt.Errorf("%w: %d bytes: %v", ErrGSO, size, err)
		}
	}
	return nil
}

// Classes of a shaped NIC's HTB tree: the root class has the NIC's rate; under it, small packets (at
// most smallPacket bytes of IP datagram: probes, acks, control messages, TCP acknowledgements) go to a
// class served first, everything else to the bulk class, and either may use the whole rate. A NIC has
// separate queues for such traffic; without this class a probe would wait behind every byte that bulk
// connections have queued. (The kernels this runs on may lack fq and fq_codel, so HTB priorities and a
// u32 filter do the job.)
const (
	classRoot   = 1
	classSmall  = 10
	classBulk   = 20
	smallPacket = 255
)

// shape limits the egress of link to rate bits per second with the HTB tree described above.
func shape(h *netlink.Handle, link netlink.Link, rate uint64) error {
	idx := link.Attrs().Index
	qdisc := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT})
	qdisc.Defcls = classBulk
	if err := h.QdiscAdd(qdisc); err != nil {
		return fmt.Errorf("htb qdisc: %w", err)
	}
	// A burst of 64 KiB admits one packet of the default GSO size at a time; a larger one (GSOMaxBytes)
	// leaves its class in debt for the rest, so the rate holds over a few packets. The quantum is set
	// so that HTB does not complain that rate/r2q is too big.
	class := func(parent, minor uint16, assured uint64, prio uint32) error {
		c := netlink.NewHtbClass(netlink.ClassAttrs{
			LinkIndex: idx,
			Parent:    netlink.MakeHandle(1, parent),
			Handle:    netlink.MakeHandle(1, minor),
		}, netlink.HtbClassAttrs{Rate: assured, Ceil: rate, Buffer: 1 << 16, Cbuffer: 1 << 16, Quantum: 60000, Prio: prio})
		if err := h.ClassAdd(c); err != nil {
			return fmt.Errorf("htb class 1:%d: %w", minor, err)
		}
		return nil
	}
	small := max(rate/20, 8000)
	if err := class(0, classRoot, rate, 0); err != nil {
		return err
	}
	if err := class(classRoot, classSmall, small, 0); err != nil {
		return err
	}
	if err := class(classRoot, classBulk, rate-min(small, rate/2), 1); err != nil {
		return err
	}
	// u32 filters on the IPv4 total length (the low 16 bits of the header's first word), tried in
	// order: a packet larger than 64 KiB (GSOMaxBytes) carries a total length of 0 and is bulk; one of
	// at most smallPacket bytes is small.
	for i, f := range []struct {
		mask  uint32
		class uint16
		what  string
	}{
		{0xffff, classBulk, "packets above 64 KiB"},
		{0xffff &^ smallPacket, classSmall, "small packets"},
	} {
		filter := &netlink.U32{
			FilterAttrs: netlink.FilterAttrs{
				LinkIndex: idx,
				Parent:    netlink.MakeHandle(1, 0),
				Priority:  uint16(i + 1),
				Protocol:  unix.ETH_P_IP,
			},
			ClassId: netlink.MakeHandle(1, f.class),
			Sel: &netlink.TcU32Sel{
				Flags: nl.TC_U32_TERMINAL,
				Keys:  []netlink.TcU32Key{{Mask: f.mask, Val: 0, Off: 0}},
			},
		}
		if err := h.FilterAdd(filter); err != nil {
			return fmt.Errorf("u32 filter for %s: %w", f.what, err)
		}
	}
	return nil
}

// AddNode creates a bare namespace of the lab, named after the lab and suffix, with only its
// loopback up: a host behind a router, say, wired with Pair. Close deletes it with the rest.
func (l *Lab) AddNode(suffix string) (*Node, error) {
	n, err := newNode(l.name+"-"+suffix, -1)
	if err != nil {
		return nil, err
	}
	l.extra = append(l.extra, n)
	if err := setLink(n.ns, "lo", true); err != nil {
		return nil, err
	}
	return n, nil
}

// Pair joins namespaces a and b with a veth pair, the end in a named aName with address aAddr and the
// end in b named bName with address bAddr (each with its prefix length), both up.
func (l *Lab) Pair(a *Node, aName string, aAddr netip.Prefix, b *Node, bName string, bAddr netip.Prefix) error {
	ah, err := netlink.NewHandleAt(a.ns)
	if err != nil {
		return fmt.Errorf("netlab: netlink in %s: %w", a.name, err)
	}
	defer ah.Close()
	bh, err := netlink.NewHandleAt(b.ns)
	if err != nil {
		return fmt.Errorf("netlab: netlink in %s: %w", b.name, err)
	}
	defer bh.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aName, MTU: l.cfg.MTU, TxQLen: 1000},
		PeerName: bName, PeerNamespace: netlink.NsFd(b.ns)}
	if err := ah.LinkAdd(veth); err != nil {
		return fmt.Errorf("netlab: veth %s-%s: %w", aName, bName, err)
	}
	for _, end := range []struct {
		h    *netlink.Handle
		name string
		addr netip.Prefix
	}{{ah, aName, aAddr}, {bh, bName, bAddr}} {
		link, err := end.h.LinkByName(end.name)
		if err != nil {
			return fmt.Errorf("netlab: %s: %w", end.name, err)
		}
		a := &netlink.Addr{IPNet: prefixIPNet(end.addr)}
		if end.addr.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD
		}
		if err := end.h.AddrAdd(link, a); err != nil {
			return fmt.Errorf("netlab: address of %s: %w", end.name, err)
		}
		if err := end.h.LinkSetUp(link); err != nil {
			return fmt.Errorf("netlab: %s up: %w", end.name, err)
		}
	}
	return nil
}

// Name is the common start of this lab's namespace names.
func (l *Lab) Name() string { return l.name }

// Config returns the lab's configuration with defaults filled in.
func (l *Lab) Config() Config { return l.cfg }

// Nodes returns the nodes in index order. The slice is the caller's; the nodes are shared.
func (l *Lab) Nodes() []*Node { return append([]*Node(nil), l.nodes...) }

// Node returns node i.
func (l *Lab) Node(i int) *Node { return l.nodes[i] }

// Hub returns the namespace that holds the bridges.
func (l *Lab) Hub() *Node { return l.hub }

// SetNIC takes node's NIC on rail down (up false) or up, inside the node: the node sees its own
// interface go down, as when a NIC fails.
func (l *Lab) SetNIC(node, rail int, up bool) error {
	if err := l.check(node, rail); err != nil {
		return err
	}
	return setLink(l.nodes[node].ns, NICName(rail), up)
}

// SetPort takes the rail's bridge port of node down or up, in the hub: the node's NIC stays up but
// loses its carrier, as when a cable or switch port fails.
func (l *Lab) SetPort(node, rail int, up bool) error {
	if err := l.check(node, rail); err != nil {
		return err
	}
	return setLink(l.hub.ns, portName(node, rail), up)
}

func (l *Lab) check(node, rail int) error {
	if node < 0 || node >= len(l.nodes) || rail < 0 || rail >= l.cfg.NICs {
		return fmt.Errorf("netlab: no NIC %d on node %d (lab has %d nodes with %d NICs)",
			rail, node, len(l.nodes), l.cfg.NICs)
	}
	return nil
}

func setLink(ns netns.NsHandle, name string, up bool) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlab: netlink: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("netlab: %s: %w", name, err)
	}
	if up {
		err = h.LinkSetUp(link)
	} else {
		err = h.LinkSetDown(link)
	}
	if err != nil {
		return fmt.Errorf("netlab: %s up=%v: %w", name, up, err)
	}
	return nil
}

// Close deletes every namespace of the lab, and with them every veth pair, bridge and qdisc. Processes
// started with Node.Start are not killed; their owner stops them first (a namespace with a process in
// it lives on, nameless, until the process exits). Close is idempotent.
func (l *Lab) Close() error {
	l.closeOnce.Do(func() {
		var errs []error
		for _, n := range append(l.extra, l.nodes...) {
			errs = append(errs, n.close())
		}
		if l.hub != nil {
			errs = append(errs, l.hub.close())
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// prefixIPNet converts p to the net.IPNet netlink takes, keeping p's address (not the masked one).
func prefixIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
