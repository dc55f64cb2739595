package wanemu

import "errors"

// flowKey names one flow on a directed link: its protocol and the source and destination address and
// port. Packets without ports (ICMP, fragments after the first) have zero ports.
type flowKey struct {
	src, dst     [4]byte
	sport, dport uint16
	proto        uint8
}

const (
	protoTCP = 6
	protoUDP = 17
)

// Errors of [parsePacket].
var (
	errNotIPv4   = errors.New("wanemu: not an IPv4 packet")
	errTruncated = errors.New("wanemu: truncated IPv4 packet")
)

// parsePacket reads the flow of the IPv4 packet b, as a TUN device without packet information
// yields it. It checks only what it reads: the version, the header length and, for TCP and UDP
// packets that are not later fragments, that the ports are present.
func parsePacket(b []byte) (flowKey, error) {
	var k flowKey
	if len(b) < 1 || b[0]>>4 != 4 {
		return k, errNotIPv4
	}
	ihl := int(b[0]&0x0f) * 4
	if ihl < 20 || len(b) < ihl {
		return k, errTruncated
	}
	k.proto = b[9]
	copy(k.src[:], b[12:16])
	copy(k.dst[:], b[16:20])
	fragOffset := (uint16(b[6])<<8 | uint16(b[7])) & 0x1fff
	if (k.proto == protoTCP || k.proto == protoUDP) && fragOffset == 0 {
		if len(b) < ihl+4 {
			return k, errTruncated
		}
		k.sport = uint16(b[ihl])<<8 | uint16(b[ihl+1])
		k.dport = uint16(b[ihl+2])<<8 | uint16(b[ihl+3])
	}
	return k, nil
}
