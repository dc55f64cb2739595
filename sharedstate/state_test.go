package sharedstate

import (
	"errors"
	"testing"

	"github.com/concord-ccl/concord/rings"
)

func TestStateAdd(t *testing.T) {
	s := NewState()
	good := []*Entry{
		{Name: "w2", DType: rings.F32, Data: make([]byte, 40)},
		{Name: "emb", DType: rings.BF16, Data: make([]byte, 6)},
		{Name: "w1", DType: rings.F16, Data: make([]byte, 2)},
		{Name: "empty", DType: rings.I64},
		{Name: "rng", DType: rings.U8, Data: make([]byte, 3), MayDiffer: true},
	}
	for _, e := range good {
		if err := s.Add(e); err != nil {
			t.Fatalf("Add(%q): %v", e.Name, err)
		}
	}
	bad := []struct {
		e    *Entry
		want error
	}{
		{nil, ErrInvalidEntry},
		{&Entry{Name: "", DType: rings.F32}, ErrInvalidEntry},
		{&Entry{Name: string(make([]byte, MaxNameLen+1)), DType: rings.F32}, ErrInvalidEntry},
		{&Entry{Name: "x", DType: 0}, ErrInvalidEntry},
		{&Entry{Name: "x", DType: 200}, ErrInvalidEntry},
		{&Entry{Name: "x", DType: rings.F16, Data: make([]byte, 3)}, ErrInvalidEntry},
		{&Entry{Name: "x", DType: rings.F64, Data: make([]byte, 12)}, ErrInvalidEntry},
		{&Entry{Name: "w1", DType: rings.F16, Data: make([]byte, 2)}, ErrDuplicateEntry},
	}
	for i, c := range bad {
		if err := s.Add(c.e); !errors.Is(err, c.want) {
			t.Errorf("case %d: Add = %v, want %v", i, err, c.want)
		}
	}
	wantOrder := []string{"emb", "empty", "rng", "w1", "w2"}
	if len(s.Entries) != len(wantOrder) {
		t.Fatalf("%d entries, want %d", len(s.Entries), len(wantOrder))
	}
	for i, n := range wantOrder {
		if s.Entries[i].Name != n {
			t.Errorf("Entries[%d] = %q, want %q", i, s.Entries[i].Name, n)
		}
		if s.Lookup(n) != s.Entries[i] {
			t.Errorf("Lookup(%q) is not the registered entry", n)
		}
	}
	if s.Lookup("nope") != nil || s.Lookup("") != nil {
		t.Error("Lookup of an unknown name returned an entry")
	}
	counts := map[string]uint64{"emb": 3, "empty": 0, "rng": 3, "w1": 1, "w2": 10}
	for n, c := range counts {
		if got := s.Lookup(n).Count(); got != c {
			t.Errorf("%s: Count = %d, want %d", n, got, c)
		}
	}
	if !s.Remove("rng") || s.Remove("rng") || s.Lookup("rng") != nil || len(s.Entries) != 4 {
		t.Error("Remove did not remove exactly once")
	}
	// Sorted is correct even after a hand-made reorder.
	s.Entries[0], s.Entries[3] = s.Entries[3], s.Entries[0]
	sorted := s.Sorted()
	for i, n := range []string{"emb", "empty", "w1", "w2"} {
		if sorted[i].Name != n {
			t.Errorf("Sorted()[%d] = %q, want %q", i, sorted[i].Name, n)
		}
	}
}

// TestHalfPrecisionSizes checks that f16 and bf16 entries are hashed over their real size, unlike
// a registry that sizes them 0 and so never sees their content.
func TestHalfPrecisionSizes(t *testing.T) {
	for _, dt := range []rings.DType{rings.F16, rings.BF16} {
		s := NewState()
		data := []byte{1, 2, 3, 4, 5, 6}
		if err := s.Add(&Entry{Name: "w", DType: dt, Data: data}); err != nil {
			t.Fatal(err)
		}
		d1 := s.Digest(2)
		if e := d1.Entries[0]; e.Count != 3 || e.Bytes() != 6 || e.Hash != Hash(data) {
			t.Errorf("%v: digest %+v, want count 3, 6 bytes, hash %#x", dt, e, Hash(data))
		}
		data[5] ^= 0x80
		if d2 := s.Digest(2); d2.Entries[0].Hash == d1.Entries[0].Hash {
			t.Errorf("%v: changing the last element did not change the hash", dt)
		}
	}
}

func TestStateDigest(t *testing.T) {
	s := NewState()
	s.Revision = 7
	big := goldenData(2*BlockSize + 10)
	entries := []*Entry{
		{Name: "b", DType: rings.U8, Data: big},
		{Name: "a", DType: rings.I32, Data: goldenData(16), MayDiffer: true},
		{Name: "c", DType: rings.F64},
	}
	for _, e := range entries {
		if err := s.Add(e); err != nil {
			t.Fatal(err)
		}
	}
	want := Digest{Revision: 7, Entries: []EntryDigest{
		{Name: "a", DType: rings.I32, Count: 4, Hash: Hash(goldenData(16)), MayDiffer: true},
		{Name: "b", DType: rings.U8, Count: uint64(len(big)), Hash: Hash(big)},
		{Name: "c", DType: rings.F64, Count: 0, Hash: Hash(nil)},
	}}
	for _, w := range []int{0, 1, 2, 5} {
		got := s.Digest(w)
		if got.Revision != want.Revision || len(got.Entries) != len(want.Entries) {
			t.Fatalf("workers %d: %+v", w, got)
		}
		for i := range want.Entries {
			if got.Entries[i] != want.Entries[i] {
				t.Errorf("workers %d entry %d: %+v, want %+v", w, i, got.Entries[i], want.Entries[i])
			}
		}
	}
}

func TestDigestReusesHashOnlyForUnchangedVersion(t *testing.T) {
	data := []byte{1, 2, 3, 4}
	st := NewState()
	e := &Entry{Name: "w", DType: rings.F32, Data: data, Version: 1}
	if err := st.Add(e); err != nil {
		t.Fatal(err)
	}
	first := st.Digest(1).Entries[0].Hash
	data[0] = 9 // changed without bumping Version: the cached hash is (by contract) reused
	if got := st.Digest(1).Entries[0].Hash; got != first {
		t.Fatalf("hash recomputed for an unchanged Version")
	}
	e.Version = 2
	if got := st.Digest(1).Entries[0].Hash; got == first || got != Hash(data) {
		t.Fatalf("hash not recomputed after Version changed")
	}
	e.Version = 0 // zero always re-hashes
	data[1] = 7
	if got := st.Digest(1).Entries[0].Hash; got != Hash(data) {
		t.Fatalf("Version 0 must always re-hash")
	}
}
