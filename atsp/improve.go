package atsp

import (
	"context"
	"math"
	"sort"
)

// A round of the bottleneck search of Improve is max(improveRound,
// improveRoundPerNode*n) kicks under one threshold, so that rebuilding the
// candidate lists between rounds stays a small part of the work.
const (
	improveRound        = 2000
	improveRoundPerNode = 20
)

// Improve searches in the background for tours better than start under
// opt.Objective and sends each strictly better tour it finds, in order of
// discovery, on the returned channel. The channel is closed when ctx ends or
// the search is exhausted: at once if cost or start is invalid (start must be
// a permutation of 0..len(cost)-1), after the exact solution for instances of
// at most opt.ExactMax nodes, after opt.Iterations kicks when that is
// positive, and otherwise only when ctx ends. opt.Budget is ignored.
//
// Improve starts one goroutine, which blocks while a result waits to be
// received; it ends, and closes the channel, once ctx is done, so a caller
// that cancels ctx may stop reading without leaking it.
func Improve(ctx context.Context, cost [][]float64, start Tour, opt Options) <-chan Result {
	ch := make(chan Result)
	if validate(cost) != nil || !isPermutation(start, len(cost)) {
		close(ch)
		return ch
	}
	go func() {
		defer close(ch)
		im := &improver{ctx: ctx, ch: ch, cost: cost, obj: opt.Objective}
		im.run(start, opt)
	}()
	return ch
}

// isPermutation reports whether t holds each of 0..n-1 exactly once.
func isPermutation(t Tour, n int) bool {
	if len(t) != n {
		return false
	}
	seen := make([]bool, n)
	for _, v := range t {
		if v < 0 || v >= n || seen[v] {
			return false
		}
		seen[v] = true
	}
	return true
}

// improver is the state of one Improve goroutine, which owns every field.
type improver struct {
	ctx   context.Context
	ch    chan<- Result
	cost  [][]float64
	obj   Objective
	best  Score
	kicks int // kicks left when capped, or -1
}

func (im *improver) stop() bool { return im.ctx.Err() != nil }

// offer sends t if it is strictly better than the best tour so far. It
// returns false when ctx ended before the result was received.
func (im *improver) offer(t []int) bool {
	sc := Evaluate(im.cost, t)
	if !sc.Better(im.best, im.obj) {
		return true
	}
	im.best = sc
	r := Result{Tour: normalise(append([]int(nil), t...)), Score: sc}
	select {
	case im.ch <- r:
		return true
	case <-im.ctx.Done():
		return false
	}
}

func (im *improver) run(start Tour, opt Options) {
	n := len(im.cost)
	im.best = Evaluate(im.cost, start)
	if n <= 1 {
		return
	}
	if n <= opt.exactMax() || n <= smallEnumerate {
		if t, err := solveExact(im.cost, im.obj, im.stop); err == nil {
			im.offer(t)
		}
		return
	}
	rng := newRand(opt.Seed)
	im.kicks = -1
	if opt.Iterations > 0 {
		im.kicks = opt.Iterations
	}
	if im.obj == Total {
		ws := newWeights(im.cost, math.Inf(1))
		s := newSearch(ws, start, rng, im.stop)
		s.optimise()
		im.offer(s.best)
		s.run(opt.Iterations, nil, func() { im.offer(s.best) })
		return
	}

	// Bottleneck: alternate between rounds that look for a tour under the
	// next lower threshold and rounds that polish the total within the
	// current bottleneck.
	vals := distinctCosts(im.cost)
	lb := bottleneckLowerBound(im.cost)
	cur := append([]int(nil), start...)
	var polish *search
	polishAt := math.NaN()
	for round := 0; !im.stop() && im.kicks != 0; round++ {
		kicks := max(improveRound, improveRoundPerNode*n)
		if im.kicks > 0 {
			kicks = min(kicks, im.kicks)
			im.kicks -= kicks
		}
		idx := sort.SearchFloat64s(vals, im.best.Bottleneck) - 1
		if round%2 == 0 && idx >= 0 && vals[idx] >= lb {
			pw := newWeights(im.cost, vals[idx])
			p := newSearch(pw, cur, rng, im.stop)
			feasible := func(w float64) bool { return w < pw.over }
			p.optimise()
			p.run(kicks, feasible, nil)
			if feasible(p.bestW) && im.offer(p.best) {
				copy(cur, p.best)
				polish = nil
			}
			continue
		}
		if polish == nil || polishAt != im.best.Bottleneck {
			polishAt = im.best.Bottleneck
			polish = newSearch(newWeights(im.cost, polishAt), cur, rng, im.stop)
			polish.optimise()
			im.offer(polish.best)
		}
		polish.run(kicks, nil, func() { im.offer(polish.best) })
		copy(cur, polish.best)
	}
}
