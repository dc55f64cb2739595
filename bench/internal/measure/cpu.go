package measure

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
)

// CPUTimes is the machine's cumulative CPU time over all cores, from the "cpu" line of /proc/stat, in
// clock ticks: Busy is every state but idle and iowait, Total every state. Guest time is left out,
// since the kernel counts it in user and nice already.
type CPUTimes struct {
	Busy, Total uint64
}

// ReadCPU reads the machine's CPU times now. It fails where there is no /proc/stat.
func ReadCPU() (CPUTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return CPUTimes{}, err
	}
	return ParseCPU(b)
}

// ParseCPU reads the aggregate "cpu" line of /proc/stat's contents: user, nice, system, idle, iowait,
// irq, softirq and steal, of which kernels before 2.6.11 lack the last; fields after them are guest
// time and are not counted.
func ParseCPU(stat []byte) (CPUTimes, error) {
	sc := bufio.NewScanner(bytes.NewReader(stat))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) == 0 || string(f[0]) != "cpu" {
			continue
		}
		if len(f) < 8 {
			return CPUTimes{}, fmt.Errorf("measure: /proc/stat cpu line has %d fields, want at least 8", len(f))
		}
		var t CPUTimes
		for i, s := range f[1:min(len(f), 9)] {
			v, err := strconv.ParseUint(string(s), 10, 64)
			if err != nil {
				return CPUTimes{}, fmt.Errorf("measure: /proc/stat cpu field %d: %w", i+1, err)
			}
			if t.Total+v < t.Total {
				return CPUTimes{}, errors.New("measure: /proc/stat cpu times overflow")
			}
			t.Total += v
			if i != 3 && i != 4 { // idle, iowait
				t.Busy += v
			}
		}
		return t, nil
	}
	if err := sc.Err(); err != nil {
		return CPUTimes{}, err
	}
	return CPUTimes{}, errors.New("measure: no cpu line in /proc/stat")
}

// BusyFraction returns the share of the CPU time between a and b (read later) that the cores spent
// busy, in [0, 1], or NaN when no time passed or b is not later than a.
func BusyFraction(a, b CPUTimes) float64 {
	if b.Total <= a.Total || b.Busy < a.Busy || b.Busy-a.Busy > b.Total-a.Total {
		return math.NaN()
	}
	return float64(b.Busy-a.Busy) / float64(b.Total-a.Total)
}
