package diloco

// Worker is the local side of a streaming DiLoCo run (RunStreaming): the model a peer trains
// between outer syncs. The trainer owns the parameter vectors and calls a Worker from its own
// goroutine only.
type Worker interface {
	// NumParams is the length of the parameter vector.
	NumParams() int
	// Init writes the initial global parameters. Every peer of a run must write the same ones.
	Init(params []float32)
	// Seek places the worker's data at the group's position: it is rank of world peers, and the
	// group has consumed consumed samples of epoch epoch. The trainer calls it before the first
	// inner step and whenever the group or the position changed outside the worker's own steps.
	Seek(rank, world int, epoch, consumed uint64)
	// Samples is the size of the training set, after which the group's position moves to the next
	// epoch; 0 when the worker reads no data set.
	Samples() int
	// Step runs one inner step on params, the peer's local parameters, reading BatchSize samples
	// from its position, and returns the step's loss.
	Step(params []float32) float32
}

// mlpWorker trains the MLP on a data set with AdamW: the worker of Run's streaming kind.
type mlpWorker struct {
	train   *Dataset
	seed    uint64
	batch   int
	inner   *AdamW
	model   MLP
	grads   []float32
	x       []float32
	y       []uint8
	sampler *Sampler
	rank    int
	world   int
}

func newMLPWorker(train *Dataset, cfg TrainerConfig) *mlpWorker {
	return &mlpWorker{
		train: train, seed: cfg.Seed, batch: cfg.BatchSize,
		inner: NewAdamW(cfg.Inner, NumParams),
		grads: make([]float32, NumParams),
		x:     make([]float32, cfg.BatchSize*InputSize),
		y:     make([]uint8, cfg.BatchSize),
	}
}

func (w *mlpWorker) NumParams() int        { return NumParams }
func (w *mlpWorker) Init(params []float32) { InitParams(params, w.seed) }
func (w *mlpWorker) Samples() int          { return w.train.N }

func (w *mlpWorker) Seek(rank, world int, epoch, consumed uint64) {
	if w.sampler == nil || rank != w.rank || world != w.world {
		w.sampler = NewSampler(w.train, rank, world)
		w.rank, w.world = rank, world
	}
	w.sampler.Epoch = epoch
	w.sampler.Pos = int(consumed / uint64(world))
}

func (w *mlpWorker) Step(params []float32) float32 {
	w.model.Params = params
	bx, by := w.train.Batch(w.sampler.Next(w.batch), w.x, w.y)
	loss := w.model.LossGrad(bx, by, w.grads)
	w.inner.Step(params, w.grads)
	return loss
}
