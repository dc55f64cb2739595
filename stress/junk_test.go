package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// pair is two peers in one ring under a master of this process, with the addresses they listen on.
type pair struct {
	comms   [2]*pccl.Communicator
	dialers [2]*linkDialer
}

// newPair starts a master and two peers in one ring; everything stops at the test's end.
func newPair(t *testing.T, ctx context.Context) *pair {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mcfg := master.LAN()
	mcfg.MinPeers = 2
	srv := master.NewServer(master.ServerConfig{Config: mcfg})
	served := make(chan error, 1)
	sctx, stop := context.WithCancel(ctx)
	go func() { served <- srv.Serve(sctx, ln) }()
	t.Cleanup(func() { stop(); <-served })

	p := &pair{}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i := range p.comms {
		p.dialers[i] = &linkDialer{Transport: pccl.NewTCP(pccl.TCPConfig{}), master: ln.Addr().String()}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := pccl.Connect(ctx, pccl.Config{Master: ln.Addr().String(), Transport: p.dialers[i], ListenAddr: "127.0.0.1:0"})
			p.comms[i] = c
			errs <- err
		}()
		if i == 0 {
			wg.Wait()
		}
	}
	for p.comms[0] != nil && p.comms[0].WorldSize() < 2 {
		if err := p.comms[0].UpdateTopology(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { p.comms[0].Close(); p.comms[1].Close() })
	return p
}

// reduce runs one AllReduce on both peers and checks every element; it returns each peer's error.
func (p *pair) reduce(ctx context.Context, tag uint64) [2]error {
	var out [2]error
	var wg sync.WaitGroup
	for i, c := range p.comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4*1024)
			for k := 0; k < 1024; k++ {
				binary.LittleEndian.PutUint32(buf[4*k:], math.Float32bits(float32(k+i)))
			}
			out[i] = c.AllReduce(ctx, buf, buf, pccl.Desc{Tag: tag, Count: 1024, DType: pccl.F32, Op: pccl.Sum})
			for k := 0; k < 1024 && out[i] == nil; k++ {
				if got := math.Float32frombits(binary.LittleEndian.Uint32(buf[4*k:])); got != float32(2*k+1) {
					out[i] = fmt.Errorf("element %d = %v, want %v", k, got, float32(2*k+1))
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// TestPeerPortJunk sends each case of the soak's junk to both peers' ports, one at a time, each
// followed by an AllReduce that must succeed on both: junk harms no live link.
func TestPeerPortJunk(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := newPair(t, ctx)
	if errs := p.reduce(ctx, 1); errs[0] != nil || errs[1] != nil {
		t.Fatalf("the AllReduce before the junk: %v", errs)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	tag := uint64(2)
	for k := range peerJunkCases {
		for to := range p.comms {
			target := junkTarget{addr: p.dialers[to].listening(), id: p.comms[to].ID(), pred: p.comms[1-to].ID()}
			c, err := net.Dial("tcp", target.addr)
			if err != nil {
				t.Fatal(err)
			}
			sendJunk(c, junkPayload(k, target, rng), 300*time.Millisecond)
			if errs := p.reduce(ctx, tag); errs[0] != nil || errs[1] != nil {
				t.Fatalf("junk case %d to peer %d broke the next AllReduce: peer 0: %v; peer 1: %v", k, to, errs[0], errs[1])
			}
			tag++
		}
	}
}

// TestReplayedLinkHello replays, to a peer's port, the LinkHello its ring predecessor sent it, with
// the run's token, as an eavesdropper on a plaintext link would. The live link between the two must
// survive it: the next AllReduce succeeds on both peers (the peer keeps the live connection as a
// spare of the slot the replay takes, pccl/internal/links). The soak's junk faults deal the same case.
func TestReplayedLinkHello(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := newPair(t, ctx)
	if errs := p.reduce(ctx, 1); errs[0] != nil || errs[1] != nil {
		t.Fatalf("the AllReduce before the replay: %v", errs)
	}
	target := junkTarget{addr: p.dialers[1].listening(), id: p.comms[1].ID(), pred: p.comms[0].ID()}
	c, err := net.Dial("tcp", target.addr)
	if err != nil {
		t.Fatal(err)
	}
	sendJunk(c, junkPayload(peerJunkCases, target, nil), 500*time.Millisecond)
	if errs := p.reduce(ctx, 2); errs[0] != nil || errs[1] != nil {
		t.Fatalf("the AllReduce after a replayed LinkHello failed: peer 0: %v; peer 1: %v", errs[0], errs[1])
	}
}
