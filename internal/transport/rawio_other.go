//go:build !linux

package transport

import (
	"errors"
	"net"
	"syscall"
)

// rawConn reports that no connection takes the raw path off Linux.
func rawConn(net.Conn) (net.Conn, syscall.RawConn, bool) { return nil, nil, false }

var errNoRawIO = errors.New("transport: raw socket I/O is Linux only")

func rawReadFull(net.Conn, syscall.RawConn, []byte) (int, error) { return 0, errNoRawIO }

func rawWriteBuffers(net.Conn, syscall.RawConn, *net.Buffers) (int64, error) { return 0, errNoRawIO }
