// Package diloco holds the model side of Concord's training demos: the
// Fashion-MNIST data (a class-balanced subset embedded in the binary, and a
// loader for the full set in IDX files), a deterministic 784-256-10 MLP whose
// parameters live in one contiguous float32 vector, the AdamW inner optimiser
// and the Nesterov outer optimiser used by DiLoCo.
//
// The model side is pure computation: no goroutines, no clocks, no global
// randomness. The pieces are driven one step at a time by the trainers that
// talk to the network (Run: DDP, DiLoCo, async DiLoCo and streaming DiLoCo),
// which all-reduce the vectors this package exposes: the parameter vector of an
// MLP, a gradient vector of the same layout, and the state vectors of the
// optimisers.
//
// # Streaming DiLoCo
//
// RunStreaming (Run's KindStreamingDiLoCo, for any Worker) cuts the parameters
// into Fragments fragments that sync on a staggered schedule: one every
// H/Fragments inner steps, each once per H, its all-reduce running on a
// goroutine of its own while the inner steps go on and its result mixed into
// the local parameters SyncDelay steps later with weight Mix. The outer
// gradients may be compressed (Compression): int8 or int4 values with a scale
// per block of 64, of the TopK fraction of each chunk of 4096 elements with
// 12-bit offsets, every peer's encoding gathered in the slot of its rank and
// summed in rank order, so the result is the same bits everywhere; each peer
// keeps what it did not send in an error-feedback buffer of its own and adds it
// to the fragment's next outer gradient. Membership changes at fragment
// boundaries only: a death aborts the fragment in flight, which the survivors
// retry; a newcomer joins at a boundary, receives the global parameters, the
// outer momentum and the counters, and starts its error feedback at zero.
//
// # Reproducibility
//
// For identical inputs every function in this package returns bit-identical
// results on every machine and architecture. The kernels are written so that the
// compiler cannot fuse a multiply and an add into one FMA instruction (every
// product is wrapped in an explicit float32 or float64 conversion, which the Go
// specification says forbids fusion), every sum is taken in a fixed order, and
// the transcendental functions the model needs (exp and log) are computed by
// this package from basic arithmetic rather than by package math, whose
// assembly versions differ between architectures and CPU features. Random
// numbers come from a splitmix64 generator implemented here, so they do not
// depend on the Go release either. (NaNs are the exception: their bit
// patterns may differ between architectures once a computation has produced
// one.)
//
// On amd64 the three hot loops (the first layer's dot products, its weight
// gradient and the AdamW update) run as SSE assembly that computes the same
// bits as the portable Go code: a dot product is kept as four lanes, lane l
// summing the products at positions l, l+4, l+8 and so on, which is exactly
// what one SSE register does, and SSE rounds each lane like the scalar code.
// Building with the purego tag selects the portable code on amd64 too; the
// tests compare the two bit for bit.
//
// # Speed
//
// BenchmarkTrainStep measures a training step; docs/results/diloco.md has
// its figures and the time TrainLocal takes to reach its accuracy.
package diloco
