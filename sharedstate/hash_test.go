package sharedstate

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"

	"github.com/zeebo/xxh3"
)

// goldenData returns n bytes of the fixed pattern used by the known-answer vectors.
func goldenData(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

// refHash is a plain restatement of the format: all leaves first, then one new slice per tree level.
func refHash(data []byte) uint64 {
	var level []uint64
	for off := 0; off < len(data); off += BlockSize {
		level = append(level, xxh3.Hash(data[off:min(off+BlockSize, len(data))]))
	}
	for len(level) > 1 {
		var up []uint64
		for i := 0; i < len(level); i += 2 {
			if i+1 == len(level) {
				up = append(up, level[i])
				continue
			}
			pair := binary.LittleEndian.AppendUint64(nil, level[i])
			pair = binary.LittleEndian.AppendUint64(pair, level[i+1])
			up = append(up, xxh3.HashSeed(pair, NodeSeed))
		}
		level = up
	}
	var top uint64
	if len(level) == 1 {
		top = level[0]
	}
	root := binary.LittleEndian.AppendUint64(nil, top)
	root = binary.LittleEndian.AppendUint64(root, uint64(len(data)))
	return xxh3.HashSeed(root, RootSeed)
}

var hashSizes = []int{0, 1, 15, 16, 17, BlockSize - 1, BlockSize, BlockSize + 1, 3 * BlockSize, 5*BlockSize + 3}

func TestHashWorkersAgree(t *testing.T) {
	for _, n := range hashSizes {
		data := goldenData(n)
		want := refHash(data)
		if got := Hash(data); got != want {
			t.Errorf("size %d: Hash = %#x, reference %#x", n, got, want)
		}
		for w := -1; w <= 8; w++ {
			if got := HashParallel(data, w); got != want {
				t.Errorf("size %d workers %d: %#x, want %#x", n, w, got, want)
			}
		}
	}
}

func TestHashGolden(t *testing.T) {
	// These values pin the format (block size, tree shape, seeds, length in the root). If one
	// changes, every stored hash and every peer of another version disagrees: do not update them
	// without a format version change.
	golden := []struct {
		n    int
		want uint64
	}{
		{0, 0xc58309b3e1e40722},
		{1, 0x10e3bdd055a2499b},
		{BlockSize, 0x4bae4f788e217344},
		{BlockSize + 1, 0x0c4dd225e066b74c},
		{5*BlockSize + 3, 0xf92faafe83afaa2f},
	}
	// The leaves are standard XXH3-64 with seed 0: the empty input has the published value.
	if got := xxh3.Hash(nil); got != 0x2d06800538d394c2 {
		t.Errorf("xxh3 of the empty input = %#x, want 0x2d06800538d394c2", got)
	}
	for _, g := range golden {
		if got := HashParallel(goldenData(g.n), 3); got != g.want {
			t.Errorf("size %d: hash %#x, golden %#x", g.n, got, g.want)
		}
	}
}

func TestHashDetectsChanges(t *testing.T) {
	data := goldenData(3*BlockSize + 100)
	base := HashParallel(data, 4)
	for _, pos := range []int{0, 1, BlockSize - 1, BlockSize, 2*BlockSize + 17, len(data) - 1} {
		for bit := range 8 {
			data[pos] ^= 1 << bit
			if got := HashParallel(data, 4); got == base {
				t.Errorf("flipping bit %d of byte %d left the hash %#x", bit, pos, got)
			}
			data[pos] ^= 1 << bit
		}
	}
	if HashParallel(data, 4) != base {
		t.Fatal("hash changed after restoring the data")
	}
	// Swapping two whole blocks changes the hash: the tree is ordered.
	swapped := append([]byte(nil), data...)
	copy(swapped[:BlockSize], data[BlockSize:2*BlockSize])
	copy(swapped[BlockSize:2*BlockSize], data[:BlockSize])
	if Hash(swapped) == base {
		t.Error("swapping blocks 0 and 1 left the hash unchanged")
	}
	// The length is covered: trailing zero bytes change the hash.
	zeros := make([]byte, 8)
	if Hash(zeros[:4]) == Hash(zeros[:8]) || Hash(nil) == Hash(zeros[:1]) {
		t.Error("zero padding does not change the hash")
	}
}

func TestHashAll(t *testing.T) {
	var datas [][]byte
	for _, n := range hashSizes {
		datas = append(datas, goldenData(n))
	}
	for _, w := range []int{0, 1, 2, 7} {
		got := HashAll(datas, w)
		if len(got) != len(datas) {
			t.Fatalf("workers %d: %d hashes for %d inputs", w, len(got), len(datas))
		}
		for i, d := range datas {
			if want := refHash(d); got[i] != want {
				t.Errorf("workers %d input %d (%d bytes): %#x, want %#x", w, i, len(d), got[i], want)
			}
		}
	}
	if got := HashAll(nil, 3); len(got) != 0 {
		t.Errorf("HashAll(nil) = %v", got)
	}
}

func TestMeasure(t *testing.T) {
	if g := MeasureHashGBps(1<<16, 2, 2); !(g > 0) {
		t.Errorf("MeasureHashGBps = %v", g)
	}
	if g := MeasureMemcpyGBps(1<<16, 2, 2); !(g > 0) {
		t.Errorf("MeasureMemcpyGBps = %v", g)
	}
}

const benchSize = 64 << 20

func BenchmarkHash(b *testing.B) {
	data := goldenData(benchSize)
	for _, w := range []int{1, runtime.GOMAXPROCS(0)} {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				HashParallel(data, w)
			}
		})
	}
}

func BenchmarkMemcpy(b *testing.B) {
	src, dst := goldenData(benchSize), make([]byte, benchSize)
	copy(dst, src) // fault the pages in before timing
	for _, w := range []int{1, runtime.GOMAXPROCS(0)} {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			b.SetBytes(benchSize)
			for b.Loop() {
				parallelCopy(dst, src, w)
			}
		})
	}
}

// BenchmarkHashVsMemcpy reports the hash throughput over the memcpy throughput measured in the same
// run with the same worker count; the target is at least 0.5.
func BenchmarkHashVsMemcpy(b *testing.B) {
	w := runtime.GOMAXPROCS(0)
	var h, m float64
	for b.Loop() {
		h = MeasureHashGBps(benchSize, w, 3)
		m = MeasureMemcpyGBps(benchSize, w, 3)
	}
	b.ReportMetric(h, "hash-GB/s")
	b.ReportMetric(m, "memcpy-GB/s")
	b.ReportMetric(h/m, "ratio")
}

func TestLeavesAndRoot(t *testing.T) {
	for _, n := range []int{0, 1, BlockSize - 1, BlockSize, 3*BlockSize + 17} {
		data := make([]byte, n)
		for i := range data {
			data[i] = byte(i * 7)
		}
		leaves := LeafHashes(data, 2)
		if got := Root(leaves, n); got != Hash(data) {
			t.Fatalf("n=%d: root of leaves %x, hash %x", n, got, Hash(data))
		}
		for k := range leaves {
			end := min((k+1)*BlockSize, n)
			if LeafHash(data[k*BlockSize:end]) != leaves[k] {
				t.Fatalf("n=%d: leaf %d differs", n, k)
			}
		}
		if n > 0 {
			bad := append([]uint64(nil), leaves...)
			bad[0] ^= 1
			if Root(bad, n) == Hash(data) {
				t.Fatalf("n=%d: a wrong leaf gives the right root", n)
			}
			if Root(leaves, n+1) == Hash(data) {
				t.Fatalf("n=%d: a wrong length gives the right root", n)
			}
		}
	}
}
