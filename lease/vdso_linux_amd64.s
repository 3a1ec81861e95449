#include "textflag.h"

// func callVDSOClockGettime(fn uintptr, clock int32, ts *unix.Timespec) int32
//
// Calls the vDSO's clock_gettime (System V ABI) on this goroutine's stack,
// inside the function's own 8 KiB frame: the stack-check prologue makes
// sure the frame fits, and the C code, which grows the stack downwards
// from the frame's top, stays within it (clock_gettime needs a few
// hundred bytes; the slack covers kernels built with stack probes). The
// runtime switches to the thread's g0 stack for its own vDSO calls; a
// frame this size is the goroutine-stack equivalent. R12 is callee-saved
// in the System V ABI and holds the Go stack pointer across the call.
TEXT ·callVDSOClockGettime(SB), 0, $8192-28
	MOVQ	fn+0(FP), AX
	MOVL	clock+8(FP), DI
	MOVQ	ts+16(FP), SI
	MOVQ	SP, R12
	LEAQ	8192(SP), BX
	ANDQ	$~15, BX
	MOVQ	BX, SP
	CALL	AX
	MOVQ	R12, SP
	MOVL	AX, ret+24(FP)
	RET
