package atsp

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// maxTSPLIBDimension bounds DIMENSION so that a header cannot ask for an
// absurd matrix; the weights are only allocated once they have been read.
const maxTSPLIBDimension = 1 << 14

// Instance is a problem read from a TSPLIB file.
type Instance struct {
	// Name is the NAME field of the header.
	Name string
	// N is the number of nodes (DIMENSION).
	N int
	// Cost is the N x N weight matrix; Cost[i][j] is the cost of the arc from
	// node i to node j. The diagonal holds whatever the file holds there.
	Cost [][]float64
}

// ReadTSPLIB reads an instance in TSPLIB 95 format with EDGE_WEIGHT_TYPE
// EXPLICIT and EDGE_WEIGHT_FORMAT FULL_MATRIX (TYPE ATSP or TSP). Header
// keys and values are trimmed; the weights are read as a stream of numbers
// regardless of line breaks, up to an EOF line or the end of the input, and
// must number exactly DIMENSION squared. Every failure wraps ErrFormat.
func ReadTSPLIB(r io.Reader) (*Instance, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	inst := &Instance{}
	var typ, edgeType, format string
	line := 0
	inWeights := false
	var nums []float64
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		if inWeights {
			if text == "EOF" {
				break
			}
			for _, f := range strings.Fields(text) {
				if f == "EOF" {
					inWeights = false
					break
				}
				v, err := strconv.ParseFloat(f, 64)
				if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
					return nil, fmt.Errorf("%w: line %d: bad weight %q", ErrFormat, line, f)
				}
				if len(nums) == inst.N*inst.N {
					return nil, fmt.Errorf("%w: line %d: more than %d weights", ErrFormat, line, inst.N*inst.N)
				}
				nums = append(nums, v)
			}
			if !inWeights {
				break
			}
			continue
		}
		key, value, _ := strings.Cut(text, ":")
		key = strings.ToUpper(strings.TrimSpace(key))
		value = strings.TrimSpace(value)
		switch key {
		case "NAME":
			inst.Name = value
		case "TYPE":
			typ = strings.ToUpper(value)
		case "COMMENT":
		case "DIMENSION":
			d, err := strconv.Atoi(value)
			if err != nil || d <= 0 || d > maxTSPLIBDimension {
				return nil, fmt.Errorf("%w: line %d: bad DIMENSION %q", ErrFormat, line, value)
			}
			inst.N = d
		case "EDGE_WEIGHT_TYPE":
			edgeType = strings.ToUpper(value)
		case "EDGE_WEIGHT_FORMAT":
			format = strings.ToUpper(value)
		case "EDGE_WEIGHT_SECTION":
			if typ != "ATSP" && typ != "TSP" {
				return nil, fmt.Errorf("%w: TYPE %q, want ATSP or TSP", ErrFormat, typ)
			}
			if edgeType != "EXPLICIT" || format != "FULL_MATRIX" {
				return nil, fmt.Errorf("%w: EDGE_WEIGHT_TYPE %q / FORMAT %q, want EXPLICIT / FULL_MATRIX", ErrFormat, edgeType, format)
			}
			if inst.N == 0 {
				return nil, fmt.Errorf("%w: EDGE_WEIGHT_SECTION before DIMENSION", ErrFormat)
			}
			inWeights = true
		case "EOF":
			return nil, fmt.Errorf("%w: EOF before EDGE_WEIGHT_SECTION", ErrFormat)
		default:
			if strings.HasSuffix(key, "_SECTION") {
				return nil, fmt.Errorf("%w: line %d: unsupported section %s", ErrFormat, line, key)
			}
			if _, _, ok := strings.Cut(text, ":"); !ok {
				return nil, fmt.Errorf("%w: line %d: expected KEY: VALUE, got %q", ErrFormat, line, truncate(text))
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: line %d: %w", ErrFormat, line, err)
	}
	if inst.N == 0 {
		return nil, fmt.Errorf("%w: no DIMENSION and EDGE_WEIGHT_SECTION", ErrFormat)
	}
	if len(nums) != inst.N*inst.N {
		return nil, fmt.Errorf("%w: %d weights, want %d", ErrFormat, len(nums), inst.N*inst.N)
	}
	inst.Cost = make([][]float64, inst.N)
	for i := range inst.Cost {
		inst.Cost[i] = nums[i*inst.N : (i+1)*inst.N : (i+1)*inst.N]
	}
	return inst, nil
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
