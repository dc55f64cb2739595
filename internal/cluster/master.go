package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/concord-ccl/concord/internal/auth"
	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/pccl/master"
)

// RoleMaster is the built-in role that runs a master server; see [Cluster.StartMaster].
const RoleMaster = "master"

// envMasterConfig carries the master's Config, as JSON, to the master role.
const envMasterConfig = "CONCORD_CLUSTER_MASTER_CONFIG"

// ListeningEvent is the line the master role prints once it accepts connections.
type ListeningEvent struct {
	Event  string `json:"event"`            // "listening"
	Addr   string `json:"addr"`             // host:port on 127.0.0.1
	Gossip string `json:"gossip,omitempty"` // where peers join its gossip detector (CONCORD_GOSSIP set)
}

// envMasterAddr carries the address the master role listens on; empty means 127.0.0.1:0.
const envMasterAddr = "CONCORD_CLUSTER_MASTER_ADDR"

// StartMaster starts the master role with cfg, waits until it listens, and returns the child and the
// address peers connect to. It fails if the master does not report its address before ctx is done.
func (c *Cluster) StartMaster(ctx context.Context, cfg master.Config) (*Proc, string, error) {
	return c.StartMasterAt(ctx, cfg, "")
}

// StartMasterAt is StartMaster on a given listen address, host:port (empty: 127.0.0.1 and any free
// port), for instance to restart a master where its peers look for it.
func (c *Cluster) StartMasterAt(ctx context.Context, cfg master.Config, addr string) (*Proc, string, error) {
	return c.StartMasterWith(ctx, cfg, addr, nil)
}

// StartMasterWith is StartMasterAt with the process started by start (see Spec.Start), on a host of
// a test bed, say.
func (c *Cluster) StartMasterWith(ctx context.Context, cfg master.Config, addr string, start func(*exec.Cmd) error) (*Proc, string, error) {
	p, ev, err := c.StartMasterEnv(ctx, cfg, addr, start, nil)
	return p, ev.Addr, err
}

// StartMasterEnv is StartMasterWith with extra environment entries for the master (the master
// command's env twins it reads: CONCORD_TRANSPORT, CONCORD_SECRET, CONCORD_GOSSIP), and returns the
// whole listening event.
func (c *Cluster) StartMasterEnv(ctx context.Context, cfg master.Config, addr string, start func(*exec.Cmd) error,
	extra []string) (*Proc, ListeningEvent, error) {
	var ev ListeningEvent
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, ev, fmt.Errorf("cluster: master config: %w", err)
	}
	env := append([]string{envMasterConfig + "=" + string(js), envMasterAddr + "=" + addr}, extra...)
	p, err := c.Spawn(Spec{Role: RoleMaster, Name: "master", Env: env, Start: start})
	if err != nil {
		return nil, ev, err
	}
	l, err := p.Await(ctx, "listening")
	if err != nil {
		return p, ev, err
	}
	if err := l.Decode(&ev); err != nil {
		return p, ev, err
	}
	return p, ev, nil
}

// masterTransport returns the transport CONCORD_TRANSPORT names (tcp when unset) with the run secret
// of CONCORD_SECRET, the environment twins of the master command's flags.
func masterTransport() (transport.Transport, error) {
	name := os.Getenv("CONCORD_TRANSPORT")
	if name == "" || name == "tcp" {
		return transport.NewTCP(transport.TCPConfig{}), nil
	}
	secret, err := auth.LoadSecret(os.Getenv("CONCORD_SECRET"), "")
	if err != nil {
		return nil, fmt.Errorf("CONCORD_SECRET: %w", err)
	}
	return transport.Select(name, transport.AuthConfig{Secret: secret})
}

// masterMain is the master role: it serves on the address StartMasterAt gave (127.0.0.1:0 by
// default) until SIGTERM, SIGINT or the end of stdin. CONCORD_GOSSIP (host:port), the env twin of the
// master command's --gossip, adds its gossip detector with the LAN preset.
func masterMain() int {
	var cfg master.Config
	if js := os.Getenv(envMasterConfig); js != "" {
		if err := json.Unmarshal([]byte(js), &cfg); err != nil {
			fmt.Fprintf(os.Stderr, "master role: %s: %v\n", envMasterConfig, err)
			return 1
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	addr := os.Getenv(envMasterAddr)
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	tr, err := masterTransport()
	if err != nil {
		fmt.Fprintf(os.Stderr, "master role: %v\n", err)
		return 1
	}
	ln, err := tr.Listen(addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "master role: listen: %v\n", err)
		return 1
	}
	sc := master.ServerConfig{Config: cfg, Logger: Logger()}
	if g := os.Getenv("CONCORD_GOSSIP"); g != "" {
		gc := master.GossipLAN()
		gc.BindAddr = g
		sc.Gossip = &gc
	}
	srv := master.NewServer(sc)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	ev := ListeningEvent{Event: "listening", Addr: ln.Addr().String()}
	if sc.Gossip != nil {
		// Serve starts the gossip member before it accepts anyone.
		gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		ev.Gossip, err = srv.GossipAddr(gctx)
		cancel()
		if err != nil || ev.Gossip == "" {
			fmt.Fprintf(os.Stderr, "master role: gossip: %v\n", err)
			stop()
			<-served
			return 1
		}
	}
	if err := Emit(ev); err != nil {
		fmt.Fprintf(os.Stderr, "master role: %v\n", err)
		stop()
		<-served
		return 1
	}
	if err := <-served; err != nil && ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "master role: serve: %v\n", err)
		return 1
	}
	return 0
}
