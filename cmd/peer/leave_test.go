package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/hosts"
)

func TestNoticeIn(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   bool
	}{
		{200, "TRUE", true},
		{200, `{"action": "terminate", "time": "2026-11-28T18:00:00Z"}`, true},
		{200, "FALSE", false},
		{200, "  false\n", false},
		{200, "", false},
		{404, "Not Found", false},
		{200, "none", false},
	} {
		if _, got, _ := noticeIn(tc.status, tc.body); got != tc.want {
			t.Errorf("noticeIn(%d, %q) = %v, want %v", tc.status, tc.body, got, tc.want)
		}
	}
}

// TestPreemptWatch polls a file and a metadata endpoint (on loopback) that announce a preemption
// after a while: the notice comes once, then the channel closes.
func TestPreemptWatch(t *testing.T) {
	file := filepath.Join(t.TempDir(), "notice")
	var preempted atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !preempted.Load() {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(`{"action": "terminate"}`))
	}))
	defer srv.Close()
	for _, where := range []string{file, srv.URL} {
		w, err := newPreemptWatch(where, 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ch := w.watch(ctx)
		select {
		case what := <-ch:
			t.Fatalf("%s: a notice before there was one: %q", where, what)
		case <-time.After(100 * time.Millisecond):
		}
		os.WriteFile(file, []byte("TRUE\n"), 0o644)
		preempted.Store(true)
		select {
		case what, ok := <-ch:
			if !ok || what == "" {
				t.Fatalf("%s: no notice", where)
			}
		case <-ctx.Done():
			t.Fatalf("%s: no notice within 10s", where)
		}
		if _, ok := <-ch; ok {
			t.Fatalf("%s: a second notice", where)
		}
		cancel()
		os.Remove(file)
		preempted.Store(false)
	}
	if _, err := newPreemptWatch(file, 0); err == nil {
		t.Error("a poll period of 0: no error")
	}
}

// TestSpotLeaveOnHosts runs four `peer run` on hosts of their own and makes one leave as a spot
// instance does, on SIGTERM and on a preemption notice in a file: it leaves at its next membership
// step and exits 0, and the others go on without a single aborted step.
func TestSpotLeaveOnHosts(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real processes on five hosts")
	}
	if raceBuild {
		t.Skip("runs the commands as separate binaries, built without the race detector: run without -race")
	}
	if err := hosts.Available(); err != nil {
		t.Skipf("runs on network namespaces, which need root: %v", err)
	}
	bin := buildBinaries(t)
	for _, how := range []string{"sigterm", "notice", "train sigterm"} {
		t.Run(how, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			dir := t.TempDir()
			notice := func(i int) string { return filepath.Join(dir, fmt.Sprintf("preempted-%d", i)) }
			o := hostRunOpts{peers: 4, extra: func(i int) []string {
				return []string{"--preempt-notice", notice(i), "--preempt-poll", "50ms"}
			}}
			steps := uint64(10)
			if how == "train sigterm" {
				// The DiLoCo trainer, with short outer steps, so that it reaches several.
				o.command = []string{"train", "--inner-steps", "4", "--batch", "16", "--steps", "100000"}
				steps = 3
			}
			r := newHostRunOpts(t, ctx, bin, o)
			r.settled(time.Minute)
			r.progress([]int{0, 1, 2, 3}, steps, time.Minute)
			const victim = 3
			if how != "notice" {
				r.peers[victim].cmd.Process.Signal(syscall.SIGTERM)
			} else {
				os.WriteFile(notice(victim), []byte("TRUE"), 0o644)
			}
			r.peers[victim].wait()
			if err := r.peers[victim].err; err != nil {
				t.Fatalf("the leaving peer exited with %v:\n%s", err, r.peers[victim].out.String())
			}
			if !strings.Contains(r.peers[victim].out.String(), "left the group at step") {
				t.Fatalf("the leaving peer did not leave at a step:\n%s", r.peers[victim].out.String())
			}
			r.peers = r.peers[:victim]
			r.progress([]int{0, 1, 2}, steps, time.Minute)
			for i := range r.peers {
				if e := r.last(i); e.Aborts != 0 || e.World != 3 {
					t.Errorf("peer %d after the leave: %d aborts, world %d; want none and 3", i, e.Aborts, e.World)
				}
			}
			r.check()
		})
	}
}
