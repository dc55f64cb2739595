package master

import (
	"fmt"
	"net"
	"time"
)

// Limits keep one misbehaving or hostile client from costing the others anything: the machine
// bounds the peers it admits and the collectives each peer may have in flight (Config.MaxPeers,
// Config.MaxOpsPerPeer); the server bounds the size of a frame (ServerConfig.MaxFrame) and the rate of
// new connections per source address (ServerConfig.HandshakeRate, HandshakeBurst). A peer that breaks
// one of them, or sends a frame that does not decode, is kicked with the reason; the others notice
// nothing unless it was a member of their ring.

// Defaults of the limits.
const (
	defaultMaxPeers       = 16384
	defaultMaxOpsPerPeer  = 256
	defaultHandshakeRate  = 50.0 // new connections per second and source address
	defaultHandshakeBurst = 200
)

// admit reports whether one more peer may register; it refuses connection c with the reason when
// not.
func (m *Machine) admit(c ConnID) bool {
	if len(m.peers) < m.cfg.MaxPeers {
		return true
	}
	reason := fmt.Sprintf("the master is full: %d peers, Config.MaxPeers is %d; retry later or raise the limit", len(m.peers), m.cfg.MaxPeers)
	m.refuse(c, reason, "master full")
	m.counters.Kicked++
	m.note("kicked", 0, "connection %d refused: %s", c, reason)
	return false
}

// withinOps reports whether peer p may vote for one more collective; it kicks p when not.
func (m *Machine) withinOps(p *peer, tag uint64) bool {
	n := 0
	for t, o := range p.group.ops {
		if t == tag {
			continue // a vote on a tag already counted is judged by the collective's own rules
		}
		running := o.seq != 0 && o.done != nil && !o.done[p.id]
		if o.voters[p.id] || running {
			n++
		}
	}
	if n < m.cfg.MaxOpsPerPeer {
		return true
	}
	m.kick(p.id, fmt.Sprintf("more than %d collectives in flight (Config.MaxOpsPerPeer)", m.cfg.MaxOpsPerPeer))
	return false
}

// rateLimiter bounds the rate of new connections per source address with a token bucket per
// address. It is owned by the server's accept loop; time is passed in.
type rateLimiter struct {
	rate    float64 // tokens per second
	burst   float64
	buckets map[string]*bucket
	swept   time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newRateLimiter(rate float64, burst int) *rateLimiter {
	return &rateLimiter{rate: rate, burst: float64(burst), buckets: map[string]*bucket{}}
}

// allow takes a token of addr's bucket at now and reports whether there was one.
func (r *rateLimiter) allow(addr string, now time.Time) bool {
	if now.Sub(r.swept) > time.Minute {
		// Forget full buckets, so that the table holds only recently busy addresses.
		for k, b := range r.buckets {
			if now.Sub(b.last).Seconds()*r.rate >= r.burst {
				delete(r.buckets, k)
			}
		}
		r.swept = now
	}
	b := r.buckets[addr]
	if b == nil {
		b = &bucket{tokens: r.burst, last: now}
		r.buckets[addr] = b
	}
	b.tokens = min(r.burst, b.tokens+now.Sub(b.last).Seconds()*r.rate)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// sourceOf returns the host part of a remote address, or the whole address if it has none.
func sourceOf(a net.Addr) string {
	if a == nil {
		return ""
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}
