//go:build amd64 && !purego

#include "textflag.h"

// func addF32AVX(d, s *float32, n int)
// d[i] = d[i] + s[i], 32 elements (four YMM registers) per round; n is a multiple of 32. VADDPS's
// first source operand is d's element, as in the scalar ADDSS the compiler emits for d[i] += s[i].
TEXT ·addF32AVX(SB), NOSPLIT, $0-24
	MOVQ d+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $5, CX
	JZ   done

loop:
	VMOVUPS 0(DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VADDPS  0(SI), Y0, Y0
	VADDPS  32(SI), Y1, Y1
	VADDPS  64(SI), Y2, Y2
	VADDPS  96(SI), Y3, Y3
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ    $128, DI
	ADDQ    $128, SI
	DECQ    CX
	JNZ     loop

done:
	VZEROUPPER
	RET

// func addF64AVX(d, s *float64, n int)
// d[i] = d[i] + s[i], 16 elements per round; n is a multiple of 16.
TEXT ·addF64AVX(SB), NOSPLIT, $0-24
	MOVQ d+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ   done

loop:
	VMOVUPD 0(DI), Y0
	VMOVUPD 32(DI), Y1
	VMOVUPD 64(DI), Y2
	VMOVUPD 96(DI), Y3
	VADDPD  0(SI), Y0, Y0
	VADDPD  32(SI), Y1, Y1
	VADDPD  64(SI), Y2, Y2
	VADDPD  96(SI), Y3, Y3
	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	ADDQ    $128, DI
	ADDQ    $128, SI
	DECQ    CX
	JNZ     loop

done:
	VZEROUPPER
	RET

// func addF32OntoAVX(d, s *float32, n int)
// d[i] = s[i] + d[i], 32 elements per round; n is a multiple of 32. s's element is the first source.
TEXT ·addF32OntoAVX(SB), NOSPLIT, $0-24
	MOVQ d+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $5, CX
	JZ   done

loop:
	VMOVUPS 0(SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VADDPS  0(DI), Y0, Y0
	VADDPS  32(DI), Y1, Y1
	VADDPS  64(DI), Y2, Y2
	VADDPS  96(DI), Y3, Y3
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ    $128, DI
	ADDQ    $128, SI
	DECQ    CX
	JNZ     loop

done:
	VZEROUPPER
	RET

// func addF64OntoAVX(d, s *float64, n int)
// d[i] = s[i] + d[i], 16 elements per round; n is a multiple of 16. s's element is the first source.
TEXT ·addF64OntoAVX(SB), NOSPLIT, $0-24
	MOVQ d+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ   done

loop:
	VMOVUPD 0(SI), Y0
	VMOVUPD 32(SI), Y1
	VMOVUPD 64(SI), Y2
	VMOVUPD 96(SI), Y3
	VADDPD  0(DI), Y0, Y0
	VADDPD  32(DI), Y1, Y1
	VADDPD  64(DI), Y2, Y2
	VADDPD  96(DI), Y3, Y3
	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	ADDQ    $128, DI
	ADDQ    $128, SI
	DECQ    CX
	JNZ     loop

done:
	VZEROUPPER
	RET

// func addF32OntoSaveAVX(d, s, save *float32, n int)
// save[i] = d[i], then d[i] = s[i] + d[i], 32 elements per round; n is a multiple of 32 and save is
// 32-byte aligned. One pass reads d once for both; s's element is the first source, as in
// addF32OntoAVX. save gets non-temporal stores (it is read again only if the operation fails), which
// need not fetch its lines first; SFENCE orders them before whatever the caller stores next.
TEXT ·addF32OntoSaveAVX(SB), NOSPLIT, $0-32
	MOVQ d+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ save+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $5, CX
	JZ   done

loop:
	VMOVUPS 0(DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VMOVNTPS Y0, 0(DX)
	VMOVNTPS Y1, 32(DX)
	VMOVNTPS Y2, 64(DX)
	VMOVNTPS Y3, 96(DX)
	VMOVUPS 0(SI), Y4
	VMOVUPS 32(SI), Y5
	VMOVUPS 64(SI), Y6
	VMOVUPS 96(SI), Y7
	VADDPS  Y0, Y4, Y4
	VADDPS  Y1, Y5, Y5
	VADDPS  Y2, Y6, Y6
	VADDPS  Y3, Y7, Y7
	VMOVUPS Y4, 0(DI)
	VMOVUPS Y5, 32(DI)
	VMOVUPS Y6, 64(DI)
	VMOVUPS Y7, 96(DI)
	ADDQ    $128, DI
	ADDQ    $128, SI
	ADDQ    $128, DX
	DECQ    CX
	JNZ     loop

done:
	SFENCE
	VZEROUPPER
	RET

// func addF64OntoSaveAVX(d, s, save *float64, n int)
// addF32OntoSaveAVX for float64: 16 elements per round; n is a multiple of 16, save 32-byte aligned.
TEXT ·addF64OntoSaveAVX(SB), NOSPLIT, $0-32
	MOVQ d+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ save+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	JZ   done

loop:
	VMOVUPD 0(DI), Y0
	VMOVUPD 32(DI), Y1
	VMOVUPD 64(DI), Y2
	VMOVUPD 96(DI), Y3
	VMOVNTPD Y0, 0(DX)
	VMOVNTPD Y1, 32(DX)
	VMOVNTPD Y2, 64(DX)
	VMOVNTPD Y3, 96(DX)
	VMOVUPD 0(SI), Y4
	VMOVUPD 32(SI), Y5
	VMOVUPD 64(SI), Y6
	VMOVUPD 96(SI), Y7
	VADDPD  Y0, Y4, Y4
	VADDPD  Y1, Y5, Y5
	VADDPD  Y2, Y6, Y6
	VADDPD  Y3, Y7, Y7
	VMOVUPD Y4, 0(DI)
	VMOVUPD Y5, 32(DI)
	VMOVUPD Y6, 64(DI)
	VMOVUPD Y7, 96(DI)
	ADDQ    $128, DI
	ADDQ    $128, SI
	ADDQ    $128, DX
	DECQ    CX
	JNZ     loop

done:
	SFENCE
	VZEROUPPER
	RET

// func addF32ToAVX(d, a, b *float32, n int)
// d[i] = a[i] + b[i], 32 elements per round; n is a multiple of 32. a's element is VADDPS's first
// source, as d's is in addF32AVX: the sum Accumulate stores in a copy of a.
TEXT ·addF32ToAVX(SB), NOSPLIT, $0-32
	MOVQ d+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $5, CX
	JZ   done

loop:
	VMOVUPS 0(SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VADDPS  0(DX), Y0, Y0
	VADDPS  32(DX), Y1, Y1
	VADDPS  64(DX), Y2, Y2
	VADDPS  96(DX), Y3, Y3
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ    $128, DI
	ADDQ    $128, SI
	ADDQ    $128, DX
	DECQ    CX
	JNZ     loop

done:
	VZEROUPPER
	RET

// func addF64ToAVX(d, a, b *float64, n int)
// addF32ToAVX for float64: 16 elements per round; n is a multiple of 16.
TEXT ·addF64ToAVX(SB), NOSPLIT, $0-32
	MOVQ d+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	JZ   done

loop:
	VMOVUPD 0(SI), Y0
	VMOVUPD 32(SI), Y1
	VMOVUPD 64(SI), Y2
	VMOVUPD 96(SI), Y3
	VADDPD  0(DX), Y0, Y0
	VADDPD  32(DX), Y1, Y1
	VADDPD  64(DX), Y2, Y2
	VADDPD  96(DX), Y3, Y3
	VMOVUPD Y0, 0(DI)
	VMOVUPD Y1, 32(DI)
	VMOVUPD Y2, 64(DI)
	VMOVUPD Y3, 96(DI)
	ADDQ    $128, DI
	ADDQ    $128, SI
	ADDQ    $128, DX
	DECQ    CX
	JNZ     loop

done:
	VZEROUPPER
	RET
