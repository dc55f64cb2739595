package wanemu

import (
	"net"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sendGSO sends segs datagrams of seg bytes from c to dst in one system call, with UDP_SEGMENT
// (generic segmentation offload, as quic-go sends its batches).
func sendGSO(t *testing.T, c *net.UDPConn, dst netip.AddrPort, seg, segs int) {
	t.Helper()
	b := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&b[unix.CmsgLen(0)])) = uint16(seg)
	payload := make([]byte, seg*segs)
	if _, _, err := c.WriteMsgUDPAddrPort(payload, b, dst); err != nil {
		t.Fatalf("sendmsg with UDP_SEGMENT: %v", err)
	}
}

// TestOffloadCarriesUDPSegmentsWhole sends UDP datagrams in GSO batches: with offload the forwarder
// carries each batch as one packet, and the receiver still gets every datagram on its own.
func TestOffloadCarriesUDPSegmentsWhole(t *testing.T) {
	const seg, segs, batches = 1200, 20, 10
	tb := startTestbed(t, Config{Sites: 2, Offload: true, Link: Link{Delay: time.Millisecond}})
	rx, err := tb.Netns(1).ListenPacket("udp4", netip.AddrPortFrom(tb.Addr(1), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	txp, err := tb.Netns(0).ListenPacket("udp4", netip.AddrPortFrom(tb.Addr(0), 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer txp.Close()
	tx := txp.(*net.UDPConn)
	dst := netip.MustParseAddrPort(rx.LocalAddr().String())
	before := tb.Stats(0, 1)
	buf := make([]byte, 65536)
	// One batch at a time, read before the next, so that no socket buffer overflows.
	for b := range batches {
		sendGSO(t, tx, dst, seg, segs)
		rx.SetReadDeadline(time.Now().Add(5 * time.Second))
		for i := range segs {
			n, _, err := rx.ReadFrom(buf)
			if err != nil {
				t.Fatalf("batch %d, datagram %d of %d: %v", b, i, segs, err)
			}
			if n != seg {
				t.Fatalf("batch %d, datagram %d has %d bytes, want %d", b, i, n, seg)
			}
		}
	}
	s := tb.Stats(0, 1)
	if packets := s.Packets - before.Packets; packets != batches {
		t.Fatalf("the link carried %d packets for %d batches of %d datagrams", packets, batches, segs)
	}
}
