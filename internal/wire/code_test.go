package wire

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestCodeNames(t *testing.T) {
	want := map[Code]string{
		CodeOK: "ok", CodePeerLeft: "peer-left", CodeAborted: "aborted", CodeMismatch: "mismatch",
		CodeTooFewPeers: "too-few-peers", CodeRejected: "rejected", CodeLocalFailure: "local-failure",
		codeMax + 1: "code(7)",
	}
	for c, name := range want {
		if got := c.String(); got != name {
			t.Errorf("Code(%d).String() = %q, want %q", uint8(c), got, name)
		}
	}
}

// TestCodeLocalFailureOnTheWire checks that the newest code travels in Done and Outcome, and that the
// code after it is still rejected.
func TestCodeLocalFailureOnTheWire(t *testing.T) {
	msgs := []Message{
		&Done{Tag: 1, Seq: 2, Code: CodeLocalFailure, Detail: "non-finite"},
		&Outcome{Tag: 1, Seq: 2, Code: CodeLocalFailure, Detail: "peer 4: non-finite"},
	}
	for _, want := range msgs {
		got, _, err := ReadFrame(bytes.NewReader(AppendFrame(nil, want)), 0, nil)
		if err != nil {
			t.Fatalf("%T: %v", want, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip: got %#v, want %#v", got, want)
		}
	}
	frame := AppendFrame(nil, &Outcome{Tag: 1, Seq: 2, Code: codeMax + 1})
	if _, _, err := ReadFrame(bytes.NewReader(frame), 0, nil); !errors.Is(err, ErrMalformed) {
		t.Fatalf("code %d: error %v, want ErrMalformed", codeMax+1, err)
	}
}
