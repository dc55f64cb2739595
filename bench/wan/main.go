// Command wan measures Concord's AllReduce across emulated wide-area links: every peer in a site of
// its own, sites joined by the packet-level emulator of internal/wanemu (per-link delay and capacity,
// a cap on every flow), so TCP and QUIC meet the real round-trip time.
//
//	sudo go run ./bench/wan --peers 4 --rtt 100ms --link-mbit 1000 --flow-mbit 100 --size 256MiB
//
// It needs root (namespaces and TUN devices). The peers run in this process, each with its sockets
// created inside its site's namespace, so every byte between them crosses the emulator; the master
// runs in site 0.
//
// For every transport of --transports and every pool size K of --ks it connects the peers with K
// connections to each neighbour, runs one untimed AllReduce of --size (to open the congestion
// windows and have the runtime's staging buffers in place, as in a training loop), then times --reps
// float32 SUM AllReduces of --size bytes one after the other, checks every element of each, and
// reports the median (every run's figure in throughput_mbit_all). Throughput is the ring's bus
// rate, 2(N-1)/N · size · 8 bits over the time, which a ring link cannot carry faster than its
// capacity --link-mbit: that is the ideal, and efficiency is throughput over it.
//
// For every pool size of --ceiling-ks (16 by default) it also measures the stream ceiling of the
// transport (ceiling.go): the rate at which K plain connections per ring link, all links at once, move
// a ring link's bytes through the same test bed, with no collective. stream_ceiling_mbit holds them,
// and <transport>_k16_of_ceiling the AllReduce's throughput over the ceiling: how much of what the
// path allowed the AllReduce used; targets compares it with 0.9 for every transport. quic-go sends
// its packets in UDP segmentation-offload batches, which the emulator carries whole (--offload), as
// it carries TCP's segments; quic_stream_ceiling_no_offload_mbit is QUIC's ceiling again with
// quic-go's offload turned off (QUIC_GO_DISABLE_GSO), every packet crossing the emulator alone, to
// show what the emulator's per-packet cost does to it.
//
// adaptive_capped_efficiency repeats K = --capped-k on tcp with one of peer 0's K connections slowed
// to a quarter of the per-flow cap, with adaptive striping; even_capped_efficiency is the same with
// an even split. u8_wire_ratio is the payload bytes a peer sends with MinMaxU8Both over those of
// float32 (from rings.SentTraffic, frame headers included), and u8_bit_identical says whether the
// quantized AllReduce left identical bytes on every peer.
//
// One JSON object goes to stdout; progress goes to stderr.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/concord-ccl/concord/bench/internal/measure"
	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/internal/wanemu"
	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/rings"
)

type options struct {
	peers      int
	rtt        time.Duration
	linkMbit   float64
	flowMbit   float64
	size       int
	mtu        int
	ks         []int
	transports []string
	cappedK    int
	ceilingKs  []int
	partBytes  int
	timeout    time.Duration
	offload    bool
	reps       int
}

func main() {
	var o options
	var size, ks, trs, cks string
	flag.IntVar(&o.peers, "peers", 4, "peers, one per site")
	flag.DurationVar(&o.rtt, "rtt", 100*time.Millisecond, "round-trip time between two sites")
	flag.Float64Var(&o.linkMbit, "link-mbit", 1000, "capacity of every directed link between sites, Mbit/s")
	flag.Float64Var(&o.flowMbit, "flow-mbit", 100, "cap on every flow, Mbit/s")
	flag.StringVar(&size, "size", "256MiB", "AllReduce size in bytes (suffixes KiB, MiB, GiB)")
	flag.IntVar(&o.mtu, "mtu", 9000, "MTU of the sites' devices")
	flag.BoolVar(&o.offload, "offload", true, "segmentation offload through the emulator, as NICs with TSO and GRO do")
	flag.StringVar(&ks, "ks", "1,4,8,16,32,64", "pool sizes to measure")
	flag.StringVar(&trs, "transports", "tcp,tls,quic", "transports to measure")
	flag.IntVar(&o.cappedK, "capped-k", 16, "pool size of the capped-connection runs")
	flag.StringVar(&cks, "ceiling-ks", "16", "pool sizes of --ks whose stream ceiling is measured too (empty: none; the default applies where --ks has 16)")
	flag.IntVar(&o.partBytes, "part-bytes", 1<<20, "frame size")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Minute, "limit on one configuration")
	flag.IntVar(&o.reps, "reps", 3, "timed AllReduces and stream-ceiling transfers of each configuration (the median is reported)")
	flag.Parse()
	var err error
	if o.size, err = parseSize(size); err != nil {
		fail(err)
	}
	if o.ks, err = parseKs("--ks", ks); err != nil {
		fail(err)
	}
	if cks != "" {
		if o.ceilingKs, err = parseKs("--ceiling-ks", cks); err != nil {
			fail(err)
		}
		// The default (16) applies where --ks has it; a pool size named on the command line must be
		// one that is measured.
		flag.Visit(func(f *flag.Flag) {
			if f.Name != "ceiling-ks" {
				return
			}
			for _, k := range o.ceilingKs {
				if !slices.Contains(o.ks, k) {
					fail(fmt.Errorf("--ceiling-ks: %d is not among --ks %s", k, ks))
				}
			}
		})
	}
	o.transports = strings.Split(trs, ",")
	for _, name := range o.transports {
		if !slices.Contains(transport.Names, name) {
			fail(fmt.Errorf("--transports: %q is not one of %s", name, strings.Join(transport.Names, ", ")))
		}
	}
	if o.peers < 2 {
		fail(fmt.Errorf("--peers %d: an AllReduce across sites needs at least 2", o.peers))
	}
	if o.reps < 1 {
		fail(fmt.Errorf("--reps %d: at least one timed run is needed", o.reps))
	}
	res, err := run(o)
	if err != nil {
		fail(err)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	enc.Encode(res)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "wan:", err)
	os.Exit(1)
}

// parseKs reads a comma-separated list of pool sizes, each in [1, 64], for the flag called name.
func parseKs(name, list string) ([]int, error) {
	var ks []int
	for _, s := range strings.Split(list, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || k < 1 || k > 64 {
			return nil, fmt.Errorf("%s: %q is not a pool size in [1, 64]", name, s)
		}
		ks = append(ks, k)
	}
	return ks, nil
}

func parseSize(s string) (int, error) {
	mult := 1
	for suf, m := range map[string]int{"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30} {
		if strings.HasSuffix(s, suf) {
			s, mult = strings.TrimSuffix(s, suf), m
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("--size: %q is not a size", s)
	}
	return n * mult, nil
}

// result is the JSON the command prints.
type result struct {
	Config         map[string]any                `json:"config"`
	IdealMbit      float64                       `json:"ideal_mbit"`
	ThroughputMbit map[string]map[string]float64 `json:"throughput_mbit"`
	Seconds        map[string]map[string]float64 `json:"seconds"`
	// ThroughputAll is every timed AllReduce's throughput, in order, per transport and pool size;
	// ThroughputMbit and Seconds are their median.
	ThroughputAll map[string]map[string][]float64 `json:"throughput_mbit_all"`
	// CeilingMbit is the stream ceiling (ceiling.go) per transport and pool size of --ceiling-ks: the
	// median of CeilingAll, every timed transfer's rate.
	CeilingMbit    map[string]map[string]float64   `json:"stream_ceiling_mbit"`
	CeilingAll     map[string]map[string][]float64 `json:"stream_ceiling_mbit_all"`
	Efficiency     map[string]float64              `json:"-"`
	AdaptiveCapped float64                         `json:"adaptive_capped_efficiency"`
	EvenCapped     float64                         `json:"even_capped_efficiency"`
	U8WireRatio    float64                         `json:"u8_wire_ratio"`
	U8Identical    bool                            `json:"u8_bit_identical"`
	U8MaxAbsErr    float64                         `json:"u8_max_abs_error"`
	// QUICNoOffload is QUIC's stream ceiling with quic-go's segmentation offload off, per pool size.
	QUICNoOffload map[string]float64 `json:"quic_stream_ceiling_no_offload_mbit,omitempty"`
	Targets       map[string]target  `json:"targets"`
	Errors        []string           `json:"errors,omitempty"`
}

// MarshalJSON adds the per-transport efficiency keys (tcp_k16_efficiency, ...) at the top level.
func (r result) MarshalJSON() ([]byte, error) {
	type plain result
	b, err := json.Marshal(plain(r))
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	for k, v := range r.Efficiency {
		m[k] = v
	}
	return json.Marshal(m)
}

// ofCeilingTarget is the share of its transport's stream ceiling the AllReduce must reach at K = 16.
const ofCeilingTarget = 0.9

// target is one figure against its limit.
type target struct {
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
	Met   bool    `json:"met"`
}

func run(o options) (*result, error) {
	tb, err := wanemu.New(wanemu.Config{Sites: o.peers, MTU: o.mtu, Offload: o.offload, Link: wanemu.Link{
		Delay: o.rtt / 2, CapacityMbit: o.linkMbit, FlowMbit: o.flowMbit}})
	if err != nil {
		return nil, err
	}
	if err := tb.Start(); err != nil {
		return nil, err
	}
	defer tb.Close()
	res := &result{
		Config: map[string]any{"peers": o.peers, "rtt": o.rtt.String(), "link_mbit": o.linkMbit,
			"flow_mbit": o.flowMbit, "size_bytes": o.size, "mtu": o.mtu, "offload": o.offload, "part_bytes": o.partBytes,
			"ks": o.ks, "transports": o.transports, "capped_k": o.cappedK, "ceiling_ks": o.ceilingKs, "reps": o.reps},
		IdealMbit:      o.linkMbit,
		ThroughputMbit: map[string]map[string]float64{},
		Seconds:        map[string]map[string]float64{},
		ThroughputAll:  map[string]map[string][]float64{},
		CeilingMbit:    map[string]map[string]float64{},
		CeilingAll:     map[string]map[string][]float64{},
		Efficiency:     map[string]float64{},
		Targets:        map[string]target{},
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	port := 7000
	b := &bench{o: o, tb: tb}
	for _, name := range o.transports {
		res.ThroughputMbit[name] = map[string]float64{}
		res.Seconds[name] = map[string]float64{}
		for _, k := range o.ks {
			port += 2
			ts, err := b.measure(name, secret, port, k, false, false)
			if err != nil {
				res.Errors = append(res.Errors, fmt.Sprintf("%s k=%d: %v", name, k, err))
				continue
			}
			t, mbits := b.medianRun(ts)
			mbit := b.busMbit(t)
			if res.ThroughputAll[name] == nil {
				res.ThroughputAll[name] = map[string][]float64{}
			}
			res.ThroughputAll[name][strconv.Itoa(k)] = mbits
			res.ThroughputMbit[name][strconv.Itoa(k)] = round(mbit)
			res.Seconds[name][strconv.Itoa(k)] = round(t.Seconds())
			if k == 16 {
				res.Efficiency[name+"_k16_efficiency"] = round(mbit / o.linkMbit)
			}
			fmt.Fprintf(os.Stderr, "wan: %s k=%d: %.2fs, %.0f Mbit/s\n", name, k, t.Seconds(), mbit)
			if !slices.Contains(o.ceilingKs, k) {
				continue
			}
			port += 2
			ceils, err := b.ceiling(name, secret, port, k)
			if err != nil {
				res.Errors = append(res.Errors, fmt.Sprintf("%s k=%d stream ceiling: %v", name, k, err))
				continue
			}
			ceil := measure.Median(ceils)
			if res.CeilingMbit[name] == nil {
				res.CeilingMbit[name] = map[string]float64{}
				res.CeilingAll[name] = map[string][]float64{}
			}
			res.CeilingAll[name][strconv.Itoa(k)] = roundAll(ceils)
			res.CeilingMbit[name][strconv.Itoa(k)] = round(ceil)
			res.Efficiency[fmt.Sprintf("%s_k%d_of_ceiling", name, k)] = round(mbit / ceil)
			fmt.Fprintf(os.Stderr, "wan: %s k=%d: stream ceiling %.0f Mbit/s, AllReduce at %.2f of it\n", name, k, ceil, mbit/ceil)
			if k == 16 {
				of := round(mbit / ceil)
				res.Targets[name+"_k16_of_ceiling"] = target{of, ofCeilingTarget, of >= ofCeilingTarget}
			}
			if name != "quic" {
				continue
			}
			port += 2
			os.Setenv("QUIC_GO_DISABLE_GSO", "true") // read by quic-go for every socket it wraps
			plains, err := b.ceiling(name, secret, port, k)
			os.Unsetenv("QUIC_GO_DISABLE_GSO")
			if err != nil {
				res.Errors = append(res.Errors, fmt.Sprintf("%s k=%d stream ceiling without offload: %v", name, k, err))
				continue
			}
			plain := measure.Median(plains)
			if res.QUICNoOffload == nil {
				res.QUICNoOffload = map[string]float64{}
			}
			res.QUICNoOffload[strconv.Itoa(k)] = round(plain)
			fmt.Fprintf(os.Stderr, "wan: quic k=%d: stream ceiling without segmentation offload %.0f Mbit/s\n", k, plain)
		}
	}
	for _, even := range []bool{false, true} {
		port += 2
		ts, err := b.measure("tcp", secret, port, o.cappedK, true, even)
		if err != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("capped even=%v: %v", even, err))
			continue
		}
		t, _ := b.medianRun(ts)
		eff := round(b.busMbit(t) / o.linkMbit)
		fmt.Fprintf(os.Stderr, "wan: capped k=%d even=%v: %.2fs, efficiency %.2f\n", o.cappedK, even, t.Seconds(), eff)
		if even {
			res.EvenCapped = eff
		} else {
			res.AdaptiveCapped = eff
		}
	}
	port += 2
	if err := b.quantized(res, secret, port); err != nil {
		res.Errors = append(res.Errors, fmt.Sprintf("u8: %v", err))
	}
	return res, nil
}

func round(x float64) float64 { return math.Round(x*1000) / 1000 }

func roundAll(xs []float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = round(x)
	}
	return out
}

// medianRun returns the median of the timed runs ts and every run's throughput in Mbit/s, in order.
func (b *bench) medianRun(ts []time.Duration) (time.Duration, []float64) {
	secs, mbits := make([]float64, len(ts)), make([]float64, len(ts))
	for i, t := range ts {
		secs[i], mbits[i] = t.Seconds(), round(b.busMbit(t))
	}
	return time.Duration(measure.Median(secs) * float64(time.Second)), mbits
}

type bench struct {
	o  options
	tb *wanemu.Testbed
}

// busMbit is the ring's bus rate of one AllReduce that took t.
func (b *bench) busMbit(t time.Duration) float64 {
	n := float64(b.o.peers)
	return 2 * (n - 1) / n * float64(b.o.size) * 8 / t.Seconds() / 1e6
}

// group is the master and the peers of one configuration.
type group struct {
	stop  context.CancelFunc
	done  chan error
	comms []*pccl.Communicator
}

func (g *group) close() {
	for _, c := range g.comms {
		if c != nil {
			c.Close()
		}
	}
	g.stop()
	<-g.done
}

// connect starts a master in site 0 on port and one peer per site listening on port+1, each with a
// pool of k connections over the named transport. With capped, the first data connection peer 0
// dials is paced at a quarter of the per-flow cap.
func (b *bench) connect(ctx context.Context, name string, secret []byte, port, k int, capped, even bool) (*group, error) {
	base, err := transport.Select(name, transport.AuthConfig{Secret: secret})
	if err != nil {
		return nil, err
	}
	mtr := &siteTransport{Transport: base, ns: b.tb.Netns(0)}
	maddr := net.JoinHostPort(b.tb.Addr(0).String(), strconv.Itoa(port))
	ln, err := mtr.Listen(maddr)
	if err != nil {
		return nil, err
	}
	sctx, stop := context.WithCancel(context.Background())
	g := &group{stop: stop, done: make(chan error, 1), comms: make([]*pccl.Communicator, b.o.peers)}
	srv := master.NewServer(master.ServerConfig{Config: master.Config{}})
	go func() { g.done <- srv.Serve(sctx, ln) }()
	errs := make([]error, b.o.peers)
	var wg sync.WaitGroup
	for i := range b.o.peers {
		tr := &siteTransport{Transport: base, ns: b.tb.Netns(i), tb: b.tb}
		if capped && i == 0 {
			tr.capMbit = b.o.flowMbit / 4
			tr.capPort = strconv.Itoa(port + 1)
		}
		cfg := pccl.Config{Master: maddr, Transport: tr, PoolSize: k, PartBytes: b.o.partBytes,
			ListenAddr:  net.JoinHostPort(b.tb.Addr(i).String(), strconv.Itoa(port+1)),
			DialTimeout: 30 * time.Second, MasterTimeout: 60 * time.Second, ProgressTimeout: 60 * time.Second,
			EvenStriping: even}
		wg.Go(func() { g.comms[i], errs[i] = pccl.Connect(ctx, cfg) })
		if i == 0 {
			wg.Wait()
		}
	}
	for len(srv.Snapshot().Peers) < b.o.peers && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond) // polling the master's view; nothing to wait on
	}
	if g.comms[0] != nil {
		if err := g.comms[0].UpdateTopology(ctx); err != nil {
			errs[0] = err
		}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			g.close()
			return nil, fmt.Errorf("peer %d: %w", i, err)
		}
	}
	return g, nil
}

// allReduce runs one AllReduce on every peer at once and returns the slowest peer's time.
func allReduce(ctx context.Context, g *group, bufs [][]byte, d pccl.Desc) (time.Duration, error) {
	var wg sync.WaitGroup
	errs := make([]error, len(g.comms))
	took := make([]time.Duration, len(g.comms))
	for i, c := range g.comms {
		wg.Go(func() {
			t0 := time.Now()
			errs[i] = c.AllReduce(ctx, bufs[i], bufs[i], d)
			took[i] = time.Since(t0)
		})
	}
	wg.Wait()
	var worst time.Duration
	for i, err := range errs {
		if err != nil {
			return 0, fmt.Errorf("peer %d: %w", i, err)
		}
		worst = max(worst, took[i])
	}
	return worst, nil
}

// fill gives peer i's float32 buffer small integers, so that sums are exact, and returns the sums.
func fill(bufs [][]byte) []float32 {
	n := len(bufs[0]) / 4
	want := make([]float32, n)
	for i, b := range bufs {
		v := rings.View[float32](b)
		for j := range v {
			x := float32((i*7 + j) % 251)
			v[j] = x
			want[j] += x
		}
	}
	return want
}

// measure times --reps AllReduces of the configured size with pool size k, one after the other on
// the same connections, and checks every element of each.
func (b *bench) measure(name string, secret []byte, port, k int, capped, even bool) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), b.o.timeout)
	defer cancel()
	g, err := b.connect(ctx, name, secret, port, k, capped, even)
	if err != nil {
		return nil, err
	}
	defer g.close()
	bufs := make([][]byte, b.o.peers)
	for i := range bufs {
		bufs[i] = make([]byte, b.o.size/4*4)
	}
	fill(bufs)
	if _, err := allReduce(ctx, g, bufs, pccl.Desc{Tag: 1, Count: len(bufs[0]) / 4, DType: pccl.F32, Op: pccl.Sum}); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	var ts []time.Duration
	for r := range b.o.reps {
		want := fill(bufs)
		fmt.Fprintf(os.Stderr, "wan: %s k=%d: timing (%d of %d)\n", name, k, r+1, b.o.reps)
		t, err := allReduce(ctx, g, bufs, pccl.Desc{Tag: 2, Count: len(want), DType: pccl.F32, Op: pccl.Sum})
		if err != nil {
			return nil, err
		}
		for i, buf := range bufs {
			for j, x := range rings.View[float32](buf) {
				if x != want[j] {
					return nil, fmt.Errorf("peer %d element %d is %v, want %v", i, j, x, want[j])
				}
			}
		}
		ts = append(ts, t)
	}
	return ts, nil
}

// quantized runs one MinMaxU8Both AllReduce over tcp with the capped-k pool, and fills in the wire
// ratio, whether every peer holds the same bytes, and the largest error against the exact sum.
func (b *bench) quantized(res *result, secret []byte, port int) error {
	n := b.o.size / 4
	opt := rings.Options{PartBytes: b.o.partBytes}
	f32, err := rings.SentTraffic(rings.KindAllReduce, n, rings.F32, 0, b.o.peers, opt)
	if err != nil {
		return err
	}
	opt.Quant = rings.MinMaxU8Both
	u8, err := rings.SentTraffic(rings.KindAllReduce, n, rings.F32, 0, b.o.peers, opt)
	if err != nil {
		return err
	}
	res.U8WireRatio = round(float64(u8.OnWire(wire.DataHeaderSize)) / float64(f32.OnWire(wire.DataHeaderSize)))

	ctx, cancel := context.WithTimeout(context.Background(), b.o.timeout)
	defer cancel()
	g, err := b.connect(ctx, "tcp", secret, port, b.o.cappedK, false, false)
	if err != nil {
		return err
	}
	defer g.close()
	bufs := make([][]byte, b.o.peers)
	for i := range bufs {
		bufs[i] = make([]byte, n*4)
	}
	want := fill(bufs)
	if _, err := allReduce(ctx, g, bufs, pccl.Desc{Tag: 3, Count: n, DType: pccl.F32, Op: pccl.Sum, Quant: pccl.MinMaxU8Both}); err != nil {
		return err
	}
	res.U8Identical = true
	for _, buf := range bufs[1:] {
		if !bytes.Equal(buf, bufs[0]) {
			res.U8Identical = false
		}
	}
	var worst float64
	for j, x := range rings.View[float32](bufs[0]) {
		worst = max(worst, math.Abs(float64(x)-float64(want[j])))
	}
	res.U8MaxAbsErr = worst
	return nil
}

// siteTransport makes every socket of a transport inside one site's namespace. With capMbit set, the
// first connection it dials to a port ending in capPort is capped at capMbit by the emulator, as one
// flow on a congested route would be: its sender's congestion control meets the cap end to end.
type siteTransport struct {
	transport.Transport
	ns      *wanemu.Netns
	tb      *wanemu.Testbed
	capMbit float64
	capPort string

	mu     sync.Mutex
	capped bool
}

func (s *siteTransport) Listen(addr string) (ln net.Listener, err error) {
	err = s.ns.Do(func() error {
		ln, err = s.Transport.Listen(addr)
		return err
	})
	return ln, err
}

func (s *siteTransport) Dial(ctx context.Context, addr string) (c net.Conn, err error) {
	err = s.ns.Do(func() error {
		c, err = s.Transport.Dial(ctx, addr)
		return err
	})
	if err != nil || s.capMbit == 0 || !strings.HasSuffix(addr, ":"+s.capPort) {
		return c, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.capped {
		return c, nil
	}
	s.capped = true
	if err := s.tb.CapFlow(flowOf(c), s.capMbit); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// flowOf names the emulator's flow that carries c from its dialling end.
func flowOf(c net.Conn) wanemu.Flow {
	proto := "tcp"
	if _, ok := c.LocalAddr().(*net.UDPAddr); ok {
		proto = "udp"
	}
	src, _ := netip.ParseAddrPort(c.LocalAddr().String())
	dst, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	return wanemu.Flow{Proto: proto, Src: src, Dst: dst}
}

func (s *siteTransport) ListenSession(addr string) (l transport.SessionListener, err error) {
	err = s.ns.Do(func() error {
		l, err = s.Transport.ListenSession(addr)
		return err
	})
	return l, err
}

func (s *siteTransport) DialSession(ctx context.Context, addr string) (ses transport.Session, err error) {
	err = s.ns.Do(func() error {
		ses, err = s.Transport.DialSession(ctx, addr)
		return err
	})
	return ses, err
}
