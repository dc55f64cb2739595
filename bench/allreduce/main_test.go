package main

import (
	"context"
	"io"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/cluster"
)

func TestMain(m *testing.M) {
	cluster.Main(roles)
	goleak.VerifyTestMain(m)
}

// TestBenchSmall runs the whole benchmark on a small buffer: every element of every peer's result
// must be right and the hashes equal.
func TestBenchSmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := cluster.New(cluster.Config{Stderr: io.Discard})
	defer c.Close()
	p := params{Peers: 3, Bytes: 1<<20 + 12, Iters: 2, Warmup: 1, Part: 64 << 10}
	res, err := bench(ctx, c, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Correct || !res.HashesEqual {
		t.Fatalf("result not correct: %+v", res)
	}
	if want := int64(3 * 3 * p.Bytes / 4); res.ElementsChecked != want {
		t.Fatalf("checked %d elements, want %d", res.ElementsChecked, want)
	}
	if len(res.Seconds) != 2 || !(res.SecondsMedian > 0) || !(res.LimitSeconds > 0) || !(res.LimitReduceSeconds > res.LimitSeconds) {
		t.Fatalf("figures missing: %+v", res)
	}
	for _, pr := range c.Procs() {
		if pr.Role() != roleMaster && pr.ExitCode() != 0 {
			t.Errorf("%s exited with %d", pr.Name(), pr.ExitCode())
		}
	}
}

// TestBenchTransports runs the benchmark over tls and quic on a small buffer: the master and every
// peer talk over the authenticated transport, and every element must be right.
func TestBenchTransports(t *testing.T) {
	for _, name := range []string{"tls", "quic"} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c := cluster.New(cluster.Config{Stderr: io.Discard})
			defer c.Close()
			p := params{Peers: 2, Bytes: 256<<10 + 4, Iters: 1, Warmup: 1, Part: 64 << 10, Transport: name}
			res, err := bench(ctx, c, p, 1)
			if err != nil {
				t.Fatal(err)
			}
			if res.Transport != name || !res.Correct || !res.HashesEqual {
				t.Fatalf("result not correct: %+v", res)
			}
			if want := int64(2 * 2 * p.Bytes / 4); res.ElementsChecked != want {
				t.Fatalf("checked %d elements, want %d", res.ElementsChecked, want)
			}
		})
	}
}
