package sharedstate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"

	"github.com/concord-ccl/concord/rings"
)

// EntryDigest describes one entry of a peer's state without its data.
type EntryDigest struct {
	// Name is the entry's name.
	Name string
	// DType is the element type.
	DType rings.DType
	// Count is the number of elements.
	Count uint64
	// Hash is the content hash of the entry's bytes (see Hash).
	Hash uint64
	// MayDiffer marks an entry excluded from the vote.
	MayDiffer bool
}

// Bytes returns the entry's size in bytes.
func (e EntryDigest) Bytes() int64 { return int64(e.Count) * int64(e.DType.Size()) }

// sameShape reports whether e and o agree on everything but the hash.
func (e EntryDigest) sameShape(o EntryDigest) bool {
	return e.Name == o.Name && e.DType == o.DType && e.Count == o.Count && e.MayDiffer == o.MayDiffer
}

// Digest is what a peer reports about its state: the revision and one EntryDigest per entry, sorted by
// name.
type Digest struct {
	// Revision is the state's revision.
	Revision uint64
	// Entries are sorted by name, one per entry.
	Entries []EntryDigest
}

// Digest hashes every entry of s (except entries whose non-zero Version has not changed since they were
// last hashed), MayDiffer ones included, sharing workers goroutines over all blocks
// of all entries (workers < 1 means runtime.GOMAXPROCS(0)), and returns the result sorted by name. The
// entries' data must not change while it runs.
func (s *State) Digest(workers int) Digest {
	entries := s.Sorted()
	hashes := make([]uint64, len(entries))
	var datas [][]byte
	var todo []int
	for i, e := range entries {
		if h, ok := e.cached(); ok {
			hashes[i] = h
			continue
		}
		datas = append(datas, e.Data)
		todo = append(todo, i)
	}
	roots, leaves := hashAllLeaves(datas, workers)
	for k, h := range roots {
		e := entries[todo[k]]
		hashes[todo[k]] = h
		e.RememberLeaves(leaves[k], h)
	}
	d := Digest{Revision: s.Revision, Entries: make([]EntryDigest, len(entries))}
	for i, e := range entries {
		d.Entries[i] = EntryDigest{Name: e.Name, DType: e.DType, Count: e.Count(), Hash: hashes[i], MayDiffer: e.MayDiffer}
	}
	return d
}

// DigestVersion is the version byte that starts an encoded Digest.
const DigestVersion = 1

// ErrMalformed is returned by DecodeDigest for input that is not a canonical encoded Digest.
var ErrMalformed = errors.New("sharedstate: malformed digest")

// minEncodedEntry is the size of the smallest encoded entry: name length, one name byte, dtype,
// count, hash and flags.
const minEncodedEntry = 1 + 1 + 1 + 1 + 8 + 1

// flagMayDiffer is bit 0 of an entry's flags byte.
const flagMayDiffer = 1

// AppendDigest appends the binary encoding of d to dst and returns the extended slice. The layout is:
// version byte (DigestVersion), uvarint revision, uvarint entry count, then per entry a uvarint name
// length, the name bytes, a dtype byte, a uvarint element count, the hash as 8 bytes little-endian and a
// flags byte (bit 0: MayDiffer). Entries are written in the order given; DecodeDigest only accepts
// names in strictly increasing order, which State.Digest produces.
func AppendDigest(dst []byte, d Digest) []byte {
	dst = append(dst, DigestVersion)
	dst = binary.AppendUvarint(dst, d.Revision)
	dst = binary.AppendUvarint(dst, uint64(len(d.Entries)))
	for _, e := range d.Entries {
		dst = binary.AppendUvarint(dst, uint64(len(e.Name)))
		dst = append(dst, e.Name...)
		dst = append(dst, byte(e.DType))
		dst = binary.AppendUvarint(dst, e.Count)
		dst = binary.LittleEndian.AppendUint64(dst, e.Hash)
		var flags byte
		if e.MayDiffer {
			flags |= flagMayDiffer
		}
		dst = append(dst, flags)
	}
	return dst
}

// EncodeDigest returns the binary encoding of d (see AppendDigest).
func EncodeDigest(d Digest) []byte { return AppendDigest(nil, d) }

// DecodeDigest parses an encoded Digest. It accepts only canonical input: the known version, minimal
// varints, non-empty names of at most MaxNameLen bytes in strictly increasing order, valid dtypes, no
// unknown flag bits and no trailing bytes; anything else fails with ErrMalformed. The result does not
// alias b.
func DecodeDigest(b []byte) (Digest, error) {
	r := reader{b: b}
	if v := r.byte(); r.err == nil && v != DigestVersion {
		return Digest{}, fmt.Errorf("%w: version %d, want %d", ErrMalformed, v, DigestVersion)
	}
	var d Digest
	d.Revision = r.uvarint()
	n := r.uvarint()
	if r.err != nil {
		return Digest{}, r.err
	}
	if n > uint64(len(r.b)/minEncodedEntry) {
		return Digest{}, fmt.Errorf("%w: %d entries cannot fit in %d bytes", ErrMalformed, n, len(r.b))
	}
	if n > 0 {
		d.Entries = make([]EntryDigest, 0, n)
	}
	for i := range n {
		var e EntryDigest
		l := r.uvarint()
		if r.err == nil && (l == 0 || l > MaxNameLen) {
			return Digest{}, fmt.Errorf("%w: entry %d: name length %d", ErrMalformed, i, l)
		}
		e.Name = string(r.bytes(int(l)))
		e.DType = rings.DType(r.byte())
		e.Count = r.uvarint()
		e.Hash = r.uint64()
		flags := r.byte()
		if r.err != nil {
			return Digest{}, fmt.Errorf("entry %d: %w", i, r.err)
		}
		if !e.DType.Valid() {
			return Digest{}, fmt.Errorf("%w: entry %q: invalid dtype %d", ErrMalformed, e.Name, e.DType)
		}
		if e.Count > math.MaxInt64/uint64(e.DType.Size()) {
			return Digest{}, fmt.Errorf("%w: entry %q: %d elements overflow a size", ErrMalformed, e.Name, e.Count)
		}
		if flags&^flagMayDiffer != 0 {
			return Digest{}, fmt.Errorf("%w: entry %q: unknown flags %#x", ErrMalformed, e.Name, flags)
		}
		e.MayDiffer = flags&flagMayDiffer != 0
		if len(d.Entries) > 0 && d.Entries[len(d.Entries)-1].Name >= e.Name {
			return Digest{}, fmt.Errorf("%w: entry %q out of order", ErrMalformed, e.Name)
		}
		d.Entries = append(d.Entries, e)
	}
	if len(r.b) != 0 {
		return Digest{}, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, len(r.b))
	}
	return d, nil
}

// reader consumes an encoded digest; the first error sticks and later reads return zero values.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: truncated or bad %s", ErrMalformed, what)
	}
	r.b = nil
}

func (r *reader) byte() byte {
	if r.err != nil || len(r.b) < 1 {
		r.fail("byte")
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) uint64() uint64 {
	if r.err != nil || len(r.b) < 8 {
		r.fail("hash")
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

// uvarint reads a minimally encoded uvarint.
func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 || n != uvarintLen(v) {
		r.fail("varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil || len(r.b) < n {
		r.fail("name")
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// uvarintLen returns the length of the minimal uvarint encoding of v.
func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// sortedEntries returns a copy of es sorted by name.
func sortedEntries(es []EntryDigest) []EntryDigest {
	out := append([]EntryDigest(nil), es...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
