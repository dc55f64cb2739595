package diagnosis

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Config tunes a Detector. The zero value works: every zero field takes the default it documents.
type Config struct {
	// Recent is how many of a figure's latest samples its estimate is the median of. Zero means 3.
	Recent int
	// Raise is the ratio to the group median beyond which a figure is hot. Zero means 2.
	Raise float64
	// Floor is the least excess over the median, as a fraction of the median span per byte, for a
	// figure to be hot; it keeps noise on figures close to zero quiet. Zero means 0.1.
	Floor float64
	// Confirm is how many consecutive operations a syndrome must hold before it is raised. A
	// syndrome holds in an operation only when its culprit's figure stood out in each of the last
	// Recent operations, so Confirm 1 already needs Recent slow operations in a row. Zero means 1.
	Confirm int
	// Release is how many consecutive operations a syndrome must be absent before it is cleared.
	// Zero means 3.
	Release int
	// Stale is how many operations a link's cell stays in the matrix after it was last observed.
	// Zero means 20.
	Stale int
	// WaitFraction is the least fraction of its span a peer must have waited on its predecessors to
	// count as waiting in the waiting chain. Zero means 0.25.
	WaitFraction float64
	// MinBytes is the least bytes a link must carry in an operation to be sampled: below it, latency
	// rather than bandwidth sets the figures. Zero means 64 KiB.
	MinBytes uint64
}

func (c Config) withDefaults() Config {
	if c.Recent == 0 {
		c.Recent = 3
	}
	if c.Raise == 0 {
		c.Raise = 2
	}
	if c.Floor == 0 {
		c.Floor = 0.1
	}
	if c.Confirm == 0 {
		c.Confirm = 1
	}
	if c.Release == 0 {
		c.Release = 3
	}
	if c.Stale == 0 {
		c.Stale = 20
	}
	if c.WaitFraction == 0 {
		c.WaitFraction = 0.25
	}
	if c.MinBytes == 0 {
		c.MinBytes = 64 << 10
	}
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Recent < 0 || c.Recent > maxWindow:
		return fmt.Errorf("diagnosis: Config.Recent is %d, must be in [0, %d]", c.Recent, maxWindow)
	case c.Raise != 0 && !(c.Raise > 1):
		return fmt.Errorf("diagnosis: Config.Raise is %v, must be 0 or above 1", c.Raise)
	case c.Floor < 0 || math.IsNaN(c.Floor):
		return fmt.Errorf("diagnosis: Config.Floor is %v, must be >= 0", c.Floor)
	case c.Confirm < 0 || c.Release < 0 || c.Stale < 0:
		return fmt.Errorf("diagnosis: Config.Confirm, Release and Stale must be >= 0")
	case c.WaitFraction < 0 || c.WaitFraction >= 1 || math.IsNaN(c.WaitFraction):
		return fmt.Errorf("diagnosis: Config.WaitFraction is %v, must be in [0, 1)", c.WaitFraction)
	}
	return nil
}

// Timing is what one link did during one operation, seen from the reporting peer (see the package
// documentation). Start and End are offsets from the moment the peer began the operation.
type Timing struct {
	Peer  uint64 // the other end of the link
	Out   bool   // true: bytes went from the reporting peer to Peer; false: from Peer to it
	Bytes uint64
	Start time.Duration
	End   time.Duration
	Wait  time.Duration // stalled on this link and on nothing else
}

// Report is one peer's timing summary of one operation.
type Report struct {
	Peer  uint64
	Links []Timing
	// Vote is how long after the first member's vote this peer's vote for the operation reached the
	// master (0 for the first): the others waited that long for it before the operation could start.
	Vote time.Duration
}

// Op is one completed collective of a group: its ring in order and the members' reports (a member
// that sent none is simply absent).
type Op struct {
	Ring    []uint64
	Reports []Report
}

// Link is a directed link between two peers.
type Link struct{ From, To uint64 }

func (l Link) String() string { return fmt.Sprintf("%d→%d", l.From, l.To) }

// Kind is a syndrome.
type Kind uint8

// Syndromes.
const (
	SlowLink     Kind = iota + 1 // one link (a cell of the matrix)
	SlowSender                   // a peer's links out (a row)
	SlowReceiver                 // a peer's links in (a column)
	SlowCompute                  // a peer slow outside communication (the origin of a waiting chain)
)

var kindNames = [...]string{"", "slow-link", "slow-sender", "slow-receiver", "slow-compute"}

// Kinds lists every syndrome, in order.
var Kinds = []Kind{SlowLink, SlowSender, SlowReceiver, SlowCompute}

func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Event is a syndrome raised or cleared.
type Event struct {
	Kind Kind
	// Peer is the slow peer: the row's sender, the column's receiver, the waiting chain's origin, or
	// the sender of a slow link.
	Peer uint64
	// Link is the slow link of a SlowLink; zero otherwise.
	Link Link
	// Cells are the hot cells that make the evidence (SlowLink, SlowSender, SlowReceiver).
	Cells []Link
	// Chain is the waiting chain: the peers that waited on Peer, nearest first (SlowCompute, and any
	// syndrome whose culprit is the chain's origin).
	Chain []uint64
	// Ratio is the culprit's figure over the group median: the stall per byte of the hot cells, or
	// the busy time per byte of a SlowCompute peer.
	Ratio float64
	// Confidence in [0, 1) grows with Ratio, and shrinks where the matrix cannot tell this syndrome
	// from another one.
	Confidence float64
	// Cleared is true when the syndrome ended; Evidence then says why.
	Cleared bool
	// Ops is how many operations the syndrome has held: Confirm when raised, its whole life when
	// cleared or listed by Active.
	Ops int
	// Evidence says, in words, what was seen.
	Evidence string
}

// Key identifies the syndrome an event is about.
func (e Event) Key() string {
	if e.Kind == SlowLink {
		return e.Kind.String() + " " + e.Link.String()
	}
	return fmt.Sprintf("%s %d", e.Kind, e.Peer)
}

// Detector keeps one group's delay matrix and syndromes. It is not safe for concurrent use.
type Detector struct {
	cfg    Config
	op     uint64 // operations observed
	jitter window // per operation: the median absolute deviation of the members' votes, seconds
	cells  map[Link]*cell
	probes map[Link]probe // bandwidth tests, by link
	peers  map[uint64]*peerStat
	synd   map[string]*syndrome
}

// voteSpreads is how many typical deviations of the votes (the median over recent operations of
// the median absolute deviation of an operation's votes) a vote must trail the median one to count
// as late. The deviation of a handful of votes is small; ten of them keep a chance straggler of
// three operations in a row out of sight.
const voteSpreads = 10

// maxWindow is how many samples of each figure are kept.
const maxWindow = 8

// window holds the latest samples of one figure.
type window struct {
	v [maxWindow]float64
	n int // samples held, at most maxWindow
	i int // next slot
}

func (w *window) add(v float64) {
	w.v[w.i] = v
	w.i = (w.i + 1) % maxWindow
	w.n = min(w.n+1, maxWindow)
}

// recent returns the median of the latest k samples, or the smallest sample while fewer than k are
// held, so that a figure seen once or twice is judged by its best showing (NaN without samples).
func (w *window) recent(k int) float64 {
	have := min(k, w.n)
	if have == 0 {
		return math.NaN()
	}
	s := make([]float64, have)
	for j := range have {
		s[j] = w.v[(w.i-1-j+maxWindow)%maxWindow]
	}
	if have < k {
		return slices.Min(s)
	}
	return median(s)
}

// median returns the median of every sample held (0 without samples).
func (w *window) median() float64 { return median(w.v[:w.n]) }

// least returns the smallest of the latest k samples, or NaN while fewer than k are held: a figure
// that must hold in every recent operation.
func (w *window) least(k int) float64 {
	if w.n < k || k == 0 {
		return math.NaN()
	}
	v := w.v[(w.i-1+maxWindow)%maxWindow]
	for j := 1; j < k; j++ {
		v = min(v, w.v[(w.i-1-j+maxWindow)%maxWindow])
	}
	return v
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
				c := d.cells[k]
				if c == nil {
					c = &cell{}
					d.cells[k] = c
				}
				c.transfer.add((l.End - l.Start).Seconds() / float64(l.Bytes))
				c.stall.add(l.Wait.Seconds() / float64(l.Bytes))
				c.wait.add(inWait[k].Seconds())
				c.last = d.op
			}
		} else {
			bytesIn += l.Bytes
			wait += l.Wait
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

// figures are the current estimates the classifier works on.
type figures struct {
	ring               []uint64
	pos                map[uint64]int
	busy, wait, late   map[uint64]float64
	busyLeast          map[uint64]float64 // the least busy figure of the last Recent operations
	stallLeast         map[Link]float64   // the least stall of the last Recent operations
	vote               map[uint64]float64 // the least recent lag behind the median vote, seconds
	stall              map[Link]float64   // fresh cells only
	medSecs            float64            // median span of an operation, seconds
	jitter             float64            // typical spread of the votes, seconds
	medSpan, medBusy   float64
	medStall, medLate  float64
	maxWait            float64
	hotCells, explains map[Link]bool
	hotOut             map[uint64][]uint64 // the targets of each peer's hot cells, sorted
	outKnown, inKnown  map[uint64]int      // fresh cells out of and into each peer
}

func (d *Detector) figures(ring []uint64) *figures {
	k := d.cfg.Recent
	f := &figures{ring: ring, pos: map[uint64]int{},
		busy: map[uint64]float64{}, wait: map[uint64]float64{}, late: map[uint64]float64{}, vote: map[uint64]float64{},
		busyLeast: map[uint64]float64{}, stallLeast: map[Link]float64{}, stall: map[Link]float64{},
		hotCells: map[Link]bool{}, explains: map[Link]bool{}, outKnown: map[uint64]int{}, inKnown: map[uint64]int{}}
	var spans, busys, lates, stalls, secs []float64
	for i, id := range ring {
		f.pos[id] = i
		p := d.peers[id]
		if p == nil || p.last+uint64(d.cfg.Stale) < d.op {
			continue
		}
		f.busy[id], f.wait[id], f.late[id] = p.busy.recent(k), p.wait.recent(k), p.late.recent(k)
		f.busyLeast[id] = p.busy.least(k)
		if v := p.vote.least(k); !math.IsNaN(v) {
			f.vote[id] = v
		}
		secs = append(secs, p.secs.recent(k))
		spans = append(spans, p.span.recent(k))
		busys = append(busys, f.busy[id])
		lates = append(lates, f.late[id])
		f.maxWait = max(f.maxWait, f.wait[id])
	}
	for l, c := range d.cells {
		if c.last+uint64(d.cfg.Stale) < d.op {
			continue
		}
		if _, ok := f.pos[l.From]; !ok {
			continue
		}
		if _, ok := f.pos[l.To]; !ok {
			continue
		}
		f.stall[l] = c.stall.recent(k)
		f.stallLeast[l] = c.stall.least(k)
		f.outKnown[l.From]++
		f.inKnown[l.To]++
		stalls = append(stalls, f.stall[l])
	}
	f.medSpan, f.medBusy, f.medLate, f.medStall = median(spans), median(busys), median(lates), median(stalls)
	f.medSecs, f.jitter = median(secs), d.jitter.median()
	return f
}

// hot reports whether v stands out of the group whose median is med (false for NaN).
func (d *Detector) hot(v, med, medSpan float64) bool {
	return v >= d.cfg.Raise*med && v-med >= d.cfg.Floor*medSpan && v > 0
}

// waiting reports whether a peer counts as waiting in the waiting chain.
func (d *Detector) waiting(f *figures, id uint64) bool {
	w, ok := f.wait[id]
	return ok && w >= d.cfg.WaitFraction && w >= 0.5*f.maxWait
}

// walkBack follows the waiting chain from start against the ring's direction: while a peer waits, the
// one it waits on is its predecessor. A peer that does not wait but is held back sending into a peer
// that does not wait either (a hot cell into it) waits on that peer, so the walk goes on there. It
// returns the first peer that waits on nobody (the origin) and the peers that waited on it, nearest
// first; ok is false when the whole ring waits.
func (d *Detector) walkBack(f *figures, start uint64) (origin uint64, chain []uint64, ok bool) {
	n := len(f.ring)
	x := start
	var path []uint64
	for range n + 1 {
		if d.waiting(f, x) {
			path = append(path, x)
			x = f.ring[(f.pos[x]+n-1)%n]
			continue
		}
		if y, held := d.heldBy(f, x); held && !slices.Contains(path, y) {
			path = append(path, x)
			x = y
			continue
		}
		slices.Reverse(path)
		return x, path, true
	}
	return 0, nil, false
}

// heldBy returns the peer that does not wait and into which x's link out is a hot cell, if any.
func (d *Detector) heldBy(f *figures, x uint64) (uint64, bool) {
	for _, y := range f.hotOut[x] {
		if y != x && !d.waiting(f, y) {
			return y, true
		}
	}
	return 0, false
}

// classify returns the syndromes the current estimates show, keyed.
func (d *Detector) classify(ring []uint64) map[string]Event {
	out := map[string]Event{}
	if len(ring) < 2 {
		return out
	}
	f := d.figures(ring)
	f.hotOut = map[uint64][]uint64{}
	for l, v := range f.stallLeast {
		if d.hot(v, f.medStall, f.medSpan) {
			f.hotCells[l] = true
			f.hotOut[l.From] = append(f.hotOut[l.From], l.To)
		}
	}
	for _, to := range f.hotOut {
		slices.Sort(to)
	}

	// The waiting chains, walked back from the downstream end of every run of waiting peers (a
	// waiting peer whose successor does not wait), so that each peer is walked over about once.
	chains := map[uint64][]uint64{}
	n := len(ring)
	for i, q := range ring {
		if !d.waiting(f, q) || d.waiting(f, ring[(i+1)%n]) {
			continue
		}
		if o, chain, ok := d.walkBack(f, q); ok && len(chain) > len(chains[o]) {
			chains[o] = chain
		}
	}

	// A chain's origin that is busy on its own far beyond the median, while its links out are not
	// slow, is slow outside communication. The link into it is explained by it.
	for o, chain := range chains {
		b, ok := f.busyLeast[o]
		if !ok || !d.hot(b, f.medBusy, f.medSpan) || d.rowHot(f, o) > 0 {
			continue
		}
		ratio := f.busy[o] / f.medBusy
		conf := confidence(ratio)
		if 2*len(chain) < len(ring) {
			conf *= 0.8
		}
		ev := Event{Kind: SlowCompute, Peer: o, Chain: chain, Ratio: ratio, Confidence: conf}
		ev.Evidence = fmt.Sprintf("peer %d busy outside communication %.1f× the group median; %d peer(s) wait on it (chain %s)",
			o, ratio, len(chain), chainText(chain))
		if lf := f.late[o] - f.medLate; lf >= 0.1 {
			ev.Evidence += fmt.Sprintf("; it starts its sends %.0f%% of the operation late", 100*lf)
		}
		for l := range f.hotCells {
			if l.To == o {
				f.explains[l] = true
			}
		}
		out[ev.Key()] = ev
	}

	// A peer whose vote comes last, far behind the others, is slow outside communication too: the
	// others wait for it at the vote, before the ring starts, so its lateness never reaches the
	// link timings. In each of the last Recent operations its vote must come after the median one
	// by Floor times the median operation and voteSpreads times the typical deviation of the votes,
	// so that the ordinary jitter of the training step stays quiet.
	for _, id := range ring {
		excess, ok := f.vote[id]
		if !ok || f.medSecs <= 0 || excess < d.cfg.Floor*f.medSecs || excess < voteSpreads*f.jitter {
			continue
		}
		key := fmt.Sprintf("%s %d", SlowCompute, id)
		if _, dup := out[key]; dup {
			continue
		}
		var chain []uint64
		for j := 1; j < n; j++ {
			chain = append(chain, ring[(f.pos[id]+j)%n])
		}
		ratio := (f.medSecs + excess) / f.medSecs
		ev := Event{Kind: SlowCompute, Peer: id, Chain: chain, Ratio: ratio, Confidence: confidence(ratio)}
		ev.Evidence = fmt.Sprintf("peer %d votes %s after the median peer, so every operation takes the others %.1f× its length; %d peer(s) wait on it at the vote",
			id, time.Duration(excess*1e9).Round(time.Microsecond), ratio, len(chain))
		out[key] = ev
	}

	// Rows and columns: most of a peer's recent links out (in) are hot, and at least two.
	rowOf, colOf := map[uint64][]Link{}, map[uint64][]Link{}
	for l := range f.hotCells {
		if !f.explains[l] {
			rowOf[l.From] = append(rowOf[l.From], l)
			colOf[l.To] = append(colOf[l.To], l)
		}
	}
	for _, id := range ring {
		for _, side := range []struct {
			kind  Kind
			hot   []Link
			known int
			what  string
		}{
			{SlowSender, rowOf[id], d.known(f, id, true), "links out"},
			{SlowReceiver, colOf[id], d.known(f, id, false), "links in"},
		} {
			if len(side.hot) < 2 || 2*len(side.hot) < side.known {
				continue
			}
			sortLinks(side.hot)
			ratio := d.cellRatio(f, side.hot)
			ev := Event{Kind: side.kind, Peer: id, Cells: side.hot, Ratio: ratio,
				Confidence: confidence(ratio) * float64(len(side.hot)) / float64(side.known)}
			ev.Evidence = fmt.Sprintf("%d of peer %d's %d recent %s are slow (%s), stall %.1f× the group median",
				len(side.hot), id, side.known, side.what, joinLinks(side.hot), ratio)
			for _, l := range side.hot {
				f.explains[l] = true
			}
			out[ev.Key()] = ev
		}
	}

	// A hot ring cell whose sender's (receiver's) bandwidth tests are mostly slow too is the
	// sender (receiver), even where the ring shows no second link of its row (column).
	probeRow, probeCol, medProbe := d.probeLines(f)
	for _, l := range sortedLinks(f.hotCells) {
		if f.explains[l] {
			continue
		}
		for _, side := range []struct {
			kind  Kind
			peer  uint64
			tests []Link
			what  string
		}{
			{SlowSender, l.From, probeRow[l.From], "links out"},
			{SlowReceiver, l.To, probeCol[l.To], "links in"},
		} {
			var slow []Link
			for _, t := range side.tests {
				if d.probes[t].cost >= d.cfg.Raise*medProbe {
					slow = append(slow, t)
				}
			}
			if len(slow) < 2 || 2*len(slow) < len(side.tests) {
				continue
			}
			ratio := f.stall[l] / f.medStall
			ev := Event{Kind: side.kind, Peer: side.peer, Cells: []Link{l}, Ratio: ratio,
				Confidence: confidence(ratio) * float64(len(slow)) / float64(len(side.tests))}
			ev.Evidence = fmt.Sprintf("link %s holds its sender back %.1f× the group median, and bandwidth tests found %d of peer %d's %d tested %s slow (%s)",
				l, ratio, len(slow), side.peer, len(side.tests), side.what, joinLinks(slow))
			if o, ok := out[ev.Key()]; ok {
				ev.Cells = append(o.Cells, l)
			}
			f.explains[l] = true
			out[ev.Key()] = ev
			break
		}
	}

	// What is left is single slow links.
	for l := range f.hotCells {
		if f.explains[l] {
			continue
		}
		ratio := f.stall[l] / f.medStall
		if f.medStall == 0 {
			ratio = math.Inf(1)
		}
		conf := confidence(ratio)
		row, col := d.known(f, l.From, true)-1, d.known(f, l.To, false)-1
		ev := Event{Kind: SlowLink, Peer: l.From, Link: l, Cells: []Link{l}, Ratio: ratio}
		ev.Evidence = fmt.Sprintf("link %s holds its sender back %.1f× the group median", l, ratio)
		if len(probeRow[l.From]) >= 2 && len(probeCol[l.To]) >= 2 {
			// The bandwidth tests of both peers' other links were normal.
			row, col = max(row, 1), max(col, 1)
			ev.Evidence += "; bandwidth tests of the other links of both peers are normal"
		}
		switch {
		case row > 0 && col > 0:
			ev.Evidence += fmt.Sprintf("; the other %d recent link(s) out of %d and %d into %d are normal", row, l.From, col, l.To)
		case row == 0 && col == 0:
			conf *= 0.6
			ev.Evidence += fmt.Sprintf("; no other recent link out of %d or into %d is known, so a slow sender or receiver would look the same", l.From, l.To)
		default:
			conf *= 0.8
			ev.Evidence += "; only one side of it has other recent links, all normal"
		}
		if chain, ok := chains[l.From]; ok {
			ev.Chain = chain
			conf = min(conf+0.05, 0.99)
			ev.Evidence += fmt.Sprintf("; %d peer(s) wait downstream of it", len(chain))
		}
		ev.Confidence = conf
		out[ev.Key()] = ev
	}
	return out
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
	row, col, _ := d.probeLines(f)
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

// probeLines returns the fresh bandwidth tests between ring members by sender and by receiver
// (sorted), and the median cost of them all.
func (d *Detector) probeLines(f *figures) (row, col map[uint64][]Link, med float64) {
	row, col = map[uint64][]Link{}, map[uint64][]Link{}
	var costs []float64
	for l, p := range d.probes {
		_, a := f.pos[l.From]
		_, b := f.pos[l.To]
		if !a || !b || p.op+uint64(d.cfg.Stale) < d.op {
			continue
		}
		row[l.From] = append(row[l.From], l)
		col[l.To] = append(col[l.To], l)
		costs = append(costs, p.cost)
	}
	for _, ls := range row {
		sortLinks(ls)
	}
	for _, ls := range col {
		sortLinks(ls)
	}
	return row, col, median(costs)
}

func sortedLinks(m map[Link]bool) []Link {
	ls := make([]Link, 0, len(m))
	for l := range m {
		ls = append(ls, l)
	}
	sortLinks(ls)
	return ls
}

// rowHot counts the hot cells out of id.
func (d *Detector) rowHot(f *figures, id uint64) int { return len(f.hotOut[id]) }

// known counts the fresh cells out of id (out) or into it.
func (d *Detector) known(f *figures, id uint64, out bool) int {
	if out {
		return f.outKnown[id]
	}
	return f.inKnown[id]
}

// cellRatio is the median stall of cells over the group median.
func (d *Detector) cellRatio(f *figures, cells []Link) float64 {
	v := make([]float64, len(cells))
	for i, l := range cells {
		v[i] = f.stall[l]
	}
	if f.medStall == 0 {
		return math.Inf(1)
	}
	return median(v) / f.medStall
}

// judge applies the hysteresis to this operation's syndromes.
func (d *Detector) judge(now map[string]Event) []Event {
	var out []Event
	for _, key := range sortedKeys(now) {
		ev := now[key]
		s := d.synd[key]
		if s == nil {
			s = &syndrome{}
			d.synd[key] = s
		}
		s.ev, s.clean = ev, 0
		s.held++
		if !s.active {
			s.streak++
			if s.streak >= d.cfg.Confirm {
				s.active = true
				ev.Ops = s.held
				out = append(out, ev)
			}
		}
	}
	// Broader syndromes explain narrower ones at once; the others clear after Release absences, or
	// at once when their links are no longer observed.
	for _, key := range sortedKeys(d.synd) {
		s := d.synd[key]
		if _, ok := now[key]; ok {
			continue
		}
		if !s.active {
			delete(d.synd, key)
			continue
		}
		s.held++
		s.clean++
		reason := ""
		switch {
		case d.explainedBy(s.ev) != "":
			reason = d.explainedBy(s.ev)
		case !d.observed(s.ev):
			reason = "its links are no longer observed"
		case s.clean >= d.cfg.Release:
			reason = fmt.Sprintf("absent for %d operations", s.clean)
		default:
			continue
		}
		ev := s.ev
		ev.Cleared, ev.Ops, ev.Evidence = true, s.held, "cleared: "+reason
		out = append(out, ev)
		delete(d.synd, key)
	}
	return out
}

// explainedBy names an active syndrome that covers ev, or "".
func (d *Detector) explainedBy(ev Event) string {
	if ev.Kind != SlowLink {
		return ""
	}
	for _, key := range sortedKeys(d.synd) {
		s := d.synd[key]
		if !s.active {
			continue
		}
		o := s.ev
		switch {
		case o.Kind == SlowSender && o.Peer == ev.Link.From,
			o.Kind == SlowReceiver && o.Peer == ev.Link.To,
			o.Kind == SlowCompute && o.Peer == ev.Link.To:
			return "explained by " + o.Key()
		}
	}
	return ""
}

// observed reports whether the cells of ev are still in the matrix.
func (d *Detector) observed(ev Event) bool {
	for _, l := range ev.Cells {
		if c := d.cells[l]; c != nil && c.last+uint64(d.cfg.Stale) >= d.op {
			return true
		}
	}
	if ev.Kind == SlowCompute {
		p := d.peers[ev.Peer]
		return p != nil && p.last+uint64(d.cfg.Stale) >= d.op
	}
	return len(ev.Cells) == 0
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
	// Age is how many operations ago the link was last observed (0: in the latest).
	Age uint64
}

// Cells returns the current estimates of every link in the matrix, sorted.
func (d *Detector) Cells() []Cell {
	var out []Cell
	for l, c := range d.cells {
		k := d.cfg.Recent
		out = append(out, Cell{Link: l, Transfer: c.transfer.recent(k), Stall: c.stall.recent(k),
			Wait: c.wait.recent(k), Age: d.op - c.last})
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
				out[i][j] = c.stall.recent(d.cfg.Recent) * (1 << 20)
			}
		}
	}
	return out
}

// Ops returns how many operations were observed.
func (d *Detector) Ops() uint64 { return d.op }

// confidence maps a ratio to the group median into [0, 0.99]: 2× gives 0.5, 4× 0.75, 10× 0.9.
func confidence(ratio float64) float64 {
	if math.IsNaN(ratio) || ratio <= 1 {
		return 0
	}
	return min(1-1/ratio, 0.99)
}

func median(v []float64) float64 {
	var s []float64
	for _, x := range v {
		if !math.IsNaN(x) {
			s = append(s, x)
		}
	}
	if len(s) == 0 {
		return 0
	}
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// chainText writes a waiting chain, its first peers only when it is long.
func chainText(chain []uint64) string {
	const show = 8
	if len(chain) <= show {
		return fmt.Sprint(chain)
	}
	return strings.TrimSuffix(fmt.Sprint(chain[:show]), "]") + " …]"
}

func compareLinks(a, b Link) int {
	if c := cmp.Compare(a.From, b.From); c != 0 {
		return c
	}
	return cmp.Compare(a.To, b.To)
}

func sortLinks(ls []Link) { slices.SortFunc(ls, compareLinks) }

func joinLinks(ls []Link) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = l.String()
	}
	return strings.Join(s, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
