//go:build amd64 && !purego

#include "textflag.h"

// func dot4SSE(w, x *float32, n, stride int, out *[16]float32)
//
// X0..X3 hold the four lanes of the dot products of w with the rows x,
// x+stride, x+2*stride and x+3*stride. Each step multiplies four elements of
// w by four of a row (MULPS rounds every product) and adds them to the lanes
// (ADDPS), exactly as the scalar loop does lane by lane.
TEXT ·dot4SSE(SB), NOSPLIT, $0-40
	MOVQ w+0(FP), SI
	MOVQ x+8(FP), DI
	MOVQ n+16(FP), CX
	MOVQ stride+24(FP), DX
	MOVQ out+32(FP), R8
	SHLQ $2, CX
	SHLQ $2, DX
	LEAQ (DI)(DX*1), R9
	LEAQ (R9)(DX*1), R10
	LEAQ (R10)(DX*1), R11
	XORPS X0, X0
	XORPS X1, X1
	XORPS X2, X2
	XORPS X3, X3
	XORQ AX, AX

dotloop:
	MOVUPS (SI)(AX*1), X4
	MOVUPS (DI)(AX*1), X5
	MULPS  X4, X5
	ADDPS  X5, X0
	MOVUPS (R9)(AX*1), X6
	MULPS  X4, X6
	ADDPS  X6, X1
	MOVUPS (R10)(AX*1), X7
	MULPS  X4, X7
	ADDPS  X7, X2
	MOVUPS (R11)(AX*1), X8
	MULPS  X4, X8
	ADDPS  X8, X3
	ADDQ   $16, AX
	CMPQ   AX, CX
	JB     dotloop

	MOVUPS X0, 0(R8)
	MOVUPS X1, 16(R8)
	MOVUPS X2, 32(R8)
	MOVUPS X3, 48(R8)
	RET

// func axpy4SSE(y *float32, n int, a *[4]float32, x0, x1, x2, x3 *float32)
//
// y = (((y + a0*x0) + a1*x1) + a2*x2) + a3*x3, four elements at a time, each
// product rounded before it is added, in the order of the scalar code.
TEXT ·axpy4SSE(SB), NOSPLIT, $0-56
	MOVQ y+0(FP), DI
	MOVQ n+8(FP), CX
	MOVQ a+16(FP), DX
	MOVQ x0+24(FP), R8
	MOVQ x1+32(FP), R9
	MOVQ x2+40(FP), R10
	MOVQ x3+48(FP), R11
	SHLQ $2, CX
	MOVSS  0(DX), X0
	SHUFPS $0, X0, X0
	MOVSS  4(DX), X1
	SHUFPS $0, X1, X1
	MOVSS  8(DX), X2
	SHUFPS $0, X2, X2
	MOVSS  12(DX), X3
	SHUFPS $0, X3, X3
	XORQ AX, AX

axpyloop:
	MOVUPS (DI)(AX*1), X4
	MOVUPS (R8)(AX*1), X5
	MULPS  X0, X5
	ADDPS  X5, X4
	MOVUPS (R9)(AX*1), X6
	MULPS  X1, X6
	ADDPS  X6, X4
	MOVUPS (R10)(AX*1), X7
	MULPS  X2, X7
	ADDPS  X7, X4
	MOVUPS (R11)(AX*1), X8
	MULPS  X3, X8
	ADDPS  X8, X4
	MOVUPS X4, (DI)(AX*1)
	ADDQ   $16, AX
	CMPQ   AX, CX
	JB     axpyloop
	RET

// func adamSSE(p, grad, m, v *float32, n int, k *adamConsts)
//
// The AdamW update four elements at a time, with the operations of
// adamUpdateGeneric in the same order; SQRTPS and DIVPS round correctly,
// like the scalar square root and division.
TEXT ·adamSSE(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), DI
	MOVQ grad+8(FP), SI
	MOVQ m+16(FP), R8
	MOVQ v+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ k+40(FP), DX
	SHLQ $2, CX
	MOVSS  0(DX), X0  // b1
	SHUFPS $0, X0, X0
	MOVSS  4(DX), X1  // 1-b1
	SHUFPS $0, X1, X1
	MOVSS  8(DX), X2  // b2
	SHUFPS $0, X2, X2
	MOVSS  12(DX), X3 // 1-b2
	SHUFPS $0, X3, X3
	MOVSS  16(DX), X4 // 1/sqrt(1-b2^t)
	SHUFPS $0, X4, X4
	MOVSS  20(DX), X5 // eps
	SHUFPS $0, X5, X5
	MOVSS  24(DX), X6 // 1-lr*wd
	SHUFPS $0, X6, X6
	MOVSS  28(DX), X7 // lr/(1-b1^t)
	SHUFPS $0, X7, X7
	XORQ AX, AX

adamloop:
	MOVUPS (SI)(AX*1), X8  // g
	MOVUPS (R8)(AX*1), X9  // m
	MULPS  X0, X9          // b1*m
	MOVAPS X8, X10
	MULPS  X1, X10         // (1-b1)*g
	ADDPS  X10, X9         // m'
	MOVUPS X9, (R8)(AX*1)
	MOVUPS (R9)(AX*1), X11 // v
	MULPS  X2, X11         // b2*v
	MOVAPS X8, X12
	MULPS  X3, X12         // (1-b2)*g
	MULPS  X8, X12         // ((1-b2)*g)*g
	ADDPS  X12, X11        // v'
	MOVUPS X11, (R9)(AX*1)
	SQRTPS X11, X13
	MULPS  X4, X13
	ADDPS  X5, X13         // denominator
	MULPS  X7, X9          // step size * m'
	DIVPS  X13, X9
	MOVUPS (DI)(AX*1), X14 // p
	MULPS  X6, X14         // p*(1-lr*wd)
	SUBPS  X9, X14
	MOVUPS X14, (DI)(AX*1)
	ADDQ   $16, AX
	CMPQ   AX, CX
	JB     adamloop
	RET
