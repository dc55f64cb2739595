package pccl_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// TestGossipDeclaresHungPeerDead hangs one of three peers (its links and its master connection
// black-holed, which keeps the connection open, and its gossip member deaf and mute). The master's
// heartbeat timeout and the data path's progress deadline are far away, so only gossip can find it:
// the master kicks it within the LAN preset's bound and the survivors' collective fails with
// ErrPeerLeft.
func TestGossipDeclaresHungPeerDead(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nw := pccl.NewNetwork()
	ln, err := nw.Host("master").Listen("master:7000")
	if err != nil {
		t.Fatal(err)
	}
	gcfg := master.GossipLAN()
	srv := master.NewServer(master.ServerConfig{
		Config: master.Config{HeartbeatInterval: 50 * time.Millisecond, HeartbeatTimeout: 10 * time.Minute},
		Gossip: &gcfg,
	})
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, ln) }()
	defer func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("master: %v", err)
		}
	}()
	join, err := srv.GossipAddr(ctx)
	if err != nil || join == "" {
		t.Fatalf("gossip address %q: %v", join, err)
	}
	hosts := []string{"peer1", "peer2", "peer3"}
	connect := func(host string) (*pccl.Communicator, error) {
		return pccl.Connect(ctx, pccl.Config{Master: "master:7000", ListenAddr: host + ":9000",
			Transport: nw.Host(host), PartBytes: 4096, ProgressTimeout: 10 * time.Minute,
			GossipJoin: join, Gossip: pccl.GossipLAN()})
	}
	comms := make([]*pccl.Communicator, 3)
	if comms[0], err = connect(hosts[0]); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range comms {
			if c != nil {
				c.Close()
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := 1; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			comms[i], errs[i] = connect(hosts[i])
		}()
	}
	for len(srv.Snapshot().Peers) < 3 {
		time.Sleep(2 * time.Millisecond)
	}
	if err := comms[0].UpdateTopology(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}

	hung := comms[1]
	for _, other := range []string{"master", hosts[0], hosts[2]} {
		nw.Partition(hosts[1], other)
	}
	hung.PauseGossipForTest(true)
	hungAt := time.Now()
	for _, i := range []int{0, 2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := make([]float32, 1<<12)
			errs[i] = comms[i].AllReduce(ctx, pccl.Bytes(v), pccl.Bytes(v), pccl.Desc{Tag: 2, Count: len(v), DType: pccl.F32, Op: pccl.Sum})
		}()
	}
	wg.Wait()
	took := time.Since(hungAt)
	for _, i := range []int{0, 2} {
		if !errors.Is(errs[i], pccl.ErrPeerLeft) {
			t.Fatalf("peer %d: %v, want ErrPeerLeft", i, errs[i])
		}
	}
	t.Logf("hung peer aborted after %v (LAN bound for 4 members: %v)", took, gcfg.Bound(4))
	// Four members: the master and three peers. Slack covers scheduling under the race detector.
	if bound := gcfg.Bound(4); took > bound+2*time.Second {
		t.Errorf("aborted %v after the hang, want within the LAN bound %v", took, bound)
	}
	var verdict bool
	for _, e := range srv.Snapshot().Events {
		verdict = verdict || (e.Kind == "kicked" && e.Peer == hung.ID() && strings.Contains(e.Detail, "declared dead by gossip"))
	}
	if !verdict {
		t.Fatalf("no gossip kick of peer %d in the master's events", hung.ID())
	}
	for _, other := range []string{"master", hosts[0], hosts[2]} {
		nw.Heal(hosts[1], other)
	}
}
