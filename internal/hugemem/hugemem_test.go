package hugemem

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

func TestMakeLengthsAndZeros(t *testing.T) {
	for _, c := range []struct{ n, c int }{{0, 0}, {10, 100}, {1 << 20, 1 << 20}, {Threshold, Threshold}, {5 << 20, 8 << 20}} {
		b := Make(c.n, c.c)
		if len(b) != c.n || cap(b) != c.c {
			t.Fatalf("Make(%d, %d): len %d cap %d", c.n, c.c, len(b), cap(b))
		}
		for i, v := range b[:cap(b)] {
			if v != 0 {
				t.Fatalf("Make(%d, %d): byte %d is %d", c.n, c.c, i, v)
			}
		}
	}
}

// TestMakeAdvisesHugePages reads the mapping that holds a large buffer in /proc/self/smaps: its
// flags must include "hg" (MADV_HUGEPAGE). It is skipped where the kernel has no transparent huge
// pages.
func TestMakeAdvisesHugePages(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("huge pages are asked for on Linux only")
	}
	if mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil || strings.Contains(string(mode), "[never]") {
		t.Skip("this kernel has no transparent huge pages enabled")
	}
	b := Make(16<<20, 16<<20)
	mid := uintptr(unsafe.Pointer(&b[8<<20]))
	flags, ok := vmFlags(t, mid)
	if !ok {
		t.Fatalf("no mapping in /proc/self/smaps holds %#x", mid)
	}
	if !strings.Contains(" "+flags+" ", " hg ") {
		t.Errorf("the buffer's mapping has flags %q, want hg (MADV_HUGEPAGE)", flags)
	}
	runtime.KeepAlive(b)
}

// vmFlags returns the VmFlags line of the mapping that contains addr.
func vmFlags(t *testing.T, addr uintptr) (string, bool) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Skipf("no /proc/self/smaps: %v", err)
	}
	defer f.Close()
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if fields := strings.Fields(line); len(fields) > 0 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			lo, hi, ok := strings.Cut(fields[0], "-")
			a, err1 := strconv.ParseUint(lo, 16, 64)
			z, err2 := strconv.ParseUint(hi, 16, 64)
			in = ok && err1 == nil && err2 == nil && uint64(addr) >= a && uint64(addr) < z
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "VmFlags:")), true
		}
	}
	return "", false
}
