//go:build amd64 && !purego

package rings

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// haveAVX says whether the vector add kernels may run: AVX instructions, with the YMM state saved
// by the operating system.
var haveAVX = cpu.X86.HasAVX

// addF32AVX sets d[i] += s[i] for i < n, where n is a multiple of 32.
//
//go:noescape
func addF32AVX(d, s *float32, n int)

// addF64AVX sets d[i] += s[i] for i < n, where n is a multiple of 16.
//
//go:noescape
func addF64AVX(d, s *float64, n int)

// addF32Vec adds the longest prefix of s to d that the vector kernel handles and returns its length.
// Each element is the one IEEE 754 addition the scalar loop does, with d as the first operand, so
// results are the same bit for bit; only when both operands are NaN may the payload differ from the
// scalar loop's, whose operand order the compiler chooses. On one build and one machine every run
// gives the same bits.
func addF32Vec(d, s []float32) int {
	n := len(d) &^ 31
	if !haveAVX || n == 0 {
		return 0
	}
	addF32AVX(&d[0], &s[0], n)
	return n
}

// addF64Vec is addF32Vec for float64.
func addF64Vec(d, s []float64) int {
	n := len(d) &^ 15
	if !haveAVX || n == 0 {
		return 0
	}
	addF64AVX(&d[0], &s[0], n)
	return n
}

// addF32OntoAVX sets d[i] = s[i] + d[i] for i < n, where n is a multiple of 32: s's element is
// VADDPS's first source operand.
//
//go:noescape
func addF32OntoAVX(d, s *float32, n int)

// addF64OntoAVX is addF32OntoAVX for float64; n is a multiple of 16.
//
//go:noescape
func addF64OntoAVX(d, s *float64, n int)

// addF32OntoVec is addF32Vec for d[i] = s[i] + d[i].
func addF32OntoVec(d, s []float32) int {
	n := len(d) &^ 31
	if !haveAVX || n == 0 {
		return 0
	}
	addF32OntoAVX(&d[0], &s[0], n)
	return n
}

// addF64OntoVec is addF64Vec for d[i] = s[i] + d[i].
func addF64OntoVec(d, s []float64) int {
	n := len(d) &^ 15
	if !haveAVX || n == 0 {
		return 0
	}
	addF64OntoAVX(&d[0], &s[0], n)
	return n
}

// addF32ToAVX sets d[i] = a[i] + b[i] for i < n, where n is a multiple of 32, a's element being the
// first operand.
//
//go:noescape
func addF32ToAVX(d, a, b *float32, n int)

// addF64ToAVX is addF32ToAVX for float64; n is a multiple of 16.
//
//go:noescape
func addF64ToAVX(d, a, b *float64, n int)

// addF32ToVec sets d[i] = a[i] + b[i] over the longest prefix the vector kernel handles, the prefix
// addF32Vec would take, and returns its length.
func addF32ToVec(d, a, b []float32) int {
	n := len(d) &^ 31
	if !haveAVX || n == 0 {
		return 0
	}
	addF32ToAVX(&d[0], &a[0], &b[0], n)
	return n
}

// addF64ToVec is addF32ToVec for float64.
func addF64ToVec(d, a, b []float64) int {
	n := len(d) &^ 15
	if !haveAVX || n == 0 {
		return 0
	}
	addF64ToAVX(&d[0], &a[0], &b[0], n)
	return n
}

// addF32OntoSaveAVX sets save[i] = d[i], then d[i] = s[i] + d[i], for i < n, where n is a multiple
// of 32 and save is 32-byte aligned: addF32OntoAVX that keeps d's original in the same pass, with
// non-temporal stores into save.
//
//go:noescape
func addF32OntoSaveAVX(d, s, save *float32, n int)

// addF64OntoSaveAVX is addF32OntoSaveAVX for float64; n is a multiple of 16.
//
//go:noescape
func addF64OntoSaveAVX(d, s, save *float64, n int)

// addF32OntoSaveVec is addF32OntoVec that first copies each element of d into save. The vector
// kernel's stores into save need a 32-byte boundary, so the elements before save's first one, and
// those after the last whole round, go through the same kernel on padded copies: every element's sum
// is VADDPS's with s first, wherever the buffers lie. It returns len(d), or 0 (doing nothing) without
// AVX or if save's elements cannot reach a boundary.
func addF32OntoSaveVec(d, s, save []float32) int {
	head, ok := alignHead(unsafe.Pointer(unsafe.SliceData(save)), 4, len(d))
	if !haveAVX || !ok {
		return 0
	}
	if head > 0 {
		addF32OntoSaveShort(d[:head], s[:head], save[:head])
	}
	n := (len(d) - head) &^ 31
	if n > 0 {
		addF32OntoSaveAVX(&d[head], &s[head], &save[head], n)
	}
	if rest := head + n; rest < len(d) {
		addF32OntoSaveShort(d[rest:], s[rest:], save[rest:])
	}
	return len(d)
}

// addF64OntoSaveVec is addF32OntoSaveVec for float64.
func addF64OntoSaveVec(d, s, save []float64) int {
	head, ok := alignHead(unsafe.Pointer(unsafe.SliceData(save)), 8, len(d))
	if !haveAVX || !ok {
		return 0
	}
	if head > 0 {
		addF64OntoSaveShort(d[:head], s[:head], save[:head])
	}
	n := (len(d) - head) &^ 15
	if n > 0 {
		addF64OntoSaveAVX(&d[head], &s[head], &save[head], n)
	}
	if rest := head + n; rest < len(d) {
		addF64OntoSaveShort(d[rest:], s[rest:], save[rest:])
	}
	return len(d)
}

// addF32OntoSaveShort does what addF32OntoSaveAVX does for fewer than 32 elements, through the
// vector kernel on padded copies.
func addF32OntoSaveShort(d, s, save []float32) {
	var pd, ps [32]float32
	copy(save, d)
	copy(pd[:], d)
	copy(ps[:], s)
	addF32OntoAVX(&pd[0], &ps[0], 32)
	copy(d, pd[:len(d)])
}

// addF64OntoSaveShort is addF32OntoSaveShort for float64, fewer than 16 elements.
func addF64OntoSaveShort(d, s, save []float64) {
	var pd, ps [16]float64
	copy(save, d)
	copy(pd[:], d)
	copy(ps[:], s)
	addF64OntoAVX(&pd[0], &ps[0], 16)
	copy(d, pd[:len(d)])
}

// alignHead returns how many elements of size bytes, at most n, come before p's next 32-byte
// boundary, and false if elements starting at p never reach it.
func alignHead(p unsafe.Pointer, size, n int) (int, bool) {
	off := int(-uintptr(p) & 31)
	if off%size != 0 {
		return 0, false
	}
	return min(off/size, n), true
}
