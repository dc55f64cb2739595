package transport

import (
	"bytes"
	"errors"
	"testing"
)

func TestPreambleRoundTrip(t *testing.T) {
	p := preamble{index: 0xdeadbeef}
	for i := range p.id {
		p.id[i] = byte(i * 7)
	}
	b := appendPreamble(nil, p)
	if len(b) != preambleSize {
		t.Fatalf("encoded preamble has %d bytes, want %d", len(b), preambleSize)
	}
	got, err := parsePreamble(b)
	if err != nil || got != p {
		t.Fatalf("parsePreamble = %+v, %v; want %+v", got, err, p)
	}
}

func TestParsePreambleErrors(t *testing.T) {
	good := appendPreamble(nil, preamble{id: sessionID{1}, index: 2})
	with := func(i int, v byte) []byte {
		b := bytes.Clone(good)
		b[i] = v
		return b
	}
	for name, b := range map[string][]byte{
		"empty":       nil,
		"short":       good[:preambleSize-1],
		"long":        append(bytes.Clone(good), 0),
		"magic":       with(0, 'X'),
		"version":     with(4, preambleVersion+1),
		"body length": with(5, preambleBody-1),
	} {
		if _, err := parsePreamble(b); !errors.Is(err, errBadPreamble) {
			t.Errorf("%s: parsePreamble = %v, want errBadPreamble", name, err)
		}
	}
}

func TestFrameRoundTrip(t *testing.T) {
	for _, f := range []frame{
		{typ: frameAccept}, {typ: frameRefuse}, {typ: frameOpen, index: 7}, {typ: frameOpenFailed, index: 1 << 31},
	} {
		b := appendFrame(nil, f)
		got, n, err := parseFrame(append(b, 0xff)) // a following byte is left alone
		if err != nil || got != f || n != len(b) {
			t.Errorf("parseFrame(%x) = %+v, %d, %v; want %+v, %d", b, got, n, err, f, len(b))
		}
		if got, err := readFrame(bytes.NewReader(b)); err != nil || got != f {
			t.Errorf("readFrame(%x) = %+v, %v; want %+v", b, got, err, f)
		}
	}
}

func TestParseFrameErrors(t *testing.T) {
	for name, b := range map[string][]byte{
		"empty":           nil,
		"half header":     {frameAccept},
		"unknown type":    {9, 0},
		"accept payload":  {frameAccept, 1, 0},
		"short open":      {frameOpen, 2, 0, 0},
		"truncated open":  {frameOpen, 4, 0, 0},
		"zero type":       {0, 0},
		"open no payload": {frameOpenFailed, 0},
	} {
		if _, _, err := parseFrame(b); !errors.Is(err, errBadFrame) {
			t.Errorf("%s: parseFrame = %v, want errBadFrame", name, err)
		}
	}
}

// FuzzParsePreamble checks that parsePreamble never panics, accepts exactly the encodings
// appendPreamble produces, and round-trips them.
func FuzzParsePreamble(f *testing.F) {
	f.Add(appendPreamble(nil, preamble{id: sessionID{1, 2, 3}, index: 4}))
	f.Add([]byte("CNSS\x01\x14"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parsePreamble(b)
		if err != nil {
			if !errors.Is(err, errBadPreamble) {
				t.Fatalf("error %v does not wrap errBadPreamble", err)
			}
			return
		}
		if again := appendPreamble(nil, p); !bytes.Equal(again, b) {
			t.Fatalf("parsePreamble(%x) = %+v, which encodes as %x", b, p, again)
		}
	})
}

// FuzzParseFrame checks that parseFrame never panics, takes no more bytes than it is given, and
// round-trips what it accepts; and that readFrame agrees with it.
func FuzzParseFrame(f *testing.F) {
	f.Add(appendFrame(nil, frame{typ: frameOpen, index: 3}))
	f.Add([]byte{frameAccept, 0})
	f.Add([]byte{frameOpen, 4, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, n, err := parseFrame(b)
		rfr, rerr := readFrame(bytes.NewReader(b))
		if err != nil {
			if !errors.Is(err, errBadFrame) {
				t.Fatalf("error %v does not wrap errBadFrame", err)
			}
			if rerr == nil {
				t.Fatalf("readFrame(%x) = %+v, but parseFrame failed: %v", b, rfr, err)
			}
			return
		}
		if n > len(b) || n > maxFrameSize {
			t.Fatalf("parseFrame took %d of %d bytes", n, len(b))
		}
		if again := appendFrame(nil, fr); !bytes.Equal(again, b[:n]) {
			t.Fatalf("parseFrame(%x) = %+v, which encodes as %x", b[:n], fr, again)
		}
		if rerr != nil || rfr != fr {
			t.Fatalf("readFrame(%x) = %+v, %v; parseFrame gave %+v", b, rfr, rerr, fr)
		}
	})
}
