package diagnosis

import (
	"maps"
	"math"
	"slices"
	"time"
)

// Detector keeps one group's delay matrix and syndromes. It is not safe for concurrent use: its
// owner (the master's state machine) serializes every call. It keeps no reference to the Ops and
// Reports it is given; the Events and Cells it returns are the caller's, but their slices (Cells,
// Chain) may be shared with the Detector's own state and later events, so treat them as read-only.
type Detector struct {
	cfg    Config
	op     uint64 // operations observed
	jitter window // per operation: the median absolute deviation of the members' votes, seconds
	cells  map[Link]*cell
	probes map[Link]probe // bandwidth tests, by link
	peers  map[uint64]*peerStat
	synd   map[string]*syndrome
	sites  map[uint64]string // the members' sites in the latest operation
}

// probe is a bandwidth test of one link.
type probe struct {
	cost float64 // seconds per byte
	op   uint64  // operations observed when it was taken
}

// cell is one directed link of the matrix.
type cell struct {
	transfer window // seconds per byte from first to last byte, at the sender
	stall    window // seconds per byte the link held its sender back
	wait     window // seconds per operation the receiver starved on it
	transit  window // seconds per byte its frames spent arriving, at the receiver
	last     uint64 // operation that last sampled it
}

// peerStat is one peer's figures.
type peerStat struct {
	busy window // seconds per byte busy on its own (span minus stalls)
	wait window // fraction of its span it waited on links in
	late window // fraction of its span before its first byte out
	span window // seconds per byte from begin to its last byte
	secs window // seconds from begin to its last byte
	vote window // seconds its vote came after the operation's median vote
	last uint64
}

type syndrome struct {
	ev     Event // the latest evidence
	streak int   // consecutive operations seen, while not active
	clean  int   // consecutive operations absent, while active
	held   int   // operations since it first held
	active bool
}

// New returns a Detector with an empty matrix.
func New(cfg Config) *Detector {
	return &Detector{cfg: cfg.withDefaults(), cells: map[Link]*cell{}, probes: map[Link]probe{}, peers: map[uint64]*peerStat{},
		synd: map[string]*syndrome{}}
}

// ObserveProbe records a bandwidth test of the link from one peer to another (bytes per second;
// zero or less: the test failed, which counts as a very slow link). Tests cover every link, not
// only the ring's, so they tell a slow sender or receiver from a slow link on a ring where each
// peer has one link out and one in; they count until Stale operations later.
func (d *Detector) ObserveProbe(from, to uint64, bytesPerSec float64) {
	if math.IsNaN(bytesPerSec) || from == to {
		return
	}
	cost := math.Inf(1)
	if bytesPerSec > 0 && !math.IsInf(bytesPerSec, 0) {
		cost = 1 / bytesPerSec
	}
	d.probes[Link{from, to}] = probe{cost: cost, op: d.op}
}

// Observe folds one operation into the matrix and returns the syndromes it raised or cleared, in a
// deterministic order.
func (d *Detector) Observe(op Op) []Event {
	d.op++
	d.sites = maps.Clone(op.Sites)
	inWait := map[Link]time.Duration{}
	for _, r := range op.Reports {
		for _, l := range r.Links {
			if !l.Out {
				inWait[Link{l.Peer, r.Peer}] += l.Wait
			}
		}
	}
	// Votes are judged against the operation's median vote and its spread, so that the jitter of
	// the training step sets the bar.
	votes := make([]float64, len(op.Reports))
	for i, r := range op.Reports {
		votes[i] = max(r.Vote, 0).Seconds()
	}
	medVote := median(votes)
	dev := make([]float64, len(votes))
	for i, v := range votes {
		dev[i] = math.Abs(v - medVote)
	}
	if len(votes) > 0 {
		d.jitter.add(median(dev))
	}
	for _, r := range op.Reports {
		d.sample(r, inWait, max(r.Vote, 0).Seconds()-medVote)
	}
	// Links of earlier rings and old bandwidth tests age out, so the matrix stays as large as what
	// the group still uses.
	for l, c := range d.cells {
		if c.last+uint64(d.cfg.Stale) < d.op {
			delete(d.cells, l)
		}
	}
	for l, p := range d.probes {
		if p.op+uint64(d.cfg.Stale) < d.op {
			delete(d.probes, l)
		}
	}
	return d.judge(d.classify(op.Ring))
}

// sample adds one report's figures; vote is how many seconds its vote came after the median one.
func (d *Detector) sample(r Report, inWait map[Link]time.Duration, vote float64) {
	var bytesOut, bytesIn uint64
	var span, wait, stall time.Duration
	late := time.Duration(-1)
	for _, l := range r.Links {
		span = max(span, l.End)
		if l.Out {
			bytesOut += l.Bytes
			stall += l.Wait
			if late < 0 || l.Start < late {
				late = l.Start
			}
			if l.Bytes >= d.cfg.MinBytes && l.Peer != r.Peer {
				k := Link{r.Peer, l.Peer}
				c := d.cellOf(k)
				c.transfer.add((l.End - l.Start).Seconds() / float64(l.Bytes))
				c.stall.add(l.Wait.Seconds() / float64(l.Bytes))
				c.wait.add(inWait[k].Seconds())
				c.last = d.op
			}
		} else {
			bytesIn += l.Bytes
			wait += l.Wait
			if l.Bytes >= d.cfg.MinBytes && l.Transit > 0 && l.Peer != r.Peer {
				c := d.cellOf(Link{l.Peer, r.Peer})
				c.transit.add(l.Transit.Seconds() / float64(l.Bytes))
				c.last = d.op
			}
		}
	}
	bytes := max(bytesOut, bytesIn)
	if bytes < d.cfg.MinBytes || span <= 0 {
		return
	}
	late = max(late, 0)
	p := d.peers[r.Peer]
	if p == nil {
		p = &peerStat{}
		d.peers[r.Peer] = p
	}
	busy := max(span-wait-stall, 0)
	p.busy.add(busy.Seconds() / float64(bytes))
	p.wait.add(min(wait.Seconds()/span.Seconds(), 1))
	p.late.add(min(late.Seconds()/span.Seconds(), 1))
	p.span.add(span.Seconds() / float64(bytes))
	p.secs.add(span.Seconds())
	p.vote.add(vote)
	p.last = d.op
}

// cellOf returns the cell of link l, creating it.
func (d *Detector) cellOf(l Link) *cell {
	c := d.cells[l]
	if c == nil {
		c = &cell{}
		d.cells[l] = c
	}
	return c
}

// Suspects returns the links of ring whose latest sample stood out, in the operation just observed,
// while the matrix could not tell them from a slow sender or receiver: the sender has fewer than two
// fresh bandwidth tests of its links out and no other fresh cell out, or the receiver likewise for
// its links in. A syndrome needs Recent such samples, so bandwidth tests of the neighbouring links
// asked for now are in by the time it can be raised, and it is raised as the right syndrome at once.
// The order is deterministic.
func (d *Detector) Suspects(ring []uint64) []Link {
	if len(ring) < 2 {
		return nil
	}
	f := d.figures(ring)
	tests := d.freshTests(f)
	row, col := tests.row, tests.col
	var out []Link
	for l, c := range d.cells {
		if c.last != d.op {
			continue
		}
		if _, ok := f.pos[l.From]; !ok {
			continue
		}
		if _, ok := f.pos[l.To]; !ok {
			continue
		}
		// The stall alone: a ring with one link out and one in per peer, where probes help, shows a
		// slow link by its stall, and a single noisy transit must not cost bandwidth tests.
		if !d.hot(c.stall.recent(1), f.medStall, f.medSpan) {
			continue
		}
		if (len(row[l.From]) < 2 && f.outKnown[l.From] < 2) || (len(col[l.To]) < 2 && f.inKnown[l.To] < 2) {
			out = append(out, l)
		}
	}
	sortLinks(out)
	return out
}

// Active returns the syndromes raised and not cleared, sorted by key; Ops is how long each held.
func (d *Detector) Active() []Event {
	var out []Event
	for _, key := range sortedKeys(d.synd) {
		if s := d.synd[key]; s.active {
			ev := s.ev
			ev.Ops = s.held
			out = append(out, ev)
		}
	}
	return out
}

// Forget drops a peer that left: its cells, its figures, and the syndromes about it (without
// events: its departure is news enough).
func (d *Detector) Forget(peer uint64) {
	delete(d.peers, peer)
	for l := range d.cells {
		if l.From == peer || l.To == peer {
			delete(d.cells, l)
		}
	}
	for l := range d.probes {
		if l.From == peer || l.To == peer {
			delete(d.probes, l)
		}
	}
	for key, s := range d.synd {
		if s.ev.Peer == peer || s.ev.Link.To == peer {
			delete(d.synd, key)
		}
	}
}

// Cell is one directed link's current estimates.
type Cell struct {
	Link Link
	// Transfer is the seconds per byte from the first to the last byte, at the sender.
	Transfer float64
	// Stall is the seconds per byte the link held its sender back.
	Stall float64
	// Wait is the seconds per operation the receiver starved on it.
	Wait float64
	// Transit is the seconds per byte its frames spent arriving, at the receiver (0: not timed).
	Transit float64
	// Age is how many operations ago the link was last observed (0: in the latest).
	Age uint64
}

// Cells returns the current estimates of every link in the matrix, sorted.
func (d *Detector) Cells() []Cell {
	var out []Cell
	for l, c := range d.cells {
		k := d.cfg.Recent
		out = append(out, Cell{Link: l, Transfer: orZero(c.transfer.recent(k)), Stall: orZero(c.stall.recent(k)),
			Wait: orZero(c.wait.recent(k)), Transit: orZero(c.transit.recent(k)), Age: d.op - c.last})
	}
	slices.SortFunc(out, func(a, b Cell) int { return compareLinks(a.Link, b.Link) })
	return out
}

// Delay returns the delay matrix in the order of ring for display: Delay[i][j] is the recent time in
// seconds the link from ring[i] to ring[j] held its sender back per MiB (0: not observed recently).
// It returns nil while no link was observed.
func (d *Detector) Delay(ring []uint64) [][]float64 {
	if len(d.cells) == 0 {
		return nil
	}
	out := make([][]float64, len(ring))
	for i, a := range ring {
		out[i] = make([]float64, len(ring))
		for j, b := range ring {
			if c := d.cells[Link{a, b}]; c != nil && c.last+uint64(d.cfg.Stale) >= d.op {
				out[i][j] = orZero(c.stall.recent(d.cfg.Recent)) * (1 << 20)
			}
		}
	}
	return out
}

// orZero returns v, or 0 for NaN: a figure a cell has no samples of (a link timed by one end only).
func orZero(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return v
}

// Ops returns how many operations were observed.
func (d *Detector) Ops() uint64 { return d.op }
