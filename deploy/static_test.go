package deploy

import (
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestStaticBuild builds both commands as the Dockerfile does (CGO_ENABLED=0, -trimpath, stripped)
// and checks that they are static executables, which an empty image base (FROM scratch) needs: no
// program interpreter, no dynamic section, no shared library. Each then runs --help.
func TestStaticBuild(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the image is linux; this checks ELF executables")
	}
	if testing.Short() {
		t.Skip("builds both commands; skipped with -short")
	}
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command on PATH: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	build := exec.CommandContext(ctx, gotool, "build", "-trimpath", "-ldflags=-s -w", "-o", dir+string(filepath.Separator),
		"../cmd/master", "../cmd/peer")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", build, err, out)
	}

	for _, bin := range []string{"master", "peer"} {
		f, err := elf.Open(filepath.Join(dir, bin))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("%s has a %v program header: dynamically linked", bin, p.Type)
			}
		}
		if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
			t.Errorf("%s needs shared libraries %v (%v)", bin, libs, err)
		}
		f.Close()
	}

	for _, args := range [][]string{{"master", "--help"}, {"peer", "--help"}, {"peer", "train", "--help"}, {"peer", "run", "--help"}} {
		run := exec.CommandContext(ctx, filepath.Join(dir, args[0]), args[1:]...)
		run.Env = []string{} // nothing from this environment, as in an empty image
		out, err := run.CombinedOutput()
		want := "NAME:\n   " + strings.Join(args[:len(args)-1], " ") + " - "
		if err != nil || !strings.Contains(string(out), want) {
			t.Errorf("%s: %v, output does not contain %q:\n%s", strings.Join(args, " "), err, want, out)
		}
	}
}
