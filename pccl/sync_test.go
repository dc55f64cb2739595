package pccl_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/rings"
	"github.com/concord-ccl/concord/sharedstate"
)

// newState returns a state with a weights entry (f32), an f16 and a bf16 entry, and a MayDiffer entry,
// filled from seed.
func newState(t *testing.T, seed uint64, n int) *pccl.State {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	st := sharedstate.NewState()
	for _, e := range []struct {
		name  string
		dt    rings.DType
		count int
		may   bool
	}{{"weights", rings.F32, n, false}, {"half", rings.F16, 1001, false}, {"brain", rings.BF16, 333, false}, {"rng", rings.U64, 4, true}} {
		data := make([]byte, e.count*e.dt.Size())
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		if err := st.Add(&pccl.Entry{Name: e.name, DType: e.dt, Data: data, MayDiffer: e.may}); err != nil {
			t.Fatal(err)
		}
	}
	return st
}

// syncAll runs SyncSharedState on every communicator at once.
func syncAll(ctx context.Context, comms []*pccl.Communicator, states []*pccl.State, opts []pccl.SyncOptions) ([]pccl.SyncResult, []error) {
	res := make([]pccl.SyncResult, len(comms))
	errs := each(comms, func(i int, c *pccl.Communicator) error {
		var o pccl.SyncOptions
		if opts != nil {
			o = opts[i]
		}
		var err error
		res[i], err = c.SyncSharedState(ctx, states[i], o)
		return err
	})
	return res, errs
}

func digests(states []*pccl.State) []sharedstate.Digest {
	var ds []sharedstate.Digest
	for _, st := range states {
		ds = append(ds, st.Digest(1))
	}
	return ds
}

// requireIdentical checks that every voted entry hashes equal on every peer.
func requireIdentical(t *testing.T, states []*pccl.State) {
	t.Helper()
	ds := digests(states)
	for i := 1; i < len(ds); i++ {
		if ds[i].Revision != ds[0].Revision {
			t.Fatalf("peer %d at revision %d, peer 0 at %d", i, ds[i].Revision, ds[0].Revision)
		}
		for j, e := range ds[i].Entries {
			if !e.MayDiffer && e.Hash != ds[0].Entries[j].Hash {
				t.Fatalf("peer %d entry %q differs", i, e.Name)
			}
		}
	}
}

func TestSyncOutlierFetchesOnlyMismatched(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, _ := g.start(ctx, 4)
		defer closeAll(comms)
		states := make([]*pccl.State, 4)
		for i := range states {
			states[i] = newState(t, 1, 3<<20) // identical content, 12 MiB of weights
		}
		// Peer 3 diverges in the f16 entry and the weights.
		states[3].Lookup("half").Data[7] ^= 1
		states[3].Lookup("weights").Data[12345] ^= 0x80
		var progressed atomic.Int64
		opts := make([]pccl.SyncOptions, 4)
		opts[3].Progress = func(done, total int64) { progressed.Store(total) }
		res, errs := syncAll(ctx, comms, states, opts)
		for i, err := range errs {
			if err != nil {
				t.Fatalf("peer %d: %v", i, err)
			}
		}
		requireIdentical(t, states)
		if got := res[3].Fetched; len(got) != 2 || got[0] != "half" || got[1] != "weights" {
			t.Fatalf("outlier fetched %v, want [half weights]", got)
		}
		if progressed.Load() != int64(1001*2+(3<<20)*4) {
			t.Fatalf("progress total %d", progressed.Load())
		}
		var served int64
		for i := 0; i < 3; i++ {
			if len(res[i].Fetched) != 0 {
				t.Fatalf("peer %d fetched %v", i, res[i].Fetched)
			}
			served += res[i].ServedBytes
		}
		// What the donors served is what the outlier fetched (no range had to be fetched twice here).
		if want := int64(1001*2 + (3<<20)*4); res[3].FetchedBytes != want || served != want || res[3].ServedBytes != 0 {
			t.Fatalf("fetched %d, served %d (outlier %d), want %d", res[3].FetchedBytes, served, res[3].ServedBytes, want)
		}
		// The next sync must advance the revision by exactly one.
		for _, st := range states {
			st.Revision++
		}
		if _, errs := syncAll(ctx, comms, states, nil); errors.Join(errs...) != nil {
			t.Fatal(errs)
		}
		states[0].Revision += 2
		for _, st := range states[1:] {
			st.Revision++
		}
		_, errs = syncAll(ctx, comms, states, nil)
		if !errors.Is(errs[0], pccl.ErrSync) || errs[1] != nil {
			t.Fatalf("revision jump: %v", errs)
		}
	})
}

func TestSyncStrategies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, _ := g.start(ctx, 3)
		defer closeAll(comms)
		states := []*pccl.State{newState(t, 1, 100), newState(t, 1, 100), newState(t, 2, 100)}
		opts := []pccl.SyncOptions{{}, {}, {Strategy: pccl.SendOnly}}
		_, errs := syncAll(ctx, comms, states, opts)
		if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], pccl.ErrSync) {
			t.Fatalf("SendOnly loser: %v", errs)
		}
		// ReceiveOnly newcomer-style: adopts everything, the MayDiffer entry included.
		for _, st := range states {
			st.Revision++
		}
		opts = []pccl.SyncOptions{{}, {}, {Strategy: pccl.ReceiveOnly, Compress: true}}
		res, errs := syncAll(ctx, comms, states, opts)
		if errors.Join(errs...) != nil {
			t.Fatal(errs)
		}
		requireIdentical(t, states)
		if !bytes.Equal(states[2].Lookup("rng").Data, states[0].Lookup("rng").Data) &&
			!bytes.Equal(states[2].Lookup("rng").Data, states[1].Lookup("rng").Data) {
			t.Fatalf("MayDiffer entry did not reach the receive-only peer (fetched %v)", res[2].Fetched)
		}
		// Everyone ReceiveOnly: nobody can donate.
		for _, st := range states {
			st.Revision++
		}
		opts = []pccl.SyncOptions{{Strategy: pccl.ReceiveOnly}, {Strategy: pccl.ReceiveOnly}, {Strategy: pccl.ReceiveOnly}}
		_, errs = syncAll(ctx, comms, states, opts)
		for i, err := range errs {
			if !errors.Is(err, pccl.ErrSync) {
				t.Fatalf("peer %d: %v, want ErrSync", i, err)
			}
		}
	})
}

// TestSyncCorruptDonorNotAdopted has a donor whose bytes no longer match the hash it voted: the
// receiver detects it and keeps its own content.
func TestSyncCorruptDonorNotAdopted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, _ := g.start(ctx, 3)
		defer closeAll(comms)
		states := []*pccl.State{newState(t, 1, 1000), newState(t, 1, 1000), newState(t, 2, 1000)}
		// Peers 0 and 1 vote the same hashes (cached through Version), then their bytes rot.
		for _, st := range states[:2] {
			for _, e := range st.Entries {
				e.Version = 1
			}
			st.Digest(1)
			st.Lookup("weights").Data[3] ^= 0xff
		}
		before := bytes.Clone(states[2].Lookup("weights").Data)
		_, errs := syncAll(ctx, comms, states, nil)
		if !errors.Is(errs[2], pccl.ErrSync) {
			t.Fatalf("receiver: %v, want ErrSync", errs[2])
		}
		if !bytes.Equal(states[2].Lookup("weights").Data, before) {
			t.Fatal("corrupt content was written into the application's memory")
		}
	})
}

// TestSyncDonorDiesMidTransfer crashes one donor while a newcomer fetches a large entry; the ranges it
// was serving are fetched again from the other holder.
func TestSyncDonorDiesMidTransfer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, hosts := g.start(ctx, 3)
		defer closeAll(comms)
		// Slow links into the receiver so that the crash lands mid-transfer.
		for _, h := range hosts[:2] {
			g.net.SetLink(h, hosts[2], pccl.LinkConfig{Bandwidth: 40e6})
		}
		states := []*pccl.State{newState(t, 1, 4<<20), newState(t, 1, 4<<20), newState(t, 2, 4<<20)}
		var once sync.Once
		opts := []pccl.SyncOptions{{}, {}, {Progress: func(done, total int64) {}}}
		go func() {
			for g.net.Stats(hosts[1], hosts[2]) < 1<<20 {
				time.Sleep(time.Millisecond)
			}
			once.Do(func() { g.net.Crash(hosts[1]) })
		}()
		res := make([]pccl.SyncResult, 3)
		errs := make([]error, 3)
		var wg sync.WaitGroup
		for _, i := range []int{0, 2} {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				res[i], errs[i] = comms[i].SyncSharedState(ctx, states[i], opts[i])
			}(i)
		}
		_, errs[1] = comms[1].SyncSharedState(ctx, states[1], opts[1])
		wg.Wait()
		if errs[0] != nil || errs[2] != nil {
			t.Fatalf("survivors: %v / %v", errs[0], errs[2])
		}
		requireIdentical(t, []*pccl.State{states[0], states[2]})
		if res[2].FetchedBytes == 0 {
			t.Fatal("receiver fetched nothing")
		}
		comms[1].Close()
	})
}

// TestResumeAfterEveryoneLeft: the master remembers the last accepted state; a group that comes back
// may resume only from matching state.
func TestResumeAfterEveryoneLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, _ := g.start(ctx, 2)
		states := []*pccl.State{newState(t, 5, 100), newState(t, 5, 100)}
		for _, st := range states {
			st.Revision = 41
		}
		if _, errs := syncAll(ctx, comms, states, nil); errors.Join(errs...) != nil {
			t.Fatal(errs)
		}
		closeAll(comms)
		for deadline := time.Now().Add(10 * time.Second); len(g.srv.Snapshot().Peers) != 0; {
			if time.Now().After(deadline) {
				t.Fatal("peers not gone")
			}
			time.Sleep(time.Millisecond)
		}
		c, err := g.connect(ctx, g.host())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		wrong := newState(t, 6, 100)
		wrong.Revision = 41
		if _, err := c.SyncSharedState(ctx, wrong, pccl.SyncOptions{}); !errors.Is(err, pccl.ErrSync) {
			t.Fatalf("resume from other state: %v, want ErrSync", err)
		}
		right := newState(t, 5, 100)
		right.Revision = 41
		if _, err := c.SyncSharedState(ctx, right, pccl.SyncOptions{}); err != nil {
			t.Fatalf("resume from matching state: %v", err)
		}
		right.Revision++
		if res, err := c.SyncSharedState(ctx, right, pccl.SyncOptions{}); err != nil || res.Revision != 42 {
			t.Fatalf("next sync: %+v %v", res, err)
		}
		_ = fmt.Sprint
	})
}

// TestSyncSendOnlyWins: a SendOnly peer whose content is the popular one succeeds, and the outlier
// adopts it.
func TestSyncSendOnlyWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		g := newGroup(t, master.Config{})
		comms, _ := g.start(ctx, 3)
		defer closeAll(comms)
		states := []*pccl.State{newState(t, 1, 100), newState(t, 2, 100), newState(t, 2, 100)}
		opts := []pccl.SyncOptions{{}, {Strategy: pccl.SendOnly}, {}}
		res, errs := syncAll(ctx, comms, states, opts)
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		requireIdentical(t, states)
		if len(res[0].Fetched) == 0 || len(res[1].Fetched) != 0 {
			t.Fatalf("fetched: outlier %v, send-only %v", res[0].Fetched, res[1].Fetched)
		}
	})
}
