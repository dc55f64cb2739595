package diagnosis

import (
	"math"
	"slices"
)

// figures are the current estimates the classifier works on. figures fills them from the windows;
// markHotCells fills hotCells and hotOut, and the classify steps mark in explains the hot cells a
// syndrome they raised accounts for.
type figures struct {
	ring               []uint64
	pos                map[uint64]int
	busy, wait, late   map[uint64]float64
	busyLeast          map[uint64]float64 // the least busy figure of the last Recent operations
	stallLeast         map[Link]float64   // the least stall of the last Recent operations
	vote               map[uint64]float64 // the least recent lag behind the median vote, seconds
	stall              map[Link]float64   // fresh cells only
	transit            map[Link]float64   // fresh cells their receiver timed
	transitLeast       map[Link]float64   // the least transit of the last Recent operations
	medTransit         map[bool]float64   // median transit of the links between sites (true) and within one (false)
	sites              map[uint64]string  // the members' sites ("": none)
	medSecs            float64            // median span of an operation, seconds
	jitter             float64            // typical spread of the votes, seconds
	medSpan, medBusy   float64
	medStall, medLate  float64
	maxWait            float64
	hotCells, explains map[Link]bool
	byTransit          map[Link]bool       // hot cells whose transit stands out while their stall does not
	hotOut             map[uint64][]uint64 // the targets of each peer's hot cells, sorted
	outKnown, inKnown  map[uint64]int      // fresh cells out of and into each peer
}

// figures returns the estimates of the peers of ring and of the links between them that are fresh
// (observed within Stale operations), with the group medians.
func (d *Detector) figures(ring []uint64) *figures {
	k := d.cfg.Recent
	f := &figures{ring: ring, pos: map[uint64]int{},
		busy: map[uint64]float64{}, wait: map[uint64]float64{}, late: map[uint64]float64{}, vote: map[uint64]float64{},
		busyLeast: map[uint64]float64{}, stallLeast: map[Link]float64{}, stall: map[Link]float64{},
		transit: map[Link]float64{}, transitLeast: map[Link]float64{}, medTransit: map[bool]float64{}, sites: d.sites,
		byTransit: map[Link]bool{}, hotCells: map[Link]bool{}, explains: map[Link]bool{}, hotOut: map[uint64][]uint64{}, outKnown: map[uint64]int{}, inKnown: map[uint64]int{}}
	var spans, busys, lates, stalls, secs []float64
	transits := map[bool][]float64{}
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
		if t := c.transit.recent(k); !math.IsNaN(t) {
			f.transit[l], f.transitLeast[l] = t, c.transit.least(k)
			transits[f.between(l)] = append(transits[f.between(l)], t)
		}
	}
	for _, cross := range []bool{false, true} {
		f.medTransit[cross] = median(transits[cross])
	}
	f.medSpan, f.medBusy, f.medLate, f.medStall = median(spans), median(busys), median(lates), median(stalls)
	f.medSecs, f.jitter = median(secs), d.jitter.median()
	return f
}

// between reports whether l joins two sites.
func (f *figures) between(l Link) bool { return f.sites[l.From] != f.sites[l.To] }

// hotCell reports whether cell l stands out of the group: by the least of its recent stalls (it held
// its sender back), or by the least of its recent transits against the links of its kind (within a
// site or between sites). A link paced by a slow upstream peer never fills its in-flight window and
// holds nobody back, so only its frames' transit shows that it is the slow one.
func (d *Detector) hotCell(f *figures, l Link) (hot, byTransit bool) {
	if d.hot(f.stallLeast[l], f.medStall, f.medSpan) {
		return true, false
	}
	if t, ok := f.transitLeast[l]; ok && d.hot(t, f.medTransit[f.between(l)], f.medSpan) {
		return true, true
	}
	return false, false
}

// figure returns cell l's figure over the group median and what it is: its stall, or for a cell hot
// by its transit alone its transit against the links of its kind.
func (f *figures) figure(l Link) (ratio float64, what string) {
	if f.byTransit[l] {
		if m := f.medTransit[f.between(l)]; m > 0 {
			return f.transit[l] / m, "transit"
		}
		return math.Inf(1), "transit"
	}
	if f.medStall == 0 {
		return math.Inf(1), "stall"
	}
	return f.stall[l] / f.medStall, "stall"
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

// testLines are the fresh bandwidth tests between ring members by sender (row) and by receiver
// (col), each sorted, and the median cost of them all.
type testLines struct {
	row, col map[uint64][]Link
	med      float64
}

// freshTests returns the fresh bandwidth tests between the members of f's ring.
func (d *Detector) freshTests(f *figures) testLines {
	row, col := map[uint64][]Link{}, map[uint64][]Link{}
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
	return testLines{row: row, col: col, med: median(costs)}
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

// cellRatio is the median figure of cells over the group median (see figures.figure), and what the
// figure is: "stall" unless all of them are hot by their transit alone.
func (d *Detector) cellRatio(f *figures, cells []Link) (float64, string) {
	v := make([]float64, len(cells))
	what := "transit"
	for i, l := range cells {
		v[i], _ = f.figure(l)
		if !f.byTransit[l] {
			what = "stall"
		}
	}
	return median(v), what
}

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
