package pccl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"testing"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl/internal/links"
	"github.com/concord-ccl/concord/rings"
)

func TestSentinelsAreShared(t *testing.T) {
	for _, c := range []struct{ pccl, rings error }{
		{ErrAborted, rings.ErrAborted},
		{ErrInvalid, rings.ErrInvalid},
		{ErrNonFinite, rings.ErrNonFinite},
		{ErrPeerLeft, links.ErrPeerLeft},
		{ErrClosed, links.ErrClosed},
	} {
		if c.pccl != c.rings {
			t.Errorf("%v is not the same value as %v", c.pccl, c.rings)
		}
		wrapped := fmt.Errorf("%w: cause", c.rings)
		if !errors.Is(wrapped, c.pccl) {
			t.Errorf("errors.Is(%v, %v) is false", wrapped, c.pccl)
		}
	}
}

// TestCodeTableRoundTrip checks every row both ways: a code decodes to its error, that error (bare, or
// wrapped as outcomeError wraps it) encodes back to the code.
func TestCodeTableRoundTrip(t *testing.T) {
	seen := map[wire.Code]bool{}
	for _, row := range codes {
		if seen[row.code] {
			t.Errorf("code %v appears twice", row.code)
		}
		seen[row.code] = true
		if got := errorOf(row.code); got != row.err {
			t.Errorf("errorOf(%v) = %v, want %v", row.code, got, row.err)
		}
		if got := codeOf(row.err); got != row.code {
			t.Errorf("codeOf(%v) = %v, want %v", row.err, got, row.code)
		}
		for _, detail := range []string{"", "peer 3: something"} {
			err := outcomeError("allreduce tag 1", &wire.Outcome{Tag: 1, Seq: 2, Code: row.code, Detail: detail})
			if !errors.Is(err, row.err) {
				t.Errorf("outcome %v %q: %v does not wrap %v", row.code, detail, err, row.err)
			}
			if got := codeOf(err); got != row.code {
				t.Errorf("codeOf(%v) = %v, want %v", err, got, row.code)
			}
		}
		for _, e := range row.also {
			if got := codeOf(fmt.Errorf("op: %w", e)); got != row.code {
				t.Errorf("codeOf(%v) = %v, want %v", e, got, row.code)
			}
		}
	}
	for _, c := range []wire.Code{wire.CodePeerLeft, wire.CodeAborted, wire.CodeMismatch, wire.CodeTooFewPeers, wire.CodeLocalFailure} {
		if !seen[c] {
			t.Errorf("code %v has no row", c)
		}
	}
}

// TestOutcomeErrorForEveryCode checks the error of every code a master may send.
func TestOutcomeErrorForEveryCode(t *testing.T) {
	cases := []struct {
		code wire.Code
		want error // nil: no error
	}{
		{wire.CodeOK, nil},
		{wire.CodePeerLeft, ErrPeerLeft},
		{wire.CodeAborted, ErrAborted},
		{wire.CodeMismatch, ErrDescriptorMismatch},
		{wire.CodeTooFewPeers, ErrTooFewPeers},
		{wire.CodeRejected, ErrAborted},
		{wire.CodeLocalFailure, ErrLocalFailure},
		{wire.Code(200), ErrAborted},
	}
	for _, c := range cases {
		err := outcomeError("op", &wire.Outcome{Code: c.code, Detail: "why"})
		if c.want == nil {
			if err != nil {
				t.Errorf("%v: %v, want nil", c.code, err)
			}
			continue
		}
		if !errors.Is(err, c.want) {
			t.Errorf("%v: %v, want %v", c.code, err, c.want)
		}
		for _, other := range []error{ErrPeerLeft, ErrTooFewPeers, ErrDescriptorMismatch, ErrLocalFailure} {
			if other != c.want && errors.Is(err, other) {
				t.Errorf("%v: %v also wraps %v", c.code, err, other)
			}
		}
	}
}

func TestRetryable(t *testing.T) {
	reset := errors.New("connection reset")
	cases := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{reset, false},
		{ErrPeerLeft, true},
		{ErrAborted, true},
		{ErrTooFewPeers, true},
		{ErrLocalFailure, false},
		{ErrNonFinite, false},
		{ErrKicked, false},
		{ErrClosed, false},
		{ErrDescriptorMismatch, false},
		{ErrMasterLost, false},
		{ErrBusy, false},
		{ErrInvalid, false},
		{ErrSync, false},
		{context.Canceled, false},
		{fmt.Errorf("allreduce tag 3: %w: peer 2: eof", ErrPeerLeft), true},
		{fmt.Errorf("%w: send chunk 1: %w", ErrAborted, reset), true},                 // a ring's link failure
		{fmt.Errorf("%w: chunk 0 part 0: %w", ErrAborted, ErrNonFinite), false},       // a ring's NaN
		{fmt.Errorf("%w: %w", ErrAborted, ErrKicked), false},                          // aborted because kicked
		{errors.Join(fmt.Errorf("op: %w", ErrLocalFailure), context.Canceled), false}, // another peer's NaN
		{outcomeError("op", &wire.Outcome{Code: wire.CodeLocalFailure}), false},
		{outcomeError("op", &wire.Outcome{Code: wire.CodeTooFewPeers}), true},
	}
	for _, c := range cases {
		if got := Retryable(c.err); got != c.want {
			t.Errorf("Retryable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestCodeOfRingErrors(t *testing.T) {
	reset := errors.New("connection reset")
	cases := []struct {
		err  error
		want wire.Code
	}{
		{nil, wire.CodeOK},
		{reset, wire.CodePeerLeft},
		{fmt.Errorf("%w: send chunk 1: %w", ErrAborted, reset), wire.CodePeerLeft},
		{fmt.Errorf("%w: %w", ErrAborted, context.Canceled), wire.CodeAborted},
		{fmt.Errorf("%w: %w", ErrAborted, context.DeadlineExceeded), wire.CodeAborted},
		{fmt.Errorf("%w: chunk 0 part 0: %w", ErrAborted, ErrNonFinite), wire.CodeLocalFailure},
		{fmt.Errorf("tag 1: %w", ErrAborted), wire.CodeAborted},
		{fmt.Errorf("%w: commit: %w", ErrAborted, fmt.Errorf("op: %w: detail", ErrAborted)), wire.CodeAborted},
		{fmt.Errorf("%w: recv: stream aborted: %w", ErrAborted, fmt.Errorf("op: %w", ErrPeerLeft)), wire.CodePeerLeft},
		{fmt.Errorf("%w: recv: stream aborted: %w", ErrAborted, fmt.Errorf("op: %w", ErrLocalFailure)), wire.CodeLocalFailure},
		{fmt.Errorf("%w: bad", ErrInvalid), wire.CodeLocalFailure},
	}
	for _, c := range cases {
		if got := codeOf(c.err); got != c.want {
			t.Errorf("codeOf(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// failingStream fails every Send with err and blocks every Recv until it is aborted.
type failingStream struct {
	err   error
	once  sync.Once
	abort chan struct{}
}

func (s *failingStream) Send(rings.ChunkID, []byte) error { return s.err }
func (s *failingStream) Recv(rings.ChunkID, []byte) error {
	<-s.abort
	return errors.New("aborted")
}
func (s *failingStream) Abort(error) { s.once.Do(func() { close(s.abort) }) }

// TestRingFailuresMapToCodes runs real ring collectives into each failure and checks the code a peer
// would report: a NaN under quantization is a local failure, not a peer that left.
func TestRingFailuresMapToCodes(t *testing.T) {
	nan := []float32{1, float32(math.NaN()), 3, 4}
	send := Bytes(nan)
	recv := make([]byte, len(send))
	opt := rings.Options{Quant: MinMaxU8}
	err := rings.AllReduce(context.Background(), &failingStream{abort: make(chan struct{})}, 0, 1, send, recv, F32, Sum, opt, nil)
	if !errors.Is(err, ErrNonFinite) || !errors.Is(err, ErrAborted) {
		t.Fatalf("quantized NaN: %v", err)
	}
	if got := codeOf(err); got != wire.CodeLocalFailure {
		t.Errorf("quantized NaN: code %v, want %v", got, wire.CodeLocalFailure)
	}
	if Retryable(err) {
		t.Errorf("quantized NaN: %v is retryable", err)
	}
	if remote := outcomeError("op", &wire.Outcome{Code: codeOf(err), Detail: err.Error()}); Retryable(remote) || !errors.Is(remote, ErrLocalFailure) {
		t.Errorf("quantized NaN seen by another peer: %v", remote)
	}

	err = rings.AllReduce(context.Background(), &failingStream{err: io.ErrClosedPipe, abort: make(chan struct{})}, 0, 2, send, recv, F32, Sum, rings.Options{}, nil)
	if got := codeOf(err); !errors.Is(err, io.ErrClosedPipe) || got != wire.CodePeerLeft || !Retryable(err) {
		t.Errorf("link failure %v: code %v, retryable %v", err, got, Retryable(err))
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = rings.AllReduce(ctx, &failingStream{abort: make(chan struct{})}, 0, 2, send, recv, F32, Sum, rings.Options{}, nil)
	if got := codeOf(err); got != wire.CodeAborted {
		t.Errorf("cancelled %v: code %v, want %v", err, got, wire.CodeAborted)
	}
}
