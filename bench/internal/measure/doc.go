// Package measure holds what Concord's benchmark programs share: the physical limits a ring
// all-reduce is compared to on this machine, measured in the same run (the loopback TCP ring rate and
// the reduce add rate), order statistics, byte sizes as flags spell them, and how busy the machine's
// cores were over an interval ([ReadCPU], [BusyFraction]).
//
// # The limits
//
// A ring all-reduce of D bytes per peer among N peers moves 2(N-1)·D bytes through loopback in all
// and folds (N-1)·D bytes of floats. [LoopbackRing] runs N processes in a ring, each sending D bytes
// from a real D-byte buffer to the next while receiving D bytes from the previous (1 MiB per call, a
// sender and a receiver goroutine), and reports the aggregate throughput L = N·D/t. [AddRate]
// reports Red, the best rate at which a number of goroutines fold bytes with the library's own kernel.
// Then
//
//	limit_seconds        = 2(N-1)·D / L
//	limit_reduce_seconds = (N-1)·D · (2/L + 1/Red)
package measure
