package wanemu

import (
	"fmt"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// tunName is the name of the TUN device in every site's namespace.
const tunName = "wan0"

// tunTxQueue is the length of the TUN device's transmit queue, in packets: what the kernel holds
// while the forwarder is busy. It is larger than the default so that a burst does not overflow it
// before the forwarder's own queues, which do the shaping, see it.
const tunTxQueue = 4096

// openTUN creates the TUN device of a site inside ns, gives it addr with the testbed's prefix length
// (so every other site is routed through it), brings it and the loopback device up, and returns the
// device's file. Reads yield one IPv4 packet each; writes inject one. With offload, each packet
// comes after a virtio-net header of vnetHdrLen bytes, and may be a segment of up to 64 KiB.
// vnetHdrLen is the length of the virtio-net header in front of every packet of a device opened with
// offload: flags, GSO type, header length, segment size, checksum start and offset.
const vnetHdrLen = 10

// maxOffloadPacket is the largest packet a device with offload reads or writes, header included.
const maxOffloadPacket = vnetHdrLen + 65535

func openTUN(ns *Netns, addr netip.Prefix, mtu int, offload bool) (*os.File, error) {
	var fd int
	err := ns.Do(func() (err error) {
		fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		if err := configureTUN(fd, addr, mtu, offload); err != nil {
			unix.Close(fd)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("wanemu: namespace %s: %w", ns.name, err)
	}
	// The descriptor is non-blocking, so the file is pollable and Close interrupts a pending Read.
	return os.NewFile(uintptr(fd), ns.name+"/"+tunName), nil
}

// configureTUN runs on a thread inside the site's namespace.
func configureTUN(fd int, addr netip.Prefix, mtu int, offload bool) error {
	ifr, err := unix.NewIfreq(tunName)
	if err != nil {
		return err
	}
	flags := uint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if offload {
		flags |= unix.IFF_VNET_HDR
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fmt.Errorf("create TUN device: %w", err)
	}
	if offload {
		// Partial checksums and TCP segments of both families; UDP segments where the kernel has
		// them (6.2 and later).
		tcp := unix.TUN_F_CSUM | unix.TUN_F_TSO4 | unix.TUN_F_TSO6
		if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, tcp|unix.TUN_F_USO4|unix.TUN_F_USO6); err != nil {
			if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, tcp); err != nil {
				return fmt.Errorf("set offloads of %s: %w", tunName, err)
			}
		}
	}
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(s)
	ip := addr.Addr().As4()
	mask := netip.PrefixFrom(netip.AddrFrom4([4]byte{255, 255, 255, 255}), addr.Bits()).Masked().Addr().As4()
	// IPv6 would only add router solicitations to the traffic; the file is absent without IPv6.
	if f, err := os.OpenFile("/proc/sys/net/ipv6/conf/"+tunName+"/disable_ipv6", os.O_WRONLY, 0); err == nil {
		f.WriteString("1")
		f.Close()
	}
	steps := []struct {
		what string
		req  uint
		set  func(*unix.Ifreq) error
	}{
		{"address", unix.SIOCSIFADDR, func(r *unix.Ifreq) error { return r.SetInet4Addr(ip[:]) }},
		{"netmask", unix.SIOCSIFNETMASK, func(r *unix.Ifreq) error { return r.SetInet4Addr(mask[:]) }},
		{"MTU", unix.SIOCSIFMTU, func(r *unix.Ifreq) error { r.SetUint32(uint32(mtu)); return nil }},
		{"queue length", unix.SIOCSIFTXQLEN, func(r *unix.Ifreq) error { r.SetUint32(tunTxQueue); return nil }},
	}
	for _, st := range steps {
		r, _ := unix.NewIfreq(tunName)
		if err := st.set(r); err != nil {
			return fmt.Errorf("set %s of %s: %w", st.what, tunName, err)
		}
		if err := unix.IoctlIfreq(s, st.req, r); err != nil {
			return fmt.Errorf("set %s of %s: %w", st.what, tunName, err)
		}
	}
	for _, dev := range []string{"lo", tunName} {
		if err := linkUp(s, dev); err != nil {
			return err
		}
	}
	return nil
}

func linkUp(s int, dev string) error {
	r, err := unix.NewIfreq(dev)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, r); err != nil {
		return fmt.Errorf("read flags of %s: %w", dev, err)
	}
	r.SetUint16(r.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, r); err != nil {
		return fmt.Errorf("bring %s up: %w", dev, err)
	}
	return nil
}
