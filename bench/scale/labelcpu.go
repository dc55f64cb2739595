package main

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime/pprof"
)

// cpuMeter measures the CPU time of the goroutines that carry one pprof label, from the process's CPU
// profile: the sampled CPU time of every sample with that label. Its goroutine lives outside any
// synctest bubble (the profile's writer must: it blocks in the runtime, which a bubble cannot tell
// from running), and a bubble's code asks it over channels made outside the bubble (a bubble's own
// channels may not be used from outside it).
type cpuMeter struct {
	key, value string
	cmds       chan bool    // true: start a profile; false: stop it
	replies    chan float64 // 0 for a start, the seconds measured (-1: none) for a stop
}

// newCPUMeter starts the meter's goroutine; close ends it.
func newCPUMeter(key, value string) *cpuMeter {
	m := &cpuMeter{key: key, value: value, cmds: make(chan bool), replies: make(chan float64)}
	go m.run()
	return m
}

func (m *cpuMeter) run() {
	var buf bytes.Buffer
	profiling := false
	for start := range m.cmds {
		switch {
		case start && !profiling:
			buf.Reset()
			profiling = pprof.StartCPUProfile(&buf) == nil
			m.replies <- 0
		case start:
			m.replies <- 0
		case !profiling:
			m.replies <- -1
		default:
			pprof.StopCPUProfile()
			profiling = false
			secs, err := labelledCPU(buf.Bytes(), m.key, m.value)
			if err != nil {
				secs = -1
			}
			m.replies <- secs
		}
	}
	if profiling {
		pprof.StopCPUProfile()
	}
}

// start begins a measurement.
func (m *cpuMeter) start() {
	m.cmds <- true
	<-m.replies
}

// stop ends the measurement and returns the labelled goroutines' CPU time in milliseconds, or -1
// when the profile could not be taken (another one runs).
func (m *cpuMeter) stop() float64 {
	m.cmds <- false
	if s := <-m.replies; s >= 0 {
		return s * 1e3
	}
	return -1
}

func (m *cpuMeter) close() { close(m.cmds) }

// labelledCPU returns the CPU seconds of the samples of a CPU profile (the gzipped protocol buffer
// runtime/pprof writes) that carry the label key=value.
func labelledCPU(profile []byte, key, value string) (float64, error) {
	zr, err := gzip.NewReader(bytes.NewReader(profile))
	if err != nil {
		return 0, err
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return 0, err
	}
	// Profile: 1 sample_type (ValueType), 2 sample, 6 string_table. Sample: 2 value (packed
	// int64), 3 label (Label: 1 key, 2 str, as string-table indices). The samples are read after
	// the whole string table is known.
	var (
		strs    []string
		samples [][]byte
		types   [][]byte
	)
	err = fields(raw, func(num int, wire int, v uint64, b []byte) error {
		switch {
		case num == 1 && wire == 2:
			types = append(types, b)
		case num == 2 && wire == 2:
			samples = append(samples, b)
		case num == 6 && wire == 2:
			strs = append(strs, string(b))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	// The value that counts nanoseconds of CPU: the sample type whose unit is "nanoseconds".
	cpuIndex := -1
	for i, t := range types {
		var unit uint64
		fields(t, func(num, wire int, v uint64, _ []byte) error {
			if num == 2 && wire == 0 {
				unit = v
			}
			return nil
		})
		if int(unit) < len(strs) && strs[unit] == "nanoseconds" {
			cpuIndex = i
		}
	}
	if cpuIndex < 0 {
		return 0, errors.New("no CPU sample type in the profile")
	}
	var total int64
	for _, s := range samples {
		var values []int64
		match := false
		err := fields(s, func(num, wire int, v uint64, b []byte) error {
			switch {
			case num == 2 && wire == 2:
				for len(b) > 0 {
					x, n := binary.Uvarint(b)
					if n <= 0 {
						return errors.New("bad packed value")
					}
					values = append(values, int64(x))
					b = b[n:]
				}
			case num == 2 && wire == 0:
				values = append(values, int64(v))
			case num == 3 && wire == 2:
				var k, str uint64
				fields(b, func(num, wire int, v uint64, _ []byte) error {
					switch num {
					case 1:
						k = v
					case 2:
						str = v
					}
					return nil
				})
				if int(k) < len(strs) && int(str) < len(strs) && strs[k] == key && strs[str] == value {
					match = true
				}
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
		if match && cpuIndex < len(values) {
			total += values[cpuIndex]
		}
	}
	return float64(total) / 1e9, nil
}

// fields calls f for every field of the protocol buffer message b: its number, wire type, and its
// value (varint) or bytes (length-delimited).
func fields(b []byte, f func(num, wire int, v uint64, data []byte) error) error {
	for len(b) > 0 {
		tag, n := binary.Uvarint(b)
		if n <= 0 {
			return errors.New("bad field tag")
		}
		b = b[n:]
		num, wire := int(tag>>3), int(tag&7)
		var v uint64
		var data []byte
		switch wire {
		case 0:
			v, n = binary.Uvarint(b)
			if n <= 0 {
				return errors.New("bad varint")
			}
			b = b[n:]
		case 1:
			if len(b) < 8 {
				return errors.New("short fixed64")
			}
			b = b[8:]
		case 2:
			l, n := binary.Uvarint(b)
			if n <= 0 || uint64(len(b)-n) < l {
				return errors.New("bad length")
			}
			data = b[n : n+int(l)]
			b = b[n+int(l):]
		case 5:
			if len(b) < 4 {
				return errors.New("short fixed32")
			}
			b = b[4:]
		default:
			return fmt.Errorf("wire type %d", wire)
		}
		if err := f(num, wire, v, data); err != nil {
			return err
		}
	}
	return nil
}
