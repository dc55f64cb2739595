package main

import (
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// palette gives each curve a distinct colour.
var palette = []color.Color{
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
	color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
	color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
}

// addLine adds a solid (or dashed) line with a legend entry.
func addLine(p *plot.Plot, name string, pts plotter.XYs, c int, dashed bool) error {
	l, err := plotter.NewLine(pts)
	if err != nil {
		return err
	}
	l.Color = palette[c%len(palette)]
	l.Width = vg.Points(1.5)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
	}
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}

// addPoints adds markers with a legend entry.
func addPoints(p *plot.Plot, name string, pts plotter.XYs, c int, shape draw.GlyphDrawer, r vg.Length) error {
	s, err := plotter.NewScatter(pts)
	if err != nil {
		return err
	}
	s.Color = palette[c%len(palette)]
	s.Shape = shape
	s.Radius = r
	p.Add(s)
	if name != "" {
		p.Legend.Add(name, s)
	}
	return nil
}

func plotCrossover(r crossoverReport, path string) error {
	p := plot.New()
	p.Title.Text = "Single failure: standard ring vs R²CCL-AllReduce (Appendix A model, α = 0)"
	p.X.Label.Text = "lost bandwidth fraction X of the degraded server"
	p.Y.Label.Text = "AllReduce time / fault-free time"
	var std, r2 plotter.XYs
	top := 0.0
	for _, c := range r.Curve {
		std = append(std, plotter.XY{X: c.X, Y: c.StandardVsFF})
		r2 = append(r2, plotter.XY{X: c.X, Y: c.R2CCLVsFF})
		top = max(top, c.StandardVsFF, c.R2CCLVsFF)
	}
	top = math.Min(top, 8)
	if err := addLine(p, "standard ring (Balance)", std, 1, false); err != nil {
		return err
	}
	if err := addLine(p, "R²CCL-AllReduce at Y*", r2, 0, false); err != nil {
		return err
	}
	if err := addLine(p, "crossover ng/(3ng−2)", plotter.XYs{{X: r.Formula, Y: 1}, {X: r.Formula, Y: top}}, 6, true); err != nil {
		return err
	}
	p.Y.Min, p.Y.Max = 1, top
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	return p.Save(20*vg.Centimeter, 13*vg.Centimeter, path)
}

func plotRetention(r retentionReport, path string) error {
	p := plot.New()
	p.Title.Text = "AllReduce retention, 2 servers x 8 NICs, one NIC failed"
	p.X.Label.Text = "message size (bytes)"
	p.Y.Label.Text = "throughput retention (%)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	for i, c := range r.Curves {
		if c.Name == "planner_all_strategies" {
			continue
		}
		var pts plotter.XYs
		for j, b := range r.Sizes {
			pts = append(pts, plotter.XY{X: float64(b), Y: 100 * c.Retention[j]})
		}
		if err := addLine(p, c.Name, pts, i, c.Name == "planner_r2ccl_strategies"); err != nil {
			return err
		}
	}
	var paper plotter.XYs
	for _, c := range r.Compare {
		paper = append(paper, plotter.XY{X: float64(c.Bytes), Y: c.Paper})
	}
	if err := addPoints(p, "paper §8.4", paper, 6, draw.CrossGlyph{}, vg.Points(4)); err != nil {
		return err
	}
	p.Y.Min, p.Y.Max = 0, 105
	p.Legend.Left = true
	p.Legend.Top = false
	p.Add(plotter.NewGrid())
	return p.Save(22*vg.Centimeter, 14*vg.Centimeter, path)
}

func plotTraining(r trainingReport, path string) error {
	p := plot.New()
	p.Title.Text = "Training-iteration overhead, 7B model, random NIC failures"
	p.X.Label.Text = "concurrent NIC failures"
	p.Y.Label.Text = "iteration overhead (%)"
	for i, v := range r.Variants {
		var mean, all plotter.XYs
		for _, st := range v.PerK {
			mean = append(mean, plotter.XY{X: float64(st.Failures), Y: st.MeanOverheadPct})
			if i == 0 {
				for _, ps := range st.Patterns {
					all = append(all, plotter.XY{X: float64(st.Failures), Y: ps.OverheadPct})
				}
			}
		}
		if err := addLine(p, v.Name+" (mean)", mean, i, false); err != nil {
			return err
		}
		if i == 0 {
			if err := addPoints(p, v.Name+" (each pattern)", all, i, draw.CircleGlyph{}, vg.Points(1.2)); err != nil {
				return err
			}
		}
	}
	paper := plotter.XYs{{X: 1, Y: 1.5}, {X: 10, Y: 4.3}}
	if err := addPoints(p, "paper Fig. 10 endpoints", paper, 6, draw.CrossGlyph{}, vg.Points(5)); err != nil {
		return err
	}
	p.Y.Min, p.Y.Max = 0, p.Y.Max+0.5
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	return p.Save(20*vg.Centimeter, 13*vg.Centimeter, path)
}
