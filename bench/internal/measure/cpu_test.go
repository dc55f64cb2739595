package measure

import (
	"math"
	"testing"
)

const statSample = `cpu  3357 12 4123 90210 77 0 51 9 5 0
cpu0 1600 6 2100 45000 40 0 30 4 0 0
cpu1 1757 6 2023 45210 37 0 21 5 5 0
intr 114930548 113199788 3 0 5 263 0 4 [...]
ctxt 1990473
`

func TestParseCPU(t *testing.T) {
	got, err := ParseCPU([]byte(statSample))
	if err != nil {
		t.Fatal(err)
	}
	// Busy: user 3357 + nice 12 + system 4123 + irq 0 + softirq 51 + steal 9; guest fields ignored.
	want := CPUTimes{Busy: 3357 + 12 + 4123 + 51 + 9, Total: 3357 + 12 + 4123 + 90210 + 77 + 51 + 9}
	if got != want {
		t.Errorf("ParseCPU = %+v, want %+v", got, want)
	}
	// A kernel without the steal field.
	got, err = ParseCPU([]byte("cpu 1 2 3 4 5 6 7\n"))
	if want := (CPUTimes{Busy: 1 + 2 + 3 + 6 + 7, Total: 28}); err != nil || got != want {
		t.Errorf("seven fields: ParseCPU = %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5 6 7 8\n", "cpu 1 2 3\n", "cpu 1 2 x 4 5 6 7 8\n",
		"cpu 18446744073709551615 1 0 0 0 0 0 0\n", "cpu -1 2 3 4 5 6 7 8\n"} {
		if got, err := ParseCPU([]byte(bad)); err == nil {
			t.Errorf("ParseCPU(%q) = %+v, want an error", bad, got)
		}
	}
}

func TestBusyFraction(t *testing.T) {
	a := CPUTimes{Busy: 100, Total: 400}
	if got := BusyFraction(a, CPUTimes{Busy: 175, Total: 500}); got != 0.75 {
		t.Errorf("BusyFraction = %v, want 0.75", got)
	}
	for _, b := range []CPUTimes{a, {Busy: 90, Total: 500}, {Busy: 300, Total: 500}, {Busy: 100, Total: 300}} {
		if got := BusyFraction(a, b); !math.IsNaN(got) {
			t.Errorf("BusyFraction(%+v, %+v) = %v, want NaN", a, b, got)
		}
	}
}

func TestReadCPU(t *testing.T) {
	a, err := ReadCPU()
	if err != nil {
		t.Skipf("no /proc/stat here: %v", err)
	}
	if a.Busy > a.Total || a.Total == 0 {
		t.Errorf("ReadCPU = %+v: want 0 <= busy <= total, total > 0", a)
	}
}

func FuzzParseCPU(f *testing.F) {
	f.Add([]byte(statSample))
	f.Add([]byte("cpu 1 2 3 4 5 6 7\n"))
	f.Add([]byte("cpu 1 2 3\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseCPU(b)
		if err == nil && c.Busy > c.Total {
			t.Fatalf("ParseCPU(%q) = %+v: busy exceeds total", b, c)
		}
	})
}
