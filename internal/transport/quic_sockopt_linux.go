package transport

import (
	"log/slog"
	"net"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Warnings about small socket buffers are logged once per process and direction.
var rcvbufWarning, sndbufWarning sync.Once

// setUDPBuffers asks for size bytes of receive and send buffer on c, forcing past the sysctl limits
// where the process may (CAP_NET_ADMIN), and logs once per process when the kernel grants less.
func setUDPBuffers(c *net.UDPConn, size int, log *slog.Logger) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	set := func(opt, force int, sysctl string, once *sync.Once) {
		var got int
		rc.Control(func(fd uintptr) {
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, size)
			got, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, opt)
			if got < size {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, force, size)
				got, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, opt)
			}
		})
		if got < size {
			once.Do(func() {
				log.Warn("quic: the kernel limits the UDP socket buffer; long fat pipes will lose packets and throughput",
					"wanted_bytes", size, "got_bytes", got, "fix", "sysctl -w "+sysctl+"="+strconv.Itoa(size))
			})
		}
	}
	set(unix.SO_RCVBUF, unix.SO_RCVBUFFORCE, "net.core.rmem_max", &rcvbufWarning)
	set(unix.SO_SNDBUF, unix.SO_SNDBUFFORCE, "net.core.wmem_max", &sndbufWarning)
}

// setRecvErr turns IP_RECVERR (IPV6_RECVERR) on or off on c, whose peer has address ip. With it on,
// an ICMP error such as port unreachable makes the socket's next read fail (ECONNREFUSED), which
// quic-go reports as the end of the transport.
func setRecvErr(c *net.UDPConn, ip net.IP, on bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	v := 0
	if on {
		v = 1
	}
	rc.Control(func(fd uintptr) {
		if ip.To4() != nil {
			unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVERR, v)
		} else {
			unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVERR, v)
		}
	})
}
