package pccl_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// group is a master and peers on one in-memory network, the harness of every test that does not put
// the kernel under test. Such a test runs in a synctest bubble (bubbled, or synctest.Test for one
// that measures the bubble's clock): time is the bubble's fake clock, so link latency and bandwidth
// are exact and nothing depends on the machine's load.
type group struct {
	t      *testing.T
	net    *pccl.Network
	addr   string
	srv    *master.Server
	cancel context.CancelFunc
	done   chan error
	stop   sync.Once
	n      int
	hosts  []string       // every host admitted, in order
	part   int            // Config.PartBytes of every peer; 0: 4096
	parts  map[string]int // Config.PartBytes by host, where not part
}

// masterAddr is the master's address on a group's network.
const masterAddr = "master:7000"

// newGroup starts a master with cfg; it stops when the test ends, or at close.
func newGroup(t *testing.T, cfg master.Config) *group {
	t.Helper()
	g := &group{t: t, net: pccl.NewNetwork(), addr: masterAddr, done: make(chan error, 1)}
	ln, err := g.net.Host("master").Listen(g.addr)
	if err != nil {
		t.Fatal(err)
	}
	g.srv = master.NewServer(master.ServerConfig{Config: cfg})
	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	go func() { g.done <- g.srv.Serve(ctx, ln) }()
	t.Cleanup(g.close)
	return g
}

// newBubble is newGroup with the default master and 16 KiB parts, for tests whose links have latency
// and bandwidth.
func newBubble(t *testing.T) *group {
	t.Helper()
	g := newGroup(t, master.Config{})
	g.part = 16 << 10
	return g
}

// close stops the master; every communicator must be closed before.
func (g *group) close() {
	g.stop.Do(func() {
		g.cancel()
		if err := <-g.done; err != nil {
			g.t.Errorf("master: %v", err)
		}
	})
}

// host returns the name of the next peer host.
func (g *group) host() string {
	g.n++
	return fmt.Sprintf("peer%d", g.n)
}

// config is the Config of a peer on host.
func (g *group) config(host string) pccl.Config {
	return pccl.Config{
		Master:     g.addr,
		ListenAddr: host + ":9000",
		Transport:  g.net.Host(host),
		PartBytes:  cmp.Or(g.parts[host], g.part, 4096),
	}
}

func (g *group) connect(ctx context.Context, host string) (*pccl.Communicator, error) {
	return pccl.Connect(ctx, g.config(host))
}

// admit connects a peer on each host, peer i's Config passed through edit (if not nil) first: the
// first is accepted alone, the rest through one UpdateTopology once every one registered.
func (g *group) admit(ctx context.Context, hosts []string, edit func(i int, cfg *pccl.Config)) []*pccl.Communicator {
	g.t.Helper()
	before := len(g.srv.Snapshot().Peers)
	g.hosts = append(g.hosts, hosts...)
	comms := make([]*pccl.Communicator, len(hosts))
	errs := make([]error, len(hosts))
	connect := func(i int) {
		cfg := g.config(hosts[i])
		if edit != nil {
			edit(i, &cfg)
		}
		comms[i], errs[i] = pccl.Connect(ctx, cfg)
	}
	connect(0)
	if errs[0] != nil {
		g.t.Fatal(errs[0])
	}
	var wg sync.WaitGroup
	for i := 1; i < len(hosts); i++ {
		wg.Go(func() { connect(i) })
	}
	for deadline := time.Now().Add(10 * time.Second); len(g.srv.Snapshot().Peers) < before+len(hosts); {
		if time.Now().After(deadline) {
			g.t.Fatal("peers did not register")
		}
		time.Sleep(time.Millisecond) // in a bubble, the fake clock: other goroutines run meanwhile
	}
	if err := comms[0].UpdateTopology(ctx); err != nil {
		g.t.Fatal(err)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			closeAll(comms)
			g.t.Fatalf("peer %d on %s: %v", i, hosts[i], err)
		}
	}
	return comms
}

// start connects n peers and admits them; every one must see a world of n.
func (g *group) start(ctx context.Context, n int) ([]*pccl.Communicator, []string) {
	g.t.Helper()
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = g.host()
	}
	comms := g.admit(ctx, hosts, nil)
	for _, c := range comms {
		if c.WorldSize() != n {
			g.t.Fatalf("world size %d, want %d", c.WorldSize(), n)
		}
	}
	return comms, hosts
}

// link gives every pair of the hosts admitted so far and of more the link config link(from, to).
func (g *group) link(more []string, link func(from, to int) pccl.LinkConfig) {
	all := append(slices.Clone(g.hosts), more...)
	for i, from := range all {
		for j, to := range all {
			if i != j {
				g.net.SetLink(from, to, link(i, j))
			}
		}
	}
}

// startLinked connects n peers whose links all have the given latency and bandwidth, and admits them.
func (g *group) startLinked(ctx context.Context, n int, link pccl.LinkConfig) []*pccl.Communicator {
	g.t.Helper()
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = g.host()
	}
	g.link(hosts, func(int, int) pccl.LinkConfig { return link })
	return g.admit(ctx, hosts, nil)
}

// each runs f for every communicator at once and returns the errors by index.
func each(comms []*pccl.Communicator, f func(i int, c *pccl.Communicator) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i, c)
		}()
	}
	wg.Wait()
	return errs
}

func closeAll(comms []*pccl.Communicator) {
	for _, c := range comms {
		if c != nil {
			c.Close()
		}
	}
}

// bubbled runs f in a synctest bubble: time is the bubble's clock, and part runs the parts of f in
// place, since t.Run may not be called there.
func bubbled(t *testing.T, f func(t *testing.T)) {
	synctest.Test(t, func(t *testing.T) {
		inBubble.Store(t, true)
		defer inBubble.Delete(t)
		f(t)
	})
}

// inBubble holds the *testing.T of every test that bubbled runs now.
var inBubble sync.Map

// part runs f as the part of t called name: a subtest, or in a bubble, in place after a line that
// names it in the test's log.
func part(t *testing.T, name string, f func(t *testing.T)) {
	t.Helper()
	if _, ok := inBubble.Load(t); ok {
		t.Logf("%s:", name)
		f(t)
		return
	}
	t.Run(name, f)
}
