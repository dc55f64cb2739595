package diloco

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// rawIDX encodes x or fails the test.
func rawIDX(t testing.TB, x *IDX) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteIDX(&buf, x); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// gz compresses b.
func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sameIDX(a, b *IDX) bool {
	return a.Type == b.Type && slices.Equal(a.Dims, b.Dims) && bytes.Equal(a.Data, b.Data)
}

func TestReadIDXValid(t *testing.T) {
	want := &IDX{Type: IDXUint8, Dims: []int{2, 3}, Data: []byte{1, 2, 3, 4, 5, 6}}
	raw := rawIDX(t, want)
	if !bytes.Equal(raw[:12], []byte{0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3}) {
		t.Fatalf("header % x", raw[:12])
	}
	for name, in := range map[string][]byte{"raw": raw, "gzip": gz(t, raw)} {
		got, err := ReadIDX(bytes.NewReader(in))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !sameIDX(got, want) {
			t.Fatalf("%s: got %+v, want %+v", name, got, want)
		}
	}
	// A multi-byte type keeps its big-endian bytes.
	i32 := &IDX{Type: IDXInt32, Dims: []int{2}, Data: []byte{0, 0, 1, 0, 0xff, 0xff, 0xff, 0xff}}
	got, err := ReadIDX(bytes.NewReader(rawIDX(t, i32)))
	if err != nil || !sameIDX(got, i32) {
		t.Fatalf("int32: %+v, %v", got, err)
	}
	// A zero-length dimension is a valid empty array.
	empty := &IDX{Type: IDXFloat64, Dims: []int{0, 5}, Data: []byte{}}
	got, err = ReadIDX(bytes.NewReader(rawIDX(t, empty)))
	if err != nil || !sameIDX(got, empty) {
		t.Fatalf("empty: %+v, %v", got, err)
	}
}

func TestReadIDXMalformed(t *testing.T) {
	valid := rawIDX(t, &IDX{Type: IDXUint8, Dims: []int{2, 3}, Data: []byte{1, 2, 3, 4, 5, 6}})
	gzValid := gz(t, valid)
	cases := map[string][]byte{
		"empty":              {},
		"short magic":        {0, 0, 8},
		"wrong magic":        append([]byte{1, 2}, valid[2:]...),
		"unknown type":       append([]byte{0, 0, 7}, valid[3:]...),
		"zero dims":          {0, 0, 8, 0},
		"truncated dims":     valid[:10],
		"truncated data":     valid[:len(valid)-1],
		"no data":            valid[:12],
		"trailing bytes":     append(slices.Clone(valid), 9),
		"huge size":          {0, 0, 0x0E, 2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		"gzip truncated":     gzValid[:len(gzValid)-6],
		"gzip bad checksum":  append(slices.Clone(gzValid[:len(gzValid)-8]), 0, 0, 0, 0, 6, 0, 0, 0),
		"gzip bad header":    {0x1f, 0x8b, 0, 0, 0, 0},
		"gzip of truncation": gz(t, valid[:len(valid)-2]),
		"gzip corrupt body":  append(slices.Clone(gzValid[:10]), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff),
	}
	for name, in := range cases {
		_, err := ReadIDX(bytes.NewReader(in))
		if !errors.Is(err, ErrMalformedIDX) {
			t.Errorf("%s: got %v, want ErrMalformedIDX", name, err)
		}
	}
}

func TestReadIDXFile(t *testing.T) {
	dir := t.TempDir()
	want := &IDX{Type: IDXUint8, Dims: []int{4}, Data: []byte{9, 8, 7, 6}}
	path := filepath.Join(dir, "x.idx")
	if err := os.WriteFile(path, rawIDX(t, want), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ReadIDXFile(path)
	if err != nil || !sameIDX(got, want) {
		t.Fatalf("got %+v, %v", got, err)
	}
	if _, err := ReadIDXFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if err := os.WriteFile(path, []byte{1, 2, 3, 4}, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadIDXFile(path); !errors.Is(err, ErrMalformedIDX) {
		t.Fatalf("bad file: %v", err)
	}
}

func TestWriteIDXRejects(t *testing.T) {
	for name, x := range map[string]*IDX{
		"unknown type": {Type: 1, Dims: []int{1}, Data: []byte{0}},
		"no dims":      {Type: IDXUint8},
		"negative dim": {Type: IDXUint8, Dims: []int{-1}},
		"size":         {Type: IDXInt16, Dims: []int{2}, Data: []byte{1, 2, 3}},
	} {
		if err := WriteIDX(&bytes.Buffer{}, x); !errors.Is(err, ErrMalformedIDX) {
			t.Errorf("%s: got %v", name, err)
		}
	}
}

// FuzzReadIDX checks that any input either fails with ErrMalformedIDX or
// decodes to an array that encodes back to the same bytes.
func FuzzReadIDX(f *testing.F) {
	valid := rawIDX(f, &IDX{Type: IDXUint8, Dims: []int{2, 3}, Data: []byte{1, 2, 3, 4, 5, 6}})
	f.Add(valid)
	f.Add(gz(f, valid))
	f.Add(rawIDX(f, &IDX{Type: IDXFloat32, Dims: []int{1, 1, 1}, Data: []byte{0x3f, 0x80, 0, 0}}))
	f.Add([]byte{0, 0, 8, 1, 0, 0, 0, 0})
	f.Add([]byte{0, 0, 0x0E, 2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		x, err := ReadIDX(bytes.NewReader(in))
		if err != nil {
			if !errors.Is(err, ErrMalformedIDX) {
				t.Fatalf("error %v does not wrap ErrMalformedIDX", err)
			}
			return
		}
		size := idxElemSize(x.Type)
		for _, d := range x.Dims {
			size *= d
		}
		if size != len(x.Data) {
			t.Fatalf("dims %v type %#x with %d bytes", x.Dims, x.Type, len(x.Data))
		}
		again, err := ReadIDX(bytes.NewReader(rawIDX(t, x)))
		if err != nil || !sameIDX(again, x) {
			t.Fatalf("round trip: %+v, %v", again, err)
		}
	})
}
