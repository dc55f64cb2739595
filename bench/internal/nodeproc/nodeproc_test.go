package nodeproc

import (
	"strings"
	"testing"
)

func TestCommandsDecodeEveryLineAndStopAtABadOne(t *testing.T) {
	type cmd struct {
		Op    string `json:"op"`
		Label string `json:"label"`
	}
	in := strings.NewReader(`{"op":"run","label":"a"}` + "\n" + `{"op":"check"}` + "\n" + `not json` + "\n" + `{"op":"quit"}` + "\n")
	var got []cmd
	var errs int
	for c, err := range Commands[cmd](in) {
		if err != nil {
			errs++
			if !strings.Contains(err.Error(), `"not json"`) {
				t.Errorf("error %v does not quote the line", err)
			}
			continue
		}
		got = append(got, c)
	}
	if len(got) != 2 || got[0] != (cmd{"run", "a"}) || got[1] != (cmd{"check", ""}) || errs != 1 {
		t.Fatalf("commands %+v and %d errors, want run a, check, then one error and nothing after it", got, errs)
	}
}
