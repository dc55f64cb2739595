package cluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
)

// Environment variables the supervisor sets for every child.
const (
	// EnvRole names the role a child runs. A program started without it is a parent.
	EnvRole = "CONCORD_CLUSTER_ROLE"
	// EnvName is the child's name (Spec.Name).
	EnvName = "CONCORD_CLUSTER_NAME"
	// EnvLog sets the level of [Logger] in a child: "debug", "info", "warn" (the default) or "error".
	EnvLog = "CONCORD_CLUSTER_LOG"
)

// Exit codes of [Main] itself, next to those the roles return.
const (
	// ExitUnknownRole means EnvRole named a role the program does not register.
	ExitUnknownRole = 2
	// ExitParentGone means the child's stdin reached end of file: its supervisor closed it or died.
	ExitParentGone = 3
)

// child-side state, set up by Main before the role runs.
var (
	emitMu sync.Mutex // serializes writes to stdout
	inbox  *feed[json.RawMessage]
)

// Main runs the role named by EnvRole and exits the process with its status, or returns at once when
// EnvRole is unset (the parent). Call it first thing in main. roles maps role names to functions that
// return the exit status; [RoleMaster] is added when roles lacks it. While the role runs, the child's
// stdin is read into [Inbox]; at its end of file the child exits with ExitParentGone.
func Main(roles map[string]func() int) {
	role, ok := os.LookupEnv(EnvRole)
	if !ok {
		return
	}
	fn := roles[role]
	if fn == nil && role == RoleMaster {
		fn = masterMain
	}
	if fn == nil {
		fmt.Fprintf(os.Stderr, "cluster: unknown role %q\n", role)
		os.Exit(ExitUnknownRole)
	}
	inbox = newFeed[json.RawMessage](nil)
	go readInbox()
	os.Exit(fn())
}

// readInbox feeds the child's stdin lines to the inbox and exits the process at end of file.
func readInbox() {
	r := bufio.NewReaderSize(os.Stdin, 64<<10)
	for {
		raw, err := readLine(r)
		if len(raw) > 0 {
			inbox.push(json.RawMessage(raw))
		}
		if err != nil {
			os.Exit(ExitParentGone)
		}
	}
}

// Inbox returns the channel of the JSON lines the parent sent with [Proc.Send], in order. It is nil in
// a process that [Main] did not start as a child.
func Inbox() <-chan json.RawMessage {
	if inbox == nil {
		return nil
	}
	return inbox.out
}

// Emit writes v as one JSON line to stdout, where the parent reads it as a [Line]. It may be called
// from any goroutine; lines are never interleaved.
func Emit(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("cluster: emit: %w", err)
	}
	b = append(b, '\n')
	emitMu.Lock()
	defer emitMu.Unlock()
	if _, err := os.Stdout.Write(b); err != nil {
		return fmt.Errorf("cluster: emit: %w", err)
	}
	return nil
}

// Name returns the child's name (EnvName), or "" in a parent.
func Name() string { return os.Getenv(EnvName) }

// Logger returns a logger that writes text to stderr at the level EnvLog names (default warn), with
// the child's name as attribute "proc".
func Logger() *slog.Logger {
	var lvl slog.Level
	switch strings.ToLower(os.Getenv(EnvLog)) {
	case "debug":
		lvl = slog.LevelDebug
	case "info":
		lvl = slog.LevelInfo
	case "error":
		lvl = slog.LevelError
	default:
		lvl = slog.LevelWarn
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})).With("proc", Name())
}
