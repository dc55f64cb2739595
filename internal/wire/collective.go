package wire

import "math"

// Collective messages between a peer and the master: the vote that starts a collective, its
// commencement, each member's report and the verdict.

// Desc describes a collective: element count, dtype, op and quantization. All participants must send
// the same Desc for one operation.
type Desc struct {
	Count uint64
	DType uint8
	// Op is the reduction of an all-reduce, or OpGather for an all-gather of Count elements from
	// every peer. The master only compares it between the peers.
	Op    uint8
	Quant uint8
	// Part is the pipelining granularity in bytes the peer cuts the operation's frames by: peers
	// that cut differently could not match each other's frames, so it must agree like the rest.
	Part uint32
}

// OpGather is Desc.Op of an all-gather: no reduction has this value.
const OpGather uint8 = 0x80

// Initiate is a peer's vote to start the collective on Tag.
type Initiate struct {
	Tag  uint64
	Desc Desc
	// Stats, when the peer computes them, describe its contribution, for the master's contribution
	// guard.
	Stats *Contribution
}

// Contribution describes a peer's input to a collective: whether every element is finite, and its
// Euclidean norm (meaningful only when Finite).
type Contribution struct {
	Finite bool
	Norm   float64
}

func (m *Initiate) Append(b []byte) []byte {
	b = appendU64(b, m.Tag)
	b = appendU64(b, m.Desc.Count)
	b = append(b, m.Desc.DType, m.Desc.Op, m.Desc.Quant)
	b = appendU32(b, m.Desc.Part)
	b = appendBool(b, m.Stats != nil)
	if m.Stats != nil {
		b = appendBool(b, m.Stats.Finite)
		b = appendU64(b, math.Float64bits(m.Stats.Norm))
	}
	return b
}

func (m *Initiate) decode(d *decoder) {
	*m = Initiate{Tag: d.u64("tag"), Desc: Desc{Count: d.u64("count"), DType: d.u8("dtype"), Op: d.u8("op"),
		Quant: d.u8("quant"), Part: d.u32("part")}}
	if d.boolean("stats") {
		m.Stats = &Contribution{Finite: d.boolean("finite"), Norm: d.f64("norm")}
	}
}

// Commence starts the collective (Tag, Seq) on the ring of Epoch.
type Commence struct {
	Tag   uint64
	Seq   uint64
	Epoch uint64
	// Alone says that no other collective of the group was running when this one commenced, nor will
	// one commence before every member has reported this one done: the collective may use resources
	// that one collective at a time can hold (the intra-site fabric of a hierarchical AllReduce).
	Alone bool
}

func (m *Commence) Append(b []byte) []byte {
	b = appendU64(b, m.Tag)
	b = appendU64(b, m.Seq)
	b = appendU64(b, m.Epoch)
	return appendBool(b, m.Alone)
}

func (m *Commence) decode(d *decoder) {
	*m = Commence{Tag: d.u64("tag"), Seq: d.u64("seq"), Epoch: d.u64("epoch"), Alone: d.boolean("alone")}
}

// Done reports that the peer finished its part of the operation (Tag, Seq) (Code is CodeOK) or failed
// it: CodePeerLeft for an I/O failure on a link, CodeAborted when the caller cancelled. Seq 0 withdraws
// a vote for an operation whose Commence the peer has not seen; the master then counts the withdrawal
// as the peer's Done of that operation, and the peer ignores a Commence that crosses it.
//
// LinkBytes and LinkNanos time the peer's link to its successor during the operation: the bytes it
// sent and the nanoseconds its sends were blocked. The master keeps its bandwidth estimates fresh
// from them.
//
// Links is the operation's timing summary per link, for the master's diagnosis of slow links and
// slow peers: at most MaxLinkTimings entries, one per link and direction the operation used (in a
// ring: the link to the successor and the link from the predecessor). It is a bounded summary of
// the whole operation, never one entry per chunk. A peer that does not time its links sends none.
//
// Silent names the link whose progress deadline failed the operation (Silent.Peer 0: none). Both ends
// still reached the master, so the master avoids that edge in the next ring rather than evict
// either (a route black-holed between them).
//
// Encoding: tag u64 | seq u64 | code u8 | detail string | link bytes u64 | link nanos u64 | link
// count u32 (at most MaxLinkTimings) | per link: peer u64 | dir u8 | bytes u64 | start u64 | end u64
// | wait u64 | transit u64 (49 bytes each) | silent peer u64 | silent dir u8 | site NIC count u8 (at
// most MaxSiteNICs) | per NIC: bytes u64 | site nanos u64.
//
// SiteNICBytes and SiteNanos are the intra-site fabric's per-NIC figures of an operation whose site
// phases ran on it: the data bytes this peer posted on each of its NICs (by index), and the time from
// the start of the operation's data path on this peer to its report, over which they moved. Both
// are empty, 0, otherwise.
type Done struct {
	Tag          uint64
	Seq          uint64
	Code         Code
	Detail       string
	LinkBytes    uint64
	LinkNanos    uint64
	Links        []LinkTiming
	Silent       LinkRef
	SiteNICBytes []uint64
	SiteNanos    uint64
}

// MaxSiteNICs bounds Done.SiteNICBytes; the decoder refuses more.
const MaxSiteNICs = 16

func (m *Done) Append(b []byte) []byte {
	b = appendU64(b, m.Tag)
	b = appendU64(b, m.Seq)
	b = append(b, byte(m.Code))
	b = appendString(b, m.Detail)
	b = appendU64(b, m.LinkBytes)
	b = appendU64(b, m.LinkNanos)
	b = appendLinkTimings(b, m.Links)
	b = appendU64(b, m.Silent.Peer)
	b = append(b, byte(m.Silent.Dir), byte(len(m.SiteNICBytes)))
	for _, v := range m.SiteNICBytes {
		b = appendU64(b, v)
	}
	return appendU64(b, m.SiteNanos)
}

func (m *Done) decode(d *decoder) {
	*m = Done{Tag: d.u64("tag"), Seq: d.u64("seq"), Code: d.code(), Detail: d.str("detail"),
		LinkBytes: d.u64("link bytes"), LinkNanos: d.u64("link nanos")}
	m.Links = d.linkTimings()
	m.Silent = LinkRef{Peer: d.u64("silent peer"), Dir: LinkDir(d.u8("silent dir"))}
	if m.Silent.Dir > LinkIn || (m.Silent.Peer == 0 && m.Silent.Dir != 0) {
		d.fail("silent link")
		return
	}
	n := int(d.u8("site NIC count"))
	if n > MaxSiteNICs {
		d.fail("site NIC count")
		return
	}
	for range n {
		m.SiteNICBytes = append(m.SiteNICBytes, d.u64("site NIC bytes"))
	}
	m.SiteNanos = d.u64("site nanos")
}

// LinkRef names one direction of the link between the reporting peer and Peer.
type LinkRef struct {
	Peer uint64
	Dir  LinkDir
}

// MaxLinkTimings bounds Done.Links; the decoder refuses more.
const MaxLinkTimings = 8

// LinkDir says which way a LinkTiming's bytes went.
type LinkDir uint8

// Link directions.
const (
	LinkOut LinkDir = iota // from the reporting peer to LinkTiming.Peer
	LinkIn                 // from LinkTiming.Peer to the reporting peer
)

// LinkTiming is what one link did during one operation, seen from the reporting peer. Start, End and
// Wait are nanoseconds; Start and End are offsets from the moment the peer began the operation (it
// received Commence), so no clocks need to agree.
//
// Wait is the time the peer spent stalled on this link and on nothing else: for LinkOut, the time a
// step of the operation could not go on because the send to Peer had not completed while the
// step's other work had; for LinkIn, the time it could not go on because the bytes from Peer had
// not arrived. A peer's stalls therefore never overlap, and its span minus its waits is the time it
// was busy on its own (computing, copying, or late to start).
//
// Transit (LinkIn only; 0 for LinkOut and where not timed) is the time the link's frames spent
// arriving, summed over its frames: per frame, from the read of its first payload byte to the read
// of its last. It measures the link itself, not the pace of the ring: a frame crosses a link paced
// by a slow upstream peer as fast as the link allows, and crosses a slow link slowly, whether or not
// its sender was ever held back.
type LinkTiming struct {
	Peer  uint64  // the peer at the other end of the link
	Dir   LinkDir // LinkOut or LinkIn
	Bytes uint64  // payload bytes carried
	Start uint64  // offset of the first byte sent or received
	End   uint64  // offset of the last byte sent or received
	Wait  uint64  // stalled on this link
	// Transit is the nanoseconds the frames spent arriving, summed per frame (LinkIn).
	Transit uint64
}

// appendLinkTimings appends a list of link timings: count u32, then per entry peer u64 | dir u8 |
// bytes u64 | start u64 | end u64 | wait u64 | transit u64 (49 bytes).
func appendLinkTimings(b []byte, ls []LinkTiming) []byte {
	b = appendU32(b, uint32(len(ls)))
	for _, l := range ls {
		b = appendU64(b, l.Peer)
		b = append(b, byte(l.Dir))
		b = appendU64(b, l.Bytes)
		b = appendU64(b, l.Start)
		b = appendU64(b, l.End)
		b = appendU64(b, l.Wait)
		b = appendU64(b, l.Transit)
	}
	return b
}

// linkTimingSize is the encoded size of one LinkTiming.
const linkTimingSize = 49

// linkTimings reads what appendLinkTimings wrote. It refuses more than MaxLinkTimings entries, an
// unknown direction, an entry that ends before it starts, and a transit time on a link out (only the
// receiver times it).
func (d *decoder) linkTimings() []LinkTiming {
	n := d.count(linkTimingSize, "link timings")
	if n > MaxLinkTimings {
		d.fail("link timings")
		return nil
	}
	var ls []LinkTiming
	for range n {
		l := LinkTiming{Peer: d.u64("link peer"), Dir: LinkDir(d.u8("link dir")), Bytes: d.u64("link bytes"),
			Start: d.u64("link start"), End: d.u64("link end"), Wait: d.u64("link wait"), Transit: d.u64("link transit")}
		if l.Dir > LinkIn || l.End < l.Start || (l.Dir == LinkOut && l.Transit != 0) {
			d.fail("link timing")
			return nil
		}
		ls = append(ls, l)
	}
	return ls
}

// Outcome ends the operation (Tag, Seq) for this peer; each participant gets exactly one. Seq is 0 when
// the operation never commenced.
type Outcome struct {
	Tag    uint64
	Seq    uint64
	Code   Code
	Detail string
}

func (m *Outcome) Append(b []byte) []byte {
	b = appendU64(b, m.Tag)
	b = appendU64(b, m.Seq)
	b = append(b, byte(m.Code))
	return appendString(b, m.Detail)
}

func (m *Outcome) decode(d *decoder) {
	*m = Outcome{Tag: d.u64("tag"), Seq: d.u64("seq"), Code: d.code(), Detail: d.str("detail")}
}

func (*Initiate) Type() Type { return TypeInitiate }
func (*Commence) Type() Type { return TypeCommence }
func (*Done) Type() Type     { return TypeDone }
func (*Outcome) Type() Type  { return TypeOutcome }
