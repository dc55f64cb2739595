package transport

import (
	"io"
	"testing"
	"testing/synctest"
	"time"
)

// arrival writes msg on w and returns how long it took to read it whole on r.
func arrival(t *testing.T, w, r interface {
	Write([]byte) (int, error)
	Read([]byte) (int, error)
}, msg string) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := w.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(r, buf); err != nil {
		t.Fatal(err)
	}
	if string(buf) != msg {
		t.Fatalf("read %q, want %q", buf, msg)
	}
	return time.Since(start)
}

// TestLinkDefaultGivesNewLinksTheirConfig: links made after SetLinkDefault take its config, each
// direction its own; a link set before keeps its config.
func TestLinkDefaultGivesNewLinksTheirConfig(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		n.SetLink("a", "c", LinkConfig{Latency: time.Millisecond})
		n.SetLinkDefault(func(from, to string) LinkConfig {
			if from == "a" {
				return LinkConfig{Latency: 30 * time.Millisecond}
			}
			return LinkConfig{Latency: 10 * time.Millisecond}
		})
		ab, ba := memPair(t, n, "a", "b")
		if d := arrival(t, ab, ba, "x"); d != 30*time.Millisecond {
			t.Fatalf("a->b took %v, want 30ms", d)
		}
		if d := arrival(t, ba, ab, "y"); d != 10*time.Millisecond {
			t.Fatalf("b->a took %v, want 10ms", d)
		}
		ac2, ca2 := memPair(t, n, "a", "c")
		if d := arrival(t, ac2, ca2, "z"); d != time.Millisecond {
			t.Fatalf("a->c took %v, want the 1ms set before the default", d)
		}
	})
}

// TestHoldDelaysWithoutLoss: while a host is held, what it writes and what is written to it arrives
// when the hold ends, in order and whole; connections are accepted meanwhile; afterwards the links
// are as before.
func TestHoldDelaysWithoutLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewNetwork()
		n.SetLinkDefault(func(from, to string) LinkConfig { return LinkConfig{Latency: 5 * time.Millisecond} })
		ab, ba := memPair(t, n, "a", "b")
		start := time.Now()
		n.Hold("b", start.Add(2*time.Second))
		if d := arrival(t, ab, ba, "to the held host"); d != 2*time.Second {
			t.Fatalf("a->b during the hold took %v, want 2s", d)
		}
		if d := arrival(t, ba, ab, "from it"); d != 5*time.Millisecond {
			t.Fatalf("b->a after the hold took %v, want 5ms", d)
		}
		n.Hold("b", time.Now().Add(time.Second))
		// A new link, made during the hold (c has never talked to b), is held too.
		cb, bc := memPair(t, n, "c", "b")
		if d := arrival(t, bc, cb, "from the held host on a new link"); d != time.Second {
			t.Fatalf("b->c during the hold took %v, want 1s", d)
		}
		n.Hold("b", time.Time{})
		if d := arrival(t, ab, ba, "after"); d != 5*time.Millisecond {
			t.Fatalf("a->b after the hold took %v, want 5ms", d)
		}
	})
}
