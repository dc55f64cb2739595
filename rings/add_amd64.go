//go:build amd64 && !purego

package rings

import "golang.org/x/sys/cpu"

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

// addF32OntoSaveAVX sets save[i] = d[i], then d[i] = s[i] + d[i], for i < n, where n is a multiple
// of 32: addF32OntoAVX that keeps d's original in the same pass.
//
//go:noescape
func addF32OntoSaveAVX(d, s, save *float32, n int)

// addF64OntoSaveAVX is addF32OntoSaveAVX for float64; n is a multiple of 16.
//
//go:noescape
func addF64OntoSaveAVX(d, s, save *float64, n int)

// addF32OntoSaveVec is addF32OntoVec that first copies each element of d it covers into save.
func addF32OntoSaveVec(d, s, save []float32) int {
	n := len(d) &^ 31
	if !haveAVX || n == 0 {
		return 0
	}
	addF32OntoSaveAVX(&d[0], &s[0], &save[0], n)
	return n
}

// addF64OntoSaveVec is addF32OntoSaveVec for float64.
func addF64OntoSaveVec(d, s, save []float64) int {
	n := len(d) &^ 15
	if !haveAVX || n == 0 {
		return 0
	}
	addF64OntoSaveAVX(&d[0], &s[0], &save[0], n)
	return n
}
