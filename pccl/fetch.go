package pccl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/sharedstate"
)

// The fetch side of a sync: a peer whose content lost the election gets the elected entries from
// the peers that hold them (the donors).
//
// Every donor serves at once, each over a few connections of its own (Config.PoolSize, two at
// least), and on each connection the fetcher keeps fetchDepth requests outstanding, so that a donor
// always has the next range to send while the last one crosses the network: a donor sends at its
// upload's pace whatever the round trip, and a faster donor serves more ranges, as ranges go to
// whichever connection asks next. Ranges are checked block by block against the entry's leaf hashes,
// and only then copied into the application's memory: nothing unverified is ever written there. A
// range whose leaf hashes are in is checked by the goroutine that received it, while it is still in
// that core's cache; one that came first waits for them in a hashing goroutine, so that the
// connection receives the next meanwhile. The leaf hashes of every entry are asked of every donor at
// once, on connections of their own, and the first good answer is taken. A range whose donor fails
// or sends a bad block is fetched again from another donor of its entry; a donor whose connection
// failed gets no more ranges on it.

// Sizes of the fetch.
const (
	// fetchDepth is the number of requests (one block each) outstanding on one connection to a
	// donor, so that it always has the next range to send while earlier ones cross a WAN's round
	// trip. More only lengthens the tail, where the donors finish what they were asked for at
	// their own pace.
	fetchDepth = 8
	// fetchBuffers is the number of range buffers of one connection: one being received while
	// the others are checked and copied.
	fetchBuffers = 2
)

// entryJob is one entry of the plan being fetched.
type entryJob struct {
	it     wire.FetchItem
	entry  *Entry
	leaves []uint64      // written once before ready is closed
	ready  chan struct{} // closed when leaves holds the checked leaf hashes
	left   atomic.Int32  // ranges not yet installed
}

// fetchTask is one range of an entry.
type fetchTask struct {
	job   *entryJob
	off   int
	n     int
	tried []uint64 // donors that failed it
}

// fetcher is one fetchAll. Its queue is guarded by mu; the rest is set before the workers start.
type fetcher struct {
	c      *Communicator
	ctx    context.Context
	cancel context.CancelCauseFunc
	opt    SyncOptions
	step   int // bytes of a full range

	mu      sync.Mutex
	wake    *sync.Cond
	queue   []*fetchTask             // ranges to fetch, retried ones first
	depth   int                      // requests outstanding per connection: fetchDepth, or fewer for a small plan
	pending int                      // ranges not yet installed (queued, in flight or being checked)
	live    map[uint64]int           // donor -> workers still fetching from it
	donors  map[uint64]wire.PeerInfo // donor -> its addresses

	verify chan verified

	done     atomic.Int64
	total    int64
	finished func(*entryJob)
}

// verified is a received range on its way to the hashing goroutines.
type verified struct {
	t     *fetchTask
	donor uint64
	buf   []byte
	free  chan []byte // where the buffer goes back
}

// fetchAll fetches and installs every entry of the plan (see the comment at the top of the file).
func (c *Communicator) fetchAll(ctx context.Context, st *State, items []wire.FetchItem, opt SyncOptions, res *SyncResult) error {
	if len(items) == 0 {
		return nil
	}
	f := &fetcher{c: c, opt: opt, live: map[uint64]int{}, donors: map[uint64]wire.PeerInfo{}}
	f.wake = sync.NewCond(&f.mu)
	largest := 0
	for _, it := range items {
		f.total += int64(it.Bytes)
		e := st.Lookup(it.Name)
		if e == nil || uint64(len(e.Data)) != it.Bytes {
			return fmt.Errorf("entry %q: not registered here with %d bytes", it.Name, it.Bytes)
		}
		if len(it.Donors) == 0 {
			return fmt.Errorf("entry %q: no donor", it.Name)
		}
		for _, d := range it.Donors {
			f.donors[d.ID] = d
		}
		largest = max(largest, int(it.Bytes))
	}
	// A range is one hash-tree block (or a smaller entry): it is checked while it is still in the
	// cache from its receive, and a connection's buffers stay small, so a newcomer does not fault
	// in fresh memory for them while it fetches. Requests are pipelined (fetchDepth) instead.
	perDonor := max(2, c.cfg.PoolSize)
	f.step = min(sharedstate.BlockSize, largest)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	f.ctx, f.cancel = ctx, cancel
	stopWake := context.AfterFunc(ctx, func() {
		f.mu.Lock()
		f.wake.Broadcast()
		f.mu.Unlock()
	})
	defer stopWake()

	var resMu sync.Mutex
	f.finished = func(j *entryJob) {
		j.entry.RememberLeaves(j.leaves, j.it.Hash)
		resMu.Lock()
		res.Fetched = append(res.Fetched, j.it.Name)
		res.FetchedBytes += int64(j.it.Bytes)
		resMu.Unlock()
	}
	jobs := make([]*entryJob, len(items))
	for i, it := range items {
		j := &entryJob{it: it, entry: st.Lookup(it.Name), ready: make(chan struct{})}
		jobs[i] = j
		n := (int(it.Bytes) + f.step - 1) / max(f.step, 1)
		j.left.Store(int32(n))
		for r := range n {
			f.queue = append(f.queue, &fetchTask{job: j, off: r * f.step, n: min(f.step, int(it.Bytes)-r*f.step)})
		}
	}
	f.pending = len(f.queue)
	// A connection asks for its share of a small plan, no more: the first to start must not take
	// every range.
	workers := len(f.donors) * perDonor
	f.depth = min(fetchDepth, max(1, (len(f.queue)+workers-1)/workers))

	hashers := opt.HashWorkers
	if hashers <= 0 {
		hashers = max(1, min(len(f.queue), defaultHashWorkers()))
	}
	f.verify = make(chan verified, len(f.donors)*perDonor*fetchBuffers)
	// Every donor counts its connections before any goroutine starts: a hasher's retry reads the
	// counts to tell whether a range still has a donor.
	var ids []uint64
	if len(f.queue) > 0 {
		ids = slices.Sorted(maps.Keys(f.donors))
		for _, id := range ids {
			f.live[id] = perDonor
		}
	}
	var wg, hwg sync.WaitGroup
	for range hashers {
		hwg.Go(f.hash)
	}
	wg.Go(func() { f.fetchLeaves(jobs) })
	for _, id := range ids {
		for range perDonor {
			wg.Go(func() { f.work(id) })
		}
	}
	wg.Wait()
	close(f.verify)
	hwg.Wait()
	// The entries complete in any order; the result lists them in the plan's.
	order := make(map[string]int, len(items))
	for i, it := range items {
		order[it.Name] = i
	}
	slices.SortFunc(res.Fetched, func(a, b string) int { return order[a] - order[b] })
	return context.Cause(ctx)
}

// defaultHashWorkers is the number of hashing goroutines when SyncOptions.HashWorkers is 0.
func defaultHashWorkers() int { return runtime.GOMAXPROCS(0) }

// fetchLeaves gets the leaf hashes of every job from every donor of it at once, each donor over a
// connection of its own with all its requests sent before any answer is read: the first answer whose
// leaves combine to the elected hash makes the entry ready (an entry without bytes is installed
// then), so the leaves come in after the nearest donor's round trip. It cancels the fetch when
// every donor of an entry failed it.
func (f *fetcher) fetchLeaves(jobs []*entryJob) {
	type state struct {
		once   sync.Once
		failed int
		last   error
	}
	states := make(map[*entryJob]*state, len(jobs))
	byDonor := map[uint64][]*entryJob{}
	for _, j := range jobs {
		states[j] = &state{}
		for _, d := range j.it.Donors {
			byDonor[d.ID] = append(byDonor[d.ID], j)
		}
	}
	var mu sync.Mutex // guards the failure counts
	var wg sync.WaitGroup
	for id, batch := range byDonor {
		donor := f.donors[id]
		wg.Go(func() {
			f.leavesFrom(donor, batch, func(j *entryJob, leaves []uint64) {
				states[j].once.Do(func() {
					j.leaves = leaves
					close(j.ready)
					if j.it.Bytes == 0 {
						f.finished(j)
					}
				})
			}, func(j *entryJob, err error) {
				mu.Lock()
				defer mu.Unlock()
				st := states[j]
				st.failed++
				st.last = err
				if st.failed == len(j.it.Donors) {
					f.cancel(fmt.Errorf("entry %q: %w", j.it.Name, err))
				}
			})
		})
	}
	wg.Wait()
}

// leavesFrom asks donor for the leaves of batch, all requests at once, and calls got with the
// leaves of each entry whose leaves combine to its elected hash, fail with why for every other.
func (f *fetcher) leavesFrom(donor wire.PeerInfo, batch []*entryJob, got func(*entryJob, []uint64), fail func(*entryJob, error)) {
	failAll := func(js []*entryJob, err error) {
		for _, j := range js {
			fail(j, fmt.Errorf("leaves from donor %d: %w", donor.ID, err))
		}
	}
	conns := map[uint64]*stateConn{}
	sc, err := f.c.dialState(f.ctx, conns, donor)
	if err != nil {
		failAll(batch, err)
		return
	}
	defer sc.close()
	stop := context.AfterFunc(f.ctx, func() { sc.conn.SetDeadline(time.Now()) })
	defer stop()
	var out []byte
	for _, j := range batch {
		out = wire.AppendFrame(out, &wire.StateRequest{Token: f.c.cfg.Token, Name: j.it.Name, Hash: j.it.Hash, Leaves: true})
	}
	sc.conn.SetDeadline(time.Now().Add(f.c.cfg.DialTimeout))
	if _, err := sc.conn.Write(out); err != nil {
		failAll(batch, err)
		return
	}
	for k, j := range batch {
		want := (int(j.it.Bytes) + sharedstate.BlockSize - 1) / sharedstate.BlockSize
		raw := make([]byte, 8*want)
		sc.conn.SetDeadline(time.Now().Add(f.c.cfg.DialTimeout))
		if err := readResponse(sc, raw); err != nil {
			// The donor closes the connection after a refusal: what was asked after it is lost too.
			failAll(batch[k:], err)
			return
		}
		leaves := make([]uint64, want)
		for i := range leaves {
			leaves[i] = binary.LittleEndian.Uint64(raw[8*i:])
		}
		if sharedstate.Root(leaves, int(j.it.Bytes)) != j.it.Hash {
			fail(j, fmt.Errorf("leaves from donor %d: leaf hashes do not combine to the elected hash", donor.ID))
			continue
		}
		got(j, leaves)
	}
}

// work is one connection to donor: it takes ranges the donor can serve, keeps f.depth of them
// asked for, receives each answer into a free buffer and hands it to the hashing goroutines. On an
// error it puts back the ranges it held and stops.
func (f *fetcher) work(donor uint64) {
	var (
		sc       *stateConn
		inflight []*fetchTask
		err      error
	)
	free := make(chan []byte, fetchBuffers)
	for range fetchBuffers {
		free <- nil // allocated at first use, to the size of a range
	}
	defer func() {
		if sc != nil {
			sc.close()
		}
		f.mu.Lock()
		f.live[donor]--
		f.mu.Unlock()
		for _, t := range inflight {
			f.retry(t, donor, err)
		}
		f.orphans()
	}()
	addr := f.donors[donor]
	for {
		for len(inflight) < f.depth {
			t := f.take(donor, len(inflight) == 0)
			if t == nil {
				break
			}
			if sc == nil {
				conns := map[uint64]*stateConn{}
				if sc, err = f.c.dialState(f.ctx, conns, addr); err != nil {
					f.retry(t, donor, err)
					return
				}
			}
			req := &wire.StateRequest{Token: f.c.cfg.Token, Name: t.job.it.Name, Hash: t.job.it.Hash, Off: uint64(t.off),
				Len: uint64(t.n), Compress: f.opt.Compress}
			sc.conn.SetWriteDeadline(time.Now().Add(f.c.cfg.DialTimeout))
			if _, err = sc.conn.Write(wire.AppendFrame(nil, req)); err != nil {
				f.retry(t, donor, err)
				return
			}
			inflight = append(inflight, t)
		}
		if len(inflight) == 0 {
			return // nothing left for this donor
		}
		t := inflight[0]
		var buf []byte
		select {
		case buf = <-free:
		case <-f.ctx.Done():
			err = context.Cause(f.ctx)
			return
		}
		if cap(buf) < f.step {
			buf = make([]byte, f.step)
		}
		buf = buf[:t.n]
		if err = f.receive(sc, buf); err != nil {
			free <- buf
			return
		}
		inflight = inflight[1:]
		v := verified{t: t, donor: donor, buf: buf, free: free}
		select {
		case <-t.job.ready:
			// Checked here, on the core whose cache the receive just filled.
			f.install(v)
		default:
			f.verify <- v
		}
	}
}

// receive reads the answer to the oldest request on sc into buf. The transfer may take long: its
// pace, not a fixed deadline, decides (a silent donor is cut off when the fetch ends).
func (f *fetcher) receive(sc *stateConn, buf []byte) error {
	stop := context.AfterFunc(f.ctx, func() { sc.conn.SetReadDeadline(time.Now()) })
	defer stop()
	sc.conn.SetReadDeadline(time.Now().Add(f.c.cfg.DialTimeout))
	return readResponse(sc, buf)
}

// hash checks received ranges against their entry's leaves and installs them.
func (f *fetcher) hash() {
	for v := range f.verify {
		select {
		case <-v.t.job.ready:
		case <-f.ctx.Done():
			v.free <- v.buf
			continue
		}
		f.install(v)
	}
}

// install checks the range of v against its entry's leaves, which must be ready, and copies it into
// the entry; a range that does not match is fetched again from another donor.
func (f *fetcher) install(v verified) {
	t := v.t
	if err := verifyBlocks(v.buf, t.off, t.job.leaves); err != nil {
		v.free <- v.buf
		f.retry(t, v.donor, err)
		f.orphans()
		return
	}
	copy(t.job.entry.Data[t.off:t.off+t.n], v.buf)
	v.free <- v.buf
	if f.opt.Progress != nil {
		f.opt.Progress(f.done.Add(int64(t.n)), f.total)
	} else {
		f.done.Add(int64(t.n))
	}
	if t.job.left.Add(-1) == 0 {
		f.finished(t.job)
	}
	f.mu.Lock()
	f.pending--
	if f.pending == 0 {
		f.wake.Broadcast()
	}
	f.mu.Unlock()
}

// take returns the first queued range that donor holds and has not failed, or nil when none is
// left for it. With wait, it waits while other connections hold ranges that may come back.
func (f *fetcher) take(donor uint64, wait bool) *fetchTask {
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		if f.ctx.Err() != nil {
			return nil
		}
		for i, t := range f.queue {
			if slices.Contains(t.tried, donor) || !holds(t.job.it, donor) {
				continue
			}
			f.queue = slices.Delete(f.queue, i, i+1)
			return t
		}
		if !wait || f.pending == 0 {
			return nil
		}
		f.wake.Wait()
	}
}

// retry puts t back at the front of the queue after donor failed it with err; when no other donor
// of its entry is left to try, the fetch fails.
func (f *fetcher) retry(t *fetchTask, donor uint64, err error) {
	if f.ctx.Err() != nil {
		return
	}
	if err != nil {
		f.c.log.Warn("state fetch failed, trying another donor", "entry", t.job.it.Name, "donor", donor, "err", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t.tried = append(t.tried, donor)
	if !f.servable(t) {
		if err == nil {
			err = errors.New("no donor left")
		}
		f.cancel(fmt.Errorf("entry %q: %w", t.job.it.Name, err))
		return
	}
	f.queue = slices.Insert(f.queue, 0, t)
	f.wake.Broadcast()
}

// orphans fails the fetch when a queued range is left with no donor that still fetches.
func (f *fetcher) orphans() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range f.queue {
		if !f.servable(t) {
			f.cancel(fmt.Errorf("entry %q: every donor failed", t.job.it.Name))
			return
		}
	}
}

// servable reports whether a donor of t's entry that has not failed it still has connections
// fetching. f.mu must be held.
func (f *fetcher) servable(t *fetchTask) bool {
	for _, d := range t.job.it.Donors {
		if !slices.Contains(t.tried, d.ID) && f.live[d.ID] > 0 {
			return true
		}
	}
	return false
}

// holds reports whether donor is one of it's donors.
func holds(it wire.FetchItem, donor uint64) bool {
	return slices.ContainsFunc(it.Donors, func(d wire.PeerInfo) bool { return d.ID == donor })
}

// verifyBlocks checks every block of part, which holds the bytes at off of an entry, against the
// entry's leaves.
func verifyBlocks(part []byte, off int, leaves []uint64) error {
	for b := 0; b < len(part); b += sharedstate.BlockSize {
		k := (off + b) / sharedstate.BlockSize
		end := min(b+sharedstate.BlockSize, len(part))
		if k >= len(leaves) || sharedstate.LeafHash(part[b:end]) != leaves[k] {
			return fmt.Errorf("block %d does not match the elected content: not adopted", k)
		}
	}
	return nil
}

// stateConn is a connection to one donor.
type stateConn struct {
	conn net.Conn
	dec  *zstd.Decoder
}

func (sc *stateConn) close() {
	sc.conn.Close()
	if sc.dec != nil {
		sc.dec.Close()
	}
}

// dialState returns the connection to donor in conns, opening it on first use.
func (c *Communicator) dialState(ctx context.Context, conns map[uint64]*stateConn, donor wire.PeerInfo) (*stateConn, error) {
	if sc := conns[donor.ID]; sc != nil {
		return sc, nil
	}
	cfg := c.cfg
	dctx, cancel := context.WithTimeout(ctx, c.reachTimeout(donor))
	conn, err := c.dialPeer(dctx, donor)
	cancel()
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(cfg.DialTimeout))
	if err := wire.Exchange(conn, wire.KindState); err != nil {
		conn.Close()
		return nil, err
	}
	sc := &stateConn{conn: conn}
	conns[donor.ID] = sc
	return sc, nil
}

// dropState closes and forgets the connection to donor.
func (c *Communicator) dropState(conns map[uint64]*stateConn, donor uint64) {
	if sc := conns[donor]; sc != nil {
		sc.close()
		delete(conns, donor)
	}
}

// readResponse reads one StateResponse and its bytes into dst, which must be exactly as long as the
// data it carries (decompressed if it came compressed).
func readResponse(sc *stateConn, dst []byte) error {
	conn := sc.conn
	msg, _, err := wire.ReadFrame(conn, 1<<16, nil)
	if err != nil {
		return err
	}
	resp, ok := msg.(*wire.StateResponse)
	switch {
	case !ok:
		return fmt.Errorf("donor answered %T", msg)
	case !resp.OK:
		return fmt.Errorf("donor refused: %s", resp.Detail)
	}
	conn.SetReadDeadline(time.Time{})
	if !resp.Compressed {
		if resp.Len != uint64(len(dst)) {
			return fmt.Errorf("donor sends %d bytes, asked for %d", resp.Len, len(dst))
		}
		_, err := io.ReadFull(conn, dst)
		return err
	}
	if resp.Len > uint64(len(dst))+uint64(len(dst))/8+1<<20 {
		return fmt.Errorf("compressed payload of %d bytes for %d bytes of data", resp.Len, len(dst))
	}
	z := make([]byte, resp.Len)
	if _, err := io.ReadFull(conn, z); err != nil {
		return err
	}
	if sc.dec == nil {
		if sc.dec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(uint64(len(dst))+1<<20)); err != nil {
			return err
		}
	}
	out, err := sc.dec.DecodeAll(z, dst[:0])
	if err != nil {
		return fmt.Errorf("decompress: %w", err)
	}
	if len(out) != len(dst) || (len(dst) > 0 && &out[0] != &dst[0]) {
		return fmt.Errorf("compressed payload holds %d bytes, want %d", len(out), len(dst))
	}
	return nil
}
