package rings

import (
	"errors"
	"testing"
)

func TestDTypeNamesRoundTrip(t *testing.T) {
	sizes := map[DType]int{F16: 2, BF16: 2, F32: 4, F64: 8, I8: 1, I16: 2, I32: 4, I64: 8, U8: 1, U16: 2, U32: 4, U64: 8}
	for d := F16; d <= U64; d++ {
		if !d.Valid() {
			t.Fatalf("%d not valid", d)
		}
		if d.Size() != sizes[d] {
			t.Errorf("%v.Size() = %d, want %d", d, d.Size(), sizes[d])
		}
		got, err := ParseDType(d.String())
		if err != nil || got != d {
			t.Errorf("ParseDType(%q) = %v, %v", d.String(), got, err)
		}
	}
	for _, d := range []DType{0, U64 + 1, 255} {
		if d.Valid() || d.Size() != 0 {
			t.Errorf("dtype %d: Valid %v Size %d", d, d.Valid(), d.Size())
		}
	}
	if _, err := ParseDType("f128"); !errors.Is(err, ErrInvalid) {
		t.Errorf("ParseDType(f128) error %v", err)
	}
	if F16.String() != "f16" || BF16.String() != "bf16" || U64.String() != "u64" {
		t.Errorf("unexpected names %v %v %v", F16, BF16, U64)
	}
}

func TestOpNamesRoundTrip(t *testing.T) {
	want := []string{"sum", "avg", "prod", "min", "max"}
	for i, name := range want {
		o := Op(i + 1)
		if !o.Valid() || o.String() != name {
			t.Errorf("op %d: Valid %v String %q", o, o.Valid(), o.String())
		}
		got, err := ParseOp(name)
		if err != nil || got != o {
			t.Errorf("ParseOp(%q) = %v, %v", name, got, err)
		}
	}
	if Op(0).Valid() || Op(6).Valid() {
		t.Error("out-of-range ops are valid")
	}
	if _, err := ParseOp("xor"); !errors.Is(err, ErrInvalid) {
		t.Errorf("ParseOp(xor) error %v", err)
	}
}

func TestBytesAndViewAlias(t *testing.T) {
	f := []float32{1, 2, 3}
	b := Bytes(f)
	if len(b) != 12 {
		t.Fatalf("len %d", len(b))
	}
	v := View[float32](b)
	v[1] = 7
	if f[1] != 7 {
		t.Fatal("View does not alias Bytes")
	}
	if b[4] != 0 || b[7] != 0x40 || b[6] != 0xe0 { // 7.0 = 0x40e00000 little-endian
		t.Fatalf("unexpected layout % x", b[4:8])
	}
	if Bytes([]int64(nil)) != nil || View[int64](nil) != nil {
		t.Error("empty slices are not nil")
	}
	defer func() {
		if recover() == nil {
			t.Error("View of a partial element did not panic")
		}
	}()
	View[uint32](make([]byte, 6))
}

func TestBufferPool(t *testing.T) {
	var p BufferPool
	if p.Get(0) != nil {
		t.Error("Get(0) is not nil")
	}
	for _, n := range []int{1, 2, 3, 1000, 1024, 1025} {
		b := p.Get(n)
		if len(b) != n || cap(b) < n || cap(b)&(cap(b)-1) != 0 {
			t.Fatalf("Get(%d): len %d cap %d", n, len(b), cap(b))
		}
		p.Put(b)
	}
	p.Put(make([]byte, 3)) // not a power of two: dropped
	p.Put(nil)

	// A returned buffer is handed out again.
	b := p.Get(100)
	b[0] = 42
	p.Put(b)
	if c := p.Get(120); &c[0] != &b[0] {
		t.Error("buffer not reused")
	}
	// Nothing is kept beyond MaxIdleBytes.
	small := BufferPool{MaxIdleBytes: 64}
	x, y := small.Get(64), small.Get(64)
	small.Put(x)
	small.Put(y)
	if z := small.Get(64); &z[0] != &x[0] {
		t.Error("first buffer not kept")
	}
	if z := small.Get(64); &z[0] == &y[0] {
		t.Error("buffer kept beyond MaxIdleBytes")
	}
	none := BufferPool{MaxIdleBytes: -1}
	none.Put(none.Get(8))
	if none.bytes != 0 {
		t.Error("pool with negative MaxIdleBytes kept a buffer")
	}
}

// TestBufferPoolKeepsWorkingSet: by default a pool keeps as much as its callers held at once, even
// beyond DefaultMaxIdleBytes, so that a loop that holds two buffers of 1 GiB at every step (the
// backups of two peers in one process, say) gets both back instead of allocating one anew. The
// buffers are never touched, so they cost address space only.
func TestBufferPoolKeepsWorkingSet(t *testing.T) {
	var p BufferPool
	n := DefaultMaxIdleBytes/2 + 1 // a 1 GiB class
	for step := range 3 {
		x, y := p.Get(n), p.Get(n)
		p.Put(x)
		p.Put(y)
		if p.bytes != 2*DefaultMaxIdleBytes {
			t.Fatalf("step %d: %d bytes idle after putting back two 1 GiB buffers, want both kept", step, p.bytes)
		}
		if a, b := p.Get(n), p.Get(n); &a[0] != &y[0] && &a[0] != &x[0] || &b[0] != &y[0] && &b[0] != &x[0] {
			t.Fatalf("step %d: a buffer was allocated anew", step)
		} else {
			p.Put(a)
			p.Put(b)
		}
	}
	// An explicit bound still holds.
	q := BufferPool{MaxIdleBytes: 64}
	x, y := q.Get(64), q.Get(64)
	q.Put(x)
	q.Put(y)
	if q.bytes != 64 {
		t.Fatalf("%d bytes idle with MaxIdleBytes 64", q.bytes)
	}
}
