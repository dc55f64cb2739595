package plan

import (
	"errors"
	"math"
)

// Errors of [simplex].
var (
	errInfeasible = errors.New("plan: linear program: infeasible")
	errUnbounded  = errors.New("plan: linear program: unbounded")
	errPivots     = errors.New("plan: linear program: no optimum within the pivot limit")
)

// simplexTol is the tolerance of the simplex method: a pivot element, a reduced cost or a residual
// infeasibility smaller than it counts as zero. The programs it solves are scaled so that their
// coefficients are of order one.
const simplexTol = 1e-9

// simplex minimizes c·x subject to a·x = b and x ≥ 0 (a has len(b) rows of len(c) columns) by the
// two-phase tableau simplex method, and returns an optimal vertex.
//
// The weighted rings' programs are highly degenerate (almost every right-hand side is zero), and a
// simplex method can cycle on them forever among pivots that do not move the vertex; gonum's did on
// measured topologies, and it has no bound on its pivots. This one takes Dantzig's rule (the most
// negative reduced cost) after a pivot that moved the vertex, and Bland's rule (the lowest-indexed
// candidate entering and leaving) after one that did not. A cycle consists of pivots that do not move the
// vertex, so every pivot of a cycle would follow Bland's rule, which cannot cycle. The pivots are
// also bounded in number, so that rounding cannot make it run forever either: past the bound it
// returns errPivots.
//
// It is deterministic: the same program gives the same vertex, bit for bit, on every node.
func simplex(c []float64, a [][]float64, b []float64) ([]float64, error) {
	m, n := len(b), len(c)
	// Tableau: rows 0..m-1 are the constraints over the n columns, then one artificial column per
	// row that has no slack-like column of its own, then the right-hand side.
	basis := make([]int, m)
	for i := range basis {
		basis[i] = -1
	}
	neg := make([]bool, m)
	for i := range m {
		neg[i] = b[i] < 0
	}
	// A column that is 1 in row i (after the sign flip) and 0 in every other row starts in the basis.
	for j := range n {
		row, unit := -1, true
		for i := range m {
			v := a[i][j]
			if neg[i] {
				v = -v
			}
			switch {
			case v == 0:
			case v == 1 && row < 0:
				row = i
			default:
				unit = false
			}
		}
		if unit && row >= 0 && basis[row] < 0 {
			basis[row] = j
		}
	}
	art := 0
	for i := range m {
		if basis[i] < 0 {
			basis[i] = n + art
			art++
		}
	}
	w := n + art // the right-hand side's column
	tab := make([][]float64, m)
	for i := range m {
		r := make([]float64, w+1)
		sign := 1.0
		if neg[i] {
			sign = -1
		}
		for j := range n {
			r[j] = sign * a[i][j]
		}
		if basis[i] >= n {
			r[basis[i]] = 1
		}
		r[w] = sign * b[i]
		tab[i] = r
	}
	x := &tableau{tab: tab, basis: basis, cols: w, limit: 50 * (m + w)}

	// Phase 1: minimize the sum of the artificial variables.
	if art > 0 {
		z := make([]float64, w+1)
		for j := n; j < w; j++ {
			z[j] = 1
		}
		x.price(z)
		if err := x.run(z, w); err != nil {
			return nil, err
		}
		if -z[w] > simplexTol*float64(1+m) {
			return nil, errInfeasible
		}
		// Drive the artificial variables left in the basis (at zero) out of it where a real column
		// can replace them; a row where none can is redundant and keeps its artificial at zero.
		for i := range m {
			if basis[i] < n {
				continue
			}
			for j := range n {
				if math.Abs(tab[i][j]) > simplexTol {
					x.pivot(i, j, nil)
					break
				}
			}
		}
	}

	// Phase 2: minimize c·x over the real columns.
	z := make([]float64, w+1)
	copy(z, c)
	x.price(z)
	if err := x.run(z, n); err != nil {
		return nil, err
	}
	out := make([]float64, n)
	for i, j := range basis {
		if j < n {
			out[j] = tab[i][w]
		}
	}
	return out, nil
}

// tableau is the simplex method's working state.
type tableau struct {
	tab    [][]float64
	basis  []int // the basic column of every row
	cols   int   // columns before the right-hand side's
	limit  int   // the most pivots it may take
	bland  bool  // the last pivot did not move the vertex
	pivots int
}

// price turns the cost row z into reduced costs: the basic columns' costs are eliminated.
func (x *tableau) price(z []float64) {
	for i, j := range x.basis {
		if f := z[j]; f != 0 {
			row := x.tab[i]
			for k := range z {
				z[k] -= float64(f * row[k]) // no fused multiply-add: every node rounds alike
			}
		}
	}
}

// run pivots until no column below enter has a negative reduced cost in z.
func (x *tableau) run(z []float64, enter int) error {
	w := x.cols
	for {
		j := -1
		for k := range enter {
			if z[k] < -simplexTol && (j < 0 || (!x.bland && z[k] < z[j])) {
				j = k
				if x.bland {
					break
				}
			}
		}
		if j < 0 {
			return nil
		}
		// The leaving row: the smallest ratio, ties to the lowest basic column.
		r := -1
		var best float64
		for i, row := range x.tab {
			if row[j] <= simplexTol {
				continue
			}
			q := row[w] / row[j]
			if r < 0 || q < best-simplexTol || (q <= best+simplexTol && x.basis[i] < x.basis[r]) {
				r, best = i, q
			}
		}
		if r < 0 {
			return errUnbounded
		}
		if x.pivots >= x.limit {
			return errPivots
		}
		x.bland = best <= simplexTol
		x.pivot(r, j, z)
	}
}

// pivot makes column j basic in row r, updating every row and the cost row z (if any).
func (x *tableau) pivot(r, j int, z []float64) {
	x.pivots++
	pr := x.tab[r]
	inv := 1 / pr[j]
	for k := range pr {
		pr[k] *= inv
	}
	pr[j] = 1
	elim := func(row []float64) {
		f := row[j]
		if f == 0 {
			return
		}
		for k := range row {
			row[k] -= float64(f * pr[k])
		}
		row[j] = 0
	}
	for i, row := range x.tab {
		if i != r {
			elim(row)
		}
	}
	if z != nil {
		elim(z)
	}
	x.basis[r] = j
}
