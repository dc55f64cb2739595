package diagnosis

import (
	"math"
	"slices"
)

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
