package status

import (
	"math"
	"strconv"
)

// buildHeatMap colours m's cells on a log scale from the smallest known entry (lightest) to the largest
// (darkest), since link figures across sites span orders of magnitude. It returns nil for a nil m,
// which the page shows as "no data yet". Zero, negative and non-finite entries are unknown.
func buildHeatMap(m [][]float64, labels []string, format func(float64) string, ramp [2][3]float64) *statusHeatMap {
	if m == nil {
		return nil
	}
	label := func(i int) string {
		if i < len(labels) {
			return labels[i]
		}
		return "#" + strconv.Itoa(i)
	}
	cols := 0
	minV, maxV := math.Inf(1), 0.0
	for _, row := range m {
		cols = max(cols, len(row))
		for _, v := range row {
			if known(v) {
				minV, maxV = math.Min(minV, v), math.Max(maxV, v)
			}
		}
	}
	h := &statusHeatMap{}
	if maxV > 0 {
		h.Min, h.Max = format(minV), format(maxV)
	}
	shade := func(v float64) float64 {
		if maxV <= minV {
			return 1
		}
		return math.Log(v/minV) / math.Log(maxV/minV)
	}
	for k := range cols {
		h.Labels = append(h.Labels, label(k))
	}
	for i, row := range m {
		hr := statusHeatRow{Label: label(i)}
		for k := range cols {
			cell := statusHeatCell{Text: "·", Background: "#eeeeee", Foreground: "#888888",
				Title: label(i) + " → " + label(k) + ": unknown"}
			if k < len(row) && known(row[k]) {
				t := shade(row[k])
				cell.Text = format(row[k])
				cell.Background = rampColor(ramp, t)
				cell.Foreground = "#111111"
				if t > 0.55 {
					cell.Foreground = "#ffffff"
				}
				cell.Title = label(i) + " → " + label(k) + ": " + cell.Text
			}
			hr.Cells = append(hr.Cells, cell)
		}
		h.Rows = append(h.Rows, hr)
	}
	return h
}

func known(v float64) bool { return v > 0 && !math.IsInf(v, 0) }
