package netlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newLab builds a lab for a test, or skips the test without root.
func newLab(t *testing.T, cfg Config) *Lab {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("netns testbed unavailable: %v (run as root)", err)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// roundTrip listens on node a's NIC rail, dials it from node b's NIC rail (bound to that address),
// sends msg and reads it back echoed.
func roundTrip(t *testing.T, ctx context.Context, l *Lab, a, b, rail int, msg string) error {
	t.Helper()
	ln, err := l.Node(a).Listen(ctx, "tcp", net.JoinHostPort(Addr(a, rail).String(), "0"))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	echoed := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			echoed <- err
			return
		}
		defer c.Close()
		if got := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr(); got != Addr(b, rail) {
			echoed <- fmt.Errorf("peer address %v, want %v", got, Addr(b, rail))
			return
		}
		_, err = io.CopyN(c, c, int64(len(msg)))
		echoed <- err
	}()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: Addr(b, rail).AsSlice()}, Timeout: 2 * time.Second}
	c, err := l.Node(b).Dial(ctx, d, "tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		<-echoed
		return fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if string(got) != msg {
		return fmt.Errorf("echo %q, want %q", got, msg)
	}
	return <-echoed
}

func TestEveryNICReachesItsRail(t *testing.T) {
	l := newLab(t, Config{Nodes: 3, NICs: 2, NICMbit: 100})
	ctx := testCtx(t)
	for rail := range 2 {
		for a := range 3 {
			b := (a + 1) % 3
			if err := roundTrip(t, ctx, l, a, b, rail, fmt.Sprintf("rail %d from %d to %d", rail, b, a)); err != nil {
				t.Errorf("rail %d, node %d to %d: %v", rail, b, a, err)
			}
		}
	}
	for i, n := range l.Nodes() {
		nics := n.NICs()
		if len(nics) != 2 {
			t.Fatalf("node %d has %d NICs, want 2", i, len(nics))
		}
		for r, nic := range nics {
			if nic.Rail != r || nic.Name != NICName(r) || nic.Addr != Addr(i, r) {
				t.Errorf("node %d NIC %d = %+v", i, r, nic)
			}
		}
	}
}

func TestNICsAreShapedWithHTB(t *testing.T) {
	l := newLab(t, Config{Nodes: 1, NICs: 1, NICMbit: 400})
	h, link := nodeLink(t, l.Node(0), NICName(0))
	classes, err := h.ClassList(link, netlink.MakeHandle(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	const rate = 400_000_000 / 8 // bytes per second
	type want struct {
		parent     uint32
		rate, ceil uint64
	}
	under := netlink.MakeHandle(1, classRoot)
	wants := map[uint16]want{
		classRoot:  {netlink.HANDLE_ROOT, rate, rate}, // the kernel reports a top class under the root
		classSmall: {under, rate / 20, rate},
		classBulk:  {under, rate - rate/20, rate},
	}
	seen := 0
	for _, c := range classes {
		htb, ok := c.(*netlink.HtbClass)
		if !ok {
			continue
		}
		_, minor := netlink.MajorMinor(htb.Handle)
		w, ok := wants[minor]
		if !ok {
			t.Errorf("unexpected class %s", netlink.HandleStr(htb.Handle))
			continue
		}
		seen++
		if htb.Parent != w.parent || htb.Rate != w.rate || htb.Ceil != w.ceil {
			t.Errorf("class 1:%d: parent %s rate %d ceil %d, want parent %s rate %d ceil %d", minor,
				netlink.HandleStr(htb.Parent), htb.Rate, htb.Ceil, netlink.HandleStr(w.parent), w.rate, w.ceil)
		}
	}
	if seen != len(wants) {
		t.Errorf("found %d of the %d HTB classes", seen, len(wants))
	}
	filters, err := h.FilterList(link, netlink.MakeHandle(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	small := false
	for _, f := range filters {
		if u, ok := f.(*netlink.U32); ok && u.ClassId == netlink.MakeHandle(1, classSmall) {
			small = true
		}
	}
	if !small {
		t.Errorf("no u32 filter sends small packets to class 1:%d (filters %v)", classSmall, filters)
	}
}

// TestBigGSOPacketsAreBulk: with GSOMaxBytes above 64 KiB, a NIC passes TCP packets of more than
// 64 KiB whole, and those packets, whose IPv4 total length reads 0, go to the bulk class, not to the
// class of small packets that HTB serves first.
func TestBigGSOPacketsAreBulk(t *testing.T) {
	l := newLab(t, Config{Nodes: 2, NICs: 1, NICMbit: 400, MTU: 9000, GSOMaxBytes: MaxGSOBytes})
	h, link := nodeLink(t, l.Node(1), NICName(0))
	if a := link.Attrs(); a.GSOIPv4MaxSize != MaxGSOBytes || a.GROIPv4MaxSize != MaxGSOBytes || a.GSOMaxSize != MaxGSOBytes {
		t.Errorf("NIC: GSO IPv4 %d, GRO IPv4 %d, GSO %d; want %d each", a.GSOIPv4MaxSize, a.GROIPv4MaxSize, a.GSOMaxSize, MaxGSOBytes)
	}

	// Node 1 sends 16 MiB to node 0.
	const size = 16 << 20
	ctx := testCtx(t)
	ln, err := l.Node(0).Listen(ctx, "tcp", net.JoinHostPort(Addr(0, 0).String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(8 * time.Second))
		n, _ := io.Copy(io.Discard, c)
		got <- n
	}()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: Addr(1, 0).AsSlice()}, Timeout: 2 * time.Second}
	c, err := l.Node(1).Dial(ctx, d, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(8 * time.Second))
	_, err = c.Write(make([]byte, size))
	c.Close()
	if n := <-got; err != nil || n != size {
		t.Fatalf("sent with error %v; received %d bytes, want %d", err, n, size)
	}

	// The veth counts a packet passed whole as one; HTB counts its segments.
	after, err := h.LinkByName(NICName(0))
	if err != nil {
		t.Fatal(err)
	}
	st := after.Attrs().Statistics
	t.Logf("NIC: %d bytes in %d packets", st.TxBytes, st.TxPackets)
	if st.TxPackets == 0 || st.TxBytes/st.TxPackets <= 1<<16 {
		t.Errorf("the NIC's packets averaged %d bytes (%d in %d packets), want more than 64 KiB", st.TxBytes/max(st.TxPackets, 1), st.TxBytes, st.TxPackets)
	}
	classes, err := h.ClassList(link, netlink.MakeHandle(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	var bulk, small netlink.GnetStatsBasic
	for _, c := range classes {
		htb, ok := c.(*netlink.HtbClass)
		if !ok || htb.Statistics == nil || htb.Statistics.Basic == nil {
			continue
		}
		switch _, minor := netlink.MajorMinor(htb.Handle); minor {
		case classBulk:
			bulk = *htb.Statistics.Basic
		case classSmall:
			small = *htb.Statistics.Basic
		}
	}
	t.Logf("bulk class: %d bytes; small class: %d bytes", bulk.Bytes, small.Bytes)
	if bulk.Bytes < size {
		t.Errorf("bulk class sent %d bytes, want at least the %d of the transfer", bulk.Bytes, size)
	}
	if small.Bytes > size/100 {
		t.Errorf("small-packet class sent %d bytes of a %d-byte transfer", small.Bytes, size)
	}
}

// nodeLink opens a netlink handle inside node n, closed when the test ends, and finds the link name
// there.
func nodeLink(t *testing.T, n *Node, name string) (*netlink.Handle, netlink.Link) {
	t.Helper()
	h, err := netlink.NewHandleAt(n.ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	link, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return h, link
}

// linkState reads a NIC's administrative state and carrier inside node.
func linkState(t *testing.T, n *Node, name string) (up, carrier bool) {
	t.Helper()
	_, link := nodeLink(t, n, name)
	a := link.Attrs()
	return a.Flags&net.FlagUp != 0, a.RawFlags&unix.IFF_LOWER_UP != 0
}

func TestSetNICTakesTheInterfaceDown(t *testing.T) {
	l := newLab(t, Config{Nodes: 2, NICs: 2})
	ctx := testCtx(t)
	if err := l.SetNIC(1, 1, false); err != nil {
		t.Fatal(err)
	}
	if up, _ := linkState(t, l.Node(1), NICName(1)); up {
		t.Errorf("nic1 of node 1 is up after SetNIC(false)")
	}
	if err := roundTrip(t, ctx, l, 0, 1, 1, "x"); err == nil {
		t.Errorf("traffic crossed a NIC that is down")
	}
	if err := roundTrip(t, ctx, l, 0, 1, 0, "rail 0 still works"); err != nil {
		t.Errorf("rail 0 with rail 1 down: %v", err)
	}
	if err := l.SetNIC(1, 1, true); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(t, ctx, l, 0, 1, 1, "back up"); err != nil {
		t.Errorf("after SetNIC(true): %v", err)
	}
	if err := l.SetNIC(2, 0, false); err == nil {
		t.Errorf("SetNIC on a missing node succeeded")
	}
}

func TestSetPortDropsTheCarrier(t *testing.T) {
	l := newLab(t, Config{Nodes: 2, NICs: 1})
	if err := l.SetPort(0, 0, false); err != nil {
		t.Fatal(err)
	}
	up, carrier := linkState(t, l.Node(0), NICName(0))
	if !up || carrier {
		t.Errorf("after SetPort(false): up %v carrier %v, want up without carrier", up, carrier)
	}
	if err := l.SetPort(0, 0, true); err != nil {
		t.Fatal(err)
	}
	if up, carrier := linkState(t, l.Node(0), NICName(0)); !up || !carrier {
		t.Errorf("after SetPort(true): up %v carrier %v", up, carrier)
	}
	if err := roundTrip(t, testCtx(t), l, 1, 0, 0, "port back"); err != nil {
		t.Errorf("after SetPort(true): %v", err)
	}
}

func TestStartRunsTheProcessInTheNode(t *testing.T) {
	l := newLab(t, Config{Nodes: 1, NICs: 1})
	readlink, err := exec.LookPath("readlink")
	if err != nil {
		t.Skip("no readlink binary")
	}
	var out bytes.Buffer
	cmd := exec.Command(readlink, "/proc/self/ns/net")
	cmd.Stdout = &out
	if err := l.Node(0).Start(cmd); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(l.Node(0).Path(), &st); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(out.String()), fmt.Sprintf("net:[%d]", st.Ino); got != want {
		t.Errorf("child's namespace %s, want %s", got, want)
	}
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if self == out.String() {
		t.Errorf("child ran in the test's own namespace")
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("netns testbed unavailable: %v (run as root)", err)
	}
	l, err := New(Config{Nodes: 2, NICs: 2, NICMbit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if got := labNamespaces(t, l.Name()); len(got) != 3 {
		t.Errorf("namespaces %v, want hub and 2 nodes", got)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if got := labNamespaces(t, l.Name()); len(got) != 0 {
		t.Errorf("namespaces left after Close: %v", got)
	}
	if err := l.Node(0).Start(exec.Command("true")); !errors.Is(err, ErrClosed) {
		t.Errorf("Start after Close: %v, want ErrClosed", err)
	}
}

func labNamespaces(t *testing.T, name string) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(nsDir, name+"-*"))
	if err != nil {
		t.Fatal(err)
	}
	return matches
}

func TestSweepRemovesOnlyDeadOwners(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("netns testbed unavailable: %v (run as root)", err)
	}
	const prefix = "cndsweep-"
	dead := deadPID(t)
	names := []string{
		prefix + strconv.Itoa(dead) + "-1-n0",
		prefix + strconv.Itoa(os.Getpid()) + "-1-n0",
	}
	for _, name := range names {
		n, err := newNode(name, 0)
		if err != nil {
			t.Fatal(err)
		}
		n.ns.Close()
		t.Cleanup(func() { netns.DeleteNamed(name) })
	}
	removed, err := Sweep(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if removed != 1 {
		t.Errorf("Sweep removed %d, want 1", removed)
	}
	if _, err := os.Stat(filepath.Join(nsDir, names[0])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("namespace of a dead process still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(nsDir, names[1])); err != nil {
		t.Errorf("namespace of this live process removed: %v", err)
	}
}

// deadPID returns a process id that no process has: pid_max itself is never handed out.
func deadPID(t *testing.T) int {
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	max, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return max
}

func TestOwnerPID(t *testing.T) {
	cases := []struct {
		name string
		pid  int
		ok   bool
	}{
		{"cnd-123-4-n0", 123, true},
		{"cnd-9-1-h", 9, true},
		{"cnd-x-1-h", 0, false},
		{"cnd--1", 0, false},
		{"other-123-1", 0, false},
		{"cnd-0-1", 0, false},
	}
	for _, c := range cases {
		pid, ok := ownerPID(c.name, "cnd-")
		if pid != c.pid || ok != c.ok {
			t.Errorf("ownerPID(%q) = %d, %v, want %d, %v", c.name, pid, ok, c.pid, c.ok)
		}
	}
}

func TestValidate(t *testing.T) {
	bad := []Config{{Nodes: -1}, {Nodes: MaxNodes + 1}, {NICs: MaxNICs + 1}, {NICMbit: -1}, {MTU: 100}, {Prefix: "much-too-long-prefix"},
		{GSOMaxBytes: -1}, {GSOMaxBytes: 1000}, {MTU: 9000, GSOMaxBytes: 8000}, {GSOMaxBytes: MaxGSOBytes + 1}}
	for _, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil", c)
		}
	}
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
}
