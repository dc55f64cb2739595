package transport

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawConn returns the socket of the net package that c is or wraps (a SocketWrapper), with its
// descriptor access, when the build allows raw calls. Such a socket's descriptor is non-blocking, so
// a raw call never sleeps.
func rawConn(c net.Conn) (net.Conn, syscall.RawConn, bool) {
	if raceEnabled {
		return nil, nil, false
	}
	if w, ok := c.(SocketWrapper); ok {
		c = w.Socket()
	}
	var sc syscall.Conn
	switch c := c.(type) {
	case *net.TCPConn:
		sc = c
	case *net.UnixConn:
		sc = c
	default:
		return nil, nil, false
	}
	rc, err := sc.SyscallConn()
	return c, rc, err == nil
}

// rawCall makes the system call trap(fd, p, n) as a raw call, again if a signal interrupted it, and
// returns its result and error number. p stays a pointer up to the call expression of RawSyscall,
// where the conversion keeps its memory alive and in place through the call.
func rawCall(trap, fd uintptr, p unsafe.Pointer, n int) (uintptr, syscall.Errno) {
	for {
		r, _, errno := unix.RawSyscall(trap, fd, uintptr(p), uintptr(n))
		if errno != unix.EINTR {
			return r, errno
		}
	}
}

// rawReadFull is ReadFull on rc, c's descriptor.
func rawReadFull(c net.Conn, rc syscall.RawConn, b []byte) (int, error) {
	n := 0
	var callErr error
	read := func(fd uintptr) bool {
		for n < len(b) {
			k := min(len(b)-n, rawMax)
			r, errno := rawCall(unix.SYS_READ, fd, unsafe.Pointer(&b[n]), k)
			if errno == unix.EAGAIN {
				return false // wait until readable, then call again
			} else if errno != 0 {
				callErr = opError(c, "read", errno)
				return true
			}
			if r == 0 {
				callErr = io.ErrUnexpectedEOF
				if n == 0 {
					callErr = io.EOF
				}
				return true
			}
			n += int(r)
		}
		return true
	}
	if len(b) == 0 {
		return 0, nil // as io.ReadFull: no call at all
	}
	// RawConn.Read calls read again each time the descriptor turns readable, until read returns
	// true: once b is full or a call failed.
	if err := rc.Read(read); err != nil {
		return n, err
	}
	return n, callErr
}

// rawIovecs bounds the buffers one writev call takes.
const rawIovecs = 16

// rawWriteBuffers is WriteBuffers on rc, c's descriptor.
func rawWriteBuffers(c net.Conn, rc syscall.RawConn, bufs *net.Buffers) (int64, error) {
	var written int64
	var callErr error
	var iov [rawIovecs]unix.Iovec
	write := func(fd uintptr) bool {
		for {
			k, total := 0, 0
			for _, b := range *bufs {
				if k == len(iov) || total == rawMax {
					break
				}
				if len(b) == 0 {
					continue
				}
				m := min(len(b), rawMax-total)
				iov[k].Base = &b[0]
				iov[k].SetLen(m)
				k++
				total += m
			}
			if k == 0 {
				return true
			}
			r, errno := rawCall(unix.SYS_WRITEV, fd, unsafe.Pointer(&iov[0]), k)
			if errno == unix.EAGAIN {
				return false // wait until writable, then call again
			} else if errno != 0 {
				callErr = opError(c, "write", errno)
				return true
			}
			if r == 0 {
				callErr = io.ErrShortWrite // a socket never takes nothing without saying why
				return true
			}
			written += int64(r)
			consume(bufs, int(r))
		}
	}
	if !buffered(*bufs) {
		return 0, nil // as net.Buffers.WriteTo: nothing to write
	}
	// RawConn.Write calls write again each time the descriptor turns writable, until write
	// returns true: once every byte is written or a call failed.
	if err := rc.Write(write); err != nil {
		return written, err
	}
	return written, callErr
}

// consume drops the first n bytes of *bufs, as net.Buffers' own writes do.
func consume(bufs *net.Buffers, n int) {
	for len(*bufs) > 0 {
		b := (*bufs)[0]
		if n < len(b) {
			(*bufs)[0] = b[n:]
			return
		}
		n -= len(b)
		(*bufs)[0] = nil
		*bufs = (*bufs)[1:]
	}
}

// buffered reports whether bufs holds any byte.
func buffered(bufs net.Buffers) bool {
	for _, b := range bufs {
		if len(b) > 0 {
			return true
		}
	}
	return false
}

// opError wraps the error number of a failed call on c as the net package would.
func opError(c net.Conn, op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(),
		Err: os.NewSyscallError(op, errno)}
}
