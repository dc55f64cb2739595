package diloco

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
)

// Shapes of the Fashion-MNIST data.
const (
	// ImageSide is the width and height of an image in pixels.
	ImageSide = 28
	// InputSize is the number of pixels of an image, the model's input width.
	InputSize = ImageSide * ImageSide
	// NumClasses is the number of labels (0 to 9).
	NumClasses = 10
)

// ErrBadDataset is returned (wrapped) when well-formed IDX files do not make a
// Fashion-MNIST data set: wrong shapes or element types, image and label
// counts that differ, or labels outside 0..9.
var ErrBadDataset = errors.New("diloco: bad data set")

// Dataset is a set of labelled images held in memory. A Dataset is read-only
// once built and may be shared by any number of goroutines.
type Dataset struct {
	// X holds N images of InputSize pixels each, row-major, scaled to [0, 1]
	// as byte/255.
	X []float32
	// Y holds the N labels, each in 0..NumClasses-1.
	Y []uint8
	// N is the number of images.
	N int
}

// The embedded subset: the first 1000 images of each class of the training
// set and the first 200 of each class of the test set, written by data/gen.go.
//
//go:embed data/*.gz
var embedded embed.FS

// LoadEmbedded returns the Fashion-MNIST subset compiled into the binary:
// 10,000 training images and 2,000 test images, class balanced. It works on
// any machine without files on disk; each call decodes a fresh copy.
func LoadEmbedded() (train, test *Dataset, err error) {
	read := func(name string) (*IDX, error) {
		b, err := embedded.ReadFile("data/" + name + ".gz")
		if err != nil {
			return nil, err
		}
		x, err := ReadIDX(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("embedded %s: %w", name, err)
		}
		return x, nil
	}
	return load(read)
}

// DefaultDir returns the directory where Debian's dataset-fashion-mnist
// package installs the full data set.
func DefaultDir() string { return "/usr/share/datasets/fashion-mnist" }

// LoadDir reads the full data set from dir, which must hold the four files
// train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
// t10k-labels-idx1-ubyte, each either raw or gzip-compressed with a .gz suffix
// (the compressed name is tried first).
func LoadDir(dir string) (train, test *Dataset, err error) {
	read := func(name string) (*IDX, error) {
		path := filepath.Join(dir, name+".gz")
		if _, err := os.Stat(path); err != nil {
			path = filepath.Join(dir, name)
		}
		return ReadIDXFile(path)
	}
	return load(read)
}

// load builds the training and test sets from the four files that read
// returns by their base names.
func load(read func(name string) (*IDX, error)) (train, test *Dataset, err error) {
	train, err = loadPair(read, "train")
	if err != nil {
		return nil, nil, err
	}
	test, err = loadPair(read, "t10k")
	if err != nil {
		return nil, nil, err
	}
	return train, test, nil
}

// loadPair builds one data set from prefix-images-idx3-ubyte and
// prefix-labels-idx1-ubyte.
func loadPair(read func(name string) (*IDX, error), prefix string) (*Dataset, error) {
	img, err := read(prefix + "-images-idx3-ubyte")
	if err != nil {
		return nil, err
	}
	lab, err := read(prefix + "-labels-idx1-ubyte")
	if err != nil {
		return nil, err
	}
	d, err := NewDataset(img, lab)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", prefix, err)
	}
	return d, nil
}

// NewDataset builds a Dataset from decoded image and label files. images must
// be uint8 of shape [n, 28, 28] and labels uint8 of shape [n] with values
// below NumClasses; anything else wraps ErrBadDataset.
func NewDataset(images, labels *IDX) (*Dataset, error) {
	if images.Type != IDXUint8 || len(images.Dims) != 3 || images.Dims[1] != ImageSide || images.Dims[2] != ImageSide {
		return nil, fmt.Errorf("%w: images have type %#02x and shape %v, want uint8 [n 28 28]", ErrBadDataset, images.Type, images.Dims)
	}
	if labels.Type != IDXUint8 || len(labels.Dims) != 1 {
		return nil, fmt.Errorf("%w: labels have type %#02x and shape %v, want uint8 [n]", ErrBadDataset, labels.Type, labels.Dims)
	}
	n := images.Dims[0]
	if labels.Dims[0] != n {
		return nil, fmt.Errorf("%w: %d images but %d labels", ErrBadDataset, n, labels.Dims[0])
	}
	d := &Dataset{X: make([]float32, n*InputSize), Y: make([]uint8, n), N: n}
	for i, c := range labels.Data {
		if c >= NumClasses {
			return nil, fmt.Errorf("%w: label %d of image %d", ErrBadDataset, c, i)
		}
		d.Y[i] = c
	}
	for i, p := range images.Data {
		d.X[i] = float32(p) / 255
	}
	return d, nil
}

// Batch copies the images and labels at the given indices into x and y,
// which must hold at least len(idx)*InputSize and len(idx) elements, and
// returns the filled prefixes.
func (d *Dataset) Batch(idx []int, x []float32, y []uint8) ([]float32, []uint8) {
	x = x[:len(idx)*InputSize]
	y = y[:len(idx)]
	for k, i := range idx {
		copy(x[k*InputSize:(k+1)*InputSize], d.X[i*InputSize:(i+1)*InputSize])
		y[k] = d.Y[i]
	}
	return x, y
}

// shardSeed is the fixed seed of the per-epoch permutations.
const shardSeed = 0x6a09e667f3bcc908

// Shard returns the indices of the images that rank uses in epoch, out of a
// group of world ranks.
//
// Every epoch has one permutation of 0..N-1 that depends only on the epoch
// number (and on a fixed seed built into the package): a Fisher-Yates shuffle
// driven by a splitmix64 generator seeded with the epoch. The permutation is
// cut into world contiguous parts, rank r taking positions
// [r*N/world, (r+1)*N/world). Across the ranks of one epoch every index
// appears exactly once, and every process computes the same parts without
// talking to the others. The caller owns the returned slice. It panics
// unless 0 <= rank < world.
func (d *Dataset) Shard(rank, world int, epoch uint64) []int {
	if world <= 0 || rank < 0 || rank >= world {
		panic(fmt.Sprintf("diloco: shard rank %d of world %d", rank, world))
	}
	perm := Permutation(d.N, shardSeed^mix64(epoch))
	lo := rank * d.N / world
	hi := (rank + 1) * d.N / world
	return perm[lo:hi:hi]
}

// Permutation returns a pseudo-random permutation of 0..n-1 determined by
// seed alone: a Fisher-Yates shuffle driven by splitmix64, with unbiased
// bounded draws. The result is the same on every machine and Go release.
func Permutation(n int, seed uint64) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	r := newRNG(seed)
	for i := n - 1; i > 0; i-- {
		j := r.below(uint64(i) + 1)
		p[i], p[j] = p[j], p[i]
	}
	return p
}

// rng is a splitmix64 generator. It is specified here, not taken from
// math/rand, so that its output never changes.
type rng struct{ s uint64 }

// newRNG seeds a generator.
func newRNG(seed uint64) *rng { return &rng{s: seed} }

// next returns the next 64 random bits.
func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return mix64(r.s)
}

// mix64 is the splitmix64 finaliser, a bijection that scrambles its input.
func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// below returns a uniform value in [0, n) for n > 0 (Lemire's method with
// rejection, so it has no bias).
func (r *rng) below(n uint64) uint64 {
	hi, lo := bits.Mul64(r.next(), n)
	if lo < n {
		thresh := -n % n
		for lo < thresh {
			hi, lo = bits.Mul64(r.next(), n)
		}
	}
	return hi
}

// uniform returns a float32 uniform in [-limit, limit), computed exactly up to
// one final rounding.
func (r *rng) uniform(limit float32) float32 {
	u := float32(float32(r.next()>>40) * (1.0 / (1 << 24))) // exact: 24 bits
	return float32((float32(2*u) - 1) * limit)
}
