package rdma_test

import (
	"errors"
	"testing"

	"github.com/concord-ccl/concord/rdma"
)

func TestMessageRoundTrip(t *testing.T) {
	msgs := []rdma.Message{
		{Kind: rdma.MsgNotice, Path: rdma.PathID{Src: 1, Dst: 2, Channel: 3}, Epoch: 4, Local: 3, Remote: 3, ID: 9},
		{Kind: rdma.MsgFailReq, Path: rdma.PathID{Src: 7, Dst: 8}, Epoch: 1, Local: 1, Remote: 1, Seq: 1 << 40, ID: 2},
		{Kind: rdma.MsgFailAck, Path: rdma.PathID{Src: 7, Dst: 8}, Epoch: 1, Seq: 5},
		{Kind: rdma.MsgProbeAsk, ID: 3, A: rdma.NICRef{Node: 1, NIC: 2}, B: rdma.NICRef{Node: 4, NIC: 2}},
		{Kind: rdma.MsgProbeReport, ID: 3, OKA: true},
		{Kind: rdma.MsgProbeConn, ID: 4, A: rdma.NICRef{Node: 1, NIC: 1}, B: rdma.NICRef{Node: 2, NIC: 1}},
		{Kind: rdma.MsgVerdict, Origin: 5, ID: 6, Fault: rdma.FaultLink, A: rdma.NICRef{Node: 1}, B: rdma.NICRef{Node: 2}, Health: rdma.Down},
	}
	for _, m := range msgs {
		b := rdma.AppendMessage(nil, m)
		if len(b) != rdma.MessageSize {
			t.Fatalf("%v: %d bytes", m, len(b))
		}
		got, err := rdma.DecodeMessage(b)
		if err != nil || got != m {
			t.Fatalf("%v: decoded %v, %v", m, got, err)
		}
	}
	bad := rdma.AppendMessage(nil, msgs[0])
	for _, b := range [][]byte{nil, bad[:10], append([]byte{9}, bad[1:]...), append([]byte{1, 0}, bad[2:]...)} {
		if _, err := rdma.DecodeMessage(b); !errors.Is(err, rdma.ErrBadMessage) {
			t.Errorf("decoding %x: %v, want ErrBadMessage", b, err)
		}
	}
}

func FuzzDecodeMessage(f *testing.F) {
	f.Add(rdma.AppendMessage(nil, rdma.Message{Kind: rdma.MsgFailReq, Epoch: 2, Seq: 3}))
	f.Add(rdma.AppendMessage(nil, rdma.Message{Kind: rdma.MsgVerdict, Fault: rdma.FaultNIC, Health: rdma.Down}))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := rdma.DecodeMessage(b)
		if err != nil {
			if !errors.Is(err, rdma.ErrBadMessage) {
				t.Fatalf("error %v does not wrap ErrBadMessage", err)
			}
			return
		}
		// Whatever decodes re-encodes to the same bytes.
		if again := rdma.AppendMessage(nil, m); string(again) != string(b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", b, again)
		}
	})
}
