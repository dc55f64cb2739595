package diloco

import (
	"os"
	"testing"
)

func TestTrainLocalLossDecreases(t *testing.T) {
	train, test, err := LoadEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	steps := 300
	if testing.Short() {
		steps = 60
	}
	res := TrainLocal(LocalConfig{Steps: steps, BatchSize: 32, AdamW: AdamWConfig{LR: 2e-3}}, train, test)
	if res.Steps != steps || res.Samples != steps*32 || len(res.Losses) != steps || len(res.Params) != NumParams {
		t.Fatalf("result shape: %d steps, %d samples, %d losses, %d params", res.Steps, res.Samples, len(res.Losses), len(res.Params))
	}
	mean := func(l []float32) float64 {
		var s float64
		for _, v := range l {
			s += float64(v)
		}
		return s / float64(len(l))
	}
	first, last := mean(res.Losses[:10]), mean(res.Losses[steps-10:])
	if !(last < 0.7*first) {
		t.Fatalf("mean loss of the first 10 steps %.3f, of the last 10 %.3f", first, last)
	}
	// Chance is 0.1; even the short run is far above it.
	if res.TestAccuracy < 0.6 {
		t.Fatalf("test accuracy %.3f after %d steps", res.TestAccuracy, steps)
	}
	t.Logf("%d steps: loss %.3f -> %.3f, test accuracy %.4f, test loss %.4f", steps, first, last, res.TestAccuracy, res.TestLoss)
}

// BenchmarkTrainLocalEmbedded trains with the default configuration on the
// embedded subset and reports the test accuracy reached.
func BenchmarkTrainLocalEmbedded(b *testing.B) {
	train, test, err := LoadEmbedded()
	if err != nil {
		b.Fatal(err)
	}
	var res Result
	for b.Loop() {
		res = TrainLocal(LocalConfig{}, train, test)
	}
	b.ReportMetric(res.TestAccuracy, "test_accuracy")
	b.ReportMetric(float64(b.Elapsed().Seconds())/float64(b.N), "s/run")
}

// BenchmarkTrainLocalFull trains for three epochs of the full training set
// (when installed) and reports the test accuracy on the full test set.
func BenchmarkTrainLocalFull(b *testing.B) {
	if _, err := os.Stat(DefaultDir()); err != nil {
		b.Skipf("full data set not installed: %v", err)
	}
	train, test, err := LoadDir(DefaultDir())
	if err != nil {
		b.Fatal(err)
	}
	cfg := LocalConfig{Steps: 3 * train.N / 64}
	var res Result
	for b.Loop() {
		res = TrainLocal(cfg, train, test)
	}
	b.ReportMetric(res.TestAccuracy, "test_accuracy")
	b.ReportMetric(float64(b.Elapsed().Seconds())/float64(b.N), "s/run")
}
