package sharedstate

import (
	"encoding/binary"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"
)

// BlockSize is the size in bytes of the leaves of the hash tree. It is part of the hash format:
// changing it changes every hash.
const BlockSize = 1 << 20

// Seeds that separate the three kinds of xxh3 calls of the format: leaves use seed 0, inner nodes
// NodeSeed and the root RootSeed, so a node can never be mistaken for a leaf of 16 bytes.
const (
	// NodeSeed is the xxh3 seed of an inner node of the hash tree.
	NodeSeed uint64 = 0x436f6e636f72644e // "ConcordN"
	// RootSeed is the xxh3 seed of the root, which also covers the data length.
	RootSeed uint64 = 0x436f6e636f726452 // "ConcordR"
)

// Hash returns the content hash of data in Concord's format, computed on the calling goroutine.
func Hash(data []byte) uint64 {
	return HashParallel(data, 1)
}

// HashParallel returns the same value as Hash, hashing the blocks of data on up to workers goroutines
// (the caller's included). workers < 1 means runtime.GOMAXPROCS(0). It may be called concurrently;
// data must not change while it runs.
func HashParallel(data []byte, workers int) uint64 {
	leaves := make([]uint64, leafCount(len(data)))
	hashLeaves([][]byte{data}, [][]uint64{leaves}, workers)
	return combine(leaves, len(data))
}

// HashAll returns the hash of each element of datas, as HashParallel would, but shares the workers over
// all blocks of all elements, so that many small tensors are hashed in parallel too.
func HashAll(datas [][]byte, workers int) []uint64 {
	roots, _ := hashAllLeaves(datas, workers)
	return roots
}

// LeafHashes returns the hashes of the BlockSize blocks of data (the leaves of its hash tree).
func LeafHashes(data []byte, workers int) []uint64 {
	leaves := make([]uint64, leafCount(len(data)))
	hashLeaves([][]byte{data}, [][]uint64{leaves}, workers)
	return leaves
}

// LeafHash returns the hash of one block as a leaf of the tree.
func LeafHash(block []byte) uint64 { return xxh3.Hash(block) }

// Root returns the hash of an n-byte input whose leaves are leaves (it does not modify them). A
// receiver that knows the elected hash checks a donor's leaves with it, then each block with its leaf.
func Root(leaves []uint64, n int) uint64 {
	if len(leaves) != leafCount(n) {
		return ^Hash(nil)
	}
	return combine(append([]uint64(nil), leaves...), n)
}

// hashAllLeaves returns the root and the leaves of every element of datas.
func hashAllLeaves(datas [][]byte, workers int) ([]uint64, [][]uint64) {
	leaves := make([][]uint64, len(datas))
	total := 0
	for _, d := range datas {
		total += leafCount(len(d))
	}
	flat := make([]uint64, total)
	for i, d := range datas {
		n := leafCount(len(d))
		leaves[i], flat = flat[:n:n], flat[n:]
	}
	hashLeaves(datas, leaves, workers)
	out := make([]uint64, len(datas))
	for i, d := range datas {
		out[i] = Root(leaves[i], len(d))
	}
	return out, leaves
}

// leafCount returns the number of blocks of an n-byte input.
func leafCount(n int) int { return (n + BlockSize - 1) / BlockSize }

// hashLeaves fills leaves[i][k] with the xxh3 hash of block k of datas[i]. Blocks are handed out one at
// a time through an atomic counter; which goroutine hashes a block does not change its value.
func hashLeaves(datas [][]byte, leaves [][]uint64, workers int) {
	// starts[i] is the global index of the first block of datas[i].
	starts := make([]int, len(datas)+1)
	for i := range datas {
		starts[i+1] = starts[i] + len(leaves[i])
	}
	total := starts[len(datas)]
	if workers < 1 {
		workers = runtime.GOMAXPROCS(0)
	}
	workers = min(workers, total)
	block := func(j int) {
		i := sort.SearchInts(starts, j+1) - 1
		k := j - starts[i]
		d := datas[i][k*BlockSize:]
		if len(d) > BlockSize {
			d = d[:BlockSize]
		}
		leaves[i][k] = xxh3.Hash(d)
	}
	if workers <= 1 {
		for j := range total {
			block(j)
		}
		return
	}
	var next atomic.Int64
	run := func() {
		for {
			j := int(next.Add(1) - 1)
			if j >= total {
				return
			}
			block(j)
		}
	}
	var wg sync.WaitGroup
	for range workers - 1 {
		wg.Go(run)
	}
	run()
	wg.Wait()
}

// combine folds leaves into the root hash of an input of length n. It overwrites leaves.
func combine(leaves []uint64, n int) uint64 {
	var buf [16]byte
	for m := len(leaves); m > 1; {
		w := 0
		for r := 0; r+1 < m; r += 2 {
			binary.LittleEndian.PutUint64(buf[0:8], leaves[r])
			binary.LittleEndian.PutUint64(buf[8:16], leaves[r+1])
			leaves[w] = xxh3.HashSeed(buf[:], NodeSeed)
			w++
		}
		if m%2 == 1 {
			leaves[w] = leaves[m-1]
			w++
		}
		m = w
	}
	var top uint64
	if len(leaves) > 0 {
		top = leaves[0]
	}
	binary.LittleEndian.PutUint64(buf[0:8], top)
	binary.LittleEndian.PutUint64(buf[8:16], uint64(n))
	return xxh3.HashSeed(buf[:], RootSeed)
}
