package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"io"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

var replay = flag.Bool("replay", false, "run TestReplayedLinkHello, which fails until a peer keeps a live link on a replayed LinkHello")

// TestReplayedLinkHello replays, to a peer's port, the LinkHello its ring predecessor sent it, with
// the run's token, as an eavesdropper on a plaintext link would. The live link between the two must
// survive it: the next AllReduce succeeds on both peers. Today the peer admits the replayed hello and
// closes the live connection in its place (pccl/links.go, admit), so the test runs only with -replay;
// the soak's --junk-replay deals the same case.
func TestReplayedLinkHello(t *testing.T) {
	if !*replay {
		t.Skip("a replayed LinkHello still replaces a live link (pccl/links.go admit): run with -replay")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
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
	defer func() { stop(); <-served }()

	dialers := [2]*linkDialer{}
	comms := [2]*pccl.Communicator{}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i := range comms {
		dialers[i] = &linkDialer{Transport: pccl.NewTCP(pccl.TCPConfig{}), master: ln.Addr().String()}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := pccl.Connect(ctx, pccl.Config{Master: ln.Addr().String(), Transport: dialers[i], ListenAddr: "127.0.0.1:0"})
			comms[i] = c
			errs <- err
		}()
		if i == 0 {
			wg.Wait()
		}
	}
	for comms[0] != nil && comms[0].WorldSize() < 2 {
		if err := comms[0].UpdateTopology(ctx); err != nil {
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
	defer comms[0].Close()
	defer comms[1].Close()

	reduce := func(tag uint64) [2]error {
		var out [2]error
		var wg sync.WaitGroup
		for i, c := range comms {
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
						out[i] = errors.New("wrong element")
					}
				}
			}()
		}
		wg.Wait()
		return out
	}
	if errs := reduce(1); errs[0] != nil || errs[1] != nil {
		t.Fatalf("the AllReduce before the replay: %v", errs)
	}

	// What peer 0 sent when it opened its link to peer 1 (the run has no token).
	conn, err := net.Dial("tcp", dialers[1].listening())
	if err != nil {
		t.Fatal(err)
	}
	hello := wire.AppendHandshake(nil, wire.Handshake{Version: wire.Version, Kind: wire.KindData})
	hello = wire.AppendFrame(hello, &wire.LinkHello{From: comms[0].ID(), To: comms[1].ID()})
	conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := conn.Write(hello); err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, conn) // the peer's answer, until it closes or the deadline
	conn.Close()

	if errs := reduce(2); errs[0] != nil || errs[1] != nil {
		t.Fatalf("the AllReduce after a replayed LinkHello failed: peer 0: %v; peer 1: %v", errs[0], errs[1])
	}
}
