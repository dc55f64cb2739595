package tcp

import (
	"bytes"
	"errors"
	"testing"

	"github.com/concord-ccl/concord/rdma"
)

func TestFramesRoundTrip(t *testing.T) {
	h := hello{Version: version, From: 7, To: 9, FromNIC: 3, ToNIC: 1, Class: rdma.ProbeClass, Index: 42, Lane: 1}
	var b []byte
	b = appendHello(b, h)
	b = appendPrefix(b, kindHelloAck, 0)
	b = appendChunkHead(b, 5, 1<<40, 3)
	b = append(b, "abc"...)
	b = appendAck(b, 5, 1<<40)
	b = appendID(b, kindProbe, 11)
	b = appendID(b, kindProbeReply, 12)
	b = appendChunkHead(b, 6, 0, 0)
	want := []frame{
		{Kind: kindHello, Hello: h},
		{Kind: kindHelloAck},
		{Kind: kindChunk, Tag: 5, Seq: 1 << 40, Data: []byte("abc")},
		{Kind: kindAck, Tag: 5, Seq: 1 << 40},
		{Kind: kindProbe, ID: 11},
		{Kind: kindProbeReply, ID: 12},
		{Kind: kindChunk, Tag: 6, Seq: 0, Data: []byte{}},
	}
	for i, w := range want {
		f, n, err := decodeFrame(b, 16)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if f.Kind != w.Kind || f.Hello != w.Hello || f.Tag != w.Tag || f.Seq != w.Seq || f.ID != w.ID ||
			!bytes.Equal(f.Data, w.Data) {
			t.Errorf("frame %d = %+v, want %+v", i, f, w)
		}
		b = b[n:]
	}
	if len(b) != 0 {
		t.Errorf("%d bytes left over", len(b))
	}
}

func TestDecodeRejectsMalformedFrames(t *testing.T) {
	chunk := append(appendChunkHead(nil, 1, 2, 4), "data"...)
	cases := map[string][]byte{
		"empty":           nil,
		"short prefix":    {0, 0, 0},
		"unknown kind":    {0, 0, 0, 1, 99},
		"ack too long":    append(appendPrefix(nil, kindAck, ackLen+1), make([]byte, ackLen+1)...),
		"ack too short":   append(appendPrefix(nil, kindAck, ackLen-1), make([]byte, ackLen-1)...),
		"zero length":     {0, 0, 0, 0, kindHelloAck},
		"truncated chunk": chunk[:len(chunk)-1],
		"chunk too big":   append(appendChunkHead(nil, 1, 2, 5), "data!"...),
	}
	for name, b := range cases {
		if _, _, err := decodeFrame(b, 4); !errors.Is(err, errFrame) {
			t.Errorf("%s: err %v, want errFrame", name, err)
		}
	}
}

func FuzzDecodeFrame(f *testing.F) {
	f.Add(appendHello(nil, hello{Version: version, From: 1, To: 2, Lane: 1}))
	f.Add(append(appendChunkHead(nil, 1, 2, 3), "abc"...))
	f.Add(appendAck(nil, 1, 2))
	f.Add(appendID(nil, kindProbe, 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, n, err := decodeFrame(b, 1<<10)
		if err != nil {
			return
		}
		if n < prefixLen || n > len(b) {
			t.Fatalf("decoded %d bytes of %d", n, len(b))
		}
		var again []byte
		switch fr.Kind {
		case kindHello:
			again = appendHello(nil, fr.Hello)
		case kindHelloAck:
			again = appendPrefix(nil, kindHelloAck, 0)
		case kindChunk:
			again = append(appendChunkHead(nil, fr.Tag, fr.Seq, len(fr.Data)), fr.Data...)
		case kindAck:
			again = appendAck(nil, fr.Tag, fr.Seq)
		case kindProbe, kindProbeReply:
			again = appendID(nil, fr.Kind, fr.ID)
		default:
			t.Fatalf("decoded unknown kind %d", fr.Kind)
		}
		if !bytes.Equal(again, b[:n]) {
			t.Fatalf("re-encoded %x, decoded from %x", again, b[:n])
		}
	})
}
