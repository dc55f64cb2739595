package wire

// Shared-state sync and topology optimization messages between a peer and the master.

// VoteSync is a peer's vote in SyncSharedState: its strategy (sharedstate.Strategy) and the digest of
// its state (sharedstate's encoding).
type VoteSync struct {
	Strategy uint8
	Digest   []byte
}

func (m *VoteSync) Append(b []byte) []byte {
	b = append(b, m.Strategy)
	return appendBytes(b, m.Digest)
}

func (m *VoteSync) decode(d *decoder) {
	*m = VoteSync{Strategy: d.u8("strategy"), Digest: d.bytes("digest")}
}

// StepReport tells the master the peer's training step and whether it is inside the optimizer step,
// so that a recovery resumes every peer at one consistent step.
type StepReport struct {
	Step        uint64
	InOptimizer bool
}

func (m *StepReport) Append(b []byte) []byte {
	b = appendU64(b, m.Step)
	return appendBool(b, m.InOptimizer)
}

func (m *StepReport) decode(d *decoder) {
	*m = StepReport{Step: d.u64("step"), InOptimizer: d.boolean("in optimizer")}
}

// FetchItem is one entry an outlier must fetch: its elected hash, size, and the peers that hold it,
// preferred first.
type FetchItem struct {
	Name   string
	Hash   uint64
	Bytes  uint64
	Donors []PeerInfo
}

// SyncPlan is the master's answer to a VoteSync: the elected revision and what this peer must fetch.
// A Code other than CodeOK means the sync failed for this peer (Detail says why).
type SyncPlan struct {
	Revision uint64
	Code     Code
	Detail   string
	Fetch    []FetchItem
}

func (m *SyncPlan) Append(b []byte) []byte {
	b = appendU64(b, m.Revision)
	b = append(b, byte(m.Code))
	b = appendString(b, m.Detail)
	b = appendU32(b, uint32(len(m.Fetch)))
	for _, f := range m.Fetch {
		b = appendString(b, f.Name)
		b = appendU64(b, f.Hash)
		b = appendU64(b, f.Bytes)
		b = appendU32(b, uint32(len(f.Donors)))
		for _, p := range f.Donors {
			b = appendPeerInfo(b, p)
		}
	}
	return b
}

func (m *SyncPlan) decode(d *decoder) {
	*m = SyncPlan{Revision: d.u64("revision"), Code: d.code(), Detail: d.str("detail")}
	n := d.count(24, "fetch")
	for range n {
		f := FetchItem{Name: d.str("fetch name"), Hash: d.u64("fetch hash"), Bytes: d.u64("fetch bytes")}
		k := d.count(peerInfoMin, "donors")
		for range k {
			f.Donors = append(f.Donors, d.peerInfo())
		}
		m.Fetch = append(m.Fetch, f)
	}
}

// SyncDone reports that the peer fetched (and verified) everything its SyncPlan listed, or failed to.
type SyncDone struct {
	OK     bool
	Detail string
}

func (m *SyncDone) Append(b []byte) []byte {
	b = appendBool(b, m.OK)
	return appendString(b, m.Detail)
}

func (m *SyncDone) decode(d *decoder) { *m = SyncDone{OK: d.boolean("ok"), Detail: d.str("detail")} }

// SyncComplete ends a sync: every peer holds Revision (CodeOK), or the sync failed. ResumeStep is the
// consistent training step to resume from, from the peers' step reports.
type SyncComplete struct {
	Revision   uint64
	Code       Code
	Detail     string
	ResumeStep uint64
}

func (m *SyncComplete) Append(b []byte) []byte {
	b = appendU64(b, m.Revision)
	b = append(b, byte(m.Code))
	b = appendString(b, m.Detail)
	return appendU64(b, m.ResumeStep)
}

func (m *SyncComplete) decode(d *decoder) {
	*m = SyncComplete{Revision: d.u64("revision"), Code: d.code(), Detail: d.str("detail"), ResumeStep: d.u64("resume step")}
}

// VoteOptimize is a peer's vote in OptimizeTopology.
type VoteOptimize struct{}

func (m *VoteOptimize) Append(b []byte) []byte { return b }
func (m *VoteOptimize) decode(*decoder)        {}

// MeasureRound asks the peer to measure its link to Target for Nanos nanoseconds over Streams
// connections, and answer MeasureReport. Target.ID 0 means the peer sends nothing this round (it may
// still be measured by another peer). Rounds of OptimizeTopology count from 1; Round 0 is a test the
// master's diagnosis asks for on its own, beside the collectives, which the peer runs whether or not
// it optimizes.
type MeasureRound struct {
	Round   uint32
	Target  PeerInfo
	Nanos   uint64
	Streams uint16
}

func (m *MeasureRound) Append(b []byte) []byte {
	b = appendU32(b, m.Round)
	b = appendPeerInfo(b, m.Target)
	b = appendU64(b, m.Nanos)
	return appendU16(b, m.Streams)
}

func (m *MeasureRound) decode(d *decoder) {
	*m = MeasureRound{Round: d.u32("round"), Target: d.peerInfo(), Nanos: d.u64("nanos"), Streams: d.u16("streams")}
}

// MeasureReport is the measured bandwidth of the directed link to To, in bytes per second (0: failed),
// and its one-way latency (half the round trip) in nanoseconds.
type MeasureReport struct {
	Round        uint32
	To           uint64
	BytesPerSec  float64
	LatencyNanos uint64
}

func (m *MeasureReport) Append(b []byte) []byte {
	b = appendU32(b, m.Round)
	b = appendU64(b, m.To)
	b = appendF64(b, m.BytesPerSec)
	return appendU64(b, m.LatencyNanos)
}

func (m *MeasureReport) decode(d *decoder) {
	*m = MeasureReport{Round: d.u32("round"), To: d.u64("to"), BytesPerSec: d.f64("rate"), LatencyNanos: d.u64("latency")}
}

func (*VoteSync) Type() Type      { return TypeVoteSync }
func (*StepReport) Type() Type    { return TypeStepReport }
func (*SyncPlan) Type() Type      { return TypeSyncPlan }
func (*SyncDone) Type() Type      { return TypeSyncDone }
func (*SyncComplete) Type() Type  { return TypeSyncComplete }
func (*VoteOptimize) Type() Type  { return TypeVoteOptimize }
func (*MeasureRound) Type() Type  { return TypeMeasureRound }
func (*MeasureReport) Type() Type { return TypeMeasureReport }
