// Package logx builds the structured loggers of Concord's commands from their flags.
package logx

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// New returns a slog logger writing to w in format "text" or "json" at level "debug", "info", "warn"
// or "error".
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}
