package wanemu

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Errors that callers branch on.
var (
	// ErrNotPermitted means the process may not create network namespaces or TUN devices: it is not
	// root (CAP_SYS_ADMIN and CAP_NET_ADMIN) or the kernel lacks them. Tests skip on it.
	ErrNotPermitted = errors.New("wanemu: needs root and a kernel with network namespaces and TUN")
	// ErrClosed means the testbed was closed.
	ErrClosed = errors.New("wanemu: testbed closed")

	errNotStarted     = errors.New("wanemu: testbed not started")
	errAlreadyStarted = errors.New("wanemu: testbed already started")
)

// Prefix is the network the sites' addresses come from: 198.18.0.0/15, set aside for benchmarks
// (RFC 2544). Site i has address 198.18.0.0 + i + 1.
var Prefix = netip.MustParsePrefix("198.18.0.0/15")

// DefaultMTU is the MTU of the sites' TUN devices when [Config.MTU] is zero.
const DefaultMTU = 1500

// Config describes a testbed. Its zero value is two sites joined by a perfect wire.
type Config struct {
	// Sites is the number of sites, each a network namespace with one address. Zero means 2.
	Sites int
	// Link is the default for every directed link between two sites; [Config.Links] and
	// [Testbed.SetLink] override it per link.
	Link Link
	// Links overrides Link for some directed links: Links[[2]int{from, to}].
	Links map[[2]int]Link
	// MTU is the MTU in bytes of every site's TUN device, between 576 and 65535. Zero means
	// [DefaultMTU]. A larger MTU lowers the packet rate the forwarder must sustain for a given
	// throughput.
	MTU int
	// Offload lets the sites' kernels hand the forwarder TCP and UDP segments of up to 64 KiB as one
	// packet (segmentation offload through the TUN devices' virtio-net headers), and the receiving
	// kernel take them whole, as a real NIC with TSO and GRO would. It divides the packets the
	// forwarder handles by up to the segment count, which is what limits its rate. The links shape
	// and delay such a packet as its bytes; a random loss drops it whole, several segments at once,
	// so loss tests leave it off. Default false.
	Offload bool
	// Seed seeds the random loss; every directed link draws from its own stream of it.
	Seed uint64
	// NamePrefix starts the name of every namespace: NAMEPREFIX-PID-TESTBED-SITE. Zero means "cwan".
	NamePrefix string
}

// Validate reports the first field of c that is out of range, by name.
func (c Config) Validate() error {
	if c.Sites < 0 || c.Sites > 1000 {
		return fmt.Errorf("wanemu: Config.Sites %d is not in [0, 1000]", c.Sites)
	}
	if c.MTU != 0 && (c.MTU < 576 || c.MTU > 65535) {
		return fmt.Errorf("wanemu: Config.MTU %d is not in [576, 65535]", c.MTU)
	}
	if err := c.Link.check(); err != nil {
		return fmt.Errorf("wanemu: Config.Link.%w", err)
	}
	n := c.withDefaults().Sites
	for k, l := range c.Links {
		if k[0] < 0 || k[0] >= n || k[1] < 0 || k[1] >= n {
			return fmt.Errorf("wanemu: Config.Links[%d→%d]: no such sites", k[0], k[1])
		}
		if err := l.check(); err != nil {
			return fmt.Errorf("wanemu: Config.Links[%d→%d].%w", k[0], k[1], err)
		}
	}
	if len(c.NamePrefix) > 16 || c.NamePrefix != "" && !validName(c.NamePrefix) {
		return fmt.Errorf("wanemu: Config.NamePrefix %q is not up to 16 letters and digits", c.NamePrefix)
	}
	return nil
}

func validName(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

func (c Config) withDefaults() Config {
	if c.Sites == 0 {
		c.Sites = 2
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.NamePrefix == "" {
		c.NamePrefix = "cwan"
	}
	return c
}

// testbeds numbers the testbeds of this process, to keep their namespace names apart.
var testbeds atomic.Uint64

// Testbed is a set of sites, each a network namespace, whose traffic to one another goes through one
// forwarder in this process that emulates the WAN links between them. Its methods may be called
// from any goroutine.
type Testbed struct {
	cfg Config

	mu      sync.Mutex // guards the fields below
	started bool
	closed  bool
	sites   []*Netns
	fwd     *forwarder
}

// New checks cfg and returns a testbed; it creates nothing until [Testbed.Start].
func New(cfg Config) (*Testbed, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Testbed{cfg: cfg.withDefaults()}, nil
}

// Available reports whether this process can build a testbed; the error wraps [ErrNotPermitted] and
// says what is missing.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: not running as root", ErrNotPermitted)
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("%w: %v", ErrNotPermitted, err)
	}
	if _, err := os.Stat("/proc/thread-self/ns/net"); err != nil {
		return fmt.Errorf("%w: %v", ErrNotPermitted, err)
	}
	return nil
}

// Start sweeps the namespaces that dead processes left behind (as far as it can), creates the sites
// and starts the forwarder. On failure it removes whatever it created. It may be called once.
func (tb *Testbed) Start() error {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.closed {
		return ErrClosed
	}
	if tb.started {
		return errAlreadyStarted
	}
	tb.started = true
	if err := Available(); err != nil {
		return err
	}
	// A leftover that cannot be removed (its mount point shadowed by a later mount over the
	// directory, say) stays; the new testbed's names differ from it.
	Sweep(tb.cfg.NamePrefix)
	err := tb.build()
	if err != nil {
		tb.teardown()
		if errors.Is(err, unix.EPERM) {
			err = fmt.Errorf("%w: %w", ErrNotPermitted, err)
		}
	}
	return err
}

func (tb *Testbed) build() error {
	n := tb.cfg.Sites
	id := testbeds.Add(1)
	tuns := make([]*os.File, 0, n)
	addrs := make([][4]byte, n)
	for i := range n {
		ns, err := createNetns(fmt.Sprintf("%s-%d-%d-%d", tb.cfg.NamePrefix, os.Getpid(), id, i))
		if err != nil {
			for _, t := range tuns {
				t.Close()
			}
			return err
		}
		tb.sites = append(tb.sites, ns)
		addr := tb.Addr(i)
		addrs[i] = addr.As4()
		t, err := openTUN(ns, netip.PrefixFrom(addr, Prefix.Bits()), tb.cfg.MTU, tb.cfg.Offload)
		if err != nil {
			for _, t := range tuns {
				t.Close()
			}
			return err
		}
		tuns = append(tuns, t)
	}
	links := make([][]Link, n)
	for i := range n {
		links[i] = make([]Link, n)
		for j := range n {
			links[i][j] = tb.cfg.Link
			if l, ok := tb.cfg.Links[[2]int{i, j}]; ok {
				links[i][j] = l
			}
		}
	}
	tb.fwd = newForwarder(tuns, addrs, links, tb.cfg.MTU, tb.cfg.Offload, tb.cfg.Seed)
	tb.fwd.start()
	return nil
}

// teardown stops the forwarder and removes the namespaces; tb.mu is held.
func (tb *Testbed) teardown() error {
	if tb.fwd != nil {
		tb.fwd.close()
		tb.fwd = nil
	}
	var errs []error
	for _, ns := range tb.sites {
		errs = append(errs, ns.close())
	}
	tb.sites = nil
	return errors.Join(errs...)
}

// Close stops the forwarder and removes every namespace of the testbed. Processes still running in
// a namespace keep it alive, cut off from the others, until they exit. Close may be called more
// than once, and on a testbed that was never started.
func (tb *Testbed) Close() error {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.closed {
		return nil
	}
	tb.closed = true
	return tb.teardown()
}

// Sites returns the number of sites.
func (tb *Testbed) Sites() int { return tb.cfg.Sites }

// Addr returns the address of site i.
func (tb *Testbed) Addr(i int) netip.Addr {
	a := Prefix.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) + uint32(i) + 1
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// Netns returns the namespace of site i, or nil before Start, after Close or for a site that does
// not exist.
func (tb *Testbed) Netns(i int) *Netns {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if i < 0 || i >= len(tb.sites) {
		return nil
	}
	return tb.sites[i]
}

// SetLink changes the directed link from site from to site to. Packets already on the link keep
// the times they were given.
func (tb *Testbed) SetLink(from, to int, l Link) error {
	if err := l.Validate(); err != nil {
		return err
	}
	n := tb.cfg.Sites
	if from < 0 || from >= n || to < 0 || to >= n {
		return fmt.Errorf("wanemu: no link %d→%d among %d sites", from, to, n)
	}
	fwd, err := tb.running()
	if err != nil {
		return err
	}
	fwd.configure(from, to, l)
	return nil
}

// running returns the forwarder of a testbed that is started and not closed.
func (tb *Testbed) running() (*forwarder, error) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	switch {
	case tb.closed:
		return nil, ErrClosed
	case tb.fwd == nil:
		return nil, errNotStarted
	}
	return tb.fwd, nil
}

// Flow names one flow, as the emulator tells flows apart: its protocol ("tcp" or "udp") and its
// source and destination, each an address of a site and a port.
type Flow struct {
	Proto    string
	Src, Dst netip.AddrPort
}

// CapFlow caps one flow at mbit Mbit/s in place of its link's [Link.FlowMbit], until it is capped
// again; 0 gives it back the link's cap. The flow need not exist yet: its first packet finds the
// cap. Its queue limit follows the rule of [Link.FlowQueueBytes]'s default at its own rate.
func (tb *Testbed) CapFlow(f Flow, mbit float64) error {
	var key flowKey
	switch f.Proto {
	case "tcp":
		key.proto = protoTCP
	case "udp":
		key.proto = protoUDP
	default:
		return fmt.Errorf("wanemu: CapFlow: protocol %q, want tcp or udp", f.Proto)
	}
	if mbit < 0 || math.IsNaN(mbit) || math.IsInf(mbit, 0) {
		return fmt.Errorf("wanemu: CapFlow: %v Mbit/s is not a finite rate >= 0", mbit)
	}
	from, to := tb.site(f.Src.Addr()), tb.site(f.Dst.Addr())
	if from < 0 || to < 0 || from == to {
		return fmt.Errorf("wanemu: CapFlow: %v → %v is not a flow between two sites of the testbed", f.Src, f.Dst)
	}
	key.src, key.dst = f.Src.Addr().As4(), f.Dst.Addr().As4()
	key.sport, key.dport = f.Src.Port(), f.Dst.Port()
	fwd, err := tb.running()
	if err != nil {
		return err
	}
	fwd.capFlow(from, to, key, mbit)
	return nil
}

// site returns the index of the site with address a, or -1.
func (tb *Testbed) site(a netip.Addr) int {
	for i := range tb.cfg.Sites {
		if tb.Addr(i) == a {
			return i
		}
	}
	return -1
}

// Stats returns the counters of the directed link from site from to site to; they are zero for a
// link that does not exist or before Start.
func (tb *Testbed) Stats(from, to int) LinkStats {
	tb.mu.Lock()
	fwd := tb.fwd
	tb.mu.Unlock()
	n := tb.cfg.Sites
	if fwd == nil || from < 0 || from >= n || to < 0 || to >= n {
		return LinkStats{}
	}
	return fwd.stats[from][to].snapshot()
}

// Unroutable counts the packets the sites sent into their TUN devices that were not IPv4 packets
// for another site (IPv6, broadcasts, malformed packets); the forwarder drops them.
func (tb *Testbed) Unroutable() uint64 {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.fwd == nil {
		return 0
	}
	return tb.fwd.other.Load()
}
