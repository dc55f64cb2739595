// Package golden runs scripted scenario tests: each script in testdata is played through the package's
// pure state machine, and what the machine did is compared with the golden file next to the script.
// The peer machine (pccl), the master (pccl/master) and the intra-site failover (rdma) share it.
//
// Run a package's tests with -update to rewrite its golden files after checking the new output.
package golden

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files of the scenario tests")

// Run plays every script that pattern matches (such as "testdata/*.txt") through play, one subtest
// per script named after its file, and compares play's output with the script's golden file (the
// same path ending in .golden), or writes the golden file with -update. It fails when no script
// matches.
func Run(t *testing.T, pattern string, play func(t *testing.T, script string) string) {
	t.Helper()
	scripts, err := filepath.Glob(pattern)
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scenarios match %s: %v", pattern, err)
	}
	for _, script := range scripts {
		name := strings.TrimSuffix(filepath.Base(script), filepath.Ext(script))
		t.Run(name, func(t *testing.T) {
			got := play(t, script)
			file := strings.TrimSuffix(script, filepath.Ext(script)) + ".golden"
			if *update {
				if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("output differs from %s (run with -update after checking):\n%s", file, Diff(string(want), got))
			}
		})
	}
}

// Diff names the first line where got differs from want, with both versions of it; "" if they are
// equal.
func Diff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(w) || i < len(g); i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			return fmt.Sprintf("line %d:\nwant: %s\ngot:  %s", i+1, a, b)
		}
	}
	return ""
}
