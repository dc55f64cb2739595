package atsp

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readInstance(t testing.TB, name string) *Instance {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name+".atsp"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	inst, err := ReadTSPLIB(f)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return inst
}

func TestReadTSPLIBBr17(t *testing.T) {
	inst := readInstance(t, "br17")
	if inst.Name != "br17" || inst.N != 17 || len(inst.Cost) != 17 {
		t.Fatalf("header: name %q n %d rows %d", inst.Name, inst.N, len(inst.Cost))
	}
	// First row of br17, which runs over two lines in the file.
	want := []float64{9999, 3, 5, 48, 48, 8, 8, 5, 5, 3, 3, 0, 3, 5, 8, 8, 5}
	for j, v := range want {
		if inst.Cost[0][j] != v {
			t.Fatalf("cost[0][%d] = %v, want %v", j, inst.Cost[0][j], v)
		}
	}
	for _, obj := range []Objective{Total, Bottleneck} {
		tour, s, err := Solve(inst.Cost, Options{Objective: obj, Now: fixedClock})
		if err != nil {
			t.Fatal(err)
		}
		checkTour(t, inst.Cost, tour, s)
		if obj == Total && s.Total != 39 {
			t.Fatalf("br17 optimum %v, want 39", s.Total)
		}
	}
}

func TestReadTSPLIBAllShipped(t *testing.T) {
	dims := map[string]int{
		"br17": 17, "ftv33": 34, "ftv35": 36, "ftv38": 39, "p43": 43, "ftv44": 45, "ftv47": 48,
		"ry48p": 48, "ft53": 53, "ftv55": 56, "ftv64": 65, "ft70": 70, "ftv70": 71, "kro124p": 100,
		"ftv170": 171, "rbg323": 323, "rbg358": 358, "rbg403": 403, "rbg443": 443,
	}
	if testing.Short() {
		dims = map[string]int{"ftv33": 34, "p43": 43}
	}
	for name, n := range dims {
		inst := readInstance(t, name)
		if inst.N != n || inst.Name != name {
			t.Errorf("%s: name %q n %d, want n %d", name, inst.Name, inst.N, n)
		}
		for i, row := range inst.Cost {
			if len(row) != n {
				t.Fatalf("%s: row %d has %d entries", name, i, len(row))
			}
		}
	}
}

const tinyHeader = "NAME: tiny\nTYPE: ATSP\nDIMENSION: 3\nEDGE_WEIGHT_TYPE: EXPLICIT\nEDGE_WEIGHT_FORMAT: FULL_MATRIX \nEDGE_WEIGHT_SECTION\n"

func TestReadTSPLIBTiny(t *testing.T) {
	in := tinyHeader + "0 1 2 3\n4 0 6\n7 8\nEOF\n"
	inst, err := ReadTSPLIB(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := [][]float64{{0, 1, 2}, {3, 4, 0}, {6, 7, 8}}
	for i := range want {
		for j := range want[i] {
			if inst.Cost[i][j] != want[i][j] {
				t.Fatalf("cost[%d][%d] = %v, want %v", i, j, inst.Cost[i][j], want[i][j])
			}
		}
	}
	// Without the EOF marker the end of input ends the weights.
	if _, err := ReadTSPLIB(strings.NewReader(tinyHeader + "0 1 2 3 4 0 6 7 8")); err != nil {
		t.Fatalf("no EOF marker: %v", err)
	}
}

func TestReadTSPLIBMalformed(t *testing.T) {
	tests := map[string]string{
		"empty":         "",
		"too few":       tinyHeader + "0 1 2 3 4 0 6 7\nEOF\n",
		"too many":      tinyHeader + "0 1 2 3 4 0 6 7 8 9\nEOF\n",
		"not a number":  tinyHeader + "0 1 2 3 x 0 6 7 8\nEOF\n",
		"nan":           tinyHeader + "0 1 2 3 NaN 0 6 7 8\nEOF\n",
		"bad dimension": strings.Replace(tinyHeader, "DIMENSION: 3", "DIMENSION: -3", 1) + "1\nEOF\n",
		"huge dimension": strings.Replace(tinyHeader, "DIMENSION: 3", "DIMENSION: 99999999999", 1) +
			"1\nEOF\n",
		"no dimension":  strings.Replace(tinyHeader, "DIMENSION: 3\n", "", 1) + "0 1 2 3 4 0 6 7 8\nEOF\n",
		"wrong format":  strings.Replace(tinyHeader, "FULL_MATRIX", "UPPER_ROW", 1) + "1 2 3\nEOF\n",
		"wrong type":    strings.Replace(tinyHeader, "TYPE: ATSP", "TYPE: CVRP", 1) + "0 1 2 3 4 0 6 7 8\nEOF\n",
		"no section":    "NAME: x\nTYPE: ATSP\nDIMENSION: 3\nEOF\n",
		"garbage line":  "NAME: x\nthis is not a header\n",
		"other section": "NAME: x\nTYPE: ATSP\nDIMENSION: 3\nNODE_COORD_SECTION\n1 0 0\nEOF\n",
	}
	for name, in := range tests {
		if inst, err := ReadTSPLIB(strings.NewReader(in)); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: got %+v, %v; want ErrFormat", name, inst, err)
		}
	}
}

func FuzzReadTSPLIB(f *testing.F) {
	br17, err := os.ReadFile(filepath.Join("testdata", "br17.atsp"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(br17)
	f.Add([]byte(tinyHeader + "0 1 2 3 4 0 6 7 8\nEOF\n"))
	f.Add([]byte(tinyHeader + "0 1 2\n"))
	f.Add([]byte("DIMENSION: 2\nEDGE_WEIGHT_SECTION\n1 2 3 4\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		inst, err := ReadTSPLIB(bytes.NewReader(data))
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		if inst.N <= 0 || len(inst.Cost) != inst.N {
			t.Fatalf("n %d with %d rows", inst.N, len(inst.Cost))
		}
		for i, row := range inst.Cost {
			if len(row) != inst.N {
				t.Fatalf("row %d has %d entries, want %d", i, len(row), inst.N)
			}
		}
	})
}
