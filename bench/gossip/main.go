// Command gossip measures what the gossip failure detector (pccl Config.GossipJoin, master
// ServerConfig.Gossip) costs a run and what it buys, to choose whether the commands run it by default.
//
//	go run ./bench/gossip --peers 8          # root: every process on a host of its own
//
// It builds a test bed (internal/hosts: a network namespace per host, with its own address, on one
// bridge), runs the master in this process on host 0 and --peers peer processes (this program,
// re-executed) on hosts 1..peers. The peers join, let newcomers in (ArePeersPending once a second)
// and otherwise stay idle, so that what they do is their heartbeats, that consensus and, with gossip,
// the gossip member's probes.
//
// Cost: a run with gossip off, then one with it on (the LAN presets), each measured over --window
// after every peer is in the ring. cpu_ms_per_s_per_peer is the mean over peers of the CPU time
// (user and system, /proc/PID/stat) per second of the window; bytes_per_s_per_peer the mean over
// peers of the bytes sent and received on the peer's host interface per second; master_bytes_per_s
// the same for the master's host. gossip_cpu_ms_per_s_per_peer and gossip_bytes_per_s_per_peer are
// the differences, on minus off.
//
// Detection: for each timing of --presets (lan: the master removes a silent peer after 1.5 s; wan:
// 6 s; pccl: 60 s, the C ABI's default) with gossip off and on (the LAN gossip preset, WAN for wan),
// --rounds rounds stop one peer with SIGSTOP and time until the master removes it (its event), and
// which rule did (heartbeat or gossip); the stopped peer is then killed and a new one started. The
// result lists kick_s per round, their median and maximum, and gossip_bound_s, the gossip package's
// worst-case bound for the group (Config.Bound with the master counted).
//
// gossip_faster_under_default is true when, under the commands' default preset (lan), the median
// time to remove a stopped peer is shorter with gossip than without, by more than a tenth:
// default_gossip follows it. The figures and the default chosen from them (off: under lan the
// heartbeat rule is as fast, and under pccl the patience is PCCL's own) are in docs/results/gossip.md. Progress goes to stderr, the JSON result is the last line on stdout.
// The default run (8 peers, a 20 s window, three rounds of each of six detection cases) takes about
// eight minutes, most of it the pccl timing's minute-long heartbeat timeout.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/internal/hosts"
	"github.com/concord-ccl/concord/pccl/master"
)

// roles are the roles this program runs as a child.
var roles = map[string]func() int{rolePeer: peerMain}

func main() {
	cluster.Main(roles)
	os.Exit(run(os.Args[1:]))
}

// detect is what one detection case measured.
type detect struct {
	Preset            string         `json:"preset"`
	HeartbeatTimeoutS float64        `json:"heartbeat_timeout_s"`
	Gossip            bool           `json:"gossip"`
	KickS             []float64      `json:"kick_s"`
	KickSP50          float64        `json:"kick_s_p50"`
	KickSMax          float64        `json:"kick_s_max"`
	By                map[string]int `json:"removed_by"` // "heartbeat" or "gossip": which rule removed the stopped peer
}

type result struct {
	Peers   int     `json:"peers"`
	WindowS float64 `json:"window_s"`

	CPUOff          float64  `json:"cpu_ms_per_s_per_peer_off"`
	CPUOn           float64  `json:"cpu_ms_per_s_per_peer_on"`
	GossipCPU       float64  `json:"gossip_cpu_ms_per_s_per_peer"`
	BytesOff        float64  `json:"bytes_per_s_per_peer_off"`
	BytesOn         float64  `json:"bytes_per_s_per_peer_on"`
	GossipBytes     float64  `json:"gossip_bytes_per_s_per_peer"`
	MasterBytesOff  float64  `json:"master_bytes_per_s_off"`
	MasterBytesOn   float64  `json:"master_bytes_per_s_on"`
	MasterCPUOff    float64  `json:"master_cpu_ms_per_s_off"`
	MasterCPUOn     float64  `json:"master_cpu_ms_per_s_on"`
	Detect          []detect `json:"detect"`
	GossipBoundS    float64  `json:"gossip_bound_s"`
	FasterByDefault bool     `json:"gossip_faster_under_default"`
	DefaultGossip   bool     `json:"default_gossip"`
	Failure         string   `json:"failure,omitempty"`
}

func run(args []string) int {
	fs := flag.NewFlagSet("gossip", flag.ContinueOnError)
	peers := fs.Int("peers", 8, "peer processes, each on a host of its own")
	window := fs.Duration("window", 20*time.Second, "how long each cost run is measured")
	rounds := fs.Int("rounds", 3, "SIGSTOP rounds per detection case")
	presets := fs.String("presets", "lan,wan,pccl", "timings of the detection cases: lan, wan, pccl (comma-separated)")
	timeout := fs.Duration("timeout", 20*time.Minute, "give up (and kill every child) after this long")
	verbose := fs.Bool("v", false, "copy the children's stderr to stderr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *peers < 3 || *window <= 0 || *rounds < 0 {
		fmt.Fprintln(os.Stderr, "gossip: need --peers >= 3, a positive --window and --rounds >= 0")
		return 2
	}
	var cases []string
	for _, p := range strings.Split(*presets, ",") {
		if _, _, err := timing(p); err != nil {
			fmt.Fprintln(os.Stderr, "gossip:", err)
			return 2
		}
		cases = append(cases, p)
	}
	if err := hosts.Available(); err != nil {
		fmt.Fprintf(os.Stderr, "gossip: runs every process on a host of its own (network namespaces), which needs root: %v\n", err)
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, *timeout)
	defer cancelT()
	b := &bench{peers: *peers, verbose: *verbose, lifetime: *timeout + time.Minute}
	res, err := b.run(ctx, *window, *rounds, cases)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gossip: FAILED:", err)
		res.Failure = err.Error()
	}
	js, _ := json.Marshal(res)
	fmt.Println(string(js))
	if err != nil {
		return 1
	}
	return 0
}

// timing returns the master configuration and the gossip preset of a detection case's timing.
func timing(name string) (master.Config, master.GossipConfig, error) {
	switch name {
	case "lan":
		return master.LAN(), master.GossipLAN(), nil
	case "wan":
		return master.WAN(), master.GossipWAN(), nil
	case "pccl":
		// The C ABI's default: a silent peer is kept for a minute, as PCCL's TCP keepalive does.
		return master.Config{HeartbeatInterval: time.Second, HeartbeatTimeout: time.Minute}, master.GossipLAN(), nil
	}
	return master.Config{}, master.GossipConfig{}, fmt.Errorf("--presets: %q is not lan, wan or pccl", name)
}

type bench struct {
	peers    int
	verbose  bool
	lifetime time.Duration
	bed      *hosts.Bed
}

func (b *bench) run(ctx context.Context, window time.Duration, rounds int, cases []string) (result, error) {
	res := result{Peers: b.peers, WindowS: window.Seconds(), GossipBoundS: master.GossipLAN().Bound(b.peers + 1).Seconds()}
	bed, err := hosts.New(hosts.Config{Hosts: b.peers + 1})
	if err != nil {
		return res, err
	}
	defer bed.Close()
	b.bed = bed
	for _, on := range []bool{false, true} {
		g, err := b.start(ctx, master.LAN(), gossipOf(on, master.GossipLAN()), false)
		if err != nil {
			return res, err
		}
		cost, err := g.cost(ctx, window)
		g.stop()
		if err != nil {
			return res, err
		}
		fmt.Fprintf(os.Stderr, "gossip: cost with gossip %v: %+v\n", on, cost)
		if on {
			res.CPUOn, res.BytesOn, res.MasterBytesOn, res.MasterCPUOn = cost.cpu, cost.bytes, cost.masterBytes, cost.masterCPU
		} else {
			res.CPUOff, res.BytesOff, res.MasterBytesOff, res.MasterCPUOff = cost.cpu, cost.bytes, cost.masterBytes, cost.masterCPU
		}
	}
	res.GossipCPU, res.GossipBytes = res.CPUOn-res.CPUOff, res.BytesOn-res.BytesOff
	for _, name := range cases {
		mcfg, gcfg, _ := timing(name)
		for _, on := range []bool{false, true} {
			g, err := b.start(ctx, mcfg, gossipOf(on, gcfg), name == "wan")
			if err != nil {
				return res, err
			}
			d := detect{Preset: name, HeartbeatTimeoutS: mcfg.HeartbeatTimeout.Seconds(), Gossip: on, By: map[string]int{}}
			for r := range rounds {
				s, by, err := g.stall(ctx, 1+r%(b.peers-1))
				if err != nil {
					g.stop()
					return res, fmt.Errorf("%s, gossip %v, round %d: %w", name, on, r, err)
				}
				d.KickS = append(d.KickS, s)
				d.By[by]++
				fmt.Fprintf(os.Stderr, "gossip: %s, gossip %v: stopped peer removed after %.2fs by %s\n", name, on, s, by)
			}
			g.stop()
			if len(d.KickS) > 0 {
				sorted := slices.Sorted(slices.Values(d.KickS))
				d.KickSP50, d.KickSMax = sorted[(len(sorted)-1)/2], sorted[len(sorted)-1]
			}
			res.Detect = append(res.Detect, d)
		}
	}
	var off, on float64
	for _, d := range res.Detect {
		if d.Preset == "lan" && len(d.KickS) > 0 {
			if d.Gossip {
				on = d.KickSP50
			} else {
				off = d.KickSP50
			}
		}
	}
	res.FasterByDefault = on > 0 && off > 0 && on < 0.9*off
	res.DefaultGossip = res.FasterByDefault
	return res, nil
}

func gossipOf(on bool, g master.GossipConfig) *master.GossipConfig {
	if !on {
		return nil
	}
	return &g
}

// group is a master and its peers on the bed.
type group struct {
	b      *bench
	cl     *cluster.Cluster
	stderr *lockedBuffer
	master struct {
		srv    *master.Server
		cancel context.CancelFunc
		done   chan error
		addr   string
		gossip string
		events chan master.Event
	}
	wan   bool
	procs map[*cluster.Proc]*member
	byIdx []*member // by host index - 1
}

// member is one peer process.
type member struct {
	proc  *cluster.Proc
	host  *hosts.Host
	id    uint64
	world int
}

// start runs a master with mcfg (and gossip, if set) on host 0 and a peer on every other host, and
// returns once every peer is in one ring.
func (b *bench) start(ctx context.Context, mcfg master.Config, gcfg *master.GossipConfig, wan bool) (*group, error) {
	g := &group{b: b, stderr: &lockedBuffer{}, wan: wan, procs: map[*cluster.Proc]*member{}}
	var stderr interface{ Write([]byte) (int, error) } = g.stderr
	if b.verbose {
		stderr = os.Stderr
	}
	g.cl = cluster.New(cluster.Config{Stderr: stderr})
	h0 := b.bed.Host(0)
	var ln net.Listener
	err := h0.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", net.JoinHostPort(h0.Addr().String(), "0"))
		return err
	})
	if err != nil {
		g.cl.Close()
		return nil, err
	}
	if gcfg != nil {
		gcfg.BindAddr = net.JoinHostPort(h0.Addr().String(), "0")
	}
	m := &g.master
	m.events = make(chan master.Event, 4096)
	m.srv = master.NewServer(master.ServerConfig{Config: mcfg, Gossip: gcfg, OnEvent: func(e master.Event) {
		select {
		case m.events <- e:
		default:
		}
	}})
	mctx, cancel := context.WithCancel(context.Background())
	m.cancel, m.done, m.addr = cancel, make(chan error, 1), ln.Addr().String()
	// Serve opens the gossip member's sockets before it returns to accepting: in host 0's namespace.
	go func() { m.done <- h0.Do(func() error { return m.srv.Serve(mctx, ln) }) }()
	if m.gossip, err = m.srv.GossipAddr(ctx); err != nil {
		g.stop()
		return nil, err
	}
	g.byIdx = make([]*member, b.peers)
	for i := range b.peers {
		if err := g.spawn(i); err != nil {
			g.stop()
			return nil, err
		}
	}
	if err := g.awaitWorld(ctx, b.peers, 2*time.Minute); err != nil {
		g.stop()
		return nil, err
	}
	return g, nil
}

// spawn starts the peer of host i+1.
func (g *group) spawn(i int) error {
	h := g.b.bed.Host(i + 1)
	p := peerParams{Master: g.master.addr, Host: h.Addr().String(), GossipJoin: g.master.gossip, WAN: g.wan, Lifetime: g.b.lifetime}
	js, _ := json.Marshal(p)
	cp, err := g.cl.Spawn(cluster.Spec{Role: rolePeer, Name: fmt.Sprintf("peer-%d", i+1), Env: []string{envParams + "=" + string(js)}, Start: h.Start})
	if err != nil {
		return err
	}
	m := &member{proc: cp, host: h}
	g.procs[cp] = m
	g.byIdx[i] = m
	go func() {
		for range cp.Lines() { // the merged feed is the one read
		}
	}()
	return nil
}

// awaitWorld reads the peers' lines until every live peer reports a ring of n.
func (g *group) awaitWorld(ctx context.Context, n int, limit time.Duration) error {
	deadline := time.After(limit)
	for {
		ok := true
		for _, m := range g.byIdx {
			if m.world != n {
				ok = false
			}
		}
		if ok {
			return nil
		}
		select {
		case l, open := <-g.cl.Lines():
			if !open {
				return errors.New("the peers' output ended")
			}
			g.handle(l)
		case <-deadline:
			return fmt.Errorf("no ring of %d peers within %v:\n%s", n, limit, g.stderr.String())
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// handle takes in one line of a peer.
func (g *group) handle(l cluster.Line) {
	m := g.procs[l.Proc]
	var ev peerEvent
	if m == nil || l.Decode(&ev) != nil {
		return
	}
	switch ev.Event {
	case "ready":
		m.id, m.world = ev.ID, ev.World
	case "removed":
		m.world = 0
	}
}

// costs are the per-peer means of one cost run.
type costs struct {
	cpu, bytes, masterBytes, masterCPU float64
}

// cost measures the peers' CPU time and their hosts' traffic over window, and the master's host's.
func (g *group) cost(ctx context.Context, window time.Duration) (costs, error) {
	select { // let the joins' traffic pass
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
		return costs{}, ctx.Err()
	}
	type sample struct{ cpu, bytes []uint64 }
	take := func() (sample, error) {
		var s sample
		for _, m := range g.byIdx {
			c, err := cpuTicks(m.proc.Pid())
			if err != nil {
				return s, err
			}
			n, err := hostBytes(m.host)
			if err != nil {
				return s, err
			}
			s.cpu, s.bytes = append(s.cpu, c), append(s.bytes, n)
		}
		c, err := cpuTicks(os.Getpid())
		if err != nil {
			return s, err
		}
		n, err := hostBytes(g.b.bed.Host(0))
		s.cpu, s.bytes = append(s.cpu, c), append(s.bytes, n)
		return s, err
	}
	a, err := take()
	if err != nil {
		return costs{}, err
	}
	start := time.Now()
	select {
	case <-time.After(window):
	case <-ctx.Done():
		return costs{}, ctx.Err()
	}
	z, err := take()
	if err != nil {
		return costs{}, err
	}
	secs := time.Since(start).Seconds()
	var c costs
	n := len(g.byIdx)
	for i := range n {
		c.cpu += float64(z.cpu[i]-a.cpu[i]) * msPerTick / secs / float64(n)
		c.bytes += float64(z.bytes[i]-a.bytes[i]) / secs / float64(n)
	}
	c.masterCPU = float64(z.cpu[n]-a.cpu[n]) * msPerTick / secs
	c.masterBytes = float64(z.bytes[n]-a.bytes[n]) / secs
	return c, nil
}

// stall stops the peer of host i+1 with SIGSTOP and returns the seconds until the master removed it
// and which rule did; then it kills the peer, starts a new one on its host and waits for a full ring.
func (g *group) stall(ctx context.Context, i int) (float64, string, error) {
	victim := g.byIdx[i-1]
	for len(g.master.events) > 0 { // what happened before the stop
		<-g.master.events
	}
	victim.proc.Stop()
	stopped := time.Now()
	limit := time.After(3 * time.Minute)
	var secs float64
	by := ""
	for by == "" {
		select {
		case e := <-g.master.events:
			if uint64(e.Peer) != victim.id || (e.Kind != "kicked" && e.Kind != "timeout" && e.Kind != "left") {
				continue
			}
			secs = e.Time.Sub(stopped).Seconds()
			by = "heartbeat"
			if strings.Contains(e.Detail, "gossip") {
				by = "gossip"
			}
		case l := <-g.cl.Lines():
			g.handle(l)
		case <-limit:
			return 0, "", errors.New("the stopped peer was never removed")
		case <-ctx.Done():
			return 0, "", ctx.Err()
		}
	}
	victim.proc.Kill()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err := victim.proc.Wait(wctx)
	cancel()
	if err != nil {
		return 0, "", fmt.Errorf("the killed peer did not exit: %w", err)
	}
	delete(g.procs, victim.proc)
	if err := g.spawn(i - 1); err != nil {
		return 0, "", err
	}
	return secs, by, g.awaitWorld(ctx, g.b.peers, 2*time.Minute)
}

// stop kills the peers and stops the master.
func (g *group) stop() {
	g.cl.Close()
	g.master.cancel()
	<-g.master.done
}

// msPerTick converts the clock ticks of /proc/PID/stat to milliseconds: Linux reports them at
// USER_HZ, 100 per second, on every architecture.
const msPerTick = 10

// cpuTicks returns the user and system CPU time of process pid, in clock ticks.
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: the fields count from after it.
	_, rest, ok := bytes.Cut(b, []byte(") "))
	f := strings.Fields(string(rest))
	if !ok || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64) // utime, field 14
	s, err2 := strconv.ParseUint(f[12], 10, 64) // stime, field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return u + s, nil
}

// hostBytes returns the bytes sent and received on host h's interfaces but loopback.
func hostBytes(h *hosts.Host) (uint64, error) {
	var n uint64
	err := h.Do(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			a := l.Attrs()
			if a.Name == "lo" || a.Statistics == nil {
				continue
			}
			n += a.Statistics.TxBytes + a.Statistics.RxBytes
		}
		return nil
	})
	return n, err
}

// lockedBuffer collects the children's stderr for a failure report, the last 64 KiB.
type lockedBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	if len(l.b) > 64<<10 {
		l.b = l.b[len(l.b)-64<<10:]
	}
	return len(p), nil
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}
