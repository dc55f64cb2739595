//go:build amd64 && !purego

package diloco

import "fmt"

// dot4SSE is dot4Generic in assembly; n is len(w), a positive multiple of 4,
// and stride is in elements.
//
//go:noescape
func dot4SSE(w, x *float32, n, stride int, out *[16]float32)

// axpy4SSE is axpy4Generic in assembly; n is len(y), a positive multiple of
// 4.
//
//go:noescape
func axpy4SSE(y *float32, n int, a *[4]float32, x0, x1, x2, x3 *float32)

// dot4 computes the lanes of four dot products; see dot4Generic.
func dot4(w, x []float32, stride int, out *[16]float32) {
	n := len(w)
	if n%4 != 0 || stride < 0 || len(x) < 3*stride+n {
		panic(fmt.Sprintf("diloco: dot4 of %d over %d with stride %d", n, len(x), stride))
	}
	if n == 0 {
		*out = [16]float32{}
		return
	}
	dot4SSE(&w[0], &x[0], n, stride, out)
}

// axpy4 adds four scaled vectors to y; see axpy4Generic.
func axpy4(y []float32, a *[4]float32, x0, x1, x2, x3 []float32) {
	n := len(y)
	if n%4 != 0 || len(x0) < n || len(x1) < n || len(x2) < n || len(x3) < n {
		panic(fmt.Sprintf("diloco: axpy4 of %d with %d %d %d %d", n, len(x0), len(x1), len(x2), len(x3)))
	}
	if n == 0 {
		return
	}
	axpy4SSE(&y[0], n, a, &x0[0], &x1[0], &x2[0], &x3[0])
}

// adamSSE is adamUpdateGeneric in assembly for n elements, a positive
// multiple of 4.
//
//go:noescape
func adamSSE(p, grad, m, v *float32, n int, k *adamConsts)

// adamUpdate applies the AdamW update; see adamUpdateGeneric. The elements
// past the last multiple of 4 go through the portable code, which computes
// the same bits.
func adamUpdate(p, g, m, v []float32, k *adamConsts) {
	n := len(p)
	if len(g) != n || len(m) != n || len(v) != n {
		panic(fmt.Sprintf("diloco: adam update of %d with %d %d %d", n, len(g), len(m), len(v)))
	}
	n4 := n &^ 3
	if n4 > 0 {
		adamSSE(&p[0], &g[0], &m[0], &v[0], n4, k)
	}
	adamUpdateGeneric(p[n4:], g[n4:], m[n4:], v[n4:], k)
}
