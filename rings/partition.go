package rings

// Span is a contiguous range of elements: Len elements starting at element Off.
type Span struct {
	Off, Len int
}

// Partition splits count elements into parts contiguous spans in order: span i holds
// count/parts elements, plus one if i < count%parts. Spans may be empty when count < parts. It panics if
// parts < 1 or count < 0.
func Partition(count, parts int) []Span {
	if parts < 1 || count < 0 {
		panic("rings: Partition needs count >= 0 and parts >= 1")
	}
	spans := make([]Span, parts)
	base, extra := count/parts, count%parts
	off := 0
	for i := range spans {
		n := base
		if i < extra {
			n++
		}
		spans[i] = Span{Off: off, Len: n}
		off += n
	}
	return spans
}
