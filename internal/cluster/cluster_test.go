package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/pccl/master"
)

// testRoles are the roles the test binary runs when re-executed as a child.
var testRoles = map[string]func() int{
	"echo":  echoRole,
	"sleep": sleepRole,
}

func TestMain(m *testing.M) {
	Main(testRoles)
	goleak.VerifyTestMain(m)
}

type helloEvent struct {
	Event string   `json:"event"`
	Name  string   `json:"name"`
	Args  []string `json:"args"`
	Extra string   `json:"extra"`
}

type command struct {
	Cmd  string `json:"cmd"`
	Code int    `json:"code"`
	Text string `json:"text"`
}

// echoRole greets, then echoes every command's text until told to exit.
func echoRole() int {
	Emit(helloEvent{Event: "hello", Name: Name(), Args: os.Args[1:], Extra: os.Getenv("EXTRA")})
	for raw := range Inbox() {
		var c command
		if err := json.Unmarshal(raw, &c); err != nil {
			return 1
		}
		switch c.Cmd {
		case "echo":
			Emit(map[string]string{"event": "echo", "text": c.Text})
			os.Stdout.WriteString("not json\n")
		case "exit":
			return c.Code
		}
	}
	return 0
}

// sleepRole reports that it runs, then waits to be killed (or for its stdin to end).
func sleepRole() int {
	Emit(map[string]string{"event": "ready"})
	select {}
}

func newTestCluster(t *testing.T) *Cluster {
	t.Helper()
	c := New(Config{Stderr: io.Discard})
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// assertGone checks that no process with pid exists any more (it was reaped, not left a zombie).
func assertGone(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("pid %d still exists after reaping (kill 0: %v)", pid, err)
	}
}

func TestSpawnReadSendKill(t *testing.T) {
	c := newTestCluster(t)
	ctx := testContext(t)
	p, err := c.Spawn(Spec{Role: "echo", Name: "e1", Args: []string{"a", "b"}, Env: []string{"EXTRA=x"}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := p.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var h helloEvent
	if err := l.Decode(&h); err != nil {
		t.Fatal(err)
	}
	if l.Event != "hello" || l.Proc != p || h.Name != "e1" || strings.Join(h.Args, ",") != "a,b" || h.Extra != "x" {
		t.Fatalf("hello line = %+v, decoded %+v", l, h)
	}
	if err := p.Send(command{Cmd: "echo", Text: "ping"}); err != nil {
		t.Fatal(err)
	}
	l, err = p.Await(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Fields["text"]; got != "ping" {
		t.Fatalf("echo text = %v, want ping", got)
	}
	l, err = p.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Fields != nil || string(l.Raw) != "not json" || l.Event != "" {
		t.Fatalf("plain line = %+v", l)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	code, err := p.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if code != -1 {
		t.Fatalf("exit code after SIGKILL = %d, want -1", code)
	}
	if ws := p.State().Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("wait status = %v, want killed by SIGKILL", ws)
	}
	if _, err := p.Next(ctx); !errors.Is(err, ErrExited) {
		t.Fatalf("Next after exit: %v, want ErrExited", err)
	}
	if err := p.Kill(); !errors.Is(err, ErrExited) {
		t.Fatalf("Kill after exit: %v, want ErrExited", err)
	}
	if err := p.Send(command{Cmd: "echo"}); !errors.Is(err, ErrExited) {
		t.Fatalf("Send after exit: %v, want ErrExited", err)
	}
	assertGone(t, p.Pid())
}

func TestExitCodes(t *testing.T) {
	c := newTestCluster(t)
	ctx := testContext(t)
	p, err := c.Spawn(Spec{Role: "echo"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Name() != "echo-1" || p.Role() != "echo" {
		t.Fatalf("name %q role %q", p.Name(), p.Role())
	}
	if err := p.Send(command{Cmd: "exit", Code: 7}); err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(ctx); err != nil || code != 7 {
		t.Fatalf("Wait = %d, %v; want 7", code, err)
	}

	u, err := c.Spawn(Spec{Role: "no-such-role"})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := u.Wait(ctx); err != nil || code != ExitUnknownRole {
		t.Fatalf("unknown role: Wait = %d, %v; want %d", code, err, ExitUnknownRole)
	}

	g, err := c.Spawn(Spec{Role: "sleep"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Await(ctx, "ready"); err != nil {
		t.Fatal(err)
	}
	g.closeStdin()
	if code, err := g.Wait(ctx); err != nil || code != ExitParentGone {
		t.Fatalf("stdin closed: Wait = %d, %v; want %d", code, err, ExitParentGone)
	}
}

// procState returns the state letter of pid from /proc (R, S, T, ...).
func procState(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return strings.Fields(s[i+1:])[0]
}

func TestStopContinue(t *testing.T) {
	c := newTestCluster(t)
	ctx := testContext(t)
	p, err := c.Spawn(Spec{Role: "echo"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Await(ctx, "hello"); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	// SIGSTOP is delivered asynchronously; wait (bounded) until the kernel shows the stop.
	for procState(t, p.Pid()) != "T" {
		select {
		case <-ctx.Done():
			t.Fatal("child never showed state T after SIGSTOP")
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := p.Send(command{Cmd: "echo", Text: "after"}); err != nil {
		t.Fatal(err)
	}
	if err := p.Continue(); err != nil {
		t.Fatal(err)
	}
	l, err := p.Await(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}
	if l.Fields["text"] != "after" {
		t.Fatalf("echo = %s", l.Raw)
	}
}

func TestCloseKillsEverything(t *testing.T) {
	c := New(Config{Stderr: io.Discard})
	ctx := testContext(t)
	var procs []*Proc
	for range 3 {
		p, err := c.Spawn(Spec{Role: "sleep"})
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
	}
	seen := map[*Proc]bool{}
	for len(seen) < len(procs) {
		select {
		case l := <-c.Lines():
			if l.Event != "ready" {
				t.Fatalf("merged line %s", l)
			}
			seen[l.Proc] = true
		case <-ctx.Done():
			t.Fatal("merged lines incomplete")
		}
	}
	if err := procs[1].Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for _, p := range procs {
		select {
		case <-p.Done():
		default:
			t.Fatalf("%s not reaped by Close", p.Name())
		}
		if p.ExitCode() != -1 {
			t.Errorf("%s exit code %d, want -1 (killed)", p.Name(), p.ExitCode())
		}
		assertGone(t, p.Pid())
		if _, ok := <-p.Lines(); ok {
			// Lines may still hold the ready line if nobody read it; drain to the close.
			for range p.Lines() {
			}
		}
	}
	if _, ok := <-c.Lines(); ok {
		t.Fatal("merged Lines not closed by Close")
	}
	if _, err := c.Spawn(Spec{Role: "sleep"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Spawn after Close: %v, want ErrClosed", err)
	}
	if got := len(c.Procs()); got != 3 {
		t.Fatalf("Procs() has %d entries, want 3", got)
	}
}

func TestStartMaster(t *testing.T) {
	c := newTestCluster(t)
	ctx := testContext(t)
	p, addr, err := c.StartMaster(ctx, master.LAN())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("master address %q is not on 127.0.0.1", addr)
	}
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(ctx); err != nil || code != 0 {
		t.Fatalf("master after SIGTERM: Wait = %d, %v; want 0", code, err)
	}
}

func TestFeedKeepsOrderWithoutReader(t *testing.T) {
	stop := make(chan struct{})
	f := newFeed[int](stop)
	for i := range 1000 {
		f.push(i)
	}
	f.close()
	f.push(-1) // dropped
	want := 0
	for v := range f.out {
		if v != want {
			t.Fatalf("got %d, want %d", v, want)
		}
		want++
	}
	if want != 1000 {
		t.Fatalf("delivered %d values, want 1000", want)
	}
	g := newFeed[int](stop)
	g.push(1)
	close(stop)
	<-g.done
}
