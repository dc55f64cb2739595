package master

import (
	"fmt"
	"math"
	"time"
)

// Config configures the master's state machine. The zero value works: it is the LAN preset with no run
// token and MinPeers 1.
type Config struct {
	// Token is the run token every peer must present in its Hello. Empty accepts only peers that send
	// an empty token.
	Token string
	// MinPeers is the smallest group that runs collectives: with fewer accepted peers, collectives fail
	// with ErrTooFewPeers until more join. Zero means 1.
	MinPeers int
	// HeartbeatInterval is how often peers send heartbeats. Zero means 250ms (LAN preset).
	HeartbeatInterval time.Duration
	// HeartbeatTimeout is how long a peer may stay silent before it is declared gone, kicked, and every
	// operation it takes part in is aborted. Zero means 1.5s (LAN preset), which bounds the detection of
	// a hung (SIGSTOPped) peer to under 2s.
	HeartbeatTimeout time.Duration
	// PartitionTimeout is how long the master waits before it kicks silent peers of a group while it
	// hears from some of the group but fewer than half: more likely the master is cut off from most of
	// the group than most of the group died at once, so it waits for the network to heal. While it
	// hears from half of a group or more, a silent peer is kicked after HeartbeatTimeout; while it
	// hears from none of a group, nobody in it is kicked for silence (see heartbeat.go). Zero means 5 ×
	// HeartbeatTimeout.
	PartitionTimeout time.Duration
	// MeasureDuration is the time budget of one bandwidth test of OptimizeTopology: the receiver counts
	// during 80% of it, the rest covers the handshake and the latencies. Zero means 500ms. A
	// measurement of n peers takes n-1 rounds of tests run in parallel.
	MeasureDuration time.Duration
	// MeasureStreams is the number of connections one bandwidth test uses. Zero means 2.
	MeasureStreams int
	// SolveBudget bounds the quick ring solve of OptimizeTopology. Zero means 200ms. A background
	// search keeps improving afterwards and proposes a better ring at the next OptimizeTopology.
	SolveBudget time.Duration
	// ImproveBudget bounds that background search. Zero means 30s.
	ImproveBudget time.Duration
	// MaxPeers is the most peers (registered and accepted, all groups) the master admits; a Hello
	// beyond it is refused with a Kick that says so. Zero means 16384.
	MaxPeers int
	// MaxOpsPerPeer is the most collectives (distinct tags) one peer may have voted for or running at
	// once; a peer that votes for more is kicked. Zero means 256.
	MaxOpsPerPeer int
	// Guard is the contribution guard (see GuardPolicy). The zero value checks nothing.
	Guard GuardPolicy
	// ResumeGrace is how long a restarted master waits for the peers of the master before it to come
	// back and report what they hold before it rebuilds each group from their reports (see resume.go);
	// it stops waiting as soon as every peer of each group's majority ring has reported. Zero means
	// 2s.
	ResumeGrace time.Duration
	// Incarnation names this start of the master; it must differ from every earlier start's (the
	// server draws a random one when it is zero) and be below 2^32. It is sent in every Welcome and
	// makes the high 32 bits of every epoch, so a restarted master never hands out an epoch that a peer
	// may still hold from before the restart. Zero (scenarios, a single master that never restarts)
	// gives plain epoch counters.
	Incarnation uint64
	// LinkCutTimeout is how long a link that went silent on the data path (or could not be dialled
	// while wiring) between two peers that both still reach the master stays out of the group's rings.
	// Zero means 60s.
	LinkCutTimeout time.Duration
	// Diagnosis configures the detection of slow links and slow peers from the peers' link timings:
	// events, the cost of slow links in the ring solve, and the eviction of chronic stragglers (off
	// by default).
	Diagnosis DiagnosisConfig
}

// LAN returns the preset for peers on one network: 250ms heartbeats, gone after 1.5s of silence.
func LAN() Config {
	return Config{HeartbeatInterval: 250 * time.Millisecond, HeartbeatTimeout: 1500 * time.Millisecond}
}

// WAN returns the preset for peers across the internet: 1s heartbeats, gone after 6s of silence, which
// rides out short routing hiccups.
func WAN() Config { return Config{HeartbeatInterval: time.Second, HeartbeatTimeout: 6 * time.Second} }

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	if c.MinPeers == 0 {
		c.MinPeers = 1
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = 250 * time.Millisecond
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = 1500 * time.Millisecond
	}
	if c.PartitionTimeout == 0 {
		c.PartitionTimeout = 5 * c.HeartbeatTimeout
	}
	if c.MeasureDuration == 0 {
		c.MeasureDuration = 500 * time.Millisecond
	}
	if c.MeasureStreams == 0 {
		c.MeasureStreams = 2
	}
	if c.SolveBudget == 0 {
		c.SolveBudget = 200 * time.Millisecond
	}
	if c.ImproveBudget == 0 {
		c.ImproveBudget = 30 * time.Second
	}
	if c.MaxPeers == 0 {
		c.MaxPeers = defaultMaxPeers
	}
	if c.MaxOpsPerPeer == 0 {
		c.MaxOpsPerPeer = defaultMaxOpsPerPeer
	}
	if c.ResumeGrace == 0 {
		c.ResumeGrace = 2 * time.Second
	}
	if c.LinkCutTimeout == 0 {
		c.LinkCutTimeout = time.Minute
	}
	return c
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	d := c.withDefaults()
	switch {
	case c.MinPeers < 0:
		return fmt.Errorf("master: Config.MinPeers is %d, must be >= 0", c.MinPeers)
	case c.HeartbeatInterval < 0:
		return fmt.Errorf("master: Config.HeartbeatInterval is %v, must be >= 0", c.HeartbeatInterval)
	case c.HeartbeatTimeout < 0:
		return fmt.Errorf("master: Config.HeartbeatTimeout is %v, must be >= 0", c.HeartbeatTimeout)
	case c.PartitionTimeout < 0:
		return fmt.Errorf("master: Config.PartitionTimeout is %v, must be >= 0", c.PartitionTimeout)
	case c.MaxPeers < 0:
		return fmt.Errorf("master: Config.MaxPeers is %d, must be >= 0", c.MaxPeers)
	case c.MaxOpsPerPeer < 0:
		return fmt.Errorf("master: Config.MaxOpsPerPeer is %d, must be >= 0", c.MaxOpsPerPeer)
	case c.Guard.NormFactor < 0 || (c.Guard.NormFactor > 0 && c.Guard.NormFactor <= 1) || math.IsNaN(c.Guard.NormFactor):
		return fmt.Errorf("master: Config.Guard.NormFactor is %v, must be 0 (off) or above 1", c.Guard.NormFactor)
	case c.ResumeGrace < 0:
		return fmt.Errorf("master: Config.ResumeGrace is %v, must be >= 0", c.ResumeGrace)
	case c.LinkCutTimeout < 0:
		return fmt.Errorf("master: Config.LinkCutTimeout is %v, must be >= 0", c.LinkCutTimeout)
	case c.MeasureDuration < 0 || c.SolveBudget < 0 || c.ImproveBudget < 0:
		return fmt.Errorf("master: Config.MeasureDuration, SolveBudget and ImproveBudget must be >= 0")
	case c.Incarnation >= 1<<32:
		return fmt.Errorf("master: Config.Incarnation is %d, must be below 2^32", c.Incarnation)
	case c.MeasureStreams < 0 || c.MeasureStreams > 64:
		return fmt.Errorf("master: Config.MeasureStreams is %d, must be in [0, 64]", c.MeasureStreams)
	case d.PartitionTimeout < d.HeartbeatTimeout:
		return fmt.Errorf("master: Config.PartitionTimeout (%v) must be at least HeartbeatTimeout (%v)", d.PartitionTimeout, d.HeartbeatTimeout)
	case d.HeartbeatTimeout <= d.HeartbeatInterval:
		return fmt.Errorf("master: Config.HeartbeatTimeout (%v) must exceed HeartbeatInterval (%v)", d.HeartbeatTimeout, d.HeartbeatInterval)
	}
	return c.Diagnosis.Validate()
}
