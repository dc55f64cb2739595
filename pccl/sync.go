package pccl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/sharedstate"
)

// ErrSync is wrapped by SyncSharedState errors: the election rejected this peer or the whole sync
// (revision rule, entry-set mismatch, SendOnly lost, no donor, state not matching a resumption), or a
// transfer failed.
var ErrSync = errors.New("pccl: shared-state sync failed")

// State, Entry and Strategy are the shared-state types, re-exported for convenience.
type (
	State    = sharedstate.State
	Entry    = sharedstate.Entry
	Strategy = sharedstate.Strategy
)

// Sync strategies (see package sharedstate).
const (
	EnforcePopular = sharedstate.EnforcePopular
	SendOnly       = sharedstate.SendOnly
	ReceiveOnly    = sharedstate.ReceiveOnly
)

// SyncOptions tunes SyncSharedState. The zero value works.
type SyncOptions struct {
	// Strategy is how this peer takes part in the vote. Default EnforcePopular.
	Strategy Strategy
	// Compress asks donors to zstd-compress what they send. Worth it only for compressible data.
	Compress bool
	// HashWorkers is the number of goroutines hashing the state. Default: GOMAXPROCS.
	HashWorkers int
	// Progress, if set, is called as fetched bytes arrive (done of total), from any goroutine.
	Progress func(done, total int64)
}

// SyncResult reports what a sync did on this peer.
type SyncResult struct {
	Revision     uint64   // the revision every participating peer now holds
	Fetched      []string // entries this peer received
	FetchedBytes int64
	ServedBytes  int64  // entry bytes this peer sent to peers that fetched from it (before compression)
	ResumeStep   uint64 // the consistent training step to resume from (see ReportStep)
}

// ReportStep tells the master this peer's training step and whether it is inside the optimizer step;
// SyncSharedState returns the consistent step to resume from after a failure.
func (c *Communicator) ReportStep(step uint64, inOptimizer bool) error {
	return cleanError(c.submit(request{in: stepCall{&wire.StepReport{Step: step, InOptimizer: inOptimizer}}}))
}

// SyncSharedState makes st identical on every accepted peer. Every accepted peer calls it with a State
// of the same entry set. Each peer sends the hash of every entry (keyed by name) and st.Revision; the
// master elects the most popular whole state (see sharedstate.Elect), and a peer whose state lost fetches the mismatched entries
// from the peers that hold the elected content, spread over several of them. It checks the leaf hashes
// of each entry's hash tree against the elected hash, and every received 1 MiB block against its leaf,
// before it writes that block into st: unverified bytes never reach the application's memory. A fresh run accepts any revision; afterwards st.Revision must
// advance by exactly one per sync (the application increments it before the call).
//
// st must not be changed while the call runs: other peers may be reading it. It needs no collective of
// this peer in flight (else ErrBusy). Failures wrap ErrSync (with the reason), ErrKicked, ErrMasterLost
// or ErrClosed; after a failed sync the entries may hold either their old content or verified elected
// content, never anything else.
func (c *Communicator) SyncSharedState(ctx context.Context, st *State, opt SyncOptions) (SyncResult, error) {
	res, err := c.syncSharedState(ctx, st, opt)
	return res, cleanError(err)
}

func (c *Communicator) syncSharedState(ctx context.Context, st *State, opt SyncOptions) (res SyncResult, err error) {
	d := st.Digest(opt.HashWorkers)
	hashes := map[string]uint64{}
	leaves := map[string][]uint64{}
	for _, e := range d.Entries {
		hashes[e.Name] = e.Hash
	}
	for _, e := range st.Entries {
		if l := e.Leaves(); l != nil {
			leaves[e.Name] = l
		} else {
			leaves[e.Name] = sharedstate.LeafHashes(e.Data, opt.HashWorkers)
		}
	}
	c.serveMu.Lock()
	c.serving, c.servingHashes, c.servingLeaves = st, hashes, leaves
	c.serveMu.Unlock()
	served := c.served.Load()
	defer func() {
		c.stopServing() // every range served in this sync is counted once it returns
		res.ServedBytes = c.served.Load() - served
	}()

	call, ch := c.newCall()
	vote := &wire.VoteSync{Strategy: uint8(opt.Strategy), Digest: sharedstate.EncodeDigest(d)}
	r, err := c.ask(ctx, "sync shared state", call, ch, syncCall{call: call, vote: vote})
	if err != nil {
		return res, err
	}
	p := r.msg.(*wire.SyncPlan)
	if p.Code != wire.CodeOK {
		return res, fmt.Errorf("%w: %s", ErrSync, p.Detail)
	}
	res.Revision = p.Revision
	ferr := c.fetchAll(ctx, st, p.Fetch, opt, &res)
	if ferr != nil && ctx.Err() != nil {
		// Given up mid-transfer: the machine reports the failure to the master for us.
		c.post(cancelCall{call: call, reason: ctx.Err()})
		return res, fmt.Errorf("pccl: sync shared state: %w: %w", ErrSync, ferr)
	}
	done := &wire.SyncDone{OK: ferr == nil}
	if ferr != nil {
		done.Detail = ferr.Error()
	}
	call2, ch2 := c.newCall()
	r, err = c.ask(context.WithoutCancel(ctx), "sync shared state", call2, ch2, syncDoneCall{call: call2, prev: call, done: done})
	if err != nil {
		return res, err
	}
	fin := r.msg.(*wire.SyncComplete)
	if ferr != nil {
		return res, fmt.Errorf("%w: %w", ErrSync, ferr)
	}
	if fin.Code != wire.CodeOK {
		return res, fmt.Errorf("%w: revision %d: %s", ErrSync, fin.Revision, fin.Detail)
	}
	st.Revision = fin.Revision
	res.ResumeStep = fin.ResumeStep
	c.holdState(d, p.Fetch, fin.Revision)
	return res, nil
}

// rangeBlocks is the number of hash-tree blocks fetched per request.
const rangeBlocks = 4

// fetchAll fetches and installs every entry of the plan. Block-aligned ranges of all entries are spread
// over a few workers, each keeping one connection per donor for the whole sync; the first worker to
// take a range of an entry gets the leaf hashes of its hash tree from a donor and checks them against
// the elected hash, so that the leaves of later entries come in while earlier entries' bytes flow.
// A worker receives a range into its own buffer, checks every block against its leaf while it is
// still in cache, and only then copies it into the application's memory: nothing unverified is ever
// written there. A range whose donor fails or sends a bad block is fetched again from the next donor.
func (c *Communicator) fetchAll(ctx context.Context, st *State, items []wire.FetchItem, opt SyncOptions, res *SyncResult) error {
	if len(items) == 0 {
		return nil
	}
	var total int64
	donorSet := map[uint64]bool{}
	for _, it := range items {
		total += int64(it.Bytes)
		e := st.Lookup(it.Name)
		if e == nil || uint64(len(e.Data)) != it.Bytes {
			return fmt.Errorf("entry %q: not registered here with %d bytes", it.Name, it.Bytes)
		}
		if len(it.Donors) == 0 {
			return fmt.Errorf("entry %q: no donor", it.Name)
		}
		for _, d := range it.Donors {
			donorSet[d.ID] = true
		}
	}
	var done atomic.Int64
	progress := func(n int64) {
		v := done.Add(n)
		if opt.Progress != nil {
			opt.Progress(v, total)
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	type entryJob struct {
		it     wire.FetchItem
		entry  *Entry
		once   sync.Once // fetches leaves, by the first worker that gets a range of the entry
		leaves []uint64
		err    error // why the leaves could not be had
		left   atomic.Int32
	}
	var resMu sync.Mutex
	finish := func(j *entryJob) {
		j.entry.RememberLeaves(j.leaves, j.it.Hash)
		resMu.Lock()
		res.Fetched = append(res.Fetched, j.it.Name)
		res.FetchedBytes += int64(j.it.Bytes)
		resMu.Unlock()
	}
	jobs := make([]*entryJob, len(items))
	for i, it := range items {
		jobs[i] = &entryJob{it: it, entry: st.Lookup(it.Name)}
	}

	type task struct {
		job   *entryJob
		off   int
		n     int
		first int // index of the preferred donor
	}
	tasks := make(chan task)
	workers := min(8, max(2, 2*len(donorSet)))
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conns := map[uint64]*stateConn{}
			defer func() {
				for _, sc := range conns {
					sc.close()
				}
			}()
			buf := make([]byte, rangeBlocks*sharedstate.BlockSize)
			for t := range tasks {
				it := t.job.it
				// The leaves of an entry, checked against the elected hash, are fetched by the
				// first worker that needs them, over its own connections, while the other
				// workers already move the ranges of earlier entries.
				t.job.once.Do(func() { t.job.leaves, t.job.err = c.fetchLeaves(ctx, conns, it) })
				if t.job.err != nil {
					cancel(fmt.Errorf("entry %q: %w", it.Name, t.job.err))
					continue
				}
				part := buf[:t.n]
				var last error
				ok := false
				for k := range it.Donors {
					donor := it.Donors[(t.first+k)%len(it.Donors)]
					last = c.fetchRange(ctx, conns, donor, it, uint64(t.off), part, opt.Compress)
					if last == nil {
						last = verifyBlocks(part, t.off, t.job.leaves)
					}
					if last == nil {
						ok = true
						break
					}
					if ctx.Err() != nil {
						break
					}
					c.log.Warn("state fetch failed, trying the next donor", "entry", it.Name, "donor", donor.ID, "err", last)
				}
				if !ok {
					cancel(fmt.Errorf("entry %q: %w", it.Name, last))
					continue
				}
				copy(t.job.entry.Data[t.off:t.off+t.n], part)
				progress(int64(t.n))
				if t.job.left.Add(-1) == 0 {
					finish(t.job)
				}
			}
		}()
	}
dispatch:
	for _, j := range jobs {
		size := int(j.it.Bytes)
		step := rangeBlocks * sharedstate.BlockSize
		n := (size + step - 1) / step
		if n == 0 {
			leafConns := map[uint64]*stateConn{}
			j.leaves, j.err = c.fetchLeaves(ctx, leafConns, j.it)
			for _, sc := range leafConns {
				sc.close()
			}
			if j.err != nil {
				cancel(fmt.Errorf("entry %q: %w", j.it.Name, j.err))
				break dispatch
			}
			finish(j)
			continue
		}
		j.left.Store(int32(n))
		for r := 0; r < n; r++ {
			off := r * step
			select {
			case tasks <- task{job: j, off: off, n: min(step, size-off), first: r % len(j.it.Donors)}:
			case <-ctx.Done():
				break dispatch
			}
		}
	}
	close(tasks)
	wg.Wait()
	return context.Cause(ctx)
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

// fetchLeaves returns the leaf hashes of entry it from the first donor whose leaves combine to the
// elected hash.
func (c *Communicator) fetchLeaves(ctx context.Context, conns map[uint64]*stateConn, it wire.FetchItem) ([]uint64, error) {
	want := (int(it.Bytes) + sharedstate.BlockSize - 1) / sharedstate.BlockSize
	var last error
	for _, donor := range it.Donors {
		raw := make([]byte, 8*want)
		err := c.request(ctx, conns, donor, &wire.StateRequest{Token: c.cfg.Token, Name: it.Name, Hash: it.Hash, Leaves: true}, raw)
		if err == nil {
			leaves := make([]uint64, want)
			for i := range leaves {
				leaves[i] = binary.LittleEndian.Uint64(raw[8*i:])
			}
			if sharedstate.Root(leaves, int(it.Bytes)) == it.Hash {
				return leaves, nil
			}
			err = errors.New("leaf hashes do not combine to the elected hash")
		}
		last = fmt.Errorf("leaves from donor %d: %w", donor.ID, err)
	}
	return nil, last
}

// stateConn is a worker's connection to one donor, reused for every request it sends there.
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

// fetchRange fills dst with the bytes at off of the entry it, from donor.
func (c *Communicator) fetchRange(ctx context.Context, conns map[uint64]*stateConn, donor wire.PeerInfo, it wire.FetchItem, off uint64, dst []byte, compress bool) error {
	req := &wire.StateRequest{Token: c.cfg.Token, Name: it.Name, Hash: it.Hash, Off: off, Len: uint64(len(dst)), Compress: compress}
	return c.request(ctx, conns, donor, req, dst)
}

// request sends req to donor over the caller's connection to it (opened on first use, dropped on any
// error) and reads the answer into dst, which must be exactly as long as the answer.
func (c *Communicator) request(ctx context.Context, conns map[uint64]*stateConn, donor wire.PeerInfo, req *wire.StateRequest, dst []byte) error {
	cfg := c.cfg
	sc := conns[donor.ID]
	if sc == nil {
		dctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
		conn, err := cfg.Transport.Dial(dctx, donor.Addr)
		cancel()
		if err != nil {
			return err
		}
		conn.SetDeadline(time.Now().Add(cfg.DialTimeout))
		if err := wire.Exchange(conn, wire.KindState); err != nil {
			conn.Close()
			return err
		}
		sc = &stateConn{conn: conn}
		conns[donor.ID] = sc
	}
	err := c.requestOn(ctx, sc, req, dst)
	if err != nil {
		sc.close()
		delete(conns, donor.ID)
	}
	return err
}

func (c *Communicator) requestOn(ctx context.Context, sc *stateConn, req *wire.StateRequest, dst []byte) error {
	conn := sc.conn
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	conn.SetDeadline(time.Now().Add(c.cfg.DialTimeout))
	if _, err := conn.Write(wire.AppendFrame(nil, req)); err != nil {
		return err
	}
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
	// The transfer may take long; its pace, not a fixed deadline, decides.
	conn.SetDeadline(time.Time{})
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

// serveState answers StateRequests on a connection from a peer that fetches our state.
func (c *Communicator) serveState(conn net.Conn) {
	defer conn.Close()
	var enc *zstd.Encoder
	for {
		conn.SetReadDeadline(time.Now().Add(c.cfg.DialTimeout))
		msg, _, err := wire.ReadFrame(conn, 1<<16, nil)
		if err != nil {
			return
		}
		req, ok := msg.(*wire.StateRequest)
		if !ok {
			return
		}
		conn.SetWriteDeadline(time.Time{})
		if req.Leaves {
			leaves, reason := c.stateLeaves(req)
			if reason != "" {
				conn.SetWriteDeadline(time.Now().Add(c.cfg.DialTimeout))
				conn.Write(wire.AppendFrame(nil, &wire.StateResponse{OK: false, Detail: reason}))
				return
			}
			out := wire.AppendFrame(nil, &wire.StateResponse{OK: true, Len: uint64(8 * len(leaves))})
			for _, l := range leaves {
				out = binary.LittleEndian.AppendUint64(out, l)
			}
			if _, err := conn.Write(out); err != nil {
				return
			}
			continue
		}
		data, reason := c.stateRange(conn, req)
		if reason != "" {
			conn.SetWriteDeadline(time.Now().Add(c.cfg.DialTimeout))
			conn.Write(wire.AppendFrame(nil, &wire.StateResponse{OK: false, Detail: reason}))
			return
		}
		err = c.sendRange(conn, data, req.Compress, &enc)
		if err == nil {
			c.served.Add(int64(len(data)))
		}
		c.endServe(conn)
		if err != nil {
			return
		}
	}
}

// sendRange writes one StateResponse and its bytes (compressed if asked). It holds a serve lease.
func (c *Communicator) sendRange(conn net.Conn, data []byte, compress bool, enc **zstd.Encoder) error {
	if compress {
		if *enc == nil {
			e, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
			if err != nil {
				return err
			}
			*enc = e
		}
		z := (*enc).EncodeAll(data, make([]byte, 0, len(data)+len(data)/16+1024))
		if _, err := conn.Write(wire.AppendFrame(nil, &wire.StateResponse{OK: true, Len: uint64(len(z)), Compressed: true})); err != nil {
			return err
		}
		_, err := conn.Write(z)
		return err
	}
	if _, err := conn.Write(wire.AppendFrame(nil, &wire.StateResponse{OK: true, Len: uint64(len(data))})); err != nil {
		return err
	}
	_, err := conn.Write(data)
	return err
}

// stopServing ends the donor side of a sync: no new range is served, transfers still in flight (a
// fetcher that gave up on us, a slow one) are cut off, and it returns only when none of them touches
// the state any more, so the application may change it.
func (c *Communicator) stopServing() {
	c.serveMu.Lock()
	c.serving, c.servingHashes, c.servingLeaves = nil, nil, nil
	for conn := range c.serveConns {
		conn.SetWriteDeadline(time.Now())
	}
	c.serveMu.Unlock()
	c.serveWG.Wait()
}

// servedEntry checks a request against the state served in this sync: the token, and that the
// entry holds the content the request expects. It returns the entry, or why not. c.serveMu must be held.
func (c *Communicator) servedEntry(req *wire.StateRequest) (*Entry, string) {
	switch {
	case req.Token != c.cfg.Token:
		return nil, "run token mismatch"
	case c.serving == nil:
		return nil, "not in a sync"
	}
	e := c.serving.Lookup(req.Name)
	if e == nil {
		return nil, fmt.Sprintf("no entry %q", req.Name)
	}
	if h, ok := c.servingHashes[req.Name]; !ok || h != req.Hash {
		return nil, fmt.Sprintf("entry %q does not hold the elected content", req.Name)
	}
	return e, ""
}

// stateLeaves returns the leaf hashes of a served entry as they were at the vote, or why not.
func (c *Communicator) stateLeaves(req *wire.StateRequest) ([]uint64, string) {
	c.serveMu.Lock()
	defer c.serveMu.Unlock()
	if _, reason := c.servedEntry(req); reason != "" {
		return nil, reason
	}
	return c.servingLeaves[req.Name], ""
}

// stateRange returns the requested bytes of the state we serve, or why not. On success the caller
// holds a serve lease on conn and must call endServe when it no longer reads the bytes.
func (c *Communicator) stateRange(conn net.Conn, req *wire.StateRequest) ([]byte, string) {
	c.serveMu.Lock()
	defer c.serveMu.Unlock()
	e, reason := c.servedEntry(req)
	if reason != "" {
		return nil, reason
	}
	if req.Off > uint64(len(e.Data)) || req.Len > uint64(len(e.Data))-req.Off {
		return nil, fmt.Sprintf("range %d+%d outside entry %q of %d bytes", req.Off, req.Len, req.Name, len(e.Data))
	}
	c.serveWG.Add(1)
	if c.serveConns == nil {
		c.serveConns = map[net.Conn]bool{}
	}
	c.serveConns[conn] = true
	return e.Data[req.Off : req.Off+req.Len], ""
}

func (c *Communicator) endServe(conn net.Conn) {
	c.serveMu.Lock()
	delete(c.serveConns, conn)
	c.serveMu.Unlock()
	c.serveWG.Done()
}

// holdState records what this peer holds after a successful sync of revision rev: the digest it voted
// with, where the entries it fetched now hash as elected. A Resume report to a restarted master
// carries it.
func (c *Communicator) holdState(d sharedstate.Digest, fetched []wire.FetchItem, rev uint64) {
	d.Revision = rev
	d.Entries = slices.Clone(d.Entries)
	for _, f := range fetched {
		for i := range d.Entries {
			if d.Entries[i].Name == f.Name {
				d.Entries[i].Hash = f.Hash
			}
		}
	}
	c.held.Store(&heldState{revision: rev, digest: sharedstate.EncodeDigest(d)})
}
