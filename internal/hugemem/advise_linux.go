package hugemem

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// advise asks for huge pages on the whole 2 MiB pages inside b. A fresh large allocation is not
// touched yet, so the kernel backs each page with a huge page on its first fault; an error (huge
// pages disabled, an old kernel) leaves ordinary pages.
func advise(b []byte) {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := (p+pageSize-1)&^(pageSize-1) - p
	hi := (p+uintptr(len(b)))&^(pageSize-1) - p
	if hi > lo {
		_ = unix.Madvise(b[lo:hi], unix.MADV_HUGEPAGE)
	}
}
