package main

import (
	"fmt"
	"net"
	"os/exec"
	"time"

	"github.com/concord-ccl/concord/internal/hosts"
)

// The soak across hosts (--hosts). The master runs on host 0 of a test bed (internal/hosts: network
// namespaces with their own addresses on one bridge), every peer process on a host of its own, and
// junk comes from a stranger's host. The relays that stage the black holes and slow links run where
// the routes they stand for run: a peer's relay to the master on the master's host, its link relay on
// its own host. A host is reused once its last peer process has exited.
//
// The partition class is dealt only across hosts; it cuts real links for 2 to 15 s, one of:
//   - the master's port (its host loses carrier): nobody should be kicked; while it lasts, nobody can
//     make progress, so the stall check is suspended, and recovery counts from the heal;
//   - one peer's port: the master kicks it, the others go on, and it joins again by itself after the
//     heal (counted in kicked_rejoined);
//   - halves: the switch split in two, the master on one side with at least two peers that hold the
//     state; the other side is kicked and joins again after the heal.

// Bounds of the partition class.
const (
	partitionMin   = 2 * time.Second
	partitionMax   = 15 * time.Second
	partitionEvery = 20 * time.Second // partition faults are at least this far apart
	spareHosts     = 4                // hosts beyond the pool's most, for processes still exiting
)

// bedHosts is the soak's test bed: the master's host, the peers' hosts and the stranger's.
type bedHosts struct {
	bed      *hosts.Bed
	master   *hosts.Host
	stranger *hosts.Host
	slots    []*hosts.Host // peer hosts
	busy     map[*hosts.Host]*peerProc
}

// newBedHosts builds a bed for a pool of peers.
func newBedHosts(peers int) (*bedHosts, error) {
	n := peers + maxExtraPeers + spareHosts
	bed, err := hosts.New(hosts.Config{Hosts: n + 2})
	if err != nil {
		return nil, err
	}
	b := &bedHosts{bed: bed, master: bed.Host(0), stranger: bed.Host(n + 1), busy: map[*hosts.Host]*peerProc{}}
	for i := range n {
		b.slots = append(b.slots, bed.Host(i+1))
	}
	return b, nil
}

// free returns a host no live peer process runs on.
func (b *bedHosts) free() (*hosts.Host, error) {
	for _, h := range b.slots {
		if b.busy[h] == nil {
			return h, nil
		}
	}
	return nil, fmt.Errorf("all %d peer hosts are taken", len(b.slots))
}

// netOf is where a relay runs on host h.
func netOf(h *hosts.Host) netHost {
	return netHost{
		listen: func() (net.Listener, error) {
			var ln net.Listener
			err := h.Do(func() error {
				var err error
				ln, err = net.Listen("tcp", net.JoinHostPort(h.Addr().String(), "0"))
				return err
			})
			return ln, err
		},
		dial: func(addr string) (net.Conn, error) {
			var c net.Conn
			err := h.Do(func() error {
				var err error
				c, err = net.DialTimeout("tcp", addr, 5*time.Second)
				return err
			})
			return c, err
		},
	}
}

// startOn returns the Start of a process on host h.
func startOn(h *hosts.Host) func(*exec.Cmd) error { return h.Start }

// partitionFault is the partition in force across hosts.
type partitionFault struct {
	kind    string // "master", "peer" or "halves"
	until   time.Time
	victim  *peerProc   // kind peer
	away    []*peerProc // kind halves: the side without the master
	healing bool
}

// dealPartition cuts the network one of the three ways, for 2 to 15 s.
func (s *soak) dealPartition(now time.Time, withSess []*peerProc) {
	until := now.Add(partitionMin + time.Duration(s.rng.Int64N(int64(partitionMax-partitionMin))))
	var healthy []*peerProc
	holders := 0
	for _, p := range s.order {
		if p.healthy() {
			healthy = append(healthy, p)
			if p.established {
				holders++
			}
		}
	}
	kinds := []string{"master"}
	if len(withSess) > 0 {
		kinds = append(kinds, "peer")
	}
	if holders >= 3 && len(healthy) >= 3 {
		kinds = append(kinds, "halves")
	}
	f := &partitionFault{kind: kinds[s.rng.IntN(len(kinds))], until: until}
	s.lastPartition = now
	switch f.kind {
	case "master":
		if err := s.bed.master.Cut(true); err != nil {
			s.event("partition of the master failed: %v", err)
			return
		}
		s.event("PARTITION the master's port down until %.3fs", until.Sub(s.start).Seconds())
	case "peer":
		v := withSess[s.rng.IntN(len(withSess))]
		if err := s.bed.hostOf(v).Cut(true); err != nil {
			s.event("partition of %s failed: %v", v.name, err)
			return
		}
		f.victim = v
		v.holedUntil = until
		s.doom(v)
		s.event("PARTITION %s's port down until %.3fs", v.name, until.Sub(s.start).Seconds())
	case "halves":
		// Away: up to half of the healthy peers, keeping two that hold the state with the master.
		kept := 0
		for _, i := range s.rng.Perm(len(healthy)) {
			p := healthy[i]
			if len(f.away) >= len(healthy)/2 || (p.established && kept < 2) {
				if p.established {
					kept++
				}
				continue
			}
			f.away = append(f.away, p)
		}
		if len(f.away) == 0 {
			return
		}
		near := []int{0} // the master's host
		for _, p := range healthy {
			if !containsProc(f.away, p) {
				near = append(near, s.bed.hostOf(p).Index())
			}
		}
		var far []int
		for _, p := range f.away {
			far = append(far, s.bed.hostOf(p).Index())
			p.holedUntil = until
			s.doom(p)
		}
		if err := s.bed.bed.Split(near, far); err != nil {
			s.event("split failed: %v", err)
			return
		}
		s.event("PARTITION halves: %d peers cut off with the master's side of %d until %.3fs", len(far), len(near)-1, until.Sub(s.start).Seconds())
	}
	s.partition = f
	if f.kind != "master" {
		s.faulted("partition", now, f.victim)
	}
}

// endPartition heals the partition in force once its time is up.
func (s *soak) endPartition(now time.Time) {
	f := s.partition
	if f == nil || now.Before(f.until) {
		return
	}
	s.partition = nil
	switch f.kind {
	case "master":
		s.bed.master.Cut(false)
		// Recovery counts from the heal: the cut itself is the fault's cost.
		s.faulted("partition", now, nil)
	case "peer":
		s.bed.hostOf(f.victim).Cut(false)
		f.victim.holedUntil = time.Time{}
	case "halves":
		s.bed.bed.Unblock()
		for _, p := range f.away {
			p.holedUntil = time.Time{}
		}
	}
	s.freezeOver = now
	s.event("partition (%s) healed", f.kind)
}

// hostOf returns the host of peer process p.
func (b *bedHosts) hostOf(p *peerProc) *hosts.Host {
	for h, q := range b.busy {
		if q == p {
			return h
		}
	}
	return b.master // not reached: every peer process runs on a host of the bed
}

func containsProc(ps []*peerProc, p *peerProc) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}
