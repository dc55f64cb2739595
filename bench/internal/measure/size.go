package measure

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits maps a size suffix to its multiplier. Bare K, M, G, T are binary, like the baseline tools.
var sizeUnits = []struct {
	suffix string
	mult   float64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// ParseSize parses a byte count such as "67108864", "64MiB", "64M", "1GiB" or "1.5GB". The units
// KiB, MiB, GiB, TiB and bare K, M, G, T are powers of 1024; KB, MB, GB, TB are powers of 1000. Unit
// letters are case-insensitive. The result must be a whole, non-negative number of bytes.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := 1.0
	for _, u := range sizeUnits {
		if len(t) > len(u.suffix) && strings.EqualFold(t[len(t)-len(u.suffix):], u.suffix) {
			mult, t = u.mult, strings.TrimSpace(t[:len(t)-len(u.suffix)])
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	b := v * mult
	if b < 0 || b != math.Trunc(b) || b > math.MaxInt64/2 {
		return 0, fmt.Errorf("size %q: not a whole non-negative number of bytes", s)
	}
	return int64(b), nil
}
