package diagnosis

import (
	"fmt"
	"slices"
	"time"
)

// classify returns the syndromes the current estimates show, keyed. It runs the steps below in
// order, broadest explanation first: each step adds the syndromes of one kind of evidence and marks
// the hot cells they explain (figures.explains), so that the later steps see only the cells left
// unexplained and what is left at the end is single slow links.
func (d *Detector) classify(ring []uint64) map[string]Event {
	out := map[string]Event{}
	if len(ring) < 2 {
		return out
	}
	f := d.figures(ring)
	d.markHotCells(f)
	chains := d.waitingChains(f)
	d.slowOrigins(f, chains, out)
	d.lateVoters(f, out)
	d.hotLines(f, out)
	tests := d.freshTests(f)
	d.testedEnds(f, tests, out)
	d.slowLinks(f, chains, tests, out)
	return out
}

// voteSpreads is how many typical deviations of the votes (the median over recent operations of
// the median absolute deviation of an operation's votes) a vote must trail the median one to count
// as late. The deviation of a handful of votes is small; ten of them keep a chance straggler of
// three operations in a row out of sight.
const voteSpreads = 10

// markHotCells marks the cells whose least recent stall, or least recent transit, stands out of the
// group (f.hotCells, f.byTransit) and lists each peer's hot cells out (f.hotOut, sorted).
func (d *Detector) markHotCells(f *figures) {
	for l := range f.stallLeast {
		if hot, byTransit := d.hotCell(f, l); hot {
			f.hotCells[l] = true
			f.byTransit[l] = byTransit
			f.hotOut[l.From] = append(f.hotOut[l.From], l.To)
		}
	}
	for _, to := range f.hotOut {
		slices.Sort(to)
	}
}

// waitingChains returns the waiting chains by origin, the longest seen for each. They are walked
// back from the downstream end of every run of waiting peers (a waiting peer whose successor does
// not wait), so that each peer is walked over about once.
func (d *Detector) waitingChains(f *figures) map[uint64][]uint64 {
	chains := map[uint64][]uint64{}
	n := len(f.ring)
	for i, q := range f.ring {
		if !d.waiting(f, q) || d.waiting(f, f.ring[(i+1)%n]) {
			continue
		}
		if o, chain, ok := d.walkBack(f, q); ok && len(chain) > len(chains[o]) {
			chains[o] = chain
		}
	}
	return chains
}

// slowOrigins adds a SlowCompute for every chain origin that is busy on its own far beyond the
// median while its links out are not slow. The hot cells into it are explained by it.
func (d *Detector) slowOrigins(f *figures, chains map[uint64][]uint64, out map[string]Event) {
	for o, chain := range chains {
		b, ok := f.busyLeast[o]
		if !ok || !d.hot(b, f.medBusy, f.medSpan) || d.rowHot(f, o) > 0 {
			continue
		}
		ratio := f.busy[o] / f.medBusy
		conf := confidence(ratio)
		if 2*len(chain) < len(f.ring) {
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
}

// lateVoters adds a SlowCompute for a peer whose vote comes last, far behind the others: they wait
// for it at the vote, before the ring starts, so its lateness never reaches the link timings. In
// each of the last Recent operations its vote must come after the median one by Floor times the
// median operation and voteSpreads times the typical deviation of the votes, so that the ordinary
// jitter of the training step stays quiet. A peer already found as a chain's origin is left as is.
func (d *Detector) lateVoters(f *figures, out map[string]Event) {
	n := len(f.ring)
	for _, id := range f.ring {
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
			chain = append(chain, f.ring[(f.pos[id]+j)%n])
		}
		ratio := (f.medSecs + excess) / f.medSecs
		ev := Event{Kind: SlowCompute, Peer: id, Chain: chain, Ratio: ratio, Confidence: confidence(ratio)}
		ev.Evidence = fmt.Sprintf("peer %d votes %s after the median peer, so every operation takes the others %.1f× its length; %d peer(s) wait on it at the vote",
			id, time.Duration(excess*1e9).Round(time.Microsecond), ratio, len(chain))
		out[key] = ev
	}
}

// hotLines adds a SlowSender (SlowReceiver) for a peer most of whose recent links out (in) are
// unexplained hot cells, and at least two. Those cells are explained by it.
func (d *Detector) hotLines(f *figures, out map[string]Event) {
	rowOf, colOf := map[uint64][]Link{}, map[uint64][]Link{}
	for l := range f.hotCells {
		if !f.explains[l] {
			rowOf[l.From] = append(rowOf[l.From], l)
			colOf[l.To] = append(colOf[l.To], l)
		}
	}
	for _, id := range f.ring {
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
			ratio, what := d.cellRatio(f, side.hot)
			ev := Event{Kind: side.kind, Peer: id, Cells: side.hot, Ratio: ratio,
				Confidence: confidence(ratio) * float64(len(side.hot)) / float64(side.known)}
			ev.Evidence = fmt.Sprintf("%d of peer %d's %d recent %s are slow (%s), %s %.1f× the group median",
				len(side.hot), id, side.known, side.what, joinLinks(side.hot), what, ratio)
			for _, l := range side.hot {
				f.explains[l] = true
			}
			out[ev.Key()] = ev
		}
	}
}

// testedEnds adds a SlowSender (SlowReceiver) for the sender (receiver) of an unexplained hot cell
// whose bandwidth tests of its links out (in) are mostly slow too, even where the ring shows no
// second link of its row (column). The cell is explained by it.
func (d *Detector) testedEnds(f *figures, tests testLines, out map[string]Event) {
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
			{SlowSender, l.From, tests.row[l.From], "links out"},
			{SlowReceiver, l.To, tests.col[l.To], "links in"},
		} {
			var slow []Link
			for _, t := range side.tests {
				if d.probes[t].cost >= d.cfg.Raise*tests.med {
					slow = append(slow, t)
				}
			}
			if len(slow) < 2 || 2*len(slow) < len(side.tests) {
				continue
			}
			ratio, _ := f.figure(l)
			ev := Event{Kind: side.kind, Peer: side.peer, Cells: []Link{l}, Ratio: ratio,
				Confidence: confidence(ratio) * float64(len(slow)) / float64(len(side.tests))}
			ev.Evidence = fmt.Sprintf("%s, and bandwidth tests found %d of peer %d's %d tested %s slow (%s)",
				f.cellText(l, ratio), len(slow), side.peer, len(side.tests), side.what, joinLinks(slow))
			if o, ok := out[ev.Key()]; ok {
				ev.Cells = append(o.Cells, l)
			}
			f.explains[l] = true
			out[ev.Key()] = ev
			break
		}
	}
}

// slowLinks adds a SlowLink for every hot cell no broader syndrome explains. Its confidence is
// lower where neither end has other recent links or tests to tell it from a slow sender or receiver,
// and a little higher when peers wait downstream of it.
func (d *Detector) slowLinks(f *figures, chains map[uint64][]uint64, tests testLines, out map[string]Event) {
	for l := range f.hotCells {
		if f.explains[l] {
			continue
		}
		if t, ok := f.transit[l]; ok && !f.byTransit[l] && !d.hot(t, f.medTransit[f.between(l)], f.medSpan) {
			// It holds its sender back while its frames cross as fast as the others': its receiver
			// did not take them (busy, or not in the operation yet), the link itself is not slow.
			continue
		}
		ratio, _ := f.figure(l)
		conf := confidence(ratio)
		row, col := d.known(f, l.From, true)-1, d.known(f, l.To, false)-1
		ev := Event{Kind: SlowLink, Peer: l.From, Link: l, Cells: []Link{l}, Ratio: ratio}
		ev.Evidence = f.cellText(l, ratio)
		if len(tests.row[l.From]) >= 2 && len(tests.col[l.To]) >= 2 {
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
}

// cellText says how hot cell l stands out, ratio times the group median.
func (f *figures) cellText(l Link, ratio float64) string {
	if f.byTransit[l] {
		kind := ""
		switch {
		case f.between(l):
			kind = " between sites"
		case f.sites[l.From] != "":
			kind = " within a site"
		}
		return fmt.Sprintf("link %s moves its frames %.1f× slower than the group median of the links%s", l, ratio, kind)
	}
	return fmt.Sprintf("link %s holds its sender back %.1f× the group median", l, ratio)
}
