package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime/pprof"
	"sync"

	"github.com/concord-ccl/concord/internal/simhook"
	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/pccl/master"
)

// Host names and the master's address on the simulated network.
const (
	MasterHost = "master"
	MasterAddr = MasterHost + ":7000"
)

// Label keys of the goroutines of the simulated processes (runtime/pprof labels): every goroutine a
// peer session starts carries its session's key, so that a leak is found by counting them.
const (
	labelRole    = "sim.role"
	labelSession = "sim.session"
)

// Cluster is a master and peers on one in-memory network, all inside one testing/synctest bubble:
// their real code, on the bubble's clock. Every link takes the latency and bandwidth its two hosts'
// sites have in the topology, unless a fault changed it.
//
// A Cluster and everything it hands out must be used inside the bubble that created it. Its methods
// are safe for concurrent use.
type Cluster struct {
	Net  *transport.Network
	topo Topology
	mcfg master.Config

	mu     sync.Mutex
	site   map[string]int // host -> site; guarded by mu (read by the network's link default)
	master *masterProc    // guarded by mu

	// OnMasterEvent, if set before the master starts, receives every event the master notes, on
	// its event loop.
	OnMasterEvent func(master.Event)
	// Planted names the bugs every master started from now on plants (simhook.WithPlanted).
	Planted []string
}

// masterProc is one start of the master.
type masterProc struct {
	srv  *master.Server
	gate *simhook.Gate
	stop context.CancelFunc
	done chan error
}

// NewCluster returns a cluster with no master and no peer on topo.
func NewCluster(topo Topology, mcfg master.Config) (*Cluster, error) {
	if err := topo.Validate(); err != nil {
		return nil, err
	}
	if err := mcfg.Validate(); err != nil {
		return nil, err
	}
	c := &Cluster{Net: transport.NewNetwork(), topo: topo, mcfg: mcfg, site: map[string]int{MasterHost: topo.MasterSite}}
	c.Net.SetLinkDefault(func(from, to string) transport.LinkConfig { return c.BaseLink(from, to) })
	return c, nil
}

// Topology returns the cluster's topology.
func (c *Cluster) Topology() Topology { return c.topo }

// Place puts host in site; its links made from now on take that site's latencies.
func (c *Cluster) Place(host string, site int) {
	c.mu.Lock()
	c.site[host] = site
	c.mu.Unlock()
}

// SiteOf returns the site of host, and whether it was placed.
func (c *Cluster) SiteOf(host string) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.site[host]
	return s, ok
}

// BaseLink returns the config the topology gives the link from host a to host b. A host that was
// not placed is in the master's site.
func (c *Cluster) BaseLink(a, b string) transport.LinkConfig {
	c.mu.Lock()
	sa, oka := c.site[a]
	sb, okb := c.site[b]
	c.mu.Unlock()
	if !oka {
		sa = c.topo.MasterSite
	}
	if !okb {
		sb = c.topo.MasterSite
	}
	return c.topo.Link(sa, sb)
}

// ResetLink gives the link from a to b its config from the topology again.
func (c *Cluster) ResetLink(a, b string) { c.Net.SetLink(a, b, c.BaseLink(a, b)) }

// StartMaster starts a master at MasterAddr with the given incarnation (0: drawn by the server). It
// fails if one runs.
func (c *Cluster) StartMaster(incarnation uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.master != nil {
		return errors.New("sim: a master runs already")
	}
	ln, err := c.Net.Host(MasterHost).Listen(MasterAddr)
	if err != nil {
		return fmt.Errorf("sim: master: %w", err)
	}
	cfg := c.mcfg
	cfg.Incarnation = incarnation
	m := &masterProc{srv: master.NewServer(master.ServerConfig{Config: cfg, OnEvent: c.OnMasterEvent}), gate: simhook.NewGate(),
		done: make(chan error, 1)}
	ctx := simhook.WithGate(context.Background(), m.gate)
	if len(c.Planted) > 0 {
		ctx = simhook.WithPlanted(ctx, c.Planted...)
	}
	ctx, stop := context.WithCancel(ctx)
	m.stop = stop
	go pprof.Do(ctx, pprof.Labels(labelRole, "master"), func(ctx context.Context) { m.done <- m.srv.Serve(ctx, ln) })
	c.master = m
	return nil
}

// KillMaster kills the master as a SIGKILL would: every connection to it is reset at once, then its
// goroutines are stopped. It returns once they have.
func (c *Cluster) KillMaster() error {
	c.mu.Lock()
	m := c.master
	c.master = nil
	c.mu.Unlock()
	if m == nil {
		return nil
	}
	c.Net.Crash(MasterHost)
	m.gate.Open()
	m.stop()
	return <-m.done
}

// StopMaster ends the master as a clean shutdown does.
func (c *Cluster) StopMaster() error {
	c.mu.Lock()
	m := c.master
	c.master = nil
	c.mu.Unlock()
	if m == nil {
		return nil
	}
	m.gate.Open()
	m.stop()
	return <-m.done
}

// PauseMaster pauses the master's event loop until ResumeMaster, as a SIGSTOP would (the network
// still delivers what peers send it; it reads it on resuming).
func (c *Cluster) PauseMaster() {
	if m := c.masterProc(); m != nil {
		m.gate.Shut()
	}
}

// ResumeMaster ends a PauseMaster.
func (c *Cluster) ResumeMaster() {
	if m := c.masterProc(); m != nil {
		m.gate.Open()
	}
}

// Master returns the running master's server, or nil.
func (c *Cluster) Master() *master.Server {
	if m := c.masterProc(); m != nil {
		return m.srv
	}
	return nil
}

func (c *Cluster) masterProc() *masterProc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.master
}

// errDead is what a dead process's dials and listens fail with.
var errDead = errors.New("sim: the process is dead")

// procTransport is the transport of one simulated process: its host's, until the process is killed;
// from then on it opens nothing, so that goroutines of a killed process that have not noticed yet
// cannot reach anyone (the crash has already reset every connection they held).
type procTransport struct {
	transport.Transport
	dead chan struct{}
	once sync.Once
}

func newProcTransport(t transport.Transport) *procTransport {
	return &procTransport{Transport: t, dead: make(chan struct{})}
}

func (t *procTransport) kill() { t.once.Do(func() { close(t.dead) }) }

func (t *procTransport) isDead() bool {
	select {
	case <-t.dead:
		return true
	default:
		return false
	}
}

func (t *procTransport) Listen(addr string) (net.Listener, error) {
	if t.isDead() {
		return nil, errDead
	}
	return t.Transport.Listen(addr)
}

func (t *procTransport) Dial(ctx context.Context, addr string) (net.Conn, error) {
	if t.isDead() {
		return nil, errDead
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // a kill ends a dial that hangs (a partition)
		select {
		case <-t.dead:
			cancel()
		case <-ctx.Done():
		}
	}()
	conn, err := t.Transport.Dial(ctx, addr)
	if err == nil && t.isDead() {
		conn.Close()
		return nil, errDead
	}
	return conn, err
}

func (t *procTransport) ListenSession(addr string) (transport.SessionListener, error) {
	if t.isDead() {
		return nil, errDead
	}
	return t.Transport.ListenSession(addr)
}

func (t *procTransport) DialSession(ctx context.Context, addr string) (transport.Session, error) {
	if t.isDead() {
		return nil, errDead
	}
	return t.Transport.DialSession(ctx, addr)
}
