package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestCProgram builds libpccl.so, compiles test/pccl_test.c against pccl.h with cc, and runs it: a
// master and three peer processes through PCCL's C API, one peer killed in the middle of an
// all-reduce. It runs a second time compiled with AddressSanitizer when cc supports it.
func TestCProgram(t *testing.T) {
	cc, err := exec.LookPath(envOr("CC", "cc"))
	if err != nil {
		t.Skip("no C compiler (cc) on PATH: the C ABI test needs one")
	}
	if testing.Short() {
		t.Skip("builds a shared library and runs four processes; skipped with -short")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	lib := filepath.Join(dir, "libpccl.so")
	build := exec.CommandContext(ctx, filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-buildmode=c-shared", "-o", lib, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -buildmode=c-shared: %v\n%s", err, out)
	}
	compile := func(name string, extra ...string) string {
		bin := filepath.Join(dir, name)
		args := append([]string{"-std=c99", "-Wall", "-Wextra", "-Werror", "-I.", "-o", bin, "test/pccl_test.c"}, extra...)
		args = append(args, "-L"+dir, "-lpccl", "-Wl,-rpath,"+dir)
		if out, err := exec.CommandContext(ctx, cc, args...).CombinedOutput(); err != nil {
			t.Logf("cc %s: %v\n%s", strings.Join(args, " "), err, out)
			return ""
		}
		return bin
	}
	run := func(bin string, env ...string) {
		cmd := exec.CommandContext(ctx, bin)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "PASS") {
			t.Fatalf("%s: %v\n%s", filepath.Base(bin), err, out)
		}
	}

	plain := compile("pccl_test")
	if plain == "" {
		t.Fatal("pccl_test.c does not compile against pccl.h")
	}
	run(plain)
	// The same program over QUIC, authenticated with a run secret, through Concord's additions.
	run(plain, "CONCORD_TEST_TRANSPORT=quic", "CONCORD_TEST_SECRET=a run secret of the C test, long enough")

	asan := compile("pccl_test_asan", "-g", "-fsanitize=address", "-fno-omit-frame-pointer")
	if asan == "" {
		t.Log("cc cannot build with -fsanitize=address here; the AddressSanitizer run is skipped")
		return
	}
	run(asan, "ASAN_OPTIONS=detect_leaks=1:abort_on_error=0")
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
