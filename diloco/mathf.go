package diloco

import "math"

// The exponential and logarithm below use only IEEE additions,
// multiplications and divisions, each product wrapped in float64(...) so it
// cannot be fused, and exact bit manipulation for the powers of two. They
// therefore give the same bits everywhere, unlike package math, whose Exp
// and Log have assembly versions on some architectures (and on amd64 an FMA
// path chosen at run time). Their accuracy, a few units in the last place
// of a float64, is far beyond what the float32 model needs.

// Cody-Waite split of ln 2: ln2Hi has trailing zero bits so that k*ln2Hi is
// exact for |k| < 2^11.
const (
	ln2Hi  = 6.93147180369123816490e-01
	ln2Lo  = 1.90821492927058770002e-10
	invLn2 = 1.44269504088896338700e+00
)

// expDet returns e^x for x <= 0; it returns 0 below the float64 range. The
// softmax only needs non-positive arguments (the maximum logit is subtracted
// first).
func expDet(x float64) float64 {
	if x < -745 {
		return 0
	}
	// x = k*ln2 + r with |r| <= ln2/2.
	k := math.Floor(float64(x*invLn2) + 0.5)
	r := (x - float64(k*ln2Hi)) - float64(k*ln2Lo)
	// e^r by its Taylor series to degree 13 in Horner form: the truncation
	// error is below 2^-60 for |r| <= ln2/2.
	p := 1.0 / 6227020800
	p = float64(p*r) + 1.0/479001600
	p = float64(p*r) + 1.0/39916800
	p = float64(p*r) + 1.0/3628800
	p = float64(p*r) + 1.0/362880
	p = float64(p*r) + 1.0/40320
	p = float64(p*r) + 1.0/5040
	p = float64(p*r) + 1.0/720
	p = float64(p*r) + 1.0/120
	p = float64(p*r) + 1.0/24
	p = float64(p*r) + 1.0/6
	p = float64(p*r) + 0.5
	p = float64(p*r) + 1
	p = float64(p*r) + 1
	ki := int(k)
	if ki < -1022 {
		// Scale in two exact steps to reach the subnormal range.
		return float64(p*pow2(ki+60)) * pow2(-60)
	}
	return float64(p * pow2(ki))
}

// pow2 returns 2^k for -1022 <= k <= 1023, built from its bits.
func pow2(k int) float64 {
	return math.Float64frombits(uint64(k+1023) << 52)
}

// logDet returns the natural logarithm of x for finite x > 0, and -Inf for 0.
func logDet(x float64) float64 {
	if x <= 0 {
		return math.Inf(-1)
	}
	// x = m * 2^e with m in [sqrt(1/2), sqrt(2)).
	b := math.Float64bits(x)
	e := int(b>>52&0x7ff) - 1023
	if e == -1023 {
		// Subnormal: normalise with an exact multiplication.
		b = math.Float64bits(x * (1 << 54))
		e = int(b>>52&0x7ff) - 1023 - 54
	}
	m := math.Float64frombits(b&^(0x7ff<<52) | 1023<<52) // in [1, 2)
	if m > math.Sqrt2 {
		m *= 0.5 // exact
		e++
	}
	// log m = 2 atanh(s) with s = (m-1)/(m+1), |s| < 0.172.
	s := (m - 1) / (m + 1)
	s2 := float64(s * s)
	// Odd series to s^23: the truncation error is below 2^-60.
	p := 1.0 / 23
	for _, c := range [...]float64{1.0 / 21, 1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13, 1.0 / 11, 1.0 / 9, 1.0 / 7, 1.0 / 5, 1.0 / 3, 1} {
		p = float64(p*s2) + c
	}
	logm := float64(2 * s * p)
	fe := float64(e)
	return (float64(fe*ln2Hi) + logm) + float64(fe*ln2Lo)
}
