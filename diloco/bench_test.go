package diloco

import (
	"testing"
)

// BenchmarkTrainStep measures one AdamW training step (forward, backward
// and update) on a batch of 64 embedded training images and reports the cost
// per sample.
func BenchmarkTrainStep(b *testing.B) {
	train, _, err := LoadEmbedded()
	if err != nil {
		b.Fatal(err)
	}
	const batch = 64
	m := NewMLP(1)
	opt := NewAdamW(AdamWConfig{}, NumParams)
	s := NewSampler(train, 0, 1)
	grads := make([]float32, NumParams)
	x := make([]float32, batch*InputSize)
	y := make([]uint8, batch)
	b.ResetTimer()
	for b.Loop() {
		bx, by := train.Batch(s.Next(batch), x, y)
		m.LossGrad(bx, by, grads)
		opt.Step(m.Params, grads)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/sample")
}

// BenchmarkForward measures the forward pass alone on a batch of 64.
func BenchmarkForward(b *testing.B) {
	train, _, err := LoadEmbedded()
	if err != nil {
		b.Fatal(err)
	}
	const batch = 64
	m := NewMLP(1)
	for b.Loop() {
		m.Forward(train.X, batch)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/sample")
}

// BenchmarkAdamWStep measures one AdamW update of the whole parameter
// vector.
func BenchmarkAdamWStep(b *testing.B) {
	r := newRNG(1)
	p := randVec(r, NumParams, 1)
	g := randVec(r, NumParams, 1)
	opt := NewAdamW(AdamWConfig{WeightDecay: 0.01}, NumParams)
	for b.Loop() {
		opt.Step(p, g)
	}
}
