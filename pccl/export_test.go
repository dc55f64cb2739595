package pccl

// AggregateForTest exposes aggregate to the external tests.
var AggregateForTest = aggregate
