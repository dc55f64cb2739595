package pccl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
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
	// HashWorkers is the number of goroutines hashing the state, and checking fetched ranges that
	// arrive before their entry's leaf hashes (a range that arrives after them is checked by the
	// goroutine that received it). Default: GOMAXPROCS.
	HashWorkers int
	// Progress, if set, is called as fetched bytes arrive (done of total), from any goroutine.
	Progress func(done, total int64)
}

// SyncResult reports what a sync did on this peer.
type SyncResult struct {
	Revision     uint64   // the revision every participating peer now holds
	Fetched      []string // entries this peer received, in the order of the master's plan
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
