package pccl_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// The retry pattern: when a peer dies, every survivor's AllReduce fails with ErrPeerLeft and leaves
// its buffers unchanged; the survivors call UpdateTopology, which re-wires the ring without the dead
// peer, and retry the same call.
func ExampleCommunicator_AllReduce() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A master and three peers on an in-memory network (TCP works the same way).
	netw := pccl.NewNetwork()
	ln, _ := netw.Host("master").Listen("master:1")
	srv := master.NewServer(master.ServerConfig{})
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, ln) }()
	defer func() { stop(); <-served }()
	connect := func(host string) *pccl.Communicator {
		c, err := pccl.Connect(ctx, pccl.Config{Master: "master:1", ListenAddr: host + ":1", Transport: netw.Host(host)})
		if err != nil {
			panic(err)
		}
		return c
	}
	first := connect("a")
	comms := []*pccl.Communicator{first}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, h := range []string{"b", "c"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := connect(h)
			mu.Lock()
			comms = append(comms, c)
			mu.Unlock()
		}()
	}
	for len(srv.Snapshot().Peers) < 3 {
		time.Sleep(time.Millisecond)
	}
	first.UpdateTopology(ctx) // the first peer admits the other two
	wg.Wait()

	// Peer "c" dies: its host crashes, every connection of it resets.
	netw.Crash("c")

	results := make([]string, len(comms))
	for i, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			grads := []float32{1, 2, 3}
			desc := pccl.Desc{Tag: 1, Count: len(grads), DType: pccl.F32, Op: pccl.Sum}
			retried := false
			for {
				err := c.AllReduce(ctx, pccl.Bytes(grads), pccl.Bytes(grads), desc)
				if errors.Is(err, pccl.ErrPeerLeft) {
					// grads is exactly as before the call: re-wire and retry.
					if err := c.UpdateTopology(ctx); err != nil {
						results[i] = "dead"
						return
					}
					retried = true
					continue
				}
				if err != nil {
					results[i] = "dead" // the crashed peer itself has lost the master
					return
				}
				results[i] = fmt.Sprintf("retried=%v world=%d sum=%v", retried, c.WorldSize(), grads)
				return
			}
		}()
	}
	wg.Wait()
	for _, r := range results {
		if r != "dead" {
			fmt.Println(r)
		}
	}
	for _, c := range comms {
		c.Close()
	}
	// Output:
	// retried=true world=2 sum=[2 4 6]
	// retried=true world=2 sum=[2 4 6]
}
