package diagnosis

import (
	"fmt"
	"math"
)

// Config tunes a Detector. The zero value works: every zero field takes the default it documents.
type Config struct {
	// Recent is how many of a figure's latest samples its estimate is the median of. Zero means 3.
	Recent int
	// Raise is the ratio to the group median beyond which a figure is hot. Zero means 2.
	Raise float64
	// Floor is the least excess over the median, as a fraction of the median span per byte, for a
	// figure to be hot; it keeps noise on figures close to zero quiet. Zero means 0.1.
	Floor float64
	// Confirm is how many consecutive operations a syndrome must hold before it is raised. A
	// syndrome holds in an operation only when its culprit's figure stood out in each of the last
	// Recent operations, so Confirm 1 already needs Recent slow operations in a row. Zero means 1.
	Confirm int
	// Release is how many consecutive operations a syndrome must be absent before it is cleared.
	// Zero means 3.
	Release int
	// Stale is how many operations a link's cell stays in the matrix after it was last observed.
	// Zero means 20.
	Stale int
	// WaitFraction is the least fraction of its span a peer must have waited on its predecessors to
	// count as waiting in the waiting chain. Zero means 0.25.
	WaitFraction float64
	// MinBytes is the least bytes a link must carry in an operation to be sampled: below it, latency
	// rather than bandwidth sets the figures. Zero means 64 KiB.
	MinBytes uint64
}

func (c Config) withDefaults() Config {
	if c.Recent == 0 {
		c.Recent = 3
	}
	if c.Raise == 0 {
		c.Raise = 2
	}
	if c.Floor == 0 {
		c.Floor = 0.1
	}
	if c.Confirm == 0 {
		c.Confirm = 1
	}
	if c.Release == 0 {
		c.Release = 3
	}
	if c.Stale == 0 {
		c.Stale = 20
	}
	if c.WaitFraction == 0 {
		c.WaitFraction = 0.25
	}
	if c.MinBytes == 0 {
		c.MinBytes = 64 << 10
	}
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Recent < 0 || c.Recent > maxWindow:
		return fmt.Errorf("diagnosis: Config.Recent is %d, must be in [0, %d]", c.Recent, maxWindow)
	case c.Raise != 0 && !(c.Raise > 1):
		return fmt.Errorf("diagnosis: Config.Raise is %v, must be 0 or above 1", c.Raise)
	case c.Floor < 0 || math.IsNaN(c.Floor):
		return fmt.Errorf("diagnosis: Config.Floor is %v, must be >= 0", c.Floor)
	case c.Confirm < 0 || c.Release < 0 || c.Stale < 0:
		return fmt.Errorf("diagnosis: Config.Confirm, Release and Stale must be >= 0")
	case c.WaitFraction < 0 || c.WaitFraction >= 1 || math.IsNaN(c.WaitFraction):
		return fmt.Errorf("diagnosis: Config.WaitFraction is %v, must be in [0, 1)", c.WaitFraction)
	}
	return nil
}
