package wire

import (
	"encoding/binary"
	"fmt"
)

// DataHeaderSize is the size of a data frame header in bytes.
const DataHeaderSize = 40

// DataHeader is the fixed header of one data frame. Len bytes of payload follow it.
type DataHeader struct {
	Len   uint32
	Epoch uint64
	Tag   uint64
	Seq   uint64
	Step  uint32
	Part  uint32
}

// PutDataHeader encodes h into b, which must hold DataHeaderSize bytes. It does not allocate.
func PutDataHeader(b []byte, h DataHeader) {
	_ = b[DataHeaderSize-1]
	b[0], b[1], b[2], b[3] = byte(TypeData), 0, 0, 0
	binary.BigEndian.PutUint32(b[4:], h.Len)
	binary.BigEndian.PutUint64(b[8:], h.Epoch)
	binary.BigEndian.PutUint64(b[16:], h.Tag)
	binary.BigEndian.PutUint64(b[24:], h.Seq)
	binary.BigEndian.PutUint32(b[32:], h.Step)
	binary.BigEndian.PutUint32(b[36:], h.Part)
}

// DecodeDataHeader decodes a data frame header and checks its payload length against max.
func DecodeDataHeader(b []byte, max uint32) (DataHeader, error) {
	if len(b) != DataHeaderSize {
		return DataHeader{}, fmt.Errorf("%w: data header of %d bytes", ErrMalformed, len(b))
	}
	if Type(b[0]) != TypeData || b[1] != 0 || b[2] != 0 || b[3] != 0 {
		return DataHeader{}, fmt.Errorf("%w: not a data frame (type %d)", ErrMalformed, b[0])
	}
	h := DataHeader{
		Len:   binary.BigEndian.Uint32(b[4:]),
		Epoch: binary.BigEndian.Uint64(b[8:]),
		Tag:   binary.BigEndian.Uint64(b[16:]),
		Seq:   binary.BigEndian.Uint64(b[24:]),
		Step:  binary.BigEndian.Uint32(b[32:]),
		Part:  binary.BigEndian.Uint32(b[36:]),
	}
	if h.Len > max {
		return DataHeader{}, fmt.Errorf("%w: data payload %d bytes, limit %d", ErrTooLarge, h.Len, max)
	}
	return h, nil
}
