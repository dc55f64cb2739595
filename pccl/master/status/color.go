package status

import (
	"fmt"
	"hash/fnv"
	"math"
)

// Heat map colour ramps, from the smallest to the largest value: bandwidth goes pale to deep blue,
// delay goes pale yellow to deep red.
var (
	bandwidthRamp = [2][3]float64{{0xde, 0xeb, 0xf7}, {0x08, 0x30, 0x6b}}
	delayRamp     = [2][3]float64{{0xff, 0xf5, 0xc0}, {0xa5, 0x0f, 0x15}}
)

func rampColor(ramp [2][3]float64, t float64) string {
	t = math.Max(0, math.Min(1, t))
	var c [3]uint8
	for i := range c {
		c[i] = uint8(math.Round(ramp[0][i] + t*(ramp[1][i]-ramp[0][i])))
	}
	return fmt.Sprintf("#%02x%02x%02x", c[0], c[1], c[2])
}

// siteColor gives every site a fixed colour derived from its name, so colours stay put across
// refreshes as peers come and go. Peers without a site are grey.
func siteColor(site string) string {
	if site == "" {
		return "#9e9e9e"
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(site))
	hue := float64(h.Sum32()%360) / 360
	r, g, b := hslToRGB(hue, 0.62, 0.48)
	return fmt.Sprintf("#%02x%02x%02x", r, g, b)
}

// hslToRGB converts hue, saturation and lightness in [0,1] to 8-bit RGB.
func hslToRGB(h, s, l float64) (r, g, b uint8) {
	q := l + s - l*s
	if l < 0.5 {
		q = l * (1 + s)
	}
	p := 2*l - q
	ch := func(t float64) uint8 {
		t -= math.Floor(t)
		var v float64
		switch {
		case t < 1.0/6:
			v = p + (q-p)*6*t
		case t < 0.5:
			v = q
		case t < 2.0/3:
			v = p + (q-p)*(2.0/3-t)*6
		default:
			v = p
		}
		return uint8(math.Round(255 * v))
	}
	return ch(h + 1.0/3), ch(h), ch(h - 1.0/3)
}
