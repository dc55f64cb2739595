package wire

import (
	"bytes"
	"errors"
	"net"
	"reflect"
	"testing"
)

func sampleMessages() []Message {
	return []Message{
		&Hello{Token: "run-1", Addr: "127.0.0.1:4000", Site: "eu", Caps: 7, NICs: []string{"eth0", "10.1.0.2"}},
		&Hello{Token: "run-1", Addr: "127.0.0.1:4001", Peer: 1 << 40, Group: 3},
		&Hello{Token: "run-1", Addr: "127.0.0.1:4002", Peer: 9, Resume: &Resume{Incarnation: 5, Epoch: 5<<32 | 3,
			Ring: []uint64{9, 4, 7}, Revision: 12, Digest: []byte{1, 2, 3}, Step: 40, HasStep: true, InOptimizer: true}},
		&VoteTopology{Rewire: true},
		&VoteTopology{Rewire: true, NoAdmit: true},
		&VoteTopology{NoAdmit: true},
		&LinksReady{Epoch: 3, OK: false, Failed: []uint64{4, 9}, Detail: "dial refused"},
		&LinksReady{Epoch: 3, OK: true},
		&VotePending{},
		&VotePending{Leave: true},
		&Initiate{Tag: 12, Desc: Desc{Count: 1 << 40, DType: 3, Op: 2, Quant: 1}},
		&Initiate{Tag: 13, Desc: Desc{Count: 8, DType: 10, Op: 0}, Stats: &Contribution{Finite: true, Norm: 2.5}},
		&Done{Tag: 12, Seq: 99, Code: CodePeerLeft, Detail: "peer 3: eof", LinkBytes: 1 << 20, LinkNanos: 5e6},
		&Done{Tag: 12, Seq: 98, Code: CodePeerLeft, Detail: "silent", Silent: LinkRef{Peer: 3, Dir: LinkIn}},
		&Done{Tag: 12, Seq: 97, SiteNICBytes: []uint64{1 << 20, 0, 3 << 19, 1 << 20}, SiteNanos: 4e6},
		&Done{Tag: 12, Seq: 100, LinkBytes: 1 << 20, LinkNanos: 5e6, Links: []LinkTiming{
			{Peer: 4, Dir: LinkOut, Bytes: 1 << 20, Start: 1e5, End: 9e6, Wait: 2e6},
			{Peer: 2, Dir: LinkIn, Bytes: 1 << 20, Start: 2e5, End: 9.5e6, Wait: 1e6, Transit: 4e6},
		}},
		&Heartbeat{Seq: 5},
		&Bye{},
		&Welcome{Peer: 17, HeartbeatInterval: 250e6, HeartbeatTimeout: 1500e6, Incarnation: 0x9e3779b9},
		&Connect{Epoch: 4, Ring: []PeerInfo{{ID: 1, Addr: "a:1", Site: "x", NICs: []string{"10.0.0.1:7000", "10.1.0.1:7000"}}, {ID: 2, Addr: "b:2"}}},
		&Topology{Epoch: 4, Changed: true, Ring: []uint64{2, 1}, Run: RunSize{Peers: 5, Groups: 2, Largest: 3}},
		&Pending{Answer: true},
		&Commence{Tag: 1, Seq: 2, Epoch: 3, Alone: true},
		&Outcome{Tag: 1, Seq: 2, Code: CodeMismatch, Detail: "count"},
		&Kick{Reason: "illegal message"},
		&Kick{Reason: "run token mismatch", Final: true},
		&Notice{Text: "peer 3 could not dial your advertised address 10.0.0.9:7000"},
		&SessionStart{ID: SessionID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}},
		&SessionResume{Token: "t", Peer: 7, ID: SessionID{9, 9}, Recv: 42},
		&SessionResumed{OK: true, Recv: 17, Next: 9},
		&SessionResumed{Detail: "no such session"},
		&SessionAck{Recv: 1 << 33},
		&Rendezvous{Mode: RendezvousRelay, Key: RendezvousKey{7, 7}, Peer: 12},
		&RendezvousCall{Mode: RendezvousPunch, Key: RendezvousKey{1}, Peer: 3, Addr: "10.0.0.3:7000", Public: "198.18.0.9:7000"},
		&CallHello{Token: "t", Key: RendezvousKey{9}},
		&Hello{Token: "run-1", Addr: "203.0.113.4:7000", Published: true},
		&Welcome{Peer: 3, Incarnation: 2, Public: "198.18.0.9:51234", Inbound: true},
		&Connect{Epoch: 9, Ring: []PeerInfo{{ID: 1, Addr: "10.1.0.2:7000", Public: "198.18.0.4:7000"}, {ID: 2, Addr: "198.18.0.5:7000", Inbound: true}}},
		&HeartbeatAck{Seq: 5},
		&LinkHello{Token: "t", From: 1, To: 2, Index: 3},
		&LinkAck{OK: false, Reason: "wrong token"},
		&VoteSync{Strategy: 2, Digest: []byte{1, 2, 3}},
		&StepReport{Step: 77, InOptimizer: true},
		&SyncDone{OK: false, Detail: "donor died"},
		&SyncPlan{Revision: 4, Code: CodeOK, Fetch: []FetchItem{{Name: "w", Hash: 9, Bytes: 1024, Donors: []PeerInfo{{ID: 2, Addr: "x:1"}}}}},
		&SyncComplete{Revision: 4, Code: CodeRejected, Detail: "send-only lost", ResumeStep: 12},
		&StateRequest{Token: "t", Name: "w", Hash: 9, Off: 512, Len: 512, Compress: true},
		&StateRequest{Token: "t", Name: "w", Hash: 9, Leaves: true},
		&StateResponse{OK: true, Len: 512, Compressed: true},
		&VoteOptimize{},
		&MeasureReport{Round: 2, To: 5, BytesPerSec: 1.25e9, LatencyNanos: 3e7},
		&MeasureRound{Round: 2, Target: PeerInfo{ID: 5, Addr: "h:1", Site: "eu", NICs: []string{"10.0.0.5:7000"}}, Nanos: 2e8, Streams: 4},
		&BenchHello{Token: "t", Nanos: 2e8},
		&BenchResult{Bytes: 1 << 30, Nanos: 2e8, Start: 1.7e18},
	}
}

func TestRoundTrip(t *testing.T) {
	var stream []byte
	for _, m := range sampleMessages() {
		stream = AppendFrame(stream, m)
	}
	r := bytes.NewReader(stream)
	var buf []byte
	for _, want := range sampleMessages() {
		got, b, err := ReadFrame(r, 0, buf)
		buf = b
		if err != nil {
			t.Fatalf("%T: %v", want, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip: got %#v, want %#v", got, want)
		}
	}
	if r.Len() != 0 {
		t.Fatalf("%d bytes left", r.Len())
	}
}

func TestDecodeRejects(t *testing.T) {
	cases := []struct {
		name string
		t    Type
		p    []byte
	}{
		{"unknown type", 250, nil},
		{"short", TypeCommence, []byte{1, 2, 3}},
		{"trailing", TypeBye, []byte{0}},
		{"bad bool", TypePending, []byte{2}},
		{"unknown topology flag", TypeVoteTopology, []byte{4}},
		{"huge count", TypeTopology, append(make([]byte, 9), 0xff, 0xff, 0xff, 0xff)},
		{"bad code", TypeOutcome, append(make([]byte, 16), 99, 0, 0, 0, 0)},
		{"huge string", TypeKick, []byte{0xff, 0xff, 0xff, 0xff}},
		{"hello without peer and group", TypeHello, make([]byte, 20)},
		{"welcome without incarnation", TypeWelcome, make([]byte, 24)},
		{"done without link timings", TypeDone, make([]byte, 8+8+1+4+8+8)},
		{"done with too many link timings", TypeDone, doneWithTimings(MaxLinkTimings+1, LinkTiming{Peer: 1, Bytes: 1})},
		{"link timing of unknown direction", TypeDone, doneWithTimings(1, LinkTiming{Peer: 1, Dir: 2})},
		{"link timing ending before it starts", TypeDone, doneWithTimings(1, LinkTiming{Peer: 1, Start: 5, End: 4})},
		{"transit time on a link out", TypeDone, doneWithTimings(1, LinkTiming{Peer: 1, Dir: LinkOut, Bytes: 1, End: 2, Transit: 1})},
		{"done without its silent link", TypeDone, doneWithTimings(0, LinkTiming{})[:8+8+1+4+8+8+4]},
		{"silent link of unknown direction", TypeDone, (&Done{Tag: 1, Silent: LinkRef{Peer: 2, Dir: 2}}).Append(nil)},
		{"silent link direction without a peer", TypeDone, (&Done{Tag: 1, Silent: LinkRef{Dir: LinkIn}}).Append(nil)},
		{"done with too many site NICs", TypeDone, (&Done{Tag: 1, SiteNICBytes: make([]uint64, MaxSiteNICs+1)}).Append(nil)},
		{"done without its site nanos", TypeDone, func() []byte { b := (&Done{Tag: 1, SiteNICBytes: []uint64{1}}).Append(nil); return b[:len(b)-8] }()},
		{"hello with too many NICs", TypeHello, (&Hello{Token: "t", Addr: "a:1", NICs: make([]string, MaxNICs+1)}).Append(nil)},
		{"short session id", TypeSessionStart, make([]byte, SessionIDSize-1)},
		{"kick without final", TypeKick, appendString(nil, "gone")},
		{"unknown rendezvous mode", TypeRendezvous, append(make([]byte, 1+16), make([]byte, 8)...)},
	}
	for _, c := range cases {
		if _, err := Decode(c.t, c.p); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", c.name, err)
		}
	}
}

// doneWithTimings encodes a Done carrying n copies of l, bypassing the encoder's own checks.
func doneWithTimings(n int, l LinkTiming) []byte {
	ls := make([]LinkTiming, n)
	for i := range ls {
		ls[i] = l
	}
	return (&Done{Tag: 1, Seq: 2, Links: ls}).Append(nil)
}

func TestDoneLinkTimings(t *testing.T) {
	want := &Done{Tag: 7, Seq: 3, Links: make([]LinkTiming, MaxLinkTimings)}
	for i := range want.Links {
		want.Links[i] = LinkTiming{Peer: uint64(i + 1), Dir: LinkDir(i % 2), Bytes: uint64(i) << 20,
			Start: uint64(i), End: uint64(10 * i), Wait: uint64(i * i)}
		if want.Links[i].Dir == LinkIn {
			want.Links[i].Transit = uint64(3 * i)
		}
	}
	b := want.Append(nil)
	if got := len(b) - len((&Done{Tag: 7, Seq: 3}).Append(nil)); got != MaxLinkTimings*49 {
		t.Errorf("%d link timings take %d bytes, want %d", MaxLinkTimings, got, MaxLinkTimings*49)
	}
	got, err := Decode(TypeDone, b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestFrameLimit(t *testing.T) {
	b := AppendFrame(nil, &Kick{Reason: string(make([]byte, 1000))})
	if _, _, err := ReadFrame(bytes.NewReader(b), 100, nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err = %v, want ErrTooLarge", err)
	}
}

func TestDataHeader(t *testing.T) {
	h := DataHeader{Len: 1 << 20, Epoch: 1, Tag: 2, Seq: 3, Step: 4, Part: 5}
	var b [DataHeaderSize]byte
	PutDataHeader(b[:], h)
	got, err := DecodeDataHeader(b[:], 1<<20)
	if err != nil || got != h {
		t.Fatalf("got %+v, %v", got, err)
	}
	if _, err := DecodeDataHeader(b[:], 1<<19); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("limit: %v", err)
	}
	b[0] = 1
	if _, err := DecodeDataHeader(b[:], 1<<20); !errors.Is(err, ErrMalformed) {
		t.Fatalf("type: %v", err)
	}
	if n := testing.AllocsPerRun(100, func() { PutDataHeader(b[:], h); _, _ = DecodeDataHeader(b[:], 1<<20) }); n != 0 {
		t.Fatalf("data header path allocates %v times", n)
	}
}

func TestExchange(t *testing.T) {
	// Exchange writes before it reads, so it needs a buffered stream like TCP (net.Pipe is not).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		b, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer b.Close()
		errc <- Exchange(b, KindData)
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := Exchange(a, KindData); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	hs := AppendHandshake(nil, Handshake{Version: Version + 1, Kind: KindControl})
	h, err := DecodeHandshake(hs)
	if err != nil || h.Version != Version+1 {
		t.Fatalf("%+v %v", h, err)
	}
	if _, err := DecodeHandshake([]byte("HTTP/1.1")); !errors.Is(err, ErrMalformed) {
		t.Fatalf("bad magic: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	for _, m := range sampleMessages() {
		f.Add(byte(m.Type()), m.Append(nil))
	}
	f.Fuzz(func(t *testing.T, typ byte, p []byte) {
		m, err := Decode(Type(typ), p)
		if err != nil {
			return
		}
		// Whatever decodes must re-encode to the same bytes.
		if got := m.Append(nil); !bytes.Equal(got, p) {
			t.Fatalf("re-encode of %T differs: %x vs %x", m, got, p)
		}
	})
}

// FuzzDecodeDone feeds the decoder of Done, whose link-timing summary is the telemetry every peer
// sends after every operation: whatever decodes must re-encode to the same bytes and respect the
// bounds.
func FuzzDecodeDone(f *testing.F) {
	for _, m := range sampleMessages() {
		if d, ok := m.(*Done); ok {
			f.Add(d.Append(nil))
		}
	}
	f.Add(doneWithTimings(MaxLinkTimings, LinkTiming{Peer: 9, Dir: LinkIn, Bytes: 1, Start: 1, End: 2, Wait: 1, Transit: 1}))
	f.Add(doneWithTimings(1, LinkTiming{Peer: 9, Dir: LinkOut, Bytes: 1, End: 2, Transit: 1}))
	f.Add(doneWithTimings(MaxLinkTimings+1, LinkTiming{}))
	f.Add((&Done{Tag: 1, SiteNICBytes: make([]uint64, MaxSiteNICs), SiteNanos: 1}).Append(nil))
	f.Add((&Done{Tag: 1, SiteNICBytes: make([]uint64, MaxSiteNICs+1)}).Append(nil))
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := Decode(TypeDone, p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		d := m.(*Done)
		if len(d.Links) > MaxLinkTimings || len(d.SiteNICBytes) > MaxSiteNICs {
			t.Fatalf("%d link timings and %d site NICs decoded, limits %d and %d", len(d.Links), len(d.SiteNICBytes), MaxLinkTimings, MaxSiteNICs)
		}
		for _, l := range d.Links {
			if l.Dir > LinkIn || l.End < l.Start || (l.Dir == LinkOut && l.Transit != 0) {
				t.Fatalf("invalid link timing decoded: %+v", l)
			}
		}
		if got := d.Append(nil); !bytes.Equal(got, p) {
			t.Fatalf("re-encode differs: %x vs %x", got, p)
		}
	})
}

func FuzzReadFrame(f *testing.F) {
	for _, m := range sampleMessages() {
		f.Add(AppendFrame(nil, m))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _ = ReadFrame(bytes.NewReader(b), 1<<16, nil)
	})
}

func FuzzDecodeDataHeader(f *testing.F) {
	var b [DataHeaderSize]byte
	PutDataHeader(b[:], DataHeader{Len: 10, Epoch: 1, Tag: 2, Seq: 3})
	f.Add(b[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeDataHeader(b, 1<<20)
		if err != nil {
			return
		}
		var out [DataHeaderSize]byte
		PutDataHeader(out[:], h)
		if !bytes.Equal(out[:], b) {
			t.Fatalf("re-encode differs")
		}
	})
}

func FuzzDecodeHandshake(f *testing.F) {
	f.Add(AppendHandshake(nil, Handshake{Version: Version, Kind: KindControl}))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := DecodeHandshake(b)
		if err != nil {
			return
		}
		if got := AppendHandshake(nil, h); !bytes.Equal(got[:7], b[:7]) {
			t.Fatalf("re-encode differs")
		}
	})
}
