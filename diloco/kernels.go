package diloco

// The two hot loops of a training step, in a portable form. On amd64 they
// are replaced by SSE versions (kernels_amd64.s) that compute exactly the
// same bits: an SSE register holds the four lanes of a dot product, and
// MULPS and ADDPS round every lane as the scalar code does. Build with the
// purego tag to use these versions everywhere.

// dot4Generic returns the four lanes of dot(w, x[b*stride:]) for the samples
// b = 0..3, lane l of sample b in out[4*b+l]. len(w) must be a multiple of 4
// and x must hold 3*stride+len(w) elements.
func dot4Generic(w, x []float32, stride int, out *[16]float32) {
	n := len(w)
	x0 := x[:n]
	x1 := x[stride : stride+n]
	x2 := x[2*stride : 2*stride+n]
	x3 := x[3*stride : 3*stride+n]
	var acc [16]float32
	for i := 0; i+4 <= n; i += 4 {
		w4 := w[i : i+4 : i+4]
		for l, wl := range w4 {
			acc[l] += float32(wl * x0[i+l])
			acc[4+l] += float32(wl * x1[i+l])
			acc[8+l] += float32(wl * x2[i+l])
			acc[12+l] += float32(wl * x3[i+l])
		}
	}
	*out = acc
}

// axpy4Generic adds a[0]*x0, a[1]*x1, a[2]*x2 and a[3]*x3 to y in that
// order, element by element, each product rounded before it is added: the
// same bits as four calls of axpy. len(y) must be a multiple of 4 and each x
// at least as long as y.
func axpy4Generic(y []float32, a *[4]float32, x0, x1, x2, x3 []float32) {
	n := len(y)
	x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
	a0, a1, a2, a3 := a[0], a[1], a[2], a[3]
	for i := range y {
		y[i] = (((y[i] + float32(a0*x0[i])) + float32(a1*x1[i])) + float32(a2*x2[i])) + float32(a3*x3[i])
	}
}

// sum4 combines the four lanes of one dot product as dot does.
func sum4(l []float32) float32 {
	l = l[:4]
	return (l[0] + l[1]) + (l[2] + l[3])
}
