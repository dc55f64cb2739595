package plan

import (
	"math"
	"slices"
)

// Apportion splits total bytes into len(weights) shares proportional to weights, each a multiple of
// align bytes (align < 1 means 1), summing exactly to total. It uses the largest-remainder method in
// units of align, ties going to the lower index, so the result depends only on its arguments. When
// total is not a multiple of align, the tail bytes go to the last share with positive weight. Weights
// must be non-negative; when all are zero the shares are equal.
func Apportion(total int64, weights []float64, align int64) []int64 {
	out := make([]int64, len(weights))
	if len(weights) == 0 || total <= 0 {
		return out
	}
	if align < 1 {
		align = 1
	}
	w := slices.Clone(weights)
	sum := 0.0
	for i, x := range w {
		if !(x > 0) || math.IsInf(x, 0) {
			w[i] = 0
		}
		sum += w[i]
	}
	if sum == 0 {
		for i := range w {
			w[i] = 1
		}
		sum = float64(len(w))
	}
	units := total / align
	type rem struct {
		i int
		r float64
	}
	rems := make([]rem, len(w))
	var given int64
	for i, x := range w {
		exact := float64(units) * x / sum
		fl := int64(math.Floor(exact))
		out[i] = fl
		given += fl
		rems[i] = rem{i, exact - float64(fl)}
	}
	slices.SortStableFunc(rems, func(a, b rem) int {
		switch {
		case a.r > b.r:
			return -1
		case a.r < b.r:
			return 1
		}
		return a.i - b.i
	})
	// Rounding can push the floors one unit over; take it back from the smallest remainders.
	for k := len(rems) - 1; given > units; k-- {
		if i := rems[(k%len(rems)+len(rems))%len(rems)].i; out[i] > 0 {
			out[i]--
			given--
		}
	}
	for k := 0; given < units; k++ {
		out[rems[k%len(rems)].i]++
		given++
	}
	last := 0
	for i, x := range w {
		out[i] *= align
		if x > 0 {
			last = i
		}
	}
	out[last] += total - units*align
	return out
}
