package measure

import (
	"context"
	"io"
	"math"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/cluster"
)

func TestMain(m *testing.M) {
	cluster.Main(map[string]func() int{RoleRing: RingMain})
	goleak.VerifyTestMain(m)
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"67108864", 64 << 20}, {"64MiB", 64 << 20}, {"64mib", 64 << 20}, {"64M", 64 << 20},
		{"1GiB", 1 << 30}, {"1G", 1 << 30}, {"1.5KiB", 1536}, {"2KB", 2000}, {"3MB", 3e6},
		{"0", 0}, {"7B", 7}, {" 16 MiB ", 16 << 20},
	} {
		got, err := ParseSize(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "MiB", "-1", "1.5B", "x64", "64XiB"} {
		if got, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", bad, got)
		}
	}
}

func TestMedianPercentile(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	if got := Median(xs); got != 3 {
		t.Errorf("Median odd = %v", got)
	}
	if xs[0] != 5 {
		t.Error("Median modified its input")
	}
	if got := Median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("Median even = %v", got)
	}
	if !math.IsNaN(Median(nil)) || !math.IsNaN(Percentile(nil, 50)) {
		t.Error("empty input is not NaN")
	}
	twenty := make([]float64, 20)
	for i := range twenty {
		twenty[i] = float64(20 - i)
	}
	for _, tc := range []struct{ p, want float64 }{{50, 10}, {99, 20}, {100, 20}, {5, 1}, {1, 1}, {95, 19}} {
		if got := Percentile(twenty, tc.p); got != tc.want {
			t.Errorf("Percentile(1..20, %v) = %v, want %v", tc.p, got, tc.want)
		}
	}
}

func TestLoopbackRing(t *testing.T) {
	c := cluster.New(cluster.Config{Stderr: io.Discard})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, local := range []bool{false, true} {
		r, err := LoopbackRing(ctx, c, 3, 3<<20+5, 1, 2, local)
		if err != nil {
			t.Fatal(err)
		}
		if r.N != 3 || len(r.Times) != 2 || !(r.Seconds > 0) || !(r.Aggregate > 0) || r.PerRank*3 != r.Aggregate || r.Local != local {
			t.Fatalf("ring result %+v", r)
		}
	}
	for _, p := range c.Procs() {
		if p.ExitCode() != 0 {
			t.Errorf("%s exit code %d", p.Name(), p.ExitCode())
		}
	}
}

func TestAddRate(t *testing.T) {
	if r := AddRate(1<<16, 2, 2); !(r > 0) {
		t.Fatalf("add rate %v", r)
	}
	if r := AddRate(0, 2, 2); r != 0 {
		t.Fatalf("add rate of nothing %v", r)
	}
}
