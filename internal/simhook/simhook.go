// Package simhook carries the hooks of the simulated cluster (stress/sim) into the runtime: a peer's
// wall-clock error, for clock jumps, and a master's pause switch, for a stall of the whole process.
// They travel in the context given to pccl.Connect and master.Server.Serve. Only code of this module
// can import the package, so the hooks are no part of the public API; a context without them leaves
// the runtime as it always is.
package simhook

import (
	"context"
	"sync"
	"time"
)

type clockKey struct{}

type gateKey struct{}

// WithWallOffset returns ctx carrying offset, which a peer connected with it calls whenever it reads
// the wall clock (Unix time) rather than measuring a duration: the result is added to the wall
// reading, as a clock that an NTP step moved forward (positive) or back. Durations measured with
// time.Since and timers use the monotonic clock and are not affected, as in a real process.
func WithWallOffset(ctx context.Context, offset func() time.Duration) context.Context {
	return context.WithValue(ctx, clockKey{}, offset)
}

// WallOffset returns the offset function ctx carries, or nil.
func WallOffset(ctx context.Context) func() time.Duration {
	f, _ := ctx.Value(clockKey{}).(func() time.Duration)
	return f
}

// Gate pauses a master's event loop as a SIGSTOP pauses its process: while shut, the loop takes no
// input and runs no timer; when opened, it finds its tick late by the pause, as a continued process
// does. The zero value is not usable; NewGate makes one. Its methods are safe for concurrent use.
type Gate struct {
	mu     sync.Mutex
	shut   chan struct{} // closed while the gate is shut
	opened chan struct{} // closed when the gate opens after a shut
}

// NewGate returns an open gate.
func NewGate() *Gate {
	g := &Gate{shut: make(chan struct{}), opened: make(chan struct{})}
	close(g.opened)
	return g
}

// Shut pauses the loop at its next turn. It does nothing on a gate already shut.
func (g *Gate) Shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.shut:
		return
	default:
	}
	g.opened = make(chan struct{})
	close(g.shut)
}

// Open lets the loop go on. It does nothing on an open gate.
func (g *Gate) Open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.shut:
	default:
		return
	}
	g.shut = make(chan struct{})
	close(g.opened)
}

// Shutting returns a channel that is closed while the gate is shut; a loop selects on it beside its
// inputs and calls Wait when it is.
func (g *Gate) Shutting() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.shut
}

// Wait blocks until the gate is open or ctx ends.
func (g *Gate) Wait(ctx context.Context) {
	g.mu.Lock()
	o := g.opened
	g.mu.Unlock()
	select {
	case <-o:
	case <-ctx.Done():
	}
}

// WithGate returns ctx carrying g, for master.Server.Serve.
func WithGate(ctx context.Context, g *Gate) context.Context {
	return context.WithValue(ctx, gateKey{}, g)
}

// GateOf returns the gate ctx carries, or nil.
func GateOf(ctx context.Context) *Gate {
	g, _ := ctx.Value(gateKey{}).(*Gate)
	return g
}

type plantedKey struct{}

// HearsSilent is a planted bug of the master: when it judges a group's silence, it counts every
// peer as heard, however long it has been silent. On the minority side of a partition it then kicks
// the silent majority after HeartbeatTimeout, where it should wait PartitionTimeout for a short cut
// of its own link to heal without costing anyone their session.
const HearsSilent = "hears-silent"

// WithPlanted returns ctx carrying the names of planted bugs: deliberate misbehaviours that the
// simulated soak plants to show that its invariants catch them. The master's code that a planted
// bug breaks checks Planted on the context of Serve; nothing else ever carries one.
func WithPlanted(ctx context.Context, names ...string) context.Context {
	return context.WithValue(ctx, plantedKey{}, append([]string(nil), names...))
}

// Planted reports whether ctx carries the planted bug name.
func Planted(ctx context.Context, name string) bool {
	names, _ := ctx.Value(plantedKey{}).([]string)
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}
