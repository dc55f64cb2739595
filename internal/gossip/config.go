package gossip

import (
	"fmt"
	"math"
	"time"
)

// Config tunes the failure detector. The zero value is the LAN preset bound to 127.0.0.1 on a free
// port.
type Config struct {
	// BindAddr is the host:port the member's UDP and TCP sockets listen on. Port 0 picks a free port
	// (the same for both). Default "127.0.0.1:0".
	BindAddr string
	// AdvertiseAddr is the host:port other members reach this one at. Default: the bound address.
	AdvertiseAddr string
	// ProbeInterval is how often a member probes another one. Default 500ms (LAN).
	ProbeInterval time.Duration
	// ProbeTimeout is how long a direct probe waits for its ack before indirect probes start; keep it
	// above the p99 round trip under bulk load. Default 300ms (LAN).
	ProbeTimeout time.Duration
	// SuspicionMult scales the suspicion timeout: SuspicionMult * max(1, log10 n) * ProbeInterval.
	// Default 4 (LAN: 2s, above the master's 1.5s heartbeat timeout).
	SuspicionMult int
	// SuspicionMaxTimeoutMult bounds the suspicion timeout before confirmations shorten it, as a
	// multiple of the one above. Default 4.
	SuspicionMaxTimeoutMult int
	// IndirectChecks is how many members probe a member on behalf of one whose direct probe failed.
	// Default 3.
	IndirectChecks int
	// AwarenessMaxMultiplier bounds how much a member that misses acks itself slows its probes and
	// lengthens its timeouts (Lifeguard). Default 8.
	AwarenessMaxMultiplier int
	// GossipInterval is how often a member gossips queued state changes. Default 100ms (LAN).
	GossipInterval time.Duration
	// Label separates runs sharing hosts: members with another label ignore each other's packets.
	// Default empty.
	Label string
}

// LAN returns the preset for members on one network: probes every 500ms, 300ms to answer, suspicion
// for 2s to 8s.
func LAN() Config {
	return Config{ProbeInterval: 500 * time.Millisecond, ProbeTimeout: 300 * time.Millisecond,
		SuspicionMult: 4, SuspicionMaxTimeoutMult: 4, IndirectChecks: 3, AwarenessMaxMultiplier: 8,
		GossipInterval: 100 * time.Millisecond}
}

// WAN returns the preset for members across the internet: probes every 2s, 1.5s to answer (round
// trips of hundreds of milliseconds under load), suspicion for 8s to 32s, above the master's 6s WAN
// heartbeat timeout.
func WAN() Config {
	return Config{ProbeInterval: 2 * time.Second, ProbeTimeout: 1500 * time.Millisecond,
		SuspicionMult: 4, SuspicionMaxTimeoutMult: 4, IndirectChecks: 3, AwarenessMaxMultiplier: 8,
		GossipInterval: 500 * time.Millisecond}
}

func (c Config) withDefaults() Config {
	l := LAN()
	if c.BindAddr == "" {
		c.BindAddr = "127.0.0.1:0"
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = l.ProbeInterval
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = l.ProbeTimeout
	}
	if c.SuspicionMult == 0 {
		c.SuspicionMult = l.SuspicionMult
	}
	if c.SuspicionMaxTimeoutMult == 0 {
		c.SuspicionMaxTimeoutMult = l.SuspicionMaxTimeoutMult
	}
	if c.IndirectChecks == 0 {
		c.IndirectChecks = l.IndirectChecks
	}
	if c.AwarenessMaxMultiplier == 0 {
		c.AwarenessMaxMultiplier = l.AwarenessMaxMultiplier
	}
	if c.GossipInterval == 0 {
		c.GossipInterval = l.GossipInterval
	}
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	d := c.withDefaults()
	switch {
	case c.ProbeInterval < 0 || c.ProbeTimeout < 0 || c.GossipInterval < 0:
		return fmt.Errorf("gossip: Config.ProbeInterval, ProbeTimeout and GossipInterval must be >= 0")
	case c.SuspicionMult < 0 || c.SuspicionMaxTimeoutMult < 0 || c.IndirectChecks < 0 || c.AwarenessMaxMultiplier < 0:
		return fmt.Errorf("gossip: Config.SuspicionMult, SuspicionMaxTimeoutMult, IndirectChecks and AwarenessMaxMultiplier must be >= 0")
	case d.ProbeTimeout >= d.ProbeInterval:
		return fmt.Errorf("gossip: Config.ProbeTimeout (%v) must be below ProbeInterval (%v)", d.ProbeTimeout, d.ProbeInterval)
	}
	return nil
}

// SuspicionTimeout returns the shortest and the longest suspicion timeout in a group of n members.
func (c Config) SuspicionTimeout(n int) (lo, hi time.Duration) {
	d := c.withDefaults()
	scale := math.Max(1, math.Log10(math.Max(1, float64(n))))
	lo = time.Duration(float64(d.SuspicionMult) * scale * float64(d.ProbeInterval))
	if n-2 < d.SuspicionMult-2 {
		// Too few members to expect confirmations: the timeout is the shortest one.
		return lo, lo
	}
	return lo, time.Duration(d.SuspicionMaxTimeoutMult) * lo
}

// Bound returns the longest time from a member hanging to its death being known to the others, in a
// group of n members (the hung one included; the others healthy). The package documentation derives
// it.
func (c Config) Bound(n int) time.Duration {
	d := c.withDefaults()
	_, hi := d.SuspicionTimeout(n)
	return time.Duration(2*max(n, 1)+1)*d.ProbeInterval + hi
}
