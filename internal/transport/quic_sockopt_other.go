//go:build !linux

package transport

import (
	"log/slog"
	"net"
	"sync"
)

var bufWarning sync.Once

// setUDPBuffers asks for size bytes of receive and send buffer on c and logs once per process when
// the operating system refuses.
func setUDPBuffers(c *net.UDPConn, size int, log *slog.Logger) {
	err1 := c.SetReadBuffer(size)
	err2 := c.SetWriteBuffer(size)
	if err1 != nil || err2 != nil {
		bufWarning.Do(func() {
			log.Warn("quic: the operating system limits the UDP socket buffers (raise kern.ipc.maxsockbuf or its equivalent)",
				"wanted_bytes", size)
		})
	}
}

// setRecvErr does nothing where ICMP errors cannot be asked for: a dial to a closed port then fails
// only at the handshake timeout.
func setRecvErr(c *net.UDPConn, ip net.IP, on bool) {}
