package rdma_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/concord-ccl/concord/rdma"
)

// Input kinds of the fuzz encoding: every step of a fuzz input starts with one of these bytes (modulo
// their count) followed by the bytes of its fields.
const (
	fzOpen = iota
	fzPosted
	fzAcked
	fzReceived
	fzLinkFailed
	fzPort
	fzNotice
	fzFailReq
	fzFailAck
	fzAsk
	fzReport
	fzVerdict
	fzProbe
	fzAdvance
	fzTick
	fzKinds
)

// fuzzRing is the group every fuzzed machine belongs to.
var fuzzRing = []rdma.NodeID{1, 2, 3, 4}

// fuzzMaxSteps bounds the inputs decoded from one fuzz input.
const fuzzMaxSteps = 200

// fuzzReader hands out the bytes of a fuzz input; past the end it returns zeros.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

// fuzzMachine is a machine under fuzzing with what the harness knows about it: the group, the paths
// it was told about, the ids of the probes it asked for and of the localizations it asked others to
// help with, and the last epoch seen on every path.
type fuzzMachine struct {
	t      *testing.T
	m      *rdma.Repair
	self   rdma.NodeID
	others []rdma.NodeID
	nics   int
	now    time.Time
	paths  []rdma.PathID
	probes []uint64
	asks   []uint64
	epochs map[rdma.PathID]uint32
	step   int
	last   rdma.Input
}

func newFuzzMachine(t *testing.T, r *fuzzReader) *fuzzMachine {
	self := fuzzRing[int(r.byte())%len(fuzzRing)]
	n := 2 + int(r.byte())%5
	nics := make([]rdma.NIC, n)
	for i := range nics {
		nics[i] = rdma.NIC{ID: rdma.NICID(i), Bandwidth: 12.5e9, Distance: i / 2}
	}
	fm := &fuzzMachine{t: t, m: rdma.NewRepair(self, fuzzRing, nics, rdma.RepairConfig{}), self: self, nics: n,
		now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), epochs: map[rdma.PathID]uint32{}}
	for _, v := range fuzzRing {
		if v != self {
			fm.others = append(fm.others, v)
		}
	}
	return fm
}

// path decodes a path between this node and another one, in either direction, on any channel.
func (fm *fuzzMachine) path(b byte) rdma.PathID { return fm.pathDir(b, (b/3)%2 == 1) }

// sent decodes a path this node sends on, and received one it receives on: the runtime reports chunk
// events only at the end of a path that handles them.
func (fm *fuzzMachine) sent(b byte) rdma.PathID     { return fm.pathDir(b, false) }
func (fm *fuzzMachine) received(b byte) rdma.PathID { return fm.pathDir(b, true) }

func (fm *fuzzMachine) pathDir(b byte, receive bool) rdma.PathID {
	peer := fm.others[int(b)%len(fm.others)]
	ch := uint16(int(b/6) % fm.nics)
	p := rdma.PathID{Src: fm.self, Dst: peer, Channel: ch}
	if receive {
		p.Src, p.Dst = peer, fm.self
	}
	if !slices.Contains(fm.paths, p) {
		fm.paths = append(fm.paths, p)
	}
	return p
}

func (fm *fuzzMachine) peer(b byte) rdma.NodeID { return fm.others[int(b)%len(fm.others)] }

func (fm *fuzzMachine) nic(b byte) rdma.NICID { return rdma.NICID(int(b) % fm.nics) }

func (fm *fuzzMachine) other(p rdma.PathID) rdma.NodeID {
	if p.Src == fm.self {
		return p.Dst
	}
	return p.Src
}

// epoch decodes an epoch: mostly small, sometimes far ahead or at the top of the range.
func epochOf(b byte) uint32 {
	switch {
	case b == 255:
		return math.MaxUint32
	case b >= 240:
		return uint32(b) << 20
	}
	return uint32(b % 16)
}

// pick returns one of ids chosen by b, or a number no action named when b says so or there is none.
func pick(ids []uint64, b byte) uint64 {
	if len(ids) == 0 || b >= 240 {
		return uint64(b)
	}
	return ids[len(ids)-1-int(b)%len(ids)]
}

// next decodes one input; ok is false when the input is exhausted.
func (fm *fuzzMachine) next(r *fuzzReader) (in rdma.Input, ok bool) {
	if len(r.b) == 0 {
		return nil, false
	}
	wire := func(from rdma.NodeID, msg rdma.Message) rdma.Input {
		dec, err := rdma.DecodeMessage(rdma.AppendMessage(nil, msg))
		if err != nil {
			fm.t.Fatalf("message %v does not survive the wire: %v", msg, err)
		}
		return rdma.ControlIn{From: from, Msg: dec}
	}
	switch k := r.byte() % fzKinds; k {
	case fzOpen:
		p := fm.path(r.byte())
		return rdma.Open{Path: p, Op: uint64(r.byte() % 8), Primary: rdma.NICID(p.Channel), Chunks: uint64(r.byte() % 16)}, true
	case fzPosted:
		return rdma.Posted{Path: fm.sent(r.byte()), Seq: uint64(r.byte() % 16), Local: fm.nic(r.byte()), Remote: fm.nic(r.byte())}, true
	case fzAcked:
		return rdma.Acked{Path: fm.sent(r.byte()), Seq: uint64(r.byte() % 16), Local: fm.nic(r.byte()), Remote: fm.nic(r.byte())}, true
	case fzReceived:
		return rdma.Received{Path: fm.received(r.byte()), Seq: uint64(r.byte() % 16), Local: fm.nic(r.byte()), Remote: fm.nic(r.byte())}, true
	case fzLinkFailed:
		return rdma.LinkFailed{Peer: fm.peer(r.byte()), Local: fm.nic(r.byte()), Remote: fm.nic(r.byte()),
			Err: errors.New("connection reset")}, true
	case fzPort:
		return rdma.PortState{NIC: fm.nic(r.byte()), Health: rdma.Health(r.byte() % 3)}, true
	case fzNotice, fzFailReq, fzFailAck:
		kind := map[byte]rdma.MsgKind{fzNotice: rdma.MsgNotice, fzFailReq: rdma.MsgFailReq, fzFailAck: rdma.MsgFailAck}[k]
		p := fm.path(r.byte())
		msg := rdma.Message{Kind: kind, Path: p, Epoch: epochOf(r.byte()), ID: uint64(r.byte() % 8),
			Local: fm.nic(r.byte()), Remote: fm.nic(r.byte())}
		if b := r.byte(); b >= 240 {
			msg.Seq = math.MaxUint64
		} else {
			msg.Seq = uint64(b % 16)
		}
		return wire(fm.other(p), msg), true
	case fzAsk:
		from, b := fm.peer(r.byte()), fm.peer(r.byte())
		if b == from {
			b = fm.others[(slices.Index(fm.others, from)+1)%len(fm.others)]
		}
		return wire(from, rdma.Message{Kind: rdma.MsgProbeAsk, ID: uint64(r.byte()),
			A: rdma.NICRef{Node: from, NIC: fm.nic(r.byte())}, B: rdma.NICRef{Node: b, NIC: fm.nic(r.byte())}}), true
	case fzReport:
		from, id, ok := fm.peer(r.byte()), pick(fm.asks, r.byte()), r.byte()
		return wire(from, rdma.Message{Kind: rdma.MsgProbeReport, ID: id, OKA: ok&1 != 0, OKB: ok&2 != 0}), true
	case fzVerdict:
		from, origin, id, how := fm.peer(r.byte()), fuzzRing[int(r.byte())%len(fuzzRing)], uint64(r.byte()), r.byte()
		a := rdma.NICRef{Node: fuzzRing[int(r.byte())%len(fuzzRing)], NIC: fm.nic(r.byte())}
		msg := rdma.Message{Kind: rdma.MsgVerdict, Origin: origin, ID: id, A: a, Fault: rdma.FaultNIC, Health: rdma.Down}
		bn, bnic := fuzzRing[int(r.byte())%len(fuzzRing)], fm.nic(r.byte())
		if how&1 != 0 {
			msg.Fault, msg.B = rdma.FaultLink, rdma.NICRef{Node: bn, NIC: bnic}
		}
		if how&2 != 0 {
			msg.Health = rdma.Healthy
		}
		return wire(from, msg), true
	case fzProbe:
		id, how, rtt := pick(fm.probes, r.byte()), r.byte(), r.byte()
		return rdma.ProbeResult{ID: id, OK: how%3 == 0, Local: how%3 == 2, RTT: time.Duration(rtt) * 10 * time.Microsecond}, true
	case fzAdvance:
		b := r.byte()
		d := time.Duration(b) * 100 * time.Microsecond
		if b >= 250 {
			d = time.Duration(b-249) * time.Second
		}
		fm.now = fm.now.Add(d)
		return rdma.Tick{}, true
	}
	return rdma.Tick{}, true
}

// FuzzRepair feeds one node's Repair machine a decoded sequence of inputs (chunk events, provider
// errors, port events, control messages with arbitrary epochs, probe results, verdicts and passing time)
// and checks after every step what the machine promises: it does not panic, no path's epoch goes
// back, every pair is on NICs of the node's backup chain, and every action names a node of the group, a
// NIC that exists and, for paths, what the machine was told about.
func FuzzRepair(f *testing.F) {
	for _, seed := range fuzzSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fuzzReader{b: data}
		fm := newFuzzMachine(t, r)
		for fm.step = 0; fm.step < fuzzMaxSteps; fm.step++ {
			in, ok := fm.next(r)
			if !ok {
				return
			}
			fm.last = in
			acts := fm.m.Step(fm.now, in)
			fm.check(in, acts)
		}
	})
}

// lazy is a description formatted only when a check fails, which keeps fuzzing fast.
type lazy func() string

func (l lazy) String() string { return l() }

func (fm *fuzzMachine) fatalf(format string, args ...any) {
	fm.t.Helper()
	fm.t.Fatalf("step %d (%#v): %s", fm.step, fm.last, fmt.Sprintf(format, args...))
}

func (fm *fuzzMachine) checkNode(what fmt.Stringer, n rdma.NodeID) {
	fm.t.Helper()
	if !slices.Contains(fm.others, n) {
		fm.fatalf("%s names node %d, not a peer of node %d in ring %v", what, n, fm.self, fuzzRing)
	}
}

func (fm *fuzzMachine) checkNIC(what fmt.Stringer, n rdma.NICID) {
	fm.t.Helper()
	if int(n) >= fm.nics {
		fm.fatalf("%s names NIC %d of %d", what, n, fm.nics)
	}
}

func (fm *fuzzMachine) checkRef(what fmt.Stringer, r rdma.NICRef) {
	fm.t.Helper()
	if !slices.Contains(fuzzRing, r.Node) {
		fm.fatalf("%s names %v, outside ring %v", what, r, fuzzRing)
	}
	fm.checkNIC(what, r.NIC)
}

// checkSent checks a control message the machine sends to node to.
func (fm *fuzzMachine) checkSent(to rdma.NodeID, msg rdma.Message) {
	fm.t.Helper()
	what := lazy(func() string { return fmt.Sprintf("message %v to %d", msg, to) })
	switch msg.Kind {
	case rdma.MsgNotice, rdma.MsgFailReq:
		if !slices.Contains(fm.paths, msg.Path) || fm.other(msg.Path) != to {
			fm.fatalf("%s: not to the other end of a known path", what)
		}
		if msg.Kind == rdma.MsgFailReq && msg.Path.Src != fm.self || msg.Kind == rdma.MsgNotice && msg.Path.Dst != fm.self {
			fm.fatalf("%s: sent by the wrong end of the path", what)
		}
		fm.checkNIC(what, msg.Local)
		fm.checkNIC(what, msg.Remote)
	case rdma.MsgFailAck:
		if !slices.Contains(fm.paths, msg.Path) || msg.Path.Dst != fm.self || msg.Path.Src != to {
			fm.fatalf("%s: not to the sender of a path this node receives", what)
		}
	case rdma.MsgProbeAsk:
		fm.checkRef(what, msg.A)
		fm.checkRef(what, msg.B)
		if msg.A.Node != fm.self || msg.B.Node == to {
			fm.fatalf("%s: a third node must be asked about this node and another one", what)
		}
	case rdma.MsgProbeReport:
	case rdma.MsgVerdict:
		fm.checkRef(what, msg.A)
		if msg.Fault == rdma.FaultLink {
			fm.checkRef(what, msg.B)
		} else if msg.Fault != rdma.FaultNIC {
			fm.fatalf("%s: verdict of fault class %d", what, msg.Fault)
		}
		if msg.Origin == to {
			fm.fatalf("%s: verdict sent back to its origin", what)
		}
	default:
		fm.fatalf("%s: unexpected kind", what)
	}
}

// check checks the actions of one step and the state the machine shows after it.
func (fm *fuzzMachine) check(in rdma.Input, acts []rdma.Action) {
	fm.t.Helper()
	// The last Pause or Resume of each path in this step, which must match the pair the machine shows.
	resumed := map[rdma.PathID]rdma.Resume{}
	for _, a := range acts {
		what := lazy(func() string { return formatAction(a) })
		switch a := a.(type) {
		case rdma.Resume:
			if !slices.Contains(fm.paths, a.Path) || a.Path.Src != fm.self {
				fm.fatalf("%s: not a path this node sends on", what)
			}
			fm.checkNIC(what, a.Local)
			fm.checkNIC(what, a.Remote)
			resumed[a.Path] = a
		case rdma.Pause:
			if !slices.Contains(fm.paths, a.Path) || a.Path.Src != fm.self {
				fm.fatalf("%s: not a path this node sends on", what)
			}
			delete(resumed, a.Path)
		case rdma.Accept, rdma.Reject:
			rcv, ok := in.(rdma.Received)
			var p rdma.PathID
			var seq uint64
			if x, isAccept := a.(rdma.Accept); isAccept {
				p, seq = x.Path, x.Seq
			} else {
				p, seq = a.(rdma.Reject).Path, a.(rdma.Reject).Seq
			}
			if !ok || rcv.Path != p || rcv.Seq != seq {
				fm.fatalf("%s: answers no Received input", what)
			}
		case rdma.SendMsg:
			fm.checkNode(what, a.To)
			if a.Avoid != rdma.NoNIC {
				fm.checkNIC(what, a.Avoid)
			}
			fm.checkSent(a.To, a.Msg)
		case rdma.ProbeNIC:
			fm.checkNode(what, a.Peer)
			fm.checkNIC(what, a.Local)
			fm.checkNIC(what, a.Remote)
			if slices.Contains(fm.probes, a.ID) {
				fm.fatalf("%s: probe id used twice", what)
			}
			fm.probes = append(fm.probes, a.ID)
		case rdma.Reconnect:
			fm.checkNode(what, a.Peer)
			fm.checkNIC(what, a.Local)
			fm.checkNIC(what, a.Remote)
		case rdma.PathFailed:
			if !slices.Contains(fm.paths, a.Path) || a.Path.Src != fm.self {
				fm.fatalf("%s: not a path this node sends on", what)
			}
			if !errors.Is(a.Err, rdma.ErrNoPath) {
				fm.fatalf("%s: error is not ErrNoPath", what)
			}
		case rdma.Note:
			if !slices.Contains([]string{"detect", "repair", "verdict", "healed"}, a.Kind) {
				fm.fatalf("%s: unknown note kind", what)
			}
		default:
			fm.fatalf("unknown action %#v", a)
		}
		if s, ok := a.(rdma.SendMsg); ok && s.Msg.Kind == rdma.MsgProbeAsk {
			fm.asks = append(fm.asks, s.Msg.ID)
		}
	}
	for _, p := range fm.paths {
		local, remote, epoch, ok := fm.m.Pair(p)
		if !ok {
			continue
		}
		if int(local) >= fm.nics || int(remote) >= fm.nics {
			fm.fatalf("path %v is on pair %d-%d, outside the chain of %d NICs", p, local, remote, fm.nics)
		}
		if prev, seen := fm.epochs[p]; seen && epoch < prev {
			fm.fatalf("path %v went back from epoch %d to %d", p, prev, epoch)
		}
		fm.epochs[p] = epoch
		if r, ok := resumed[p]; ok && (r.Epoch != epoch || r.Local != local || r.Remote != remote) {
			fm.fatalf("%s, but the path is on pair %d-%d at epoch %d", formatAction(r), local, remote, epoch)
		}
	}
	if d := fm.m.Deadline(); !d.IsZero() && !d.After(fm.now) {
		fm.fatalf("deadline %v is not after now %v: a Tick would not move", d, fm.now)
	}
}

// fuzzSeeds returns fuzz inputs that replay some of the scenario scripts in testdata. A path byte is
// 6×channel + 3×(1 when this node receives) + the index of the other end among the other nodes.
func fuzzSeeds() [][]byte {
	cat := func(steps ...[]byte) []byte { return slices.Concat(steps...) }
	return [][]byte{
		// second_failure: node 1 with 4 NICs; the backup pair fails before the receiver answers.
		cat([]byte{0, 2},
			[]byte{fzOpen, 0, 1, 8}, []byte{fzPosted, 0, 0, 0, 0},
			[]byte{fzLinkFailed, 0, 0, 0}, []byte{fzLinkFailed, 0, 1, 1},
			[]byte{fzFailAck, 0, 1, 1, 0, 0, 0}, []byte{fzFailAck, 0, 2, 1, 0, 0, 0},
			[]byte{fzPosted, 0, 0, 2, 2}, []byte{fzLinkFailed, 0, 2, 2},
			[]byte{fzFailAck, 0, 3, 1, 0, 0, 0}, []byte{fzLinkFailed, 0, 3, 3}),
		// receiver_side: node 2 receives 1->2/ch0 and moves to pair 1-1 at the sender's request.
		cat([]byte{1, 2},
			[]byte{fzOpen, 3, 1, 4}, []byte{fzReceived, 3, 0, 0, 0}, []byte{fzReceived, 3, 1, 0, 0},
			[]byte{fzLinkFailed, 0, 0, 0}, []byte{fzFailReq, 3, 1, 1, 1, 1, 1},
			[]byte{fzReceived, 3, 2, 0, 0}, []byte{fzFailReq, 3, 1, 1, 1, 1, 1}, []byte{fzFailReq, 3, 0, 1, 0, 0, 0},
			[]byte{fzReceived, 3, 1, 1, 1}, []byte{fzReceived, 3, 2, 1, 1}, []byte{fzReceived, 3, 3, 1, 1}),
		// heal: node 1 with 2 NICs; NIC 0 goes down, comes back, is probed and taken back.
		cat([]byte{0, 0},
			[]byte{fzOpen, 0, 1, 2}, []byte{fzPort, 0, 2}, []byte{fzFailAck, 0, 1, 1, 0, 0, 0},
			[]byte{fzPosted, 0, 0, 1, 1}, []byte{fzAcked, 0, 0, 1, 1}, []byte{fzPosted, 0, 1, 1, 1}, []byte{fzAcked, 0, 1, 1, 1},
			[]byte{fzAdvance, 200}, []byte{fzAdvance, 200}, []byte{fzAdvance, 100}, []byte{fzPort, 0, 0},
			[]byte{fzAdvance, 10}, []byte{fzAdvance, 30}, []byte{fzAdvance, 200}, []byte{fzProbe, 0, 0, 1},
			[]byte{fzOpen, 0, 2, 2}, []byte{fzFailAck, 0, 2, 2, 0, 0, 0}),
		// ack_deadline_link: node 1 with 4 NICs; an acknowledgement is late, the stall probe fails, and
		// localization with a third node blames the link.
		cat([]byte{0, 2},
			[]byte{fzOpen, 0, 1, 4}, []byte{fzPosted, 0, 0, 0, 0}, []byte{fzAdvance, 20}, []byte{fzProbe, 0, 1, 0},
			[]byte{fzReport, 2, 0, 3}, []byte{fzProbe, 0, 1, 0}, []byte{fzFailAck, 0, 1, 1, 0, 0, 0},
			[]byte{fzAdvance, 100}, []byte{fzAdvance, 30}, []byte{fzProbe, 0, 1, 0}, []byte{fzAdvance, 250},
			[]byte{fzProbe, 0, 0, 5}),
		// third_node: node 3 answers another node's localization and passes verdicts on.
		cat([]byte{2, 2},
			[]byte{fzAsk, 0, 1, 7, 1, 1}, []byte{fzProbe, 0, 0, 0}, []byte{fzProbe, 1, 1, 0},
			[]byte{fzVerdict, 0, 0, 1, 0, 1, 1, 0, 0}, []byte{fzVerdict, 0, 0, 1, 0, 1, 1, 0, 0},
			[]byte{fzVerdict, 1, 0, 2, 2, 1, 1, 0, 0}),
	}
}
