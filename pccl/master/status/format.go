package status

import (
	"strconv"
	"time"
)

func siteLabel(site string) string {
	if site == "" {
		return "(none)"
	}
	return site
}

// agoString says how long before now t was: "never" for a zero t.
func agoString(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := max(now.Sub(t), 0)
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String() + " ago"
	case d < time.Minute:
		return d.Round(100*time.Millisecond).String() + " ago"
	default:
		return d.Round(time.Second).String() + " ago"
	}
}

// formatBandwidth writes bytes per second with a decimal unit.
func formatBandwidth(v float64) string {
	units := []string{"B/s", "kB/s", "MB/s", "GB/s", "TB/s"}
	i := 0
	for v >= 1000 && i < len(units)-1 {
		v /= 1000
		i++
	}
	return strconv.FormatFloat(v, 'f', precisionFor(v), 64) + " " + units[i]
}

// formatDelay writes seconds in the unit that keeps the number readable.
func formatDelay(v float64) string {
	switch {
	case v < 1e-3:
		v *= 1e6
		return strconv.FormatFloat(v, 'f', precisionFor(v), 64) + " µs"
	case v < 1:
		v *= 1e3
		return strconv.FormatFloat(v, 'f', precisionFor(v), 64) + " ms"
	default:
		return strconv.FormatFloat(v, 'f', precisionFor(v), 64) + " s"
	}
}

// precisionFor keeps about three significant digits.
func precisionFor(v float64) int {
	switch {
	case v >= 100:
		return 0
	case v >= 10:
		return 1
	default:
		return 2
	}
}

// f1 formats an SVG coordinate.
func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
