package wanemu

import (
	"errors"
	"testing"
)

// ipv4 builds an IPv4 header of ihl 32-bit words for proto from src to dst, followed by payload.
func ipv4(ihl int, proto byte, fragOffset uint16, payload ...byte) []byte {
	h := make([]byte, ihl*4)
	h[0] = 0x40 | byte(ihl)
	h[6], h[7] = byte(fragOffset>>8), byte(fragOffset)
	h[9] = proto
	copy(h[12:], []byte{198, 18, 0, 1})
	copy(h[16:], []byte{198, 18, 0, 2})
	return append(h, payload...)
}

func TestParsePacket(t *testing.T) {
	src, dst := [4]byte{198, 18, 0, 1}, [4]byte{198, 18, 0, 2}
	ports := []byte{0x12, 0x34, 0x00, 0x50}
	cases := []struct {
		name string
		b    []byte
		want flowKey
		err  error
	}{
		{"tcp", ipv4(5, protoTCP, 0, ports...), flowKey{src, dst, 0x1234, 80, protoTCP}, nil},
		{"udp with options", ipv4(6, protoUDP, 0, ports...), flowKey{src, dst, 0x1234, 80, protoUDP}, nil},
		{"icmp has no ports", ipv4(5, 1, 0, ports...), flowKey{src, dst, 0, 0, 1}, nil},
		{"later fragment has no ports", ipv4(5, protoTCP, 0x2000|185, 1, 2), flowKey{src, dst, 0, 0, protoTCP}, nil},
		{"empty", nil, flowKey{}, errNotIPv4},
		{"ipv6", []byte{0x60, 0, 0, 0}, flowKey{}, errNotIPv4},
		{"short header", ipv4(5, protoTCP, 0)[:19], flowKey{}, errTruncated},
		{"ihl below 5", append([]byte{0x44}, make([]byte, 30)...), flowKey{}, errTruncated},
		{"ports cut off", ipv4(5, protoUDP, 0, 1, 2, 3), flowKey{}, errTruncated},
	}
	for _, c := range cases {
		got, err := parsePacket(c.b)
		if !errors.Is(err, c.err) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.err)
			continue
		}
		if err == nil && got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func FuzzParsePacket(f *testing.F) {
	f.Add(ipv4(5, protoTCP, 0, 1, 2, 3, 4))
	f.Add(ipv4(15, protoUDP, 0, 1, 2, 3, 4))
	f.Add([]byte{0x45})
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := parsePacket(b)
		if err != nil {
			if !errors.Is(err, errNotIPv4) && !errors.Is(err, errTruncated) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if b[0]>>4 != 4 || len(b) < 20 {
			t.Fatalf("accepted a packet that is not IPv4 or shorter than a header: % x", b)
		}
		if [4]byte(b[12:16]) != k.src || [4]byte(b[16:20]) != k.dst || b[9] != k.proto {
			t.Fatalf("key %+v does not match the header % x", k, b[:20])
		}
	})
}
