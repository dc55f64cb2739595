//go:build !amd64 || purego

package diloco

// dot4 computes the lanes of four dot products; see dot4Generic.
func dot4(w, x []float32, stride int, out *[16]float32) { dot4Generic(w, x, stride, out) }

// axpy4 adds four scaled vectors to y; see axpy4Generic.
func axpy4(y []float32, a *[4]float32, x0, x1, x2, x3 []float32) {
	axpy4Generic(y, a, x0, x1, x2, x3)
}

// adamUpdate applies the AdamW update; see adamUpdateGeneric.
func adamUpdate(p, g, m, v []float32, k *adamConsts) { adamUpdateGeneric(p, g, m, v, k) }
