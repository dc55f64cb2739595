package pccl

// The tests' buffers are small: segments of 64 KiB make most of their hierarchical AllReduces on the
// fabric pipelines of several segments.
func init() { pipeMinBytes = 64 << 10 }

// AggregateForTest exposes aggregate to the external tests.
var AggregateForTest = aggregate
