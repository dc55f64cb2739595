package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// leaver turns the first SIGTERM or SIGINT, or a preemption notice, into a request to leave the
// group at the next membership step, and the second signal, or the leave timeout, into stopping at
// once (cancel).
type leaver struct {
	sigs   chan os.Signal
	done   chan struct{}
	wg     sync.WaitGroup
	asked  atomic.Bool
	mu     sync.Mutex
	reason string
}

func newLeaver(ctx context.Context, cancel context.CancelFunc, notice *preemptWatch, timeout time.Duration) *leaver {
	l := &leaver{sigs: make(chan os.Signal, 2), done: make(chan struct{})}
	signal.Notify(l.sigs, syscall.SIGTERM, os.Interrupt)
	var noticed <-chan string
	if notice != nil {
		noticed = notice.watch(ctx)
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		var deadline <-chan time.Time
		for {
			select {
			case sig := <-l.sigs:
				if l.asked.Load() {
					l.setReason(fmt.Sprintf("%v again: stopping at once", sig))
					cancel()
					return
				}
				l.ask(fmt.Sprintf("%v", sig))
				fmt.Fprintf(os.Stderr, "\n%v: leaving the group at the next membership step (again to stop at once)\n", sig)
				deadline = time.After(timeout)
			case what, ok := <-noticed:
				if !ok {
					noticed = nil
					continue
				}
				if !l.asked.Load() {
					l.ask("preemption notice: " + what)
					fmt.Fprintf(os.Stderr, "\npreemption notice (%s): leaving the group at the next membership step\n", what)
					deadline = time.After(timeout)
				}
			case <-deadline:
				l.setReason(fmt.Sprintf("no membership step to leave at within %v: stopping at once", timeout))
				cancel()
				return
			case <-l.done:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return l
}

func (l *leaver) ask(why string) {
	l.setReason(why)
	l.asked.Store(true)
}

func (l *leaver) setReason(why string) {
	l.mu.Lock()
	l.reason = why
	l.mu.Unlock()
}

// requested reports whether the peer is to leave.
func (l *leaver) requested() bool { return l.asked.Load() }

// why says what asked the peer to leave or stop.
func (l *leaver) why() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reason == "" {
		return "stopped"
	}
	return l.reason
}

func (l *leaver) stop() {
	signal.Stop(l.sigs)
	close(l.done)
	l.wg.Wait()
}

// preemptWatch polls where a preemption notice appears: a file, or an http(s) URL.
type preemptWatch struct {
	where string
	every time.Duration
	get   func(ctx context.Context) (string, bool, error) // the notice, whether there is one
}

// newPreemptWatch returns a watch of where (nil if empty).
func newPreemptWatch(where string, every time.Duration) (*preemptWatch, error) {
	if where == "" {
		return nil, nil
	}
	if every <= 0 {
		return nil, fmt.Errorf("--preempt-poll %v: must be positive", every)
	}
	w := &preemptWatch{where: where, every: every}
	if strings.HasPrefix(where, "http://") || strings.HasPrefix(where, "https://") {
		client := &http.Client{Timeout: every}
		w.get = func(ctx context.Context) (string, bool, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, where, nil)
			if err != nil {
				return "", false, err
			}
			// The metadata services of the large clouds want one of these to answer.
			req.Header.Set("Metadata-Flavor", "Google")
			req.Header.Set("Metadata", "true")
			resp, err := client.Do(req)
			if err != nil {
				return "", false, err
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			return noticeIn(resp.StatusCode, string(body))
		}
		return w, nil
	}
	w.get = func(context.Context) (string, bool, error) {
		b, err := os.ReadFile(where)
		if os.IsNotExist(err) {
			return "", false, nil
		}
		if err != nil {
			return "", false, err
		}
		return noticeIn(http.StatusOK, string(b))
	}
	return w, nil
}

// noticeIn says whether an answer announces a preemption: status 200 and a body that is neither
// empty nor a word for no ("false", "none", "0"), as the clouds' metadata endpoints answer.
func noticeIn(status int, body string) (string, bool, error) {
	b := strings.TrimSpace(body)
	if status != http.StatusOK {
		return "", false, nil
	}
	switch strings.ToLower(b) {
	case "", "false", "none", "0", "null", "{}":
		return "", false, nil
	}
	if len(b) > 120 {
		b = b[:120] + "..."
	}
	return b, true, nil
}

// watch polls until a notice comes, sends it once, and closes the channel.
func (w *preemptWatch) watch(ctx context.Context) <-chan string {
	out := make(chan string, 1)
	go func() {
		defer close(out)
		t := time.NewTicker(w.every)
		defer t.Stop()
		for {
			if what, ok, _ := w.get(ctx); ok {
				out <- what
				return
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}
