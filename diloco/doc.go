// Package diloco holds the model side of Concord's training demos: the
// Fashion-MNIST data (a class-balanced subset embedded in the binary, and a
// loader for the full set in IDX files), a deterministic 784-256-10 MLP whose
// parameters live in one contiguous float32 vector, the AdamW inner optimiser
// and the Nesterov outer optimiser used by DiLoCo.
//
// Everything here is pure computation: no goroutines, no clocks, no global
// randomness. The pieces are meant to be driven one step at a time by the
// trainers that talk to the network (DDP, DiLoCo, async DiLoCo), which all-reduce
// the vectors this package exposes: the parameter vector of an MLP, a gradient
// vector of the same layout, and the state vectors of the optimisers.
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
