package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunPrintsJSONAndPlots(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	args := []string{"--servers", "8", "--gpus", "8", "--failures", "1-3", "--patterns", "4", "--out", dir}
	if err := run(args, &out, &errb); err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var rep report
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
		t.Fatalf("last line is not the JSON report: %v", err)
	}
	if math.Abs(rep.Crossover.Diff) > 1e-12 || math.Abs(rep.Crossover.Testbed.Diff) > 1e-12 {
		t.Errorf("crossover differs from ng/(3ng-2): %+v", rep.Crossover)
	}
	if len(rep.Training.Variants) != len(trainingVariants) {
		t.Fatalf("%d training variants", len(rep.Training.Variants))
	}
	for _, v := range rep.Training.Variants {
		if len(v.PerK) != 3 {
			t.Errorf("%s: %d failure counts, want 3", v.Name, len(v.PerK))
		}
		for _, st := range v.PerK {
			if len(st.Patterns) != 4 {
				t.Errorf("%s k=%d: %d patterns", v.Name, st.Failures, len(st.Patterns))
			}
			for _, p := range st.Patterns {
				if len(p.Failed) != st.Failures || p.VsFF < 1 || p.VsIdeal < 1-1e-9 || p.OverheadPct < 0 {
					t.Errorf("%s k=%d: bad pattern %+v", v.Name, st.Failures, p)
				}
			}
		}
	}
	for _, c := range rep.Retention.Curves {
		for i, x := range c.Retention {
			if !(x > 0 && x <= 1+1e-12) || math.Abs(x*c.VsFF[i]-1) > 1e-9 {
				t.Errorf("%s size %d: retention %v, vs_fault_free %v", c.Name, rep.Retention.Sizes[i], x, c.VsFF[i])
			}
		}
	}
	for _, f := range []string{"crossover.png", "retention.png", "training_overhead.png"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
			t.Errorf("%s: not a PNG (%v)", f, err)
		}
	}
}

func TestRunIsDeterministic(t *testing.T) {
	var a, b bytes.Buffer
	args := []string{"--servers", "4", "--gpus", "4", "--failures", "2", "--patterns", "3", "--plots=false"}
	if err := run(args, &a, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if err := run(args, &b, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var ra, rb report
	if err := json.Unmarshal(a.Bytes(), &ra); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b.Bytes(), &rb); err != nil {
		t.Fatal(err)
	}
	ja, _ := json.Marshal(ra.Training)
	jb, _ := json.Marshal(rb.Training)
	if !bytes.Equal(ja, jb) {
		t.Error("two runs with the same seed differ")
	}
}

func TestParseRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--failures", "5-2"},
		{"--failures", "x"},
		{"--servers", "1"},
		{"--patterns", "0"},
		{"--servers", "2", "--gpus", "2", "--failures", "1-3"},
	} {
		if _, err := parse(args, &bytes.Buffer{}); err == nil {
			t.Errorf("parse(%v) accepted", args)
		}
	}
}
