package wire

// Messages between two peers outside the ring's data links: shared-state transfer (a newcomer or an
// outlier fetching from a donor) and bandwidth tests.

// StateRequest asks a donor for Len bytes at Off of entry Name, whose content must hash to Hash. With
// Leaves, it asks instead for the leaf hashes of the entry's hash tree (Off and Len are ignored): the
// response carries them as little-endian u64s, so that the receiver can verify every block before it
// writes it.
type StateRequest struct {
	Token    string
	Name     string
	Hash     uint64
	Off      uint64
	Len      uint64
	Compress bool
	Leaves   bool
}

func (m *StateRequest) Append(b []byte) []byte {
	b = appendString(b, m.Token)
	b = appendString(b, m.Name)
	b = appendU64(b, m.Hash)
	b = appendU64(b, m.Off)
	b = appendU64(b, m.Len)
	b = appendBool(b, m.Compress)
	return appendBool(b, m.Leaves)
}

func (m *StateRequest) decode(d *decoder) {
	*m = StateRequest{Token: d.str("token"), Name: d.str("name"), Hash: d.u64("hash"), Off: d.u64("off"),
		Len: d.u64("len"), Compress: d.boolean("compress"), Leaves: d.boolean("leaves")}
}

// StateResponse answers a StateRequest; if OK, Len bytes follow (zstd-compressed if Compressed).
type StateResponse struct {
	OK         bool
	Detail     string
	Len        uint64
	Compressed bool
}

func (m *StateResponse) Append(b []byte) []byte {
	b = appendBool(b, m.OK)
	b = appendString(b, m.Detail)
	b = appendU64(b, m.Len)
	return appendBool(b, m.Compressed)
}

func (m *StateResponse) decode(d *decoder) {
	*m = StateResponse{OK: d.boolean("ok"), Detail: d.str("detail"), Len: d.u64("len"), Compressed: d.boolean("compressed")}
}

// BenchHello opens a bandwidth-test connection: the receiver answers an empty BenchResult at once (the
// sender times that round trip), then counts what arrives during Nanos nanoseconds from the first byte
// and answers a second BenchResult with the count.
type BenchHello struct {
	Token string
	Nanos uint64
}

func (m *BenchHello) Append(b []byte) []byte {
	b = appendString(b, m.Token)
	return appendU64(b, m.Nanos)
}

func (m *BenchHello) decode(d *decoder) {
	*m = BenchHello{Token: d.str("token"), Nanos: d.u64("nanos")}
}

// BenchResult is what a bandwidth-test receiver counted: Bytes during Nanos from Start (unix
// nanoseconds on the receiver's clock, so that the windows of parallel streams can be combined).
type BenchResult struct {
	Bytes uint64
	Nanos uint64
	Start uint64
}

func (m *BenchResult) Append(b []byte) []byte {
	b = appendU64(b, m.Bytes)
	b = appendU64(b, m.Nanos)
	return appendU64(b, m.Start)
}

func (m *BenchResult) decode(d *decoder) {
	*m = BenchResult{Bytes: d.u64("bytes"), Nanos: d.u64("nanos"), Start: d.u64("start")}
}

func (*StateRequest) Type() Type  { return TypeStateRequest }
func (*StateResponse) Type() Type { return TypeStateResponse }
func (*BenchHello) Type() Type    { return TypeBenchHello }
func (*BenchResult) Type() Type   { return TypeBenchResult }
