package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/concord-ccl/concord/internal/netlab"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/plan"
	"github.com/concord-ccl/concord/rdma/tcp"
)

// degradedNICs is the NIC count of the degraded-fabric measurement: one NIC of four goes down.
const degradedNICs = 4

// degraded measures one site's fabric with one NIC of four down on one node, under the Communicator:
// the --per-site peers of one site, each with four NICs at mbit Mbit/s in a netlab test bed of their
// own, form a group of that one site, whose AllReduce runs whole on the fabric. Two such groups share
// the NICs: one with the planner (the default) and one with Config.SiteHotRepairOnly. The planner's
// group is timed healthy, then both with the last NIC of peer 0 down, each after one untimed
// AllReduce that lets hot repair localize the fault. The model's ideal for the degraded fabric is
// plan.Ideal on the fabric's α and β as rdma.Node.Calibrate measures them before the groups start,
// with the NIC down. It returns the JSON keys.
func (b *bench) degraded(ctx context.Context, mbit float64) (map[string]any, error) {
	lab, err := netlab.New(netlab.Config{Nodes: b.per, NICs: degradedNICs, NICMbit: int(mbit), MTU: b.mtu})
	if err != nil {
		return nil, err
	}
	defer lab.Close()
	// The model's figures come from the fabric itself, measured before the groups start.
	topo, err := calibrateLab(ctx, lab, b.per)
	if err != nil {
		return nil, err
	}
	planned, err := b.siteGroup(ctx, lab, false)
	if err != nil {
		return nil, err
	}
	defer planned.close()
	repaired, err := b.siteGroup(ctx, lab, true)
	if err != nil {
		return nil, err
	}
	defer repaired.close()

	healthy, ok0, err := b.timedSite(ctx, planned, 0)
	if err != nil {
		return nil, fmt.Errorf("one site, healthy: %w", err)
	}
	fmt.Fprintf(os.Stderr, "one site of %d peers on %d NICs, healthy: %.3f s\n", b.per, degradedNICs, healthy)
	if err := lab.SetNIC(0, degradedNICs-1, false); err != nil {
		return nil, err
	}
	sec, ok1, err := b.timedSite(ctx, planned, 1)
	if err != nil {
		return nil, fmt.Errorf("one site, NIC down, planner: %w", err)
	}
	strategy := planned.comms[0].Stats().SitePlan
	for i, c := range planned.comms {
		if s := c.Stats(); s.SitePlan != strategy || s.SitePlanned == 0 {
			return nil, fmt.Errorf("peer %d planned %d calls, the last %q; peer 0 %q", i, s.SitePlanned, s.SitePlan, strategy)
		}
	}
	fmt.Fprintf(os.Stderr, "one site, NIC %d of peer 0 down, planner (%s): %.3f s\n", degradedNICs-1, strategy, sec)
	hr, ok2, err := b.timedSite(ctx, repaired, 1)
	if err != nil {
		return nil, fmt.Errorf("one site, NIC down, hot repair only: %w", err)
	}
	for i, c := range repaired.comms {
		if n := c.Stats().SitePlanned; n != 0 {
			return nil, fmt.Errorf("peer %d of the hot-repair group planned %d calls", i, n)
		}
	}
	fmt.Fprintf(os.Stderr, "one site, NIC down, hot repair only: %.3f s\n", hr)

	idealHealthy, err := plan.Ideal(topo, float64(b.size))
	if err != nil {
		return nil, err
	}
	ideal, err := plan.Ideal(topo.WithNICDown(0, degradedNICs-1, true), float64(b.size))
	if err != nil {
		return nil, err
	}
	vsIdeal, vsHR := sec/ideal, sec/hr
	return map[string]any{
		"nic_degraded_nics":                 degradedNICs,
		"nic_degraded_nic_mbit":             mbit,
		"nic_calibrated_mbit":               calibratedMbit(topo),
		"nic_healthy_seconds":               healthy,
		"nic_healthy_ideal_seconds":         idealHealthy,
		"nic_degraded_seconds":              sec,
		"nic_degraded_strategy":             strategy,
		"nic_degraded_hot_repair_seconds":   hr,
		"nic_degraded_ideal_seconds":        ideal,
		"nic_degraded_correct":              ok0 && ok1 && ok2,
		"nic_degraded_vs_ideal":             vsIdeal,
		"nic_degraded_vs_hot_repair":        vsHR,
		"nic_degraded_retention":            healthy / sec,
		"nic_degraded_hot_repair_retention": healthy / hr,
	}, nil
}

// calibrateLab measures every NIC of lab's nodes (rdma.Node.Calibrate, on rdma/tcp endpoints in the
// nodes' namespaces, one ring of all of them) and returns the model's topology of the healthy fabric
// with the measured α and β.
func calibrateLab(ctx context.Context, lab *netlab.Lab, nodes int) (plan.Topology, error) {
	ring := make([]rdma.NodeID, nodes)
	nics := make([][]tcp.NICConfig, nodes)
	var names []string
	for r := range degradedNICs {
		names = append(names, netlab.NICName(r))
	}
	for i := range nodes {
		ring[i] = rdma.NodeID(i + 1)
		path := lab.Node(i).Path()
		err := tcp.InNetNS(path, func() error {
			var err error
			nics[i], err = tcp.HostNICs(names...)
			return err
		})
		if err == nil {
			err = tcp.ReservePorts(path, nics[i])
		}
		if err != nil {
			return plan.Topology{}, err
		}
	}
	rnodes := make([]*rdma.Node, nodes)
	for i := range nodes {
		peers := map[rdma.NodeID][]netip.AddrPort{}
		for j := range nodes {
			if j != i {
				for _, n := range nics[j] {
					peers[ring[j]] = append(peers[ring[j]], netip.AddrPortFrom(n.Addr, n.Port))
				}
			}
		}
		ep, err := tcp.Listen(tcp.Config{Node: ring[i], NICs: nics[i], Peers: peers, NetNS: lab.Node(i).Path()})
		if err != nil {
			return plan.Topology{}, err
		}
		defer ep.Close()
		if rnodes[i], err = rdma.NewNode(ep, ring, rdma.Config{Repair: rdma.RepairConfig{MinAckTimeout: 5 * time.Second,
			MaxAckTimeout: 10 * time.Second, ProbeTimeout: 2 * time.Second, StallTimeout: 20 * time.Second}}); err != nil {
			return plan.Topology{}, err
		}
	}
	cals := make([]rdma.Calibration, nodes)
	errs := make([]error, nodes)
	var wg sync.WaitGroup
	for i, n := range rnodes {
		wg.Go(func() { cals[i], errs[i] = n.Calibrate(ctx, rdma.CalibrateConfig{Bytes: 1 << 20, Reps: 2}) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return plan.Topology{}, fmt.Errorf("calibrating the fabric: %w", err)
	}
	base := plan.Uniform(nodes, degradedNICs, 1, 0, 1)
	base.GPUsPerNode = 1
	return cals[0].Apply(base), nil
}

// calibratedMbit returns the mean measured rate of t's NICs in Mbit/s.
func calibratedMbit(t plan.Topology) float64 {
	sum, n := 0.0, 0
	for _, nd := range t.Nodes {
		for _, nic := range nd.NICs {
			sum += nic.Bandwidth()
			n++
		}
	}
	return sum / float64(n) * 8 / 1e6
}

// siteGroup starts a master on loopback and --per-site peers of one site whose NICs are lab's, and
// admits them; with hotRepairOnly their fabric never plans.
func (b *bench) siteGroup(ctx context.Context, lab *netlab.Lab, hotRepairOnly bool) (*group, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &group{name: "site", srv: master.NewServer(master.ServerConfig{}), comms: make([]*pccl.Communicator, b.per)}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- g.srv.Serve(sctx, ln) }()
	g.stop = func() { stop(); <-served }
	connect := func(i int) error {
		cfg := pccl.Config{Master: ln.Addr().String(), ListenAddr: "127.0.0.1:0", PoolSize: 2, ProgressTimeout: time.Minute,
			Site: "site0", NICNetNS: lab.Node(i).Path(), SiteHotRepairOnly: hotRepairOnly}
		for r := range degradedNICs {
			cfg.NICs = append(cfg.NICs, netlab.NICName(r))
		}
		var err error
		g.comms[i], err = pccl.Connect(ctx, cfg)
		return err
	}
	if err := connect(0); err != nil {
		g.close()
		return nil, err
	}
	errs := make(chan error, b.per)
	for i := 1; i < b.per; i++ {
		go func() { errs <- connect(i) }()
	}
	for len(g.srv.Snapshot().Peers) < b.per {
		time.Sleep(time.Millisecond)
	}
	err = g.comms[0].UpdateTopology(ctx)
	for i := 1; i < b.per; i++ {
		err = errors.Join(err, <-errs)
	}
	if err != nil {
		g.close()
		return nil, err
	}
	return g, nil
}

// timedSite runs warm untimed AllReduces, then iters timed ones, on g and returns the median seconds
// and whether every element of every result was right and every peer's result the same bytes. Every
// AllReduce must have run on the fabric.
func (b *bench) timedSite(ctx context.Context, g *group, warm int) (float64, bool, error) {
	n := len(g.comms)
	in := make([][]float32, n)
	want := make([]float32, b.size/4)
	for i := range in {
		in[i] = b.input(i + 200)
		for k, v := range in[i] {
			want[k] += v
		}
	}
	recv := make([][]float32, n)
	for i := range recv {
		recv[i] = make([]float32, b.size/4)
	}
	before := g.comms[0].Stats().SiteCollectives
	var secs []float64
	ok := true
	for it := range warm + b.iters {
		t0 := time.Now()
		err := all(g.comms, func(i int, c *pccl.Communicator) error {
			return c.AllReduce(ctx, pccl.Bytes(in[i]), pccl.Bytes(recv[i]), pccl.Desc{Tag: 5, Count: b.size / 4, DType: pccl.F32, Op: pccl.Sum})
		})
		if err != nil {
			return 0, false, err
		}
		if it >= warm {
			secs = append(secs, time.Since(t0).Seconds())
		}
		for i := range recv {
			if !slices.Equal(recv[i], want) || !bytes.Equal(pccl.Bytes(recv[i]), pccl.Bytes(recv[0])) {
				ok = false
			}
		}
	}
	if got := g.comms[0].Stats().SiteCollectives - before; got != uint64(warm+b.iters) {
		return 0, false, fmt.Errorf("%d of %d AllReduces ran on the fabric", got, warm+b.iters)
	}
	sort.Float64s(secs)
	return secs[len(secs)/2], ok, nil
}
