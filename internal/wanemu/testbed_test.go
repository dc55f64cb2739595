package wanemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// childEnv makes the test binary, started inside a namespace by TestStartProcess, print the
// namespace it runs in and exit.
const childEnv = "WANEMU_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		ns, err := os.Readlink("/proc/self/ns/net")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Print(ns)
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// startTestbed starts a testbed for t, or skips t when the process may not build one. The testbed
// is closed, and its namespaces checked gone, when t ends.
func startTestbed(t *testing.T, cfg Config) *Testbed {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("skipping: the WAN testbed needs root, network namespaces and /dev/net/tun: %v", err)
	}
	tb, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Start(); err != nil {
		if errors.Is(err, ErrNotPermitted) {
			t.Skipf("skipping: %v", err)
		}
		t.Fatal(err)
	}
	var names, ids []string
	for i := range tb.Sites() {
		ns := tb.Netns(i)
		names = append(names, ns.Name())
		if err := ns.Do(func() error {
			id, err := os.Readlink("/proc/thread-self/ns/net")
			ids = append(ids, id)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if err := tb.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		for _, name := range names {
			if _, err := os.Stat(filepath.Join(netnsDir, name)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("namespace %s left behind after Close (stat: %v)", name, err)
			}
		}
		// No thread or descriptor of this process may keep a site's namespace alive.
		for _, dir := range []string{"/proc/self/task/*/ns/net", "/proc/self/fd/*"} {
			links, _ := filepath.Glob(dir)
			for _, l := range links {
				if id, err := os.Readlink(l); err == nil && slices.Contains(ids, id) {
					t.Errorf("%s still refers to a site's namespace %s after Close", l, id)
				}
			}
		}
	})
	return tb
}

func TestTestbedLifecycleErrors(t *testing.T) {
	tb := startTestbed(t, Config{Sites: 3})
	if err := tb.Start(); !errors.Is(err, errAlreadyStarted) {
		t.Errorf("second Start: %v, want errAlreadyStarted", err)
	}
	if err := tb.SetLink(0, 3, Link{}); err == nil {
		t.Errorf("SetLink to a site that does not exist succeeded")
	}
	if err := tb.SetLink(0, 1, Link{Loss: -1}); err == nil || !strings.Contains(err.Error(), "Link.Loss") {
		t.Errorf("SetLink with a bad link: %v, want an error naming Link.Loss", err)
	}
	if got := tb.Netns(3); got != nil {
		t.Errorf("Netns(3) of 3 sites = %v, want nil", got)
	}
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tb.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := tb.SetLink(0, 1, Link{}); !errors.Is(err, ErrClosed) {
		t.Errorf("SetLink after Close: %v, want ErrClosed", err)
	}
	if err := tb.Start(); !errors.Is(err, ErrClosed) {
		t.Errorf("Start after Close: %v, want ErrClosed", err)
	}
	if got := tb.Netns(0); got != nil {
		t.Errorf("Netns(0) after Close = %v, want nil", got)
	}
	unstarted, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstarted.SetLink(0, 1, Link{}); !errors.Is(err, errNotStarted) {
		t.Errorf("SetLink before Start: %v, want errNotStarted", err)
	}
	if err := unstarted.Close(); err != nil {
		t.Errorf("Close of an unstarted testbed: %v", err)
	}
}

func TestStartProcessRunsInNamespace(t *testing.T) {
	tb := startTestbed(t, Config{Sites: 2})
	for i := range 2 {
		ns := tb.Netns(i)
		var want string
		if err := ns.Do(func() (err error) {
			want, err = os.Readlink("/proc/thread-self/ns/net")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		self, err := os.Readlink("/proc/self/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		if want == self {
			t.Fatalf("site %d: Do ran in the process's own namespace %s", i, self)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"=1")
		var out strings.Builder
		cmd.Stdout = &out
		cmd.Stderr = os.Stderr
		if err := ns.Start(cmd); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		if out.String() != want {
			t.Errorf("site %d: child process ran in %q, want %q", i, out.String(), want)
		}
	}
}

func TestSweepRemovesLeftoversOfDeadProcesses(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	// A process that has exited stands for a crashed run.
	cmd := exec.Command("/bin/true")
	if err := cmd.Run(); err != nil {
		t.Skipf("skipping: cannot run /bin/true: %v", err)
	}
	dead := cmd.ProcessState.Pid()
	const prefix = "cwansweep"
	stale, err := createNetns(fmt.Sprintf("%s-%d-1-0", prefix, dead))
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(stale.fd)
	live, err := createNetns(fmt.Sprintf("%s-%d-1-0", prefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { live.close() })
	removed, err := Sweep(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{stale.name}) {
		t.Errorf("Sweep removed %q, want only %q", removed, stale.name)
	}
	if _, err := os.Stat(live.path); err != nil {
		t.Errorf("namespace of a live process was removed: %v", err)
	}
}

// udpEcho serves UDP echo in site i until the test ends and returns its address.
func udpEcho(t *testing.T, tb *Testbed, site int) netip.AddrPort {
	t.Helper()
	c, err := tb.Netns(site).ListenPacket("udp4", netip.AddrPortFrom(tb.Addr(site), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			c.WriteTo(buf[:n], from)
		}
	})
	t.Cleanup(func() { c.Close(); wg.Wait() })
	return netip.MustParseAddrPort(c.LocalAddr().String())
}

func TestUDPRoundTripTakesTheConfiguredRTT(t *testing.T) {
	// An asymmetric path: 15 ms one way and 25 ms back, 40 ms in all.
	const there, back = 15 * time.Millisecond, 25 * time.Millisecond
	tb := startTestbed(t, Config{Sites: 2, Links: map[[2]int]Link{
		{0, 1}: {Delay: there, CapacityMbit: 100},
		{1, 0}: {Delay: back, CapacityMbit: 100},
	}})
	server := udpEcho(t, tb, 1)
	c, err := tb.Netns(0).ListenPacket("udp4", netip.AddrPortFrom(tb.Addr(0), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const pings = 15
	rtt := there + back
	var samples []time.Duration
	buf := make([]byte, 64)
	for i := range pings {
		msg := fmt.Appendf(nil, "ping %d", i)
		start := time.Now()
		if _, err := c.WriteTo(msg, net.UDPAddrFromAddrPort(server)); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * rtt))
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
		samples = append(samples, time.Since(start))
		if string(buf[:n]) != string(msg) {
			t.Fatalf("ping %d: echo %q, want %q", i, buf[:n], msg)
		}
	}
	slices.Sort(samples)
	median := samples[len(samples)/2]
	// The emulated delay is a lower bound; the upper bound is loose, since the machine may be loaded.
	t.Logf("configured RTT %v; measured min %v median %v max %v (asserted: every sample >= %v, median <= %v)",
		rtt, samples[0], median, samples[len(samples)-1], rtt, rtt+50*time.Millisecond)
	if samples[0] < rtt {
		t.Errorf("fastest round trip %v is shorter than the configured RTT %v", samples[0], rtt)
	}
	if median > rtt+50*time.Millisecond {
		t.Errorf("median round trip %v is far above the configured RTT %v", median, rtt)
	}
	for _, l := range [][2]int{{0, 1}, {1, 0}} {
		if s := tb.Stats(l[0], l[1]); s.Packets != pings || s.Delivered != pings {
			t.Errorf("link %d→%d: stats %+v, want %d packets, all delivered", l[0], l[1], s, pings)
		}
	}
}

func TestLossIsAppliedAtTheConfiguredRate(t *testing.T) {
	const loss, sent = 0.05, 2000
	tb := startTestbed(t, Config{Sites: 2, Seed: 7, Link: Link{Delay: time.Millisecond, Loss: loss}})
	rx, err := tb.Netns(1).ListenPacket("udp4", netip.AddrPortFrom(tb.Addr(1), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	// The packets wait in the socket until the sender is done: make room for all of them, beyond the
	// usual limit on socket buffers.
	raw, err := rx.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	tx, err := tb.Netns(0).ListenPacket("udp4", netip.AddrPortFrom(tb.Addr(0), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	msg := make([]byte, 100)
	for range sent {
		if _, err := tx.WriteTo(msg, rx.LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	// Read until every packet that the link let through has come; the counters say how many that is.
	received, idle := 0, 0
	buf := make([]byte, 2048)
	for idle < 10 {
		s := tb.Stats(0, 1)
		if s.Packets == sent && uint64(received)+s.LossDrops == sent {
			break
		}
		rx.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if _, _, err := rx.ReadFrom(buf); err != nil {
			idle++
			continue
		}
		received++
		idle = 0
	}
	s := tb.Stats(0, 1)
	mean, sd := sent*loss, math.Sqrt(sent*loss*(1-loss))
	t.Logf("sent %d, received %d; link counted %d packets, %d lost at random (expected %.0f ± %.1f)",
		sent, received, s.Packets, s.LossDrops, mean, sd)
	if s.Packets != sent {
		t.Fatalf("link saw %d packets, want %d", s.Packets, sent)
	}
	if s.QueueDrops != 0 || s.FlowQueueDrops != 0 {
		t.Errorf("queue drops %d, flow queue drops %d on an unshaped link, want none", s.QueueDrops, s.FlowQueueDrops)
	}
	if uint64(received) != sent-s.LossDrops {
		t.Errorf("received %d, want %d sent minus %d lost", received, sent, s.LossDrops)
	}
	if math.Abs(float64(s.LossDrops)-mean) > 5*sd {
		t.Errorf("%d packets lost, want %.0f ± %.0f", s.LossDrops, mean, 5*sd)
	}
}

// tcpRun is a set of bulk TCP flows from one site to another.
type tcpRun struct {
	dialed   []net.Conn // the sending end of each flow
	received []atomic.Int64
	wg       sync.WaitGroup
	closers  []io.Closer
}

// startTCP opens flows connections from site from to site to and has each send as fast as TCP lets
// it. A rcvbuf above zero sets the receivers' SO_RCVBUF, which bounds the window.
func startTCP(t *testing.T, tb *Testbed, from, to, flows, rcvbuf int) *tcpRun {
	t.Helper()
	lc := &net.ListenConfig{}
	if rcvbuf > 0 {
		lc.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf)
			})
			return errors.Join(err, serr)
		}
	}
	ln, err := tb.Netns(to).ListenConfig(context.Background(), lc, "tcp4", netip.AddrPortFrom(tb.Addr(to), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	r := &tcpRun{received: make([]atomic.Int64, flows)}
	r.closers = append(r.closers, ln)
	for i := range flows {
		c, err := tb.Netns(from).Dial(context.Background(), &net.Dialer{Timeout: 5 * time.Second}, "tcp4", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		r.closers = append(r.closers, c, s)
		r.dialed = append(r.dialed, c)
		r.wg.Go(func() {
			buf := make([]byte, 64<<10)
			for {
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		})
		r.wg.Go(func() {
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				r.received[i].Add(int64(n))
				if err != nil {
					return
				}
			}
		})
	}
	t.Cleanup(r.stop)
	return r
}

func (r *tcpRun) stop() {
	for _, c := range r.closers {
		c.Close()
	}
	r.wg.Wait()
}

// measure waits out warmup, then returns each flow's throughput in Mbit/s over the next window.
func (r *tcpRun) measure(warmup, window time.Duration) []float64 {
	<-time.After(warmup)
	before := make([]int64, len(r.received))
	for i := range r.received {
		before[i] = r.received[i].Load()
	}
	start := time.Now()
	<-time.After(window)
	secs := time.Since(start).Seconds()
	rates := make([]float64, len(r.received))
	for i := range r.received {
		rates[i] = float64(r.received[i].Load()-before[i]) * 8 / secs / 1e6
	}
	r.stop()
	return rates
}

func sum(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

// throughputAttempts bounds how often a throughput test measures before it fails. The machine that
// runs the tests may be loaded enough to starve the forwarder for a while, which shows up as a
// retransmission timeout; one good measurement shows the behaviour.
const throughputAttempts = 3

// attempt runs measure up to throughputAttempts times, logging each, until it reports no problem;
// then it fails t with the problems of the last attempt.
func attempt(t *testing.T, measure func(logf func(string, ...any)) []string) {
	t.Helper()
	var problems []string
	for n := 1; n <= throughputAttempts; n++ {
		problems = measure(func(format string, args ...any) {
			t.Helper()
			t.Logf("attempt %d: "+format, append([]any{n}, args...)...)
		})
		if len(problems) == 0 {
			return
		}
		t.Logf("attempt %d: %s", n, strings.Join(problems, "; "))
	}
	for _, p := range problems {
		t.Error(p)
	}
}

func TestOneTCPFlowIsWindowLimitedByTheRTT(t *testing.T) {
	// A receive buffer of 64 KiB lets the kernel advertise a window of roughly that size. Through a
	// 200 Mbit/s link the flow should then move W/RTT: four times as much at 20 ms as at 80 ms, and
	// far below the link's capacity. A relay that terminates TCP near the sender would hide the RTT.
	const capacity, window = 200.0, 64 << 10
	tb := startTestbed(t, Config{Sites: 2})
	rtts := []time.Duration{20 * time.Millisecond, 80 * time.Millisecond}
	attempt(t, func(logf func(string, ...any)) (problems []string) {
		var rates []float64
		for _, rtt := range rtts {
			for _, l := range [][2]int{{0, 1}, {1, 0}} {
				if err := tb.SetLink(l[0], l[1], Link{Delay: rtt / 2, CapacityMbit: capacity}); err != nil {
					t.Fatal(err)
				}
			}
			rate := startTCP(t, tb, 0, 1, 1, window).measure(500*time.Millisecond, 1200*time.Millisecond)[0]
			predicted := window * 8 / rtt.Seconds() / 1e6
			logf("RTT %v, window %d KiB: %.1f Mbit/s measured, W/RTT = %.1f Mbit/s predicted, link %.0f Mbit/s",
				rtt, window>>10, rate, predicted, capacity)
			if rate < 0.3*predicted || rate > 2.5*predicted {
				problems = append(problems, fmt.Sprintf("RTT %v: %.1f Mbit/s is not near W/RTT = %.1f Mbit/s", rtt, rate, predicted))
			}
			if rate > capacity/2 {
				problems = append(problems, fmt.Sprintf("RTT %v: %.1f Mbit/s is not well below the link's %.0f Mbit/s", rtt, rate, capacity))
			}
			rates = append(rates, rate)
		}
		ratio := rates[0] / rates[1]
		logf("throughput ratio %.2f for an RTT ratio of 4 (asserted within [2, 8])", ratio)
		if ratio < 2 || ratio > 8 {
			problems = append(problems, fmt.Sprintf("throughput at %v is %.2f times that at %v, want about 4", rtts[0], ratio, rtts[1]))
		}
		return problems
	})
}

func TestFlowsShareTheLinkCapacity(t *testing.T) {
	const capacity, flows = 40.0, 4
	tb := startTestbed(t, Config{Sites: 2, Link: Link{Delay: 5 * time.Millisecond, CapacityMbit: capacity}})
	attempt(t, func(logf func(string, ...any)) (problems []string) {
		before := tb.Stats(0, 1)
		rates := startTCP(t, tb, 0, 1, flows, 0).measure(500*time.Millisecond, 1500*time.Millisecond)
		total := sum(rates)
		s := tb.Stats(0, 1)
		drops := s.QueueDrops - before.QueueDrops
		logf("%d flows over a %.0f Mbit/s link: %.1f Mbit/s in all, per flow %.1f; %d packets, %d dropped at the full queue",
			flows, capacity, total, rates, s.Packets-before.Packets, drops)
		if total < 0.7*capacity || total > 1.05*capacity {
			problems = append(problems, fmt.Sprintf("flows moved %.1f Mbit/s together, want about the link's %.0f", total, capacity))
		}
		for i, r := range rates {
			if r < 0.1*capacity/flows {
				problems = append(problems, fmt.Sprintf("flow %d moved %.1f Mbit/s, starved of its share %.1f", i, r, capacity/flows))
			}
		}
		if drops == 0 {
			problems = append(problems, "no drops at the link queue: TCP saw no congestion signal")
		}
		return problems
	})
}

func TestPerFlowCapsApplyToEachFlow(t *testing.T) {
	const capacity, perFlow, flows = 200.0, 8.0, 3
	tb := startTestbed(t, Config{Sites: 2, Link: Link{Delay: 5 * time.Millisecond, CapacityMbit: capacity, FlowMbit: perFlow}})
	attempt(t, func(logf func(string, ...any)) (problems []string) {
		rates := startTCP(t, tb, 0, 1, flows, 0).measure(500*time.Millisecond, 1500*time.Millisecond)
		total := sum(rates)
		logf("%d flows capped at %.0f Mbit/s each on a %.0f Mbit/s link: per flow %.2f, %.1f in all",
			flows, perFlow, capacity, rates, total)
		for i, r := range rates {
			if r < 0.6*perFlow || r > 1.1*perFlow {
				problems = append(problems, fmt.Sprintf("flow %d moved %.2f Mbit/s, want about its cap %.0f", i, r, perFlow))
			}
		}
		if total < 0.6*perFlow*flows {
			problems = append(problems, fmt.Sprintf("flows moved %.1f Mbit/s together: the cap looks shared, not per flow", total))
		}
		return problems
	})
}

func TestCapFlowSlowsOneFlow(t *testing.T) {
	const capacity, perFlow, slow, flows = 200.0, 16.0, 4.0, 3
	tb := startTestbed(t, Config{Sites: 2, Link: Link{Delay: 5 * time.Millisecond, CapacityMbit: capacity, FlowMbit: perFlow}})
	if err := tb.CapFlow(Flow{Proto: "sctp"}, 1); err == nil {
		t.Error("CapFlow of protocol sctp: no error")
	}
	outside := netip.MustParseAddrPort("192.0.2.1:9")
	if err := tb.CapFlow(Flow{Proto: "tcp", Src: outside, Dst: netip.AddrPortFrom(tb.Addr(1), 9)}, 1); err == nil {
		t.Error("CapFlow of a flow from outside the testbed: no error")
	}
	attempt(t, func(logf func(string, ...any)) (problems []string) {
		r := startTCP(t, tb, 0, 1, flows, 0)
		c := r.dialed[0]
		f := Flow{Proto: "tcp", Src: c.LocalAddr().(*net.TCPAddr).AddrPort(), Dst: c.RemoteAddr().(*net.TCPAddr).AddrPort()}
		if err := tb.CapFlow(f, slow); err != nil {
			t.Fatal(err)
		}
		rates := r.measure(500*time.Millisecond, 1500*time.Millisecond)
		logf("flow 0 capped at %.0f Mbit/s, the others at the link's %.0f: %.2f Mbit/s", slow, perFlow, rates)
		if rates[0] < 0.6*slow || rates[0] > 1.1*slow {
			problems = append(problems, fmt.Sprintf("capped flow moved %.2f Mbit/s, want about %.0f", rates[0], slow))
		}
		for i, r := range rates[1:] {
			if r < 0.6*perFlow || r > 1.1*perFlow {
				problems = append(problems, fmt.Sprintf("flow %d moved %.2f Mbit/s, want about the link's cap %.0f", i+1, r, perFlow))
			}
		}
		return problems
	})
}

func TestOffloadCarriesSegmentsWholeAtTheLinkRate(t *testing.T) {
	// With offload the kernels hand the forwarder TCP segments larger than the MTU; the link still
	// paces them at its capacity, and a per-flow cap still holds.
	const capacity, perFlow, mtu = 200.0, 40.0, 1500
	tb := startTestbed(t, Config{Sites: 2, MTU: mtu, Offload: true,
		Link: Link{Delay: 5 * time.Millisecond, CapacityMbit: capacity, FlowMbit: perFlow}})
	attempt(t, func(logf func(string, ...any)) (problems []string) {
		before := tb.Stats(0, 1)
		rates := startTCP(t, tb, 0, 1, 2, 0).measure(500*time.Millisecond, 1500*time.Millisecond)
		s := tb.Stats(0, 1)
		packets, bytes := s.Packets-before.Packets, s.Bytes-before.Bytes
		mean := float64(bytes) / float64(max(packets, 1))
		logf("2 flows capped at %.0f Mbit/s: %.1f Mbit/s; %d packets of %.0f bytes on average (MTU %d)", perFlow, rates, packets, mean, mtu)
		if mean <= mtu {
			problems = append(problems, fmt.Sprintf("packets average %.0f bytes, not above the MTU: no segment came whole", mean))
		}
		for i, r := range rates {
			if r < 0.6*perFlow || r > 1.1*perFlow {
				problems = append(problems, fmt.Sprintf("flow %d moved %.1f Mbit/s, want about its cap %.0f", i, r, perFlow))
			}
		}
		return problems
	})
}
