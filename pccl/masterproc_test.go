package pccl_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/rings"
	"github.com/concord-ccl/concord/sharedstate"
)

// lockedBuffer collects the children's stderr for a failure report.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// procGroup is a master in a child process and peers in this process, over loopback TCP.
type procGroup struct {
	t      *testing.T
	c      *cluster.Cluster
	logs   *lockedBuffer
	master *cluster.Proc
	addr   string
}

func newProcGroup(ctx context.Context, t *testing.T, cfg master.Config) *procGroup {
	t.Helper()
	return newProcGroupEnv(ctx, t, cfg, nil)
}

// newProcGroupEnv is newProcGroup with env added to the master's environment (CONCORD_TRANSPORT and
// CONCORD_SECRET choose its transport).
func newProcGroupEnv(ctx context.Context, t *testing.T, cfg master.Config, env []string) *procGroup {
	t.Helper()
	g := &procGroup{t: t, logs: &lockedBuffer{}}
	g.c = cluster.New(cluster.Config{Stderr: g.logs, Env: env})
	t.Cleanup(func() {
		if err := g.c.Close(); err != nil {
			t.Errorf("cluster: %v", err)
		}
	})
	var err error
	if g.master, g.addr, err = g.c.StartMaster(ctx, cfg); err != nil {
		t.Fatalf("start master: %v\n%s", err, g.logs)
	}
	return g
}

// connect connects n peers and admits them all; it closes them at the end of the test.
func (g *procGroup) connect(ctx context.Context, n int, cfg pccl.Config) []*pccl.Communicator {
	g.t.Helper()
	cfg.Master = g.addr
	return admitEach(ctx, g.t, n, func() (*pccl.Communicator, error) { return pccl.Connect(ctx, cfg) })
}

// admitEach connects n peers with connect, one at a time: every peer accepted so far calls
// UpdateTopology until the newcomer's Connect returns. The communicators are closed at the end of the
// test.
func admitEach(ctx context.Context, t *testing.T, n int, connect func() (*pccl.Communicator, error)) []*pccl.Communicator {
	t.Helper()
	var comms []*pccl.Communicator
	t.Cleanup(func() { closeAll(comms) })
	first, err := connect()
	if err != nil {
		t.Fatal(err)
	}
	comms = append(comms, first)
	for len(comms) < n {
		type result struct {
			c   *pccl.Communicator
			err error
		}
		joined := make(chan result, 1)
		go func() {
			c, err := connect()
			joined <- result{c, err}
		}()
		for {
			// Once the ring holds the newcomer, its Connect returns: wait for it, and vote no more
			// without it.
			admitted := comms[0].WorldSize() > len(comms)
			var r result
			if admitted {
				select {
				case r = <-joined:
				case <-ctx.Done():
					t.Fatalf("peer %d not admitted: %v", len(comms), ctx.Err())
				}
			} else {
				select {
				case r = <-joined:
				case <-ctx.Done():
					t.Fatalf("peer %d not admitted: %v", len(comms), ctx.Err())
				default:
					// Admit it if it registered; the vote returns at once when nobody waits.
					for i, err := range each(comms, func(_ int, c *pccl.Communicator) error { return c.UpdateTopology(ctx) }) {
						if err != nil {
							t.Fatalf("peer %d: update topology: %v", i, err)
						}
					}
					continue
				}
			}
			if r.err != nil {
				t.Fatalf("peer %d: %v", len(comms), r.err)
			}
			comms = append(comms, r.c)
			break
		}
	}
	// Everyone leaves the admission at the same ring.
	for i, c := range comms {
		if c.WorldSize() != n {
			t.Fatalf("peer %d: world size %d, want %d", i, c.WorldSize(), n)
		}
	}
	return comms
}

// checkedLoop has every communicator run ops AllReduces of its index+1 (tag 1, I64 sum) and check each
// result. Before op pauseAt, peer 0 calls pause and waits for it to return. It returns each peer's
// first error.
func checkedLoop(ctx context.Context, comms []*pccl.Communicator, ops, pauseAt int, pause func()) []error {
	want := int64(len(comms) * (len(comms) + 1) / 2)
	return each(comms, func(i int, c *pccl.Communicator) error {
		for k := range ops {
			if i == 0 && k == pauseAt {
				pause()
			}
			v := []int64{int64(i + 1)}
			if err := c.AllReduce(ctx, pccl.Bytes(v), pccl.Bytes(v), pccl.Desc{Tag: 1, Count: 1, DType: pccl.I64, Op: pccl.Sum}); err != nil {
				return fmt.Errorf("op %d: %w", k, err)
			}
			if v[0] != want {
				return fmt.Errorf("op %d: sum %d, want %d", k, v[0], want)
			}
		}
		return nil
	})
}

// TestMasterStallCostsNothing stops a real master process with SIGSTOP for 4s (more than twice the
// peers' heartbeat timeout) while 4 peers run a checked AllReduce loop, then continues it: the master
// must see its own stall, kick nobody, and the loop must go on with every result right.
func TestMasterStallCostsNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("pauses a master process for 4s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	g := newProcGroup(ctx, t, master.LAN())
	comms := g.connect(ctx, 4, pccl.Config{MasterTimeout: 10 * time.Second})
	ids := make([]uint64, len(comms))
	for i, c := range comms {
		ids[i] = c.ID()
	}
	paused := false
	errs := checkedLoop(ctx, comms, 30, 10, func() {
		if err := g.master.Stop(); err != nil {
			t.Errorf("SIGSTOP: %v", err)
			return
		}
		select {
		case <-time.After(4 * time.Second): // the length of the fault, not a wait for an event
		case <-ctx.Done():
		}
		if err := g.master.Continue(); err != nil {
			t.Errorf("SIGCONT: %v", err)
		}
		paused = true
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("peer %d: %v", i, err)
		}
	}
	if !paused {
		t.Fatal("the master was never paused")
	}
	for i, c := range comms {
		if got := c.Ring(); len(got) != len(comms) {
			t.Errorf("peer %d: ring %v after the stall, want all of %v", i, got, ids)
		}
	}
	if t.Failed() {
		t.Logf("children's stderr:\n%s", g.logs)
	}
}

// TestMasterRestartResumes kills a real master process (SIGKILL) while 4 peers run a training-like
// loop (sync a shared state, AllReduce, update the state from the result) and starts a new one on the
// same address: the peers reconnect, the new master rebuilds the ring from their reports, and the loop
// carries on to its last revision with every result right and the state identical on every peer.
func TestMasterRestartResumes(t *testing.T) {
	masterRestartResumes(t, nil, nil)
}

// TestMasterRestartResumesQUIC is TestMasterRestartResumes over QUIC, where a killed master sends no
// reset: the peers learn of the restart by probing its address once it has been silent.
func TestMasterRestartResumesQUIC(t *testing.T) {
	secret := "a run secret of the restart test, long enough"
	// No linger: a closed connection ends at once, so nothing is left for the package's leak check.
	tr := transport.NewQUIC(transport.QUICConfig{Auth: transport.AuthConfig{Secret: []byte(secret)}, Linger: -1})
	masterRestartResumes(t, []string{"CONCORD_TRANSPORT=quic", "CONCORD_SECRET=" + secret}, tr)
}

// masterRestartResumes runs the restart test with env for the master process and tr for the peers
// (nil: TCP).
func masterRestartResumes(t *testing.T, env []string, tr pccl.Transport) {
	if testing.Short() {
		t.Skip("restarts a master process")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := master.LAN()
	g := newProcGroupEnv(ctx, t, cfg, env)
	comms := g.connect(ctx, 4, pccl.Config{MasterTimeout: 20 * time.Second, Transport: tr})
	ring := comms[0].Ring()
	const restartAt, last = 8, 20
	restarted := false
	states := make([]*pccl.State, len(comms))
	for i := range states {
		states[i] = sharedstate.NewState()
		if err := states[i].Add(&pccl.Entry{Name: "weights", DType: pccl.F32, Data: make([]byte, 64*4)}); err != nil {
			t.Fatal(err)
		}
	}
	want := int64(len(comms) * (len(comms) + 1) / 2)
	errs := each(comms, func(i int, c *pccl.Communicator) error {
		st := states[i]
		rewire := func(cause error) error {
			if !pccl.Retryable(cause) && !errors.Is(cause, pccl.ErrSync) {
				return cause
			}
			for {
				err := c.UpdateTopology(ctx)
				if err == nil || !pccl.Retryable(err) {
					return err
				}
			}
		}
		for {
			st.Revision++
			res, err := c.SyncSharedState(ctx, st, pccl.SyncOptions{})
			if err != nil {
				st.Revision--
				if err := rewire(err); err != nil {
					return fmt.Errorf("sync: %w", err)
				}
				continue
			}
			if res.Revision >= last {
				return nil
			}
			if i == 0 && res.Revision == restartAt && !restarted {
				restarted = true
				if err := g.restartMaster(ctx, cfg); err != nil {
					return err
				}
			}
			v := []int64{int64(i + 1)}
			if err := c.AllReduce(ctx, pccl.Bytes(v), pccl.Bytes(v), pccl.Desc{Tag: 1, Count: 1, DType: pccl.I64, Op: pccl.Sum}); err != nil {
				if err := rewire(err); err != nil {
					return fmt.Errorf("revision %d: allreduce: %w", res.Revision, err)
				}
				continue
			}
			if v[0] != want {
				return fmt.Errorf("revision %d: sum %d, want %d", res.Revision, v[0], want)
			}
			w := rings.View[float32](st.Lookup("weights").Data)
			for k := range w {
				w[k] += float32(v[0]) * float32(k+1)
			}
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("peer %d: %v", i, err)
		}
	}
	if !restarted {
		t.Fatal("the master was never restarted")
	}
	requireIdentical(t, states)
	for i, c := range comms {
		if got := c.Ring(); !slices.Equal(got, ring) {
			t.Errorf("peer %d: ring %v after the restart, want the ring held before, %v", i, got, ring)
		}
		if inc := c.Epoch() >> 32; inc == 0 {
			t.Errorf("peer %d: epoch %#x has no incarnation", i, c.Epoch())
		}
	}
	if t.Failed() {
		t.Logf("children's stderr:\n%s", g.logs)
	}
}

// restartMaster kills the master process and starts a new one on the same address.
func (g *procGroup) restartMaster(ctx context.Context, cfg master.Config) error {
	if err := g.master.Kill(); err != nil {
		return fmt.Errorf("kill master: %w", err)
	}
	if _, err := g.master.Wait(ctx); err != nil {
		return fmt.Errorf("wait for the killed master: %w", err)
	}
	p, addr, err := g.c.StartMasterAt(ctx, cfg, g.addr)
	if err != nil {
		return fmt.Errorf("restart master on %s: %w", g.addr, err)
	}
	g.master, g.addr = p, addr
	return nil
}
