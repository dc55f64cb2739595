package sharedstate

import "testing"

func TestResumeStep(t *testing.T) {
	cases := []struct {
		name string
		tags []StepTag
		want uint64
	}{
		{"none", nil, 0},
		{"forward/backward", []StepTag{{5, false}, {5, false}}, 5},
		{"optimizer", []StepTag{{5, true}, {5, true}}, 6},
		{"mixed at the barrier", []StepTag{{5, false}, {5, true}, {5, false}}, 6},
		{"some finished the update", []StepTag{{6, false}, {5, true}}, 6},
		{"finished and next forward", []StepTag{{6, false}, {6, false}}, 6},
		{"lagging peer", []StepTag{{3, false}, {7, false}}, 7},
		{"step zero", []StepTag{{0, false}}, 0},
		{"first step in optimizer", []StepTag{{0, true}}, 1},
	}
	for _, c := range cases {
		if got := ResumeStep(c.tags); got != c.want {
			t.Errorf("%s: ResumeStep(%v) = %d, want %d", c.name, c.tags, got, c.want)
		}
	}
}
