package diloco

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestLoadEmbedded(t *testing.T) {
	train, test, err := LoadEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		d        *Dataset
		n        int
		perClass int
	}{{"train", train, 10000, 1000}, {"test", test, 2000, 200}} {
		d := c.d
		if d.N != c.n || len(d.X) != c.n*InputSize || len(d.Y) != c.n {
			t.Fatalf("%s: N=%d len(X)=%d len(Y)=%d", c.name, d.N, len(d.X), len(d.Y))
		}
		var count [NumClasses]int
		for _, y := range d.Y {
			count[y]++
		}
		for k, n := range count {
			if n != c.perClass {
				t.Errorf("%s: class %d has %d images, want %d", c.name, k, n, c.perClass)
			}
		}
		var zeros, ones int
		for i, v := range d.X {
			if !(v >= 0 && v <= 1) {
				t.Fatalf("%s: pixel %d = %v", c.name, i, v)
			}
			if b := byte(v*255 + 0.5); float32(b)/255 != v {
				t.Fatalf("%s: pixel %d = %v is not a byte over 255", c.name, i, v)
			}
			switch v {
			case 0:
				zeros++
			case 1:
				ones++
			}
		}
		if zeros == 0 || ones == 0 || zeros == len(d.X) {
			t.Errorf("%s: %d zero and %d saturated pixels of %d", c.name, zeros, ones, len(d.X))
		}
	}
}

// writeSet writes images and labels as IDX files named with prefix into
// dir, gzip-compressed if compress is set.
func writeSet(t *testing.T, dir, prefix string, images, labels *IDX, compress bool) {
	t.Helper()
	for name, x := range map[string]*IDX{prefix + "-images-idx3-ubyte": images, prefix + "-labels-idx1-ubyte": labels} {
		b := rawIDX(t, x)
		if compress {
			b = gz(t, b)
			name += ".gz"
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// tinySet returns n images whose pixels are all equal to their index, and
// labels i mod 10.
func tinySet(n int) (images, labels *IDX) {
	images = &IDX{Type: IDXUint8, Dims: []int{n, ImageSide, ImageSide}, Data: make([]byte, n*InputSize)}
	labels = &IDX{Type: IDXUint8, Dims: []int{n}, Data: make([]byte, n)}
	for i := range n {
		for p := range InputSize {
			images.Data[i*InputSize+p] = byte(i)
		}
		labels.Data[i] = byte(i % NumClasses)
	}
	return images, labels
}

func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	img, lab := tinySet(5)
	writeSet(t, dir, "train", img, lab, true)
	img2, lab2 := tinySet(3)
	writeSet(t, dir, "t10k", img2, lab2, false)
	train, test, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 5 || test.N != 3 {
		t.Fatalf("N = %d, %d", train.N, test.N)
	}
	for i := range 5 {
		if train.Y[i] != uint8(i) {
			t.Errorf("label %d = %d", i, train.Y[i])
		}
		for p := range InputSize {
			if got, want := train.X[i*InputSize+p], float32(i)/255; got != want {
				t.Fatalf("pixel %d of image %d = %v, want %v", p, i, got, want)
			}
		}
	}
	if _, _, err := LoadDir(filepath.Join(dir, "nothing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing dir: %v", err)
	}
}

func TestNewDatasetRejects(t *testing.T) {
	img, lab := tinySet(4)
	badLabel := &IDX{Type: IDXUint8, Dims: []int{4}, Data: []byte{0, 1, 10, 2}}
	cases := map[string][2]*IDX{
		"count mismatch": {img, {Type: IDXUint8, Dims: []int{3}, Data: []byte{0, 1, 2}}},
		"label range":    {img, badLabel},
		"image shape":    {{Type: IDXUint8, Dims: []int{4, 28, 27}, Data: make([]byte, 4*28*27)}, lab},
		"image type":     {{Type: IDXInt8, Dims: []int{4, 28, 28}, Data: make([]byte, 4*InputSize)}, lab},
		"label shape":    {img, {Type: IDXUint8, Dims: []int{2, 2}, Data: []byte{0, 1, 2, 3}}},
	}
	for name, c := range cases {
		if _, err := NewDataset(c[0], c[1]); !errors.Is(err, ErrBadDataset) {
			t.Errorf("%s: got %v, want ErrBadDataset", name, err)
		}
	}
	dir := t.TempDir()
	writeSet(t, dir, "train", img, badLabel, true)
	writeSet(t, dir, "t10k", img, lab, true)
	if _, _, err := LoadDir(dir); !errors.Is(err, ErrBadDataset) {
		t.Fatalf("LoadDir: %v", err)
	}
}

func TestLoadDirFull(t *testing.T) {
	if testing.Short() {
		t.Skip("reads the full data set")
	}
	if _, err := os.Stat(DefaultDir()); err != nil {
		t.Skipf("full data set not installed: %v", err)
	}
	train, test, err := LoadDir(DefaultDir())
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 60000 || test.N != 10000 {
		t.Fatalf("N = %d, %d", train.N, test.N)
	}
	// The embedded subset is the first 1000 images of each class, in order.
	sub, _, err := LoadEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	var count [NumClasses]int
	k := 0
	for i := 0; i < train.N && k < sub.N; i++ {
		c := train.Y[i]
		if count[c] == 1000 {
			continue
		}
		count[c]++
		if sub.Y[k] != c || !slices.Equal(sub.X[k*InputSize:(k+1)*InputSize], train.X[i*InputSize:(i+1)*InputSize]) {
			t.Fatalf("embedded image %d differs from full image %d", k, i)
		}
		k++
	}
	if k != sub.N {
		t.Fatalf("matched %d of %d embedded images", k, sub.N)
	}
}

func TestShardCoversEveryIndexOnce(t *testing.T) {
	for _, n := range []int{1, 7, 100, 1001} {
		d := &Dataset{N: n}
		for _, world := range []int{1, 2, 3, 4, 7} {
			for epoch := range uint64(3) {
				seen := make([]int, n)
				total := 0
				for rank := range world {
					s := d.Shard(rank, world, epoch)
					if len(s) != (rank+1)*n/world-rank*n/world {
						t.Fatalf("n=%d world=%d rank=%d: %d indices", n, world, rank, len(s))
					}
					for _, i := range s {
						seen[i]++
					}
					total += len(s)
				}
				for i, c := range seen {
					if c != 1 {
						t.Fatalf("n=%d world=%d epoch=%d: index %d used %d times", n, world, epoch, i, c)
					}
				}
				if total != n {
					t.Fatalf("total %d", total)
				}
			}
		}
	}
}

func TestShardIsDeterministic(t *testing.T) {
	d := &Dataset{N: 1000}
	// A rank's part is a slice of the epoch's permutation, whatever the world.
	full := d.Shard(0, 1, 5)
	if got := d.Shard(1, 4, 5); !slices.Equal(got, full[250:500]) {
		t.Fatal("rank 1 of 4 is not the second quarter of the permutation")
	}
	if !slices.Equal(d.Shard(0, 1, 5), full) {
		t.Fatal("same epoch, different permutation")
	}
	if slices.Equal(d.Shard(0, 1, 6), full) {
		t.Fatal("epochs 5 and 6 have the same permutation")
	}
	// The permutation is fixed for all time: these values must never change,
	// or runs would not be comparable across releases.
	if got, want := Permutation(10, 42), []int{8, 3, 6, 5, 4, 0, 9, 2, 1, 7}; !slices.Equal(got, want) {
		t.Fatalf("Permutation(10, 42) = %v, want %v", got, want)
	}
}

func TestShardPanicsOnBadRank(t *testing.T) {
	d := &Dataset{N: 10}
	for _, c := range [][2]int{{-1, 2}, {2, 2}, {0, 0}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("rank %d of %d did not panic", c[0], c[1])
				}
			}()
			d.Shard(c[0], c[1], 0)
		}()
	}
}

func TestSampler(t *testing.T) {
	d := &Dataset{N: 10}
	s := NewSampler(d, 1, 2) // 5 samples per epoch
	var got []int
	for range 4 {
		got = append(got, s.Next(3)...)
	}
	want := append(append(slices.Clone(d.Shard(1, 2, 0)), d.Shard(1, 2, 1)...), d.Shard(1, 2, 2)[:2]...)
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if s.Epoch != 2 || s.Pos != 2 {
		t.Fatalf("position %d/%d, want 2/2", s.Epoch, s.Pos)
	}
	// A sampler restored from a position continues identically.
	r := NewSampler(d, 1, 2)
	r.Epoch, r.Pos = s.Epoch, s.Pos
	if a, b := slices.Clone(s.Next(7)), r.Next(7); !slices.Equal(a, b) {
		t.Fatalf("restored sampler: %v, want %v", b, a)
	}
}

func TestBatch(t *testing.T) {
	img, lab := tinySet(6)
	d, err := NewDataset(img, lab)
	if err != nil {
		t.Fatal(err)
	}
	x, y := d.Batch([]int{4, 1}, make([]float32, 3*InputSize), make([]uint8, 3))
	if len(x) != 2*InputSize || !bytes.Equal(y, []byte{4, 1}) {
		t.Fatalf("len(x)=%d y=%v", len(x), y)
	}
	if x[0] != float32(4)/255 || x[InputSize] != float32(1)/255 {
		t.Fatalf("pixels %v %v", x[0], x[InputSize])
	}
}

// TestRNGVectors pins the generator to the published splitmix64 output for
// seed 1234567.
func TestRNGVectors(t *testing.T) {
	r := newRNG(1234567)
	for i, want := range []uint64{6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431, 16408922859458223821} {
		if got := r.next(); got != want {
			t.Fatalf("output %d = %d, want %d", i, got, want)
		}
	}
}

// TestBelowIsUniform checks the bounded draw stays in range and hits every
// value of a small range about equally often.
func TestBelowIsUniform(t *testing.T) {
	r := newRNG(7)
	var count [6]int
	for range 60000 {
		v := r.below(6)
		if v >= 6 {
			t.Fatalf("below(6) = %d", v)
		}
		count[v]++
	}
	for v, c := range count {
		if c < 9500 || c > 10500 {
			t.Errorf("value %d drawn %d times of 60000", v, c)
		}
	}
}
