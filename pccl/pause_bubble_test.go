package pccl_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/internal/simhook"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// TestBubbleMasterPauseKicksNobody pauses the master's event loop (simhook's Gate, as the simulated
// soak's master-stall does) for 4 s, well past the 1.5 s heartbeat timeout: when it resumes it finds
// its tick late, reads what the peers sent meanwhile, notes the stall and removes nobody; the
// group's next AllReduce is correct.
func TestBubbleMasterPauseKicksNobody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := pccl.NewNetwork()
		ln, err := net.Host("master").Listen(masterAddr)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var notes []string
		srv := master.NewServer(master.ServerConfig{OnEvent: func(e master.Event) {
			mu.Lock()
			notes = append(notes, e.Kind+": "+e.Detail)
			mu.Unlock()
		}})
		gate := simhook.NewGate()
		ctx, stop := context.WithCancel(simhook.WithGate(context.Background(), gate))
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx, ln) }()
		defer func() {
			stop()
			if err := <-done; err != nil {
				t.Errorf("master: %v", err)
			}
		}()

		const n = 3
		hosts := make([]string, n)
		comms := make([]*pccl.Communicator, n)
		defer closeAll(comms)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			hosts[i] = fmt.Sprintf("peer%d", i+1)
			wg.Go(func() {
				comms[i], errs[i] = pccl.Connect(context.Background(), pccl.Config{Master: masterAddr, ListenAddr: hosts[i] + ":9000",
					Transport: net.Host(hosts[i])})
			})
			if i == 0 {
				wg.Wait()
			}
		}
		for len(srv.Snapshot().Peers) < n {
			time.Sleep(time.Millisecond)
		}
		if err := comms[0].UpdateTopology(context.Background()); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}

		gate.Shut()
		time.Sleep(4 * time.Second)
		gate.Open()
		time.Sleep(2 * time.Second)

		mu.Lock()
		all := strings.Join(notes, "\n")
		mu.Unlock()
		// The peers probed the silent master's address meanwhile; it refuses those connections
		// ("held by a live peer") and keeps the peers.
		if strings.Contains(all, "timeout: ") || strings.Contains(all, "left: ") || len(srv.Snapshot().Peers) != n {
			t.Fatalf("the paused master lost a peer (%d left):\n%s", len(srv.Snapshot().Peers), all)
		}
		if !strings.Contains(all, "stall: ") {
			t.Fatalf("the master did not note its stall:\n%s", all)
		}
		bufs, want := inputs(n, 1024, 5)
		errs = each(comms, func(i int, c *pccl.Communicator) error {
			return c.AllReduce(context.Background(), pccl.Bytes(bufs[i]), pccl.Bytes(bufs[i]),
				pccl.Desc{Tag: 1, Count: 1024, DType: pccl.F32, Op: pccl.Sum})
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("peer %d after the pause: %v", i, err)
			}
			checkSum(t, fmt.Sprintf("peer %d", i), bufs[i], want)
		}
	})
}
