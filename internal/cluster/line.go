package cluster

import (
	"encoding/json"
	"fmt"
	"time"
)

// Line is one line a child printed on stdout.
type Line struct {
	// Proc is the child that printed the line.
	Proc *Proc
	// Time is when the parent read the line.
	Time time.Time
	// Raw is the line without its newline. It is owned by the Line and never modified.
	Raw []byte
	// Fields is Raw decoded as a JSON object, or nil if Raw is not one.
	Fields map[string]any
	// Event is the string value of the field "event", or "" if there is none.
	Event string
}

// newLine builds the Line for raw, which it keeps.
func newLine(p *Proc, now time.Time, raw []byte) Line {
	l := Line{Proc: p, Time: now, Raw: raw}
	if json.Unmarshal(raw, &l.Fields) != nil {
		l.Fields = nil
	}
	if s, ok := l.Fields["event"].(string); ok {
		l.Event = s
	}
	return l
}

// Decode unmarshals the line as JSON into v.
func (l Line) Decode(v any) error {
	if err := json.Unmarshal(l.Raw, v); err != nil {
		return fmt.Errorf("cluster: %s: line %q: %w", l.Proc.Name(), l.Raw, err)
	}
	return nil
}

// String returns the child's name and the raw line.
func (l Line) String() string {
	if l.Proc == nil {
		return string(l.Raw)
	}
	return l.Proc.Name() + ": " + string(l.Raw)
}
