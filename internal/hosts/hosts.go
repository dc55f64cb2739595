// Package hosts runs a deployment the way users run one, a process per machine, on one Linux
// machine: every host is a network namespace with an address of its own, and the processes of a run
// are started inside them. Hosts share one switch (a bridge, on top of internal/netlab) or sit at the
// sites of the WAN emulator (internal/wanemu). A host can sit behind a NAT of its own (nftables
// masquerade, no port forwarded), and the network can be cut the ways networks fail: a host's port
// down, the switch split into groups that cannot reach each other, packets dropped in one direction
// only.
//
// Everything lives in namespaces the bed creates and is deleted by Close, also after a failed build;
// processes started on a host get SIGKILL when the bed closes or this process dies, and Close kills
// those still running by their process id. Building a bed needs root; Available says whether this
// process can.
//
// Addresses come from the benchmarking ranges: 198.18.0.(i+1) for host i on the bridge
// (2001:2::(i+1) with IPv6), 198.19.i.2 for a host behind NAT (its router has the public address), and
// the emulator's own plan across the WAN.
package hosts

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/concord-ccl/concord/internal/netlab"
	"github.com/concord-ccl/concord/internal/wanemu"
)

// Config describes a bed. The zero value is two hosts on a bridge.
type Config struct {
	// Hosts is the number of hosts (default 2).
	Hosts int
	// IPv6 gives the hosts IPv6 addresses only (not with NAT or WAN).
	IPv6 bool
	// NAT lists the hosts that sit behind a NAT router of their own: their packets leave with the
	// router's address, and nothing reaches them that they did not start, as behind a home router or
	// a cloud NAT gateway (IPv4, on the bridge only).
	NAT []int
	// Mbit limits every host's link to the switch, in each direction (0: no limit).
	Mbit int
	// Names are host names every process started on a host resolves (through its own /etc/hosts):
	// name -> host index. Empty: none.
	Names map[string]int
	// WAN, when set, puts host i at site i of the WAN emulator instead of on a bridge; WAN.Sites is
	// set from Hosts.
	WAN *wanemu.Config
}

// ErrNotPermitted is returned by New when this process may not create namespaces.
var ErrNotPermitted = netlab.ErrNotPermitted

// Available reports whether this process can build a bed, and if not, why.
func Available() error { return netlab.Available() }

// Bed is a set of hosts. Its methods may be called concurrently.
type Bed struct {
	cfg   Config
	lab   *netlab.Lab
	wan   *wanemu.Testbed
	hosts []*Host

	mu    sync.Mutex
	procs []*exec.Cmd
	rules bool // the switch has filter rules (Block)

	closeOnce sync.Once
	closeErr  error
}

// Host is one host of a bed.
type Host struct {
	bed    *Bed
	index  int
	ns     namespace
	nsName string
	addr   netip.Addr
	public netip.Addr
	port   int // the lab node whose switch port is the host's (its router's, behind NAT); -1 on the WAN
}

// namespace is what both backends offer of a host's namespace.
type namespace interface {
	Do(func() error) error
	Start(*exec.Cmd) error
	Name() string
	Path() string
}

// New builds a bed; on error nothing it created is left behind.
func New(cfg Config) (*Bed, error) {
	if cfg.Hosts == 0 {
		cfg.Hosts = 2
	}
	switch {
	case cfg.Hosts < 1 || cfg.Hosts > netlab.MaxNodes:
		return nil, fmt.Errorf("hosts: Config.Hosts = %d, want 1..%d", cfg.Hosts, netlab.MaxNodes)
	case cfg.IPv6 && len(cfg.NAT) > 0:
		return nil, errors.New("hosts: NAT is IPv4 only")
	case cfg.WAN != nil && (cfg.IPv6 || len(cfg.NAT) > 0 || cfg.Mbit > 0):
		return nil, errors.New("hosts: across the WAN emulator, IPv6, NAT and Mbit are not available (shape the emulator's links instead)")
	}
	for _, i := range cfg.NAT {
		if i < 0 || i >= cfg.Hosts {
			return nil, fmt.Errorf("hosts: Config.NAT names host %d of %d", i, cfg.Hosts)
		}
	}
	for name, i := range cfg.Names {
		if i < 0 || i >= cfg.Hosts || name == "" || strings.ContainsAny(name, " \t\n#") {
			return nil, fmt.Errorf("hosts: Config.Names[%q] = %d: not a name of a host of %d", name, i, cfg.Hosts)
		}
	}
	if err := Available(); err != nil {
		return nil, err
	}
	b := &Bed{cfg: cfg}
	var err error
	if cfg.WAN != nil {
		err = b.buildWAN()
	} else {
		err = b.buildBridge()
	}
	if err == nil {
		err = b.writeNames()
	}
	if err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// buildBridge puts every host on one bridge; a host behind NAT gets a router on the bridge and a
// private link to it.
func (b *Bed) buildBridge() error {
	lab, err := netlab.New(netlab.Config{Nodes: b.cfg.Hosts, NICs: 1, NICMbit: b.cfg.Mbit, IPv6: b.cfg.IPv6})
	if err != nil {
		return err
	}
	b.lab = lab
	for i := range b.cfg.Hosts {
		node := lab.Node(i)
		h := &Host{bed: b, index: i, ns: node, nsName: node.Name(), addr: node.NICs()[0].Addr, port: i}
		h.public = h.addr
		if slices.Contains(b.cfg.NAT, i) {
			if err := b.natHost(h, node); err != nil {
				return err
			}
		}
		b.hosts = append(b.hosts, h)
	}
	return nil
}

// natHost turns host h into one behind NAT: router is the lab node on the bridge; the host itself is a
// new namespace on a private link to it, whose traffic the router masquerades. As a home router's
// firewall does, the router drops what arrives from outside unasked, at once: the packet leaves no
// connection-tracking entry behind that would make the next mapping of the same port pick another.
func (b *Bed) natHost(h *Host, router *netlab.Node) error {
	priv, err := b.lab.AddNode(fmt.Sprintf("h%d", h.index))
	if err != nil {
		return err
	}
	gw := netip.AddrFrom4([4]byte{198, 19, byte(h.index), 1})
	addr := netip.AddrFrom4([4]byte{198, 19, byte(h.index), 2})
	if err := b.lab.Pair(router, "lan0", netip.PrefixFrom(gw, 24), priv, "eth0", netip.PrefixFrom(addr, 24)); err != nil {
		return err
	}
	err = priv.Do(func() error {
		return netlink.RouteAdd(&netlink.Route{Gw: gw.AsSlice()})
	})
	if err != nil {
		return fmt.Errorf("hosts: default route of host %d: %w", h.index, err)
	}
	err = router.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	})
	if err != nil {
		return fmt.Errorf("hosts: forwarding on the router of host %d: %w", h.index, err)
	}
	rules := fmt.Sprintf(`table ip nat {
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "%s" masquerade
	}
}
table ip filter {
	chain forwarding {
		type filter hook forward priority filter; policy drop;
		iifname "lan0" accept
		ct state established,related accept
	}
	chain input {
		type filter hook input priority filter; policy accept;
		iifname "%s" ct state new drop
	}
}
`, netlab.NICName(0), netlab.NICName(0))
	if err := nft(router, rules); err != nil {
		return fmt.Errorf("hosts: NAT of host %d: %w", h.index, err)
	}
	h.ns, h.nsName, h.addr = priv, priv.Name(), addr
	return nil
}

// buildWAN puts host i at site i of the WAN emulator.
func (b *Bed) buildWAN() error {
	cfg := *b.cfg.WAN
	cfg.Sites = b.cfg.Hosts
	tb, err := wanemu.New(cfg)
	if err != nil {
		return err
	}
	b.wan = tb
	if err := tb.Start(); err != nil {
		return err
	}
	for i := range b.cfg.Hosts {
		ns := tb.Netns(i)
		b.hosts = append(b.hosts, &Host{bed: b, index: i, ns: ns, nsName: ns.Name(), addr: tb.Addr(i), public: tb.Addr(i), port: -1})
	}
	return nil
}

// netnsEtc is where `ip netns exec` finds files it mounts over /etc for one namespace.
const netnsEtc = "/etc/netns"

// writeNames writes every host's /etc/hosts for Config.Names.
func (b *Bed) writeNames() error {
	if len(b.cfg.Names) == 0 {
		return nil
	}
	var lines strings.Builder
	lines.WriteString("127.0.0.1 localhost\n::1 localhost\n")
	for _, name := range slices.Sorted(mapsKeys(b.cfg.Names)) {
		fmt.Fprintf(&lines, "%s %s\n", b.hosts[b.cfg.Names[name]].public, name)
	}
	for _, h := range b.hosts {
		dir := filepath.Join(netnsEtc, h.nsName)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("hosts: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(lines.String()), 0o644); err != nil {
			return fmt.Errorf("hosts: %w", err)
		}
	}
	return nil
}

func mapsKeys(m map[string]int) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Len is the number of hosts.
func (b *Bed) Len() int { return len(b.hosts) }

// Host returns host i.
func (b *Bed) Host(i int) *Host { return b.hosts[i] }

// Index is the host's index in its bed.
func (h *Host) Index() int { return h.index }

// Addr is the host's own address: the one its processes bind and see on their interface (behind NAT,
// its private address).
func (h *Host) Addr() netip.Addr { return h.addr }

// Public is the address the other hosts reach this one at and see its packets come from: Addr, or
// behind NAT the router's.
func (h *Host) Public() netip.Addr { return h.public }

// Namespace is the name of the host's network namespace.
func (h *Host) Namespace() string { return h.nsName }

// Do runs fn on a thread inside the host's namespace (see netlab.Node.Do): sockets fn opens are the
// host's.
func (h *Host) Do(fn func() error) error { return h.ns.Do(fn) }

// Command returns a command that runs name with args on the host. With Config.Names it goes through
// `ip netns exec`, which gives the process the host's /etc/hosts.
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	if len(h.bed.cfg.Names) > 0 {
		return exec.Command("ip", append([]string{"netns", "exec", h.nsName, name}, args...)...)
	}
	return exec.Command(name, args...)
}

// Start starts cmd on the host. The child gets SIGKILL when the bed closes or this process dies,
// unless cmd.SysProcAttr is set; Close kills it by its id if it still runs.
func (h *Host) Start(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	}
	if err := h.ns.Start(cmd); err != nil {
		return err
	}
	h.bed.mu.Lock()
	h.bed.procs = append(h.bed.procs, cmd)
	h.bed.mu.Unlock()
	return nil
}

// Cut takes the host's link down (up false) or back up: on the bridge its switch port loses carrier
// (behind NAT, its router's), so its packets go nowhere and nothing reaches it; across the WAN its
// site's interface goes down.
func (h *Host) Cut(down bool) error {
	if h.port >= 0 {
		return h.bed.lab.SetPort(h.port, 0, !down)
	}
	return setLinkAt(h.ns.Path(), "wan0", !down)
}

// setLinkAt sets interface name in the namespace at path up or down.
func setLinkAt(path, name string, up bool) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("hosts: %w", err)
	}
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("hosts: %w", err)
	}
	defer nh.Close()
	l, err := nh.LinkByName(name)
	if err != nil {
		return fmt.Errorf("hosts: %s: %w", name, err)
	}
	if up {
		return nh.LinkSetUp(l)
	}
	return nh.LinkSetDown(l)
}

// Block makes the switch drop the IP packets that any host of from sends to any host of to; the
// other direction and ARP still pass. Calls add up; Unblock lifts them all. Two calls with the sides
// swapped split the network between them.
func (b *Bed) Block(from, to []int) error {
	if b.lab == nil {
		return errors.New("hosts: Block needs the bridge")
	}
	ports := func(hs []int) (string, error) {
		var names []string
		for _, i := range hs {
			if i < 0 || i >= len(b.hosts) {
				return "", fmt.Errorf("hosts: no host %d", i)
			}
			names = append(names, fmt.Sprintf("%q", portName(b.hosts[i].port)))
		}
		return "{ " + strings.Join(names, ", ") + " }", nil
	}
	src, err := ports(from)
	if err != nil {
		return err
	}
	dst, err := ports(to)
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var rules strings.Builder
	if !b.rules {
		rules.WriteString("table bridge cut {\n\tchain forwarding {\n\t\ttype filter hook forward priority filter; policy accept;\n\t}\n}\n")
	}
	for _, proto := range []string{"ip", "ip6"} {
		fmt.Fprintf(&rules, "add rule bridge cut forwarding ether type %s iifname %s oifname %s drop\n", proto, src, dst)
	}
	if err := nft(b.lab.Hub(), rules.String()); err != nil {
		return fmt.Errorf("hosts: block: %w", err)
	}
	b.rules = true
	return nil
}

// Split cuts the network between groups of hosts: no packet crosses from one group to another.
func (b *Bed) Split(groups ...[]int) error {
	for i, a := range groups {
		for j, c := range groups {
			if i != j {
				if err := b.Block(a, c); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Unblock lifts every Block and Split.
func (b *Bed) Unblock() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.rules {
		return nil
	}
	if err := nft(b.lab.Hub(), "delete table bridge cut\n"); err != nil {
		return fmt.Errorf("hosts: unblock: %w", err)
	}
	b.rules = false
	return nil
}

// portName is the hub-side interface of lab node n's NIC 0 (netlab's naming).
func portName(n int) string { return fmt.Sprintf("p%d-0", n) }

// nft loads rules into the nftables of node's namespace.
func nft(node *netlab.Node, rules string) error {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := node.Start(cmd); err != nil {
		return fmt.Errorf("nft (Debian package nftables): %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("nft: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Close kills the processes started on the hosts that still run, and deletes every namespace and
// file of the bed. It is idempotent.
func (b *Bed) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		procs := b.procs
		b.mu.Unlock()
		for _, cmd := range procs {
			if cmd.Process != nil && cmd.ProcessState == nil {
				cmd.Process.Kill()
			}
		}
		var errs []error
		if len(b.cfg.Names) > 0 {
			for _, h := range b.hosts {
				errs = append(errs, os.RemoveAll(filepath.Join(netnsEtc, h.nsName)))
			}
		}
		if b.lab != nil {
			errs = append(errs, b.lab.Close())
		}
		if b.wan != nil {
			errs = append(errs, b.wan.Close())
		}
		b.closeErr = errors.Join(errs...)
	})
	return b.closeErr
}
