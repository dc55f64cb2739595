package diloco

import "fmt"

// Sampler walks one rank's shards of a Dataset, epoch after epoch, and hands
// out minibatches. Its position (Epoch, Pos) is plain data, so a trainer can
// publish it with the step it belongs to and restore it on a replacement
// peer. A Sampler is not safe for concurrent use.
type Sampler struct {
	// Epoch is the epoch whose shard is being read.
	Epoch uint64
	// Pos is the position of the next sample within that shard.
	Pos int

	d           *Dataset
	rank, world int
	shard       []int  // indices of the current epoch, nil until needed
	shardEpoch  uint64 // epoch that shard belongs to
	idx         []int  // scratch: indices of the batch being built
}

// NewSampler returns a sampler over d for rank out of world ranks, starting
// at the first sample of epoch 0. It panics unless 0 <= rank < world.
func NewSampler(d *Dataset, rank, world int) *Sampler {
	if world <= 0 || rank < 0 || rank >= world {
		panic(fmt.Sprintf("diloco: sampler rank %d of world %d", rank, world))
	}
	return &Sampler{d: d, rank: rank, world: world}
}

// Next returns the indices of the next n samples of this rank and advances.
// A batch that reaches the end of the shard continues at the start of the
// next epoch's shard. The returned slice belongs to the Sampler and is
// overwritten by the next call.
func (s *Sampler) Next(n int) []int {
	s.idx = s.idx[:0]
	for len(s.idx) < n {
		if s.shard == nil || s.shardEpoch != s.Epoch {
			s.shard = s.d.Shard(s.rank, s.world, s.Epoch)
			s.shardEpoch = s.Epoch
			if len(s.shard) == 0 {
				panic(fmt.Sprintf("diloco: rank %d of %d has an empty shard of %d samples", s.rank, s.world, s.d.N))
			}
		}
		if s.Pos >= len(s.shard) {
			s.Epoch++
			s.Pos = 0
			continue
		}
		take := min(n-len(s.idx), len(s.shard)-s.Pos)
		s.idx = append(s.idx, s.shard[s.Pos:s.Pos+take]...)
		s.Pos += take
	}
	return s.idx
}

// LocalConfig configures TrainLocal. The zero value works: it trains the
// model of seed 0 with the defaults below.
type LocalConfig struct {
	// Seed selects the initial parameters (see InitParams). Default 0.
	Seed uint64
	// Steps is the number of optimiser steps. Default 2000, about 13 epochs
	// of the embedded subset.
	Steps int
	// BatchSize is the number of images per step. Default 64.
	BatchSize int
	// AdamW holds the optimiser's hyper-parameters; zero fields take the
	// AdamW defaults (learning rate 1e-3).
	AdamW AdamWConfig
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c LocalConfig) withDefaults() LocalConfig {
	if c.Steps == 0 {
		c.Steps = 2000
	}
	if c.BatchSize == 0 {
		c.BatchSize = 64
	}
	return c
}

// Validate reports the first field of c (after defaults) that is out of
// range, wrapping ErrBadConfig.
func (c LocalConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Steps < 0:
		return fmt.Errorf("%w: LocalConfig.Steps %d must not be negative", ErrBadConfig, c.Steps)
	case c.BatchSize < 0:
		return fmt.Errorf("%w: LocalConfig.BatchSize %d must not be negative", ErrBadConfig, c.BatchSize)
	}
	return c.AdamW.Validate()
}

// Result is the outcome of TrainLocal.
type Result struct {
	// Steps is the number of optimiser steps taken.
	Steps int
	// Samples is the number of training images processed (Steps*BatchSize).
	Samples int
	// Losses holds the mean minibatch loss of every step, in order.
	Losses []float32
	// TestLoss is the mean cross-entropy on the test set after training.
	TestLoss float64
	// TestAccuracy is the fraction of test images classified correctly
	// after training.
	TestAccuracy float64
	// Params is the final parameter vector.
	Params []float32
}

// TrainLocal trains one model on one process: cfg.Steps steps of minibatch
// AdamW over train, read in the order of a one-rank Sampler, then evaluates
// it on test. It is the single-process baseline of the distributed trainers
// and, like everything in this package, gives bit-identical results for the
// same inputs on every machine. It panics if cfg does not validate.
func TrainLocal(cfg LocalConfig, train, test *Dataset) Result {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	cfg = cfg.withDefaults()
	m := NewMLP(cfg.Seed)
	opt := NewAdamW(cfg.AdamW, NumParams)
	s := NewSampler(train, 0, 1)
	grads := make([]float32, NumParams)
	x := make([]float32, cfg.BatchSize*InputSize)
	y := make([]uint8, cfg.BatchSize)
	res := Result{Steps: cfg.Steps, Samples: cfg.Steps * cfg.BatchSize, Losses: make([]float32, cfg.Steps)}
	for step := range cfg.Steps {
		bx, by := train.Batch(s.Next(cfg.BatchSize), x, y)
		res.Losses[step] = m.LossGrad(bx, by, grads)
		opt.Step(m.Params, grads)
	}
	res.TestLoss = m.Loss(test)
	res.TestAccuracy = m.Accuracy(test)
	res.Params = m.Params
	return res
}
