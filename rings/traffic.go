package rings

import "fmt"

// Traffic is what one rank sends during a ring collective.
type Traffic struct {
	// Frames is the number of frames, one per call of Stream.Send.
	Frames int
	// Bytes is the total payload of those frames, quantization headers included; the framing that a
	// Stream adds to each frame is not.
	Bytes int64
}

// OnWire returns the bytes on the wire when the Stream adds perFrame bytes of framing (frame header,
// identifiers, lengths) to every frame.
func (t Traffic) OnWire(perFrame int) int64 { return t.Bytes + int64(t.Frames)*int64(perFrame) }

// SentTraffic returns what rank sends in a ring collective of kind k over world peers, on count
// elements of type dt, with opt (opt.PartBytes and opt.Quant shape the frames; the other fields do not
// matter). It follows the schedule of AllReduce, ReduceScatter and AllGather frame by frame, so a
// Stream that counts what it is given sees exactly these numbers. The ranks of a ring send nearly the
// same amount: they differ only by the uneven chunk sizes of Partition and the headers of their parts.
//
// With W peers an AllReduce sends each rank about 2(W-1)/W of the buffer, so the ratio between two
// encodings depends on the element type, the encoding and the part size only: for F32 with
// MinMaxU8Both and parts of at least a few KiB it is close to 1/4 (a part of n elements takes 8+n bytes
// instead of 4n). Invalid arguments yield an error wrapping ErrInvalid.
func SentTraffic(k Kind, count int, dt DType, rank, world int, opt Options) (Traffic, error) {
	if err := opt.Validate(); err != nil {
		return Traffic{}, err
	}
	switch {
	case !k.Valid():
		return Traffic{}, fmt.Errorf("%w: kind %v", ErrInvalid, k)
	case !dt.Valid():
		return Traffic{}, fmt.Errorf("%w: dtype %v", ErrInvalid, dt)
	case count < 0:
		return Traffic{}, fmt.Errorf("%w: count %d", ErrInvalid, count)
	case world < 1 || rank < 0 || rank >= world:
		return Traffic{}, fmt.Errorf("%w: rank %d of world %d", ErrInvalid, rank, world)
	case !opt.Quant.Supports(dt):
		return Traffic{}, fmt.Errorf("%w: quantization %v does not support %v", ErrInvalid, opt.Quant, dt)
	case k == KindReduceScatter && opt.Quant != NoQuant && !opt.Quant.BothPhases():
		return Traffic{}, fmt.Errorf("%w: %v encodes only an all-gather", ErrInvalid, opt.Quant)
	}
	first, last := 0, 2*world-3
	switch k {
	case KindReduceScatter:
		last = world - 2
	case KindAllGather:
		first = world - 1
	}
	chunks := Partition(count, world)
	pe := partElems(opt.PartBytes, dt.Size())
	var t Traffic
	for step := first; step <= last; step++ {
		q := opt.Quant
		if step < world-1 && !q.BothPhases() {
			q = NoQuant
		}
		n := chunks[sendChunk(rank, world, step)].Len
		for off := 0; off < n; off += pe {
			t.Frames++
			t.Bytes += int64(QuantizedLen(dt, q, min(pe, n-off)))
		}
	}
	return t, nil
}
