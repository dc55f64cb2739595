package measure

import (
	"math"
	"slices"
)

// Median returns the median of xs (the mean of the two middle values for an even count), or NaN for
// none. xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// Percentile returns the nearest-rank p-th percentile of xs (0 < p <= 100): the smallest value with
// at least p percent of the values at or below it. With fewer than 100 values the 99th percentile is
// the maximum. It returns NaN for none. xs is not modified.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Sorted(slices.Values(xs))
	k := int(math.Ceil(p / 100 * float64(len(s))))
	k = min(max(k, 1), len(s))
	return s[k-1]
}
