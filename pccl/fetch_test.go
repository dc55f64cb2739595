package pccl_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/sharedstate"
)

// TestFetchFromEveryDonorAtOnce: an outlier fetches 32 MiB from four donors whose links to it carry
// 20 MB/s each with a 50 ms round trip. Every donor sends a share, the content is the elected one,
// and the fetch takes little more than the state's size over the donors' summed bandwidth, in
// virtual time: the donors send at once, and each always has the next range asked for.
func TestFetchFromEveryDonorAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		b := newBubble(t)
		defer b.close()
		const (
			donors = 4
			bw     = 20e6
			size   = 16 << 20 // per entry, two entries
		)
		comms := b.startLinked(ctx, donors+1, pccl.LinkConfig{Latency: 25 * time.Millisecond, Bandwidth: 200e6})
		defer closeAll(comms)
		outlier := b.hosts[donors]
		for _, h := range b.hosts[:donors] {
			b.net.SetLink(h, outlier, pccl.LinkConfig{Latency: 25 * time.Millisecond, Bandwidth: bw})
		}
		content := [][]byte{make([]byte, size), make([]byte, size)}
		for k, d := range content {
			for i := range d {
				d[i] = byte(i*7 + k)
			}
		}
		states := make([]*pccl.State, donors+1)
		for i := range states {
			st := sharedstate.NewState()
			for k, d := range content {
				if i == donors {
					d = make([]byte, size) // the outlier's content loses the vote
				}
				st.Add(&sharedstate.Entry{Name: string(rune('a' + k)), DType: pccl.U8, Data: d})
			}
			st.Revision = 3
			states[i] = st
		}
		before := make([]int64, donors)
		for i, h := range b.hosts[:donors] {
			before[i] = b.net.Stats(h, outlier)
		}
		took := make([]time.Duration, donors+1)
		results := make([]pccl.SyncResult, donors+1)
		errs := each(comms, func(i int, c *pccl.Communicator) error {
			t0 := time.Now()
			var err error
			results[i], err = c.SyncSharedState(ctx, states[i], pccl.SyncOptions{})
			took[i] = time.Since(t0)
			return err
		})
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		requireIdentical(t, states)
		if got := results[donors].FetchedBytes; got != 2*size {
			t.Fatalf("the outlier fetched %d bytes, want %d", got, 2*size)
		}
		for i, h := range b.hosts[:donors] {
			if sent := b.net.Stats(h, outlier) - before[i]; sent < 2*size/(2*donors) {
				t.Errorf("donor %d sent %d bytes of %d: less than half its share", i, sent, 2*size)
			}
		}
		bound := time.Duration(float64(2*size) / (donors * bw) * float64(time.Second))
		if took[donors] > bound*3/2 {
			t.Errorf("the fetch took %v of virtual time, more than 1.5x the donors' bound of %v", took[donors], bound)
		}
		t.Logf("fetch of %d MiB from %d donors: %v against the bound %v", 2*size>>20, donors, took[donors], bound)
	})
}
