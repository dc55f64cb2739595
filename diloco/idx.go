package diloco

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
)

// ErrMalformedIDX is returned (wrapped, with the details) when an IDX file
// cannot be parsed: a bad magic number, an unknown element type, a size that
// overflows, truncated or trailing data, or a corrupt gzip stream.
var ErrMalformedIDX = errors.New("diloco: malformed IDX file")

// MaxIDXBytes is the largest payload, in bytes, that ReadIDX accepts. It is far
// above the 47 MB of the largest Fashion-MNIST file and protects the reader from
// headers that announce absurd sizes.
const MaxIDXBytes = 1 << 31

// IDX element types, the third byte of an IDX file's magic number.
const (
	IDXUint8   byte = 0x08
	IDXInt8    byte = 0x09
	IDXInt16   byte = 0x0B
	IDXInt32   byte = 0x0C
	IDXFloat32 byte = 0x0D
	IDXFloat64 byte = 0x0E
)

// idxElemSize gives the size in bytes of one element of each IDX type, or 0 for
// an unknown type.
func idxElemSize(t byte) int {
	switch t {
	case IDXUint8, IDXInt8:
		return 1
	case IDXInt16:
		return 2
	case IDXInt32, IDXFloat32:
		return 4
	case IDXFloat64:
		return 8
	}
	return 0
}

// IDX is one decoded IDX file: an n-dimensional array of elements of one type.
type IDX struct {
	// Type is the element type, one of the IDX* constants.
	Type byte
	// Dims holds the size of each dimension, outermost first.
	Dims []int
	// Data holds the elements in row-major order exactly as stored in the
	// file (multi-byte elements are big-endian).
	Data []byte
}

// ReadIDX decodes an IDX file from r. The input may be raw or gzip-compressed;
// gzip is recognised by its magic bytes. Every failure to parse wraps
// ErrMalformedIDX; errors of the underlying reader are wrapped as they are.
func ReadIDX(r io.Reader) (*IDX, error) {
	br := bufio.NewReader(r)
	if head, err := br.Peek(2); err == nil && head[0] == 0x1f && head[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: gzip header: %w", ErrMalformedIDX, err)
		}
		defer zr.Close()
		zr.Multistream(false)
		out, err := readIDX(zr)
		if err != nil {
			if !errors.Is(err, ErrMalformedIDX) && isGzipError(err) {
				return nil, fmt.Errorf("%w: gzip: %w", ErrMalformedIDX, err)
			}
			return nil, err
		}
		return out, nil
	}
	return readIDX(br)
}

// isGzipError reports whether err comes from a corrupt compressed stream.
func isGzipError(err error) bool {
	var corrupt flate.CorruptInputError
	return errors.Is(err, gzip.ErrChecksum) || errors.Is(err, gzip.ErrHeader) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &corrupt)
}

// readIDX decodes an uncompressed IDX stream.
func readIDX(r io.Reader) (*IDX, error) {
	var magic [4]byte
	if _, err := io.ReadFull(r, magic[:]); err != nil {
		return nil, truncated("magic number", err)
	}
	if magic[0] != 0 || magic[1] != 0 {
		return nil, fmt.Errorf("%w: bad magic %#x", ErrMalformedIDX, binary.BigEndian.Uint32(magic[:]))
	}
	elem := idxElemSize(magic[2])
	if elem == 0 {
		return nil, fmt.Errorf("%w: unknown element type %#02x", ErrMalformedIDX, magic[2])
	}
	ndims := int(magic[3])
	if ndims == 0 {
		return nil, fmt.Errorf("%w: zero dimensions", ErrMalformedIDX)
	}
	raw := make([]byte, 4*ndims)
	if _, err := io.ReadFull(r, raw); err != nil {
		return nil, truncated("dimensions", err)
	}
	dims := make([]int, ndims)
	size := uint64(elem)
	for i := range dims {
		d := binary.BigEndian.Uint32(raw[4*i:])
		if d > MaxIDXBytes {
			return nil, fmt.Errorf("%w: dimension %d is %d", ErrMalformedIDX, i, d)
		}
		dims[i] = int(d)
		if d != 0 && size > MaxIDXBytes/uint64(d) {
			return nil, fmt.Errorf("%w: dimensions %v... exceed %d bytes", ErrMalformedIDX, dims[:i+1], uint64(MaxIDXBytes))
		}
		size *= uint64(d)
	}
	// Read through a limit one byte past the announced size: memory then grows
	// with the data actually present, not with what the header claims.
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(r, int64(size)+1)); err != nil {
		return nil, fmt.Errorf("idx data: %w", err)
	}
	switch {
	case uint64(buf.Len()) < size:
		return nil, fmt.Errorf("%w: truncated data: want %d bytes, have %d", ErrMalformedIDX, size, buf.Len())
	case uint64(buf.Len()) > size:
		return nil, fmt.Errorf("%w: trailing bytes after %d bytes of data", ErrMalformedIDX, size)
	}
	return &IDX{Type: magic[2], Dims: dims, Data: buf.Bytes()}, nil
}

// truncated wraps a short read of part of the header.
func truncated(part string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated %s", ErrMalformedIDX, part)
	}
	return fmt.Errorf("idx %s: %w", part, err)
}

// ReadIDXFile decodes the IDX file at path (raw or gzip-compressed).
func ReadIDXFile(path string) (*IDX, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out, err := ReadIDX(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// WriteIDX encodes x as an uncompressed IDX stream to w.
func WriteIDX(w io.Writer, x *IDX) error {
	elem := idxElemSize(x.Type)
	if elem == 0 {
		return fmt.Errorf("%w: unknown element type %#02x", ErrMalformedIDX, x.Type)
	}
	if len(x.Dims) == 0 || len(x.Dims) > 255 {
		return fmt.Errorf("%w: %d dimensions", ErrMalformedIDX, len(x.Dims))
	}
	size := elem
	head := []byte{0, 0, x.Type, byte(len(x.Dims))}
	for _, d := range x.Dims {
		if d < 0 || d > 1<<32-1 {
			return fmt.Errorf("%w: dimension %d out of range", ErrMalformedIDX, d)
		}
		head = binary.BigEndian.AppendUint32(head, uint32(d))
		size *= d
	}
	if size != len(x.Data) {
		return fmt.Errorf("%w: dimensions %v need %d bytes, have %d", ErrMalformedIDX, x.Dims, size, len(x.Data))
	}
	if _, err := w.Write(head); err != nil {
		return err
	}
	_, err := w.Write(x.Data)
	return err
}
