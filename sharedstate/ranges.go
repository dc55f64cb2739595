package sharedstate

// Range is a byte range of an entry to fetch from one donor.
type Range struct {
	// Donor is the peer to fetch the range from.
	Donor string
	// Off is the offset of the first byte.
	Off int64
	// Len is the number of bytes.
	Len int64
}

// SplitRanges cuts size bytes into contiguous ranges, one per donor in the given order, so that the
// ranges can be fetched in parallel. It uses no more donors than keeps every range at least minPart
// bytes long (minPart < 1 counts as 1), and at least one donor while size > 0. The ranges cover [0,
// size) in order; their lengths differ by at most one byte, the longer ones first. It returns nil when
// size <= 0 or there is no donor.
func SplitRanges(size int64, donors []string, minPart int64) []Range {
	if size <= 0 || len(donors) == 0 {
		return nil
	}
	minPart = max(minPart, 1)
	parts := int64(len(donors))
	if most := size / minPart; most < parts {
		parts = max(most, 1)
	}
	base, extra := size/parts, size%parts
	out := make([]Range, parts)
	var off int64
	for i := range out {
		l := base
		if int64(i) < extra {
			l++
		}
		out[i] = Range{Donor: donors[i], Off: off, Len: l}
		off += l
	}
	return out
}
