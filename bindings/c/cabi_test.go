package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// libDir holds the libpccl.so that the tests of this package build once.
var lib struct {
	once sync.Once
	dir  string
	err  error
	out  []byte
}

func TestMain(m *testing.M) {
	code := m.Run()
	if lib.dir != "" {
		os.RemoveAll(lib.dir)
	}
	os.Exit(code)
}

// buildLib builds libpccl.so once for the package's tests and returns its directory. It skips the
// test without a C compiler or with -short.
func buildLib(t *testing.T) (dir, cc string) {
	t.Helper()
	cc, err := exec.LookPath(envOr("CC", "cc"))
	if err != nil {
		t.Skip("no C compiler (cc) on PATH: the C ABI tests need one")
	}
	if testing.Short() {
		t.Skip("builds a shared library and runs processes; skipped with -short")
	}
	lib.once.Do(func() {
		lib.dir, lib.err = os.MkdirTemp("", "concord-cabi-")
		if lib.err != nil {
			return
		}
		build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-buildmode=c-shared", "-o", filepath.Join(lib.dir, "libpccl.so"), ".")
		lib.out, lib.err = build.CombinedOutput()
	})
	if lib.err != nil {
		t.Fatalf("go build -buildmode=c-shared: %v\n%s", lib.err, lib.out)
	}
	return lib.dir, cc
}

// compile builds the C program src against pccl.h and the library, or returns "" (logged) when the
// compiler refuses.
func compile(t *testing.T, ctx context.Context, cc, dir, src, name string, extra ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	args := append([]string{"-std=c99", "-Wall", "-Wextra", "-Werror", "-I.", "-o", bin, src}, extra...)
	args = append(args, "-L"+dir, "-lpccl", "-Wl,-rpath,"+dir)
	if out, err := exec.CommandContext(ctx, cc, args...).CombinedOutput(); err != nil {
		t.Logf("cc %s: %v\n%s", strings.Join(args, " "), err, out)
		return ""
	}
	return bin
}

// runPass runs bin with args and env and fails unless it exits 0 and prints PASS.
func runPass(t *testing.T, ctx context.Context, bin string, args []string, env ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "PASS") {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
}

// TestCProgram compiles test/pccl_test.c against pccl.h with cc and runs it: a master and three
// peer processes through PCCL's C API, one peer killed in the middle of an all-reduce. It runs a
// second time compiled with AddressSanitizer when cc supports it.
func TestCProgram(t *testing.T) {
	dir, cc := buildLib(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	plain := compile(t, ctx, cc, dir, "test/pccl_test.c", "pccl_test")
	if plain == "" {
		t.Fatal("pccl_test.c does not compile against pccl.h")
	}
	runPass(t, ctx, plain, nil)
	// The same program over QUIC, authenticated with a run secret, through Concord's additions.
	runPass(t, ctx, plain, nil, "CONCORD_TEST_TRANSPORT=quic", "CONCORD_TEST_SECRET=a run secret of the C test, long enough")

	asan := compile(t, ctx, cc, dir, "test/pccl_test.c", "pccl_test_asan", "-g", "-fsanitize=address", "-fno-omit-frame-pointer")
	if asan == "" {
		t.Log("cc cannot build with -fsanitize=address here; the AddressSanitizer run is skipped")
		return
	}
	runPass(t, ctx, asan, nil, "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0")
}

// TestDropIn runs test/drop_in_test.c's scenarios: a retry never admits a peer waiting in
// pcclConnect; crossed shared states end as one of them, with the bytes counted; a peer stopped for
// 10 s is kept under the default timing; the master's result codes.
func TestDropIn(t *testing.T) {
	dir, cc := buildLib(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bin := compile(t, ctx, cc, dir, "test/drop_in_test.c", "drop_in_test")
	if bin == "" {
		t.Fatal("drop_in_test.c does not compile against pccl.h")
	}
	for _, scenario := range []string{"codes", "crossed", "admit", "pause"} {
		t.Run(scenario, func(t *testing.T) { runPass(t, ctx, bin, []string{scenario}) })
	}
}

// TestConcordAdditions runs test/concord_test.c's scenarios, one per addition of Concord's own: a
// peer stopped under the patient default timing is kicked by the gossip verdict and rejoins by
// itself; concordRejoin gives up in one line on a wrong secret and after its timeout on a silent
// address; the contribution guard kicks an out-of-line contribution; both-phase quantization; two peer
// groups on one master.
func TestConcordAdditions(t *testing.T) {
	dir, cc := buildLib(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bin := compile(t, ctx, cc, dir, "test/concord_test.c", "concord_test", "-lm")
	if bin == "" {
		t.Fatal("concord_test.c does not compile against pccl.h")
	}
	for _, scenario := range []string{"quant", "group", "guard", "refused", "gossip"} {
		t.Run(scenario, func(t *testing.T) { runPass(t, ctx, bin, []string{scenario}) })
	}
}

// TestPCCLHeaders compiles a C++ translation unit written like PCCL's own C++ tests (it includes
// <ccoip.h> and <pccl.h> and uses CCOIP_PROTOCOL_PORT_MASTER in designated initializers) with
// -I bindings/c alone and links it against the library, and checks that ccoip.h is C99 as well.
func TestPCCLHeaders(t *testing.T) {
	dir, cc := buildLib(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cxx, err := exec.LookPath(envOr("CXX", "c++"))
	if err != nil {
		t.Skip("no C++ compiler (c++) on PATH")
	}
	out := filepath.Join(t.TempDir(), "pccl_includes")
	args := []string{"-std=c++20", "-Wall", "-Werror", "-I", ".", "-o", out, "test/pccl_includes.cpp",
		"-L" + dir, "-lpccl", "-Wl,-rpath," + dir}
	if b, err := exec.CommandContext(ctx, cxx, args...).CombinedOutput(); err != nil {
		t.Fatalf("c++ %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	if b, err := exec.CommandContext(ctx, out).CombinedOutput(); err != nil || !strings.Contains(string(b), "PASS") {
		t.Fatalf("pccl_includes: %v\n%s", err, b)
	}
	c99 := []string{"-std=c99", "-pedantic-errors", "-Wall", "-Wextra", "-Werror", "-I", ".", "-fsyntax-only", "-x", "c", "-"}
	cmd := exec.CommandContext(ctx, cc, c99...)
	cmd.Stdin = strings.NewReader("#include <ccoip.h>\n#include <pccl.h>\nint port = CCOIP_PROTOCOL_PORT_MASTER;\n")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cc %s: %v\n%s", strings.Join(c99, " "), err, b)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
