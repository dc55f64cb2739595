//go:build race

package transport

// raceEnabled reports whether this build runs the race detector.
const raceEnabled = true
