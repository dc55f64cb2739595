package sharedstate

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/concord-ccl/concord/rings"
)

func sampleDigest() Digest {
	return Digest{Revision: 1 << 40, Entries: []EntryDigest{
		{Name: "a", DType: rings.F16, Count: 3, Hash: 0x0123456789abcdef},
		{Name: "b/rng", DType: rings.U64, Count: 0, Hash: 1, MayDiffer: true},
		{Name: "layer.0.weight", DType: rings.BF16, Count: 1 << 30, Hash: ^uint64(0)},
	}}
}

func TestDigestRoundTrip(t *testing.T) {
	for _, d := range []Digest{{}, {Revision: 5}, sampleDigest()} {
		b := EncodeDigest(d)
		got, err := DecodeDigest(b)
		if err != nil {
			t.Fatalf("%+v: %v", d, err)
		}
		if got.Revision != d.Revision || len(got.Entries) != len(d.Entries) {
			t.Fatalf("round trip %+v -> %+v", d, got)
		}
		for i := range d.Entries {
			if got.Entries[i] != d.Entries[i] {
				t.Errorf("entry %d: %+v, want %+v", i, got.Entries[i], d.Entries[i])
			}
		}
		if pre := []byte{9, 9}; !bytes.Equal(AppendDigest(pre, d)[2:], b) {
			t.Error("AppendDigest differs from EncodeDigest")
		}
	}
}

func TestDigestLayout(t *testing.T) {
	d := Digest{Revision: 300, Entries: []EntryDigest{{Name: "w", DType: rings.F32, Count: 2, Hash: 0x0807060504030201, MayDiffer: true}}}
	want := []byte{
		DigestVersion,
		0xac, 0x02, // revision 300
		0x01,      // one entry
		0x01, 'w', // name
		byte(rings.F32),
		0x02, // count
		0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
		0x01, // MayDiffer
	}
	if got := EncodeDigest(d); !bytes.Equal(got, want) {
		t.Errorf("encoding\n got %x\nwant %x", got, want)
	}
}

func TestDecodeDigestRejects(t *testing.T) {
	valid := EncodeDigest(sampleDigest())
	entry := func(name string, dt byte, flags byte) []byte {
		b := []byte{byte(len(name))}
		b = append(b, name...)
		b = append(b, dt, 1, 0, 0, 0, 0, 0, 0, 0, 0, flags)
		return b
	}
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	f32 := byte(rings.F32)
	cases := map[string][]byte{
		"empty":             nil,
		"version":           {2, 0, 0},
		"truncated":         valid[:len(valid)-1],
		"trailing":          append(append([]byte(nil), valid...), 0),
		"long varint":       {DigestVersion, 0x80, 0x00, 0x00},
		"count too large":   {DigestVersion, 0, 0xff, 0xff, 0x03},
		"empty name":        cat([]byte{DigestVersion, 0, 1}, entry("", f32, 0)),
		"bad dtype":         cat([]byte{DigestVersion, 0, 1}, entry("x", 0, 0)),
		"unknown dtype":     cat([]byte{DigestVersion, 0, 1}, entry("x", 250, 0)),
		"unknown flag":      cat([]byte{DigestVersion, 0, 1}, entry("x", f32, 2)),
		"duplicate names":   cat([]byte{DigestVersion, 0, 2}, entry("x", f32, 0), entry("x", f32, 0)),
		"unsorted names":    cat([]byte{DigestVersion, 0, 2}, entry("y", f32, 0), entry("x", f32, 0)),
		"count overflows":   {DigestVersion, 0, 1, 1, 'x', f32, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"name past the end": {DigestVersion, 0, 1, 100, 'x', f32, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	}
	for name, b := range cases {
		if d, err := DecodeDigest(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: DecodeDigest = %+v, %v; want ErrMalformed", name, d, err)
		}
	}
}

func FuzzDecodeDigest(f *testing.F) {
	f.Add(EncodeDigest(sampleDigest()))
	f.Add(EncodeDigest(Digest{}))
	f.Add([]byte{DigestVersion, 0x80, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DecodeDigest(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		// Accepted input is canonical: it encodes back to the same bytes.
		if again := EncodeDigest(d); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, again)
		}
		d2, err := DecodeDigest(EncodeDigest(d))
		if err != nil || !reflect.DeepEqual(d, d2) {
			t.Fatalf("second decode: %+v, %v", d2, err)
		}
	})
}
