package atsp

import (
	"math"
	"math/rand/v2"
	"sort"
)

// maxNeighbours is the length of the candidate lists the local search
// draws new edges from.
const maxNeighbours = 24

// weights is a cost matrix turned into finite working weights for the local
// search. Edges costing more than a threshold are priced at cost+over, and
// missing edges at missing, with over above the total of any tour of regular
// edges and missing above the total of any tour without missing edges. So a
// tour of lower weight never uses more missing edges, and among tours with
// the same number of missing edges never more edges over the threshold.
type weights struct {
	n       int
	w       []float64 // n*n, row-major
	over    float64
	missing float64
	eps     float64 // smallest weight change treated as an improvement
}

// newWeights prices cost for the local search with the given threshold
// (+Inf for none).
func newWeights(cost [][]float64, threshold float64) *weights {
	n := len(cost)
	maxC := 0.0
	for i := range cost {
		for j, c := range cost[i] {
			if i != j && !math.IsInf(c, 1) && c > maxC {
				maxC = c
			}
		}
	}
	fn := float64(n)
	// Explicit conversions keep the products from being fused with the
	// additions, so the weights are the same on every architecture.
	over := float64(fn*(maxC+1)) + 1
	missing := float64(fn*(maxC+1+over)) + 1
	ws := &weights{n: n, w: make([]float64, n*n), over: over, missing: missing, eps: 1e-9 * math.Max(maxC, 1e-3)}
	for i := range cost {
		for j, c := range cost[i] {
			v := c
			switch {
			case i == j || math.IsInf(c, 1):
				v = missing
			case c > threshold:
				v = c + over
			}
			ws.w[i*n+j] = v
		}
	}
	return ws
}

// search is an iterated local search over one weight matrix. The tour is an
// array with a position index; moves rebuild the array in O(n), which is
// cheap next to the neighbourhood scans at the sizes this package serves.
type search struct {
	n     int
	ws    *weights
	w     []float64
	tour  []int
	pos   []int
	cur   float64 // weight of tour
	succN [][]int32
	predN [][]int32
	queue []int
	inQ   []bool
	rng   *rand.Rand
	buf   []int

	best  []int
	bestW float64
	kept  []int // the accepted tour the next kick starts from
	keptW float64
	stop  func() bool
	polls int
}

// newSearch prepares a search over ws starting from tour start (a
// permutation, not modified).
func newSearch(ws *weights, start []int, rng *rand.Rand, stop func() bool) *search {
	n := ws.n
	s := &search{
		n: n, ws: ws, w: ws.w,
		tour: append([]int(nil), start...),
		pos:  make([]int, n),
		inQ:  make([]bool, n),
		rng:  rng,
		buf:  make([]int, n),
		stop: stop,
	}
	s.buildNeighbours()
	s.reindex()
	s.cur = s.weight(s.tour)
	s.best = append([]int(nil), s.tour...)
	s.bestW = s.cur
	s.kept = append([]int(nil), s.tour...)
	s.keptW = s.cur
	return s
}

func (s *search) buildNeighbours() {
	n := s.n
	k := min(n-1, maxNeighbours)
	s.succN = make([][]int32, n)
	s.predN = make([][]int32, n)
	idx := make([]int32, 0, n)
	for i := 0; i < n; i++ {
		idx = idx[:0]
		for j := 0; j < n; j++ {
			if j != i {
				idx = append(idx, int32(j))
			}
		}
		sort.SliceStable(idx, func(a, b int) bool { return s.w[i*n+int(idx[a])] < s.w[i*n+int(idx[b])] })
		s.succN[i] = append([]int32(nil), idx[:k]...)
		sort.SliceStable(idx, func(a, b int) bool { return s.w[int(idx[a])*n+i] < s.w[int(idx[b])*n+i] })
		s.predN[i] = append([]int32(nil), idx[:k]...)
	}
}

func (s *search) reindex() {
	for p, v := range s.tour {
		s.pos[v] = p
	}
}

func (s *search) weight(t []int) float64 {
	total := 0.0
	for k, v := range t {
		next := t[0]
		if k+1 < len(t) {
			next = t[k+1]
		}
		total += s.w[v*s.n+next]
	}
	return total
}

func (s *search) c(i, j int) float64 { return s.w[i*s.n+j] }

func (s *search) succ(v int) int {
	p := s.pos[v] + 1
	if p == s.n {
		p = 0
	}
	return s.tour[p]
}

func (s *search) pred(v int) int {
	p := s.pos[v] - 1
	if p < 0 {
		p = s.n - 1
	}
	return s.tour[p]
}

// rel is the number of steps from a forward to v.
func (s *search) rel(a, v int) int {
	d := s.pos[v] - s.pos[a]
	if d < 0 {
		d += s.n
	}
	return d
}

// at returns the node r steps after a.
func (s *search) at(a, r int) int {
	p := s.pos[a] + r
	if p >= s.n {
		p -= s.n
	}
	return s.tour[p]
}

func (s *search) push(v int) {
	if !s.inQ[v] {
		s.inQ[v] = true
		s.queue = append(s.queue, v)
	}
}

// exchange applies the reversal-free segment exchange around node a: with
// the tour read from a as a, S1 = steps 1..rc, S2 = steps rc+1..re,
// R = steps re+1..n-1, the new tour is a, S2, S1, R. Every node touched by
// a changed edge is queued.
func (s *search) exchange(a, rc, re int) {
	n := s.n
	b, c := s.at(a, 1), s.at(a, rc)
	d, e, f := s.at(a, rc+1), s.at(a, re), s.at(a, (re+1)%n)
	pa := s.pos[a]
	get := func(r int) int {
		p := pa + r
		if p >= n {
			p -= n
		}
		return s.tour[p]
	}
	out := s.buf[:0]
	out = append(out, a)
	for r := rc + 1; r <= re; r++ {
		out = append(out, get(r))
	}
	for r := 1; r <= rc; r++ {
		out = append(out, get(r))
	}
	for r := re + 1; r < n; r++ {
		out = append(out, get(r))
	}
	s.buf, s.tour = s.tour, out
	s.reindex()
	for _, v := range [...]int{a, b, c, d, e, f} {
		s.push(v)
	}
}

// try3opt looks for the best improving segment exchange whose first removed
// edge leaves a. New edges are a->d, e->b and c->f for removed edges a->b,
// c->d and e->f, with d drawn from a's cheapest successors and e from b's
// cheapest predecessors, pruned by the positive partial gain rule.
func (s *search) try3opt(a int) bool {
	n := s.n
	b := s.succ(a)
	cab := s.c(a, b)
	bestD, bestRC, bestRE := -s.ws.eps, -1, -1
	for _, d32 := range s.succN[a] {
		d := int(d32)
		g1 := cab - s.c(a, d)
		if g1 <= 0 {
			break
		}
		rd := s.rel(a, d)
		if rd < 2 {
			continue
		}
		c := s.at(a, rd-1)
		gcd := g1 + s.c(c, d)
		for _, e32 := range s.predN[b] {
			e := int(e32)
			g2 := gcd - s.c(e, b)
			if g2 <= 0 {
				break
			}
			re := s.rel(a, e)
			if re < rd {
				continue
			}
			f := s.at(a, (re+1)%n)
			if delta := s.c(c, f) - s.c(e, f) - g2; delta < bestD {
				bestD, bestRC, bestRE = delta, rd-1, re
			}
		}
	}
	if bestRC < 0 {
		return false
	}
	s.exchange(a, bestRC, bestRE)
	return true
}

// tryOrOpt looks for the best move of a segment of 1 to 3 nodes that starts
// at x to another place in the tour, without reversing it.
func (s *search) tryOrOpt(x int) bool {
	n := s.n
	bestD, bestP, bestL, bestRU := -s.ws.eps, -1, 0, 0
	p := s.pred(x)
	for l := 1; l <= 3 && l+2 < n; l++ {
		t := s.at(x, l-1)
		q := s.succ(t)
		gain := s.c(p, x) + s.c(t, q) - s.c(p, q)
		consider := func(u int) {
			ru := s.rel(p, u)
			if ru <= l {
				return // u is p or inside the segment
			}
			v := s.at(p, (ru+1)%n)
			if delta := s.c(u, x) + s.c(t, v) - s.c(u, v) - gain; delta < bestD {
				bestD, bestP, bestL, bestRU = delta, p, l, ru
			}
		}
		for _, u := range s.predN[x] {
			if s.c(int(u), x) >= gain+s.c(int(u), s.succ(int(u))) {
				continue
			}
			consider(int(u))
		}
		for _, v := range s.succN[t] {
			consider(s.pred(int(v)))
		}
	}
	if bestP < 0 {
		return false
	}
	s.exchange(bestP, bestL, bestRU)
	return true
}

// trySwap looks for the best exchange of the positions of x and another
// node y, drawn from the cheapest successors of x's predecessor.
func (s *search) trySwap(x int) bool {
	n := s.n
	px, sx := s.pred(x), s.succ(x)
	bestD, bestY := -s.ws.eps, -1
	for _, y32 := range s.succN[px] {
		y := int(y32)
		if y == x || y == px {
			continue
		}
		py, sy := s.pred(y), s.succ(y)
		var delta float64
		switch {
		case y == sx: // px x y sy
			delta = s.c(px, y) + s.c(y, x) + s.c(x, sy) - s.c(px, x) - s.c(x, y) - s.c(y, sy)
		case sy == px: // py y px x sx: y and x are not adjacent when n >= 4
			fallthrough
		default:
			delta = s.c(px, y) + s.c(y, sx) + s.c(py, x) + s.c(x, sy) -
				s.c(px, x) - s.c(x, sx) - s.c(py, y) - s.c(y, sy)
		}
		if delta < bestD {
			bestD, bestY = delta, y
		}
	}
	if bestY < 0 || n < 5 {
		return false
	}
	y := bestY
	py, sy := s.pred(y), s.succ(y)
	i, j := s.pos[x], s.pos[y]
	s.tour[i], s.tour[j] = y, x
	s.pos[x], s.pos[y] = j, i
	for _, v := range [...]int{px, x, sx, py, y, sy} {
		s.push(v)
	}
	return true
}

// localSearch applies improving moves until no queued node yields one.
func (s *search) localSearch() {
	for len(s.queue) > 0 {
		s.polls++
		if s.polls%256 == 0 && s.stop() {
			for _, v := range s.queue {
				s.inQ[v] = false
			}
			s.queue = s.queue[:0]
			break
		}
		x := s.queue[0]
		s.queue = s.queue[1:]
		s.inQ[x] = false
		if s.try3opt(x) || s.try3opt(s.pred(x)) || s.tryOrOpt(x) || s.trySwap(x) {
			s.push(x)
		}
	}
	s.queue = s.queue[:0]
	s.cur = s.weight(s.tour)
}

// optimise runs a full local search from the current tour.
func (s *search) optimise() {
	for _, v := range s.tour {
		s.push(v)
	}
	s.localSearch()
	s.accept()
}

// accept records the current tour as the one to kick next, and as the best
// one if it is.
func (s *search) accept() bool {
	copy(s.kept, s.tour)
	s.keptW = s.cur
	if s.cur < s.bestW-s.ws.eps {
		copy(s.best, s.tour)
		s.bestW = s.cur
		return true
	}
	return false
}

// kick perturbs the tour by moving three consecutive segments, each of 1 to
// limit nodes, into reverse order (a reversal-free change of four edges that
// no single local-search move undoes).
func (s *search) kick() {
	n := s.n
	limit := max(1, min((n-1)/3, 30))
	a := s.tour[s.rng.IntN(n)]
	l1, l2, l3 := 1+s.rng.IntN(limit), 1+s.rng.IntN(limit), 1+s.rng.IntN(limit)
	pa := s.pos[a]
	get := func(r int) int {
		p := pa + r
		if p >= n {
			p -= n
		}
		return s.tour[p]
	}
	out := s.buf[:0]
	out = append(out, a)
	for r := l1 + l2 + 1; r <= l1+l2+l3; r++ {
		out = append(out, get(r))
	}
	for r := l1 + 1; r <= l1+l2; r++ {
		out = append(out, get(r))
	}
	for r := 1; r <= l1; r++ {
		out = append(out, get(r))
	}
	for r := l1 + l2 + l3 + 1; r < n; r++ {
		out = append(out, get(r))
	}
	for _, r := range [...]int{0, 1, l1, l1 + 1, l1 + l2, l1 + l2 + 1, l1 + l2 + l3, (l1 + l2 + l3 + 1) % n} {
		s.push(get(r))
	}
	s.buf, s.tour = s.tour, out
	s.reindex()
}

// run performs up to iterations kick-and-repair steps (no cap when
// iterations <= 0), stopping early when stop returns true or done reports
// that the best weight is good enough. improved is called after each new
// best tour.
func (s *search) run(iterations int, done func(bestW float64) bool, improved func()) {
	stall := max(stallMin, stallPerNode*s.n)
	last := 0
	for k := 0; iterations <= 0 || k < iterations; k++ {
		if k-last >= stall {
			s.restart()
			last = k
		}
		if (done != nil && done(s.bestW)) || s.stop() {
			return
		}
		if s.n < 8 {
			return // too small for the kick; the local search is exhaustive enough
		}
		s.kick()
		s.localSearch()
		if s.cur <= s.keptW+s.ws.eps {
			if s.accept() {
				last = k
				if improved != nil {
					improved()
				}
			}
			continue
		}
		copy(s.tour, s.kept)
		s.reindex()
		s.cur = s.keptW
	}
}

// Stagnation handling: after max(stallMin, stallPerNode*n) kicks without a
// new best tour, the search restarts from the best tour scrambled by
// n/restartDivisor kicks and accepts wherever the local search takes it.
const (
	stallMin       = 1000
	stallPerNode   = 10
	restartDivisor = 4
)

// restart moves the search away from a tour it cannot improve: it applies
// several kicks to the best tour, repairs it, and accepts the result
// unconditionally (the best tour is kept apart).
func (s *search) restart() {
	copy(s.tour, s.best)
	s.reindex()
	for k := max(2, s.n/restartDivisor); k > 0; k-- {
		s.kick()
	}
	s.localSearch()
	copy(s.kept, s.tour)
	s.keptW = s.cur
}
