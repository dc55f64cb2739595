package main

import (
	"time"

	"github.com/concord-ccl/concord/stress/invariant"
)

// scene is what the fault classes look at when one fault is dealt: who may be hit, and what holds
// the group already.
type scene struct {
	now      time.Time
	running  int           // processes not gone
	slowable []*peerProc   // healthy ones whose control path is not slowed already
	all      []*peerProc   // candidates of a fault (candidates(false))
	withSess []*peerProc   // candidates with a master session (candidates(true))
	frozen   bool          // a freeze, a master stall or restart, a partition or a link hole holds the group
	settling bool          // the peers are still finding a restarted master
	links    []linkFault   // ring links a link fault may hit
	inRing   int           // healthy peers in the ring
	hold     time.Duration // how long a stop, black hole or slow-down lasts, drawn with the class
}

// inject deals one fault: a class picked at random among those possible now.
func (s *soak) inject(now time.Time) {
	sc := s.scene(now)
	var possible []string
	for _, c := range faultClasses {
		if s.possible(c, sc) {
			possible = append(possible, c)
		}
	}
	if len(possible) == 0 {
		return
	}
	class := possible[s.rng.IntN(len(possible))]
	sc.hold = 2*time.Second + time.Duration(s.rng.Int64N(int64(2*time.Second)))
	switch class {
	case "kill":
		s.dealKill(sc)
	case "stop":
		s.dealStop(sc)
	case "blackhole":
		s.dealBlackhole(sc)
	case "leave":
		s.dealLeave(sc)
	case "slow":
		s.dealSlow(sc)
	case "link-blackhole":
		s.dealLinkBlackhole(sc)
	case "link-slow":
		s.dealLinkSlow(sc)
	case "spawn":
		if p, err := s.spawn("fault"); err == nil {
			s.faulted(class, now, p)
		}
	case "join":
		s.joinArmed = true // spawned at the next "started" line
	case "master-stall":
		s.dealMasterStall(sc)
	case "master-restart":
		s.dealMasterRestart(sc)
	case "junk":
		s.faulted(class, now, nil)
		s.junk(s.rng.Uint64())
	case "partition":
		s.dealPartition(now, sc.withSess)
	}
}

// scene looks at the group before a fault is dealt.
func (s *soak) scene(now time.Time) *scene {
	sc := &scene{now: now}
	for _, p := range s.order {
		if !p.gone() {
			sc.running++
		}
		if p.healthy() && p.slowUntil.IsZero() {
			sc.slowable = append(sc.slowable, p)
		}
	}
	sc.all, sc.withSess = s.candidates(false), s.candidates(true)
	// One freeze (stop or black hole) at a time, 2 s apart: each blocks the group until the master
	// declares the peer gone, and a chain of them would stall it by the schedule rather than by a bug.
	sc.frozen = now.Sub(s.freezeOver) < 2*time.Second
	for _, p := range s.order {
		if !p.exited && (!p.stoppedUntil.IsZero() || !p.holedUntil.IsZero()) {
			sc.frozen = true
		}
	}
	if !s.masterStoppedUntil.IsZero() || s.partition != nil {
		sc.frozen = true
	}
	// While the peers find a restarted master and it rebuilds the ring from their reports, no peer
	// is frozen, removed or added: a peer cut off then reports after the rebuild window and comes
	// back as a newcomer that fetches the state, and a newcomer that reaches the new master before
	// the others report is wired alone and fetches the state once they join; the revision
	// invariants read both as a divergence.
	sc.settling = now.Sub(s.lastMasterRestart) < restartSettle
	if sc.settling {
		sc.frozen = true
	}
	for _, f := range s.linkFaults {
		if f.class == "link-blackhole" && !f.over {
			sc.frozen = true
		}
	}
	sc.links, sc.inRing = s.ringLinks()
	return sc
}

// possible reports whether a fault of class may strike in scene sc.
func (s *soak) possible(class string, sc *scene) bool {
	switch class {
	case "master-stall":
		return !sc.frozen && sc.now.Sub(s.lastMasterStall) > masterStallEvery
	case "master-restart":
		return !sc.frozen && sc.now.Sub(s.lastMasterRestart) > masterRestartEvery
	case "junk":
		return true
	case "kill":
		return len(sc.all) > 0 && !sc.settling
	case "stop":
		return len(sc.all) > 0 && !sc.frozen
	case "blackhole":
		return len(sc.withSess) > 0 && !sc.frozen
	case "leave":
		return len(sc.withSess) > 0 && !sc.settling
	case "spawn", "join":
		return sc.running < s.o.Peers+maxExtraPeers && !s.joinArmed && !sc.settling
	case "slow":
		return len(sc.slowable) > 0
	case "link-blackhole":
		// Four healthy peers in the ring: a ring without the link exists.
		return len(sc.links) > 0 && !sc.frozen && sc.inRing >= 4 && s.o.Transport != "quic"
	case "link-slow":
		return len(sc.links) > 0 && s.o.Transport != "quic"
	case "partition":
		return s.bed != nil && !sc.frozen && sc.now.Sub(s.lastPartition) > partitionEvery
	}
	return false
}

// pick draws one of ps.
func (s *soak) pick(ps []*peerProc) *peerProc { return ps[s.rng.IntN(len(ps))] }

// dealKill SIGKILLs a peer.
func (s *soak) dealKill(sc *scene) {
	v := s.pick(sc.all)
	v.proc.Kill()
	v.killed = true
	s.doom(v)
	s.faulted("kill", sc.now, v)
}

// dealStop SIGSTOPs a peer for sc.hold.
func (s *soak) dealStop(sc *scene) {
	v := s.pick(sc.all)
	v.proc.Stop()
	v.stoppedUntil = sc.now.Add(sc.hold)
	s.doom(v)
	s.faulted("stop", sc.now, v)
}

// dealBlackhole drops everything between a peer and the master for sc.hold.
func (s *soak) dealBlackhole(sc *scene) {
	v := s.pick(sc.withSess)
	v.relay.blackhole(sc.now.Add(sc.hold))
	v.holedUntil = sc.now.Add(sc.hold)
	s.doom(v)
	s.faulted("blackhole", sc.now, v)
}

// dealLeave has a peer leave gracefully at its next membership step.
func (s *soak) dealLeave(sc *scene) {
	v := s.pick(sc.withSess)
	if v.proc.Send(peerCommand{Cmd: "leave"}) == nil {
		v.leaveAt = sc.now
		s.doom(v)
		s.faulted("leave", sc.now, v)
	}
}

// dealSlow delays a peer's control path by 20 to 100 ms for sc.hold.
func (s *soak) dealSlow(sc *scene) {
	v := s.pick(sc.slowable)
	v.relay.setDelay(20*time.Millisecond + time.Duration(s.rng.Int64N(int64(80*time.Millisecond))))
	v.slowUntil = sc.now.Add(sc.hold)
	s.faulted("slow", sc.now, v)
}

// dealLinkBlackhole black-holes one ring link for longer than a peer's progress deadline.
func (s *soak) dealLinkBlackhole(sc *scene) {
	l := sc.links[s.rng.IntN(len(sc.links))]
	l.class, l.until = "link-blackhole", sc.now.Add(linkHoleMin+time.Duration(s.rng.Int64N(int64(2*time.Second))))
	l.from.links.holeLink(l.dest, l.until)
	s.linkFaults = append(s.linkFaults, l)
	s.event("link %s→%s of ring %v black-holed until %.3fs", l.from.name, l.to.name, s.ring, l.until.Sub(s.start).Seconds())
	s.faulted(l.class, sc.now, nil)
}

// dealLinkSlow delays one ring link by 20 to 100 ms for sc.hold.
func (s *soak) dealLinkSlow(sc *scene) {
	l := sc.links[s.rng.IntN(len(sc.links))]
	l.class, l.until = "link-slow", sc.now.Add(sc.hold)
	l.from.links.slowLink(l.dest, 20*time.Millisecond+time.Duration(s.rng.Int64N(int64(80*time.Millisecond))))
	s.linkFaults = append(s.linkFaults, l)
	s.event("link %s→%s slowed until %.3fs", l.from.name, l.to.name, l.until.Sub(s.start).Seconds())
	s.faulted(l.class, sc.now, nil)
}

// dealMasterStall SIGSTOPs the master for 2 to 8 s.
func (s *soak) dealMasterStall(sc *scene) {
	s.mproc.Stop()
	s.masterStoppedUntil = sc.now.Add(2*time.Second + time.Duration(s.rng.Int64N(int64(6*time.Second))))
	s.lastMasterStall = sc.now
	s.event("SIGSTOP master until %.3fs", s.masterStoppedUntil.Sub(s.start).Seconds())
}

// dealMasterRestart kills the master and starts a new one on its address.
func (s *soak) dealMasterRestart(sc *scene) {
	s.lastMasterRestart = sc.now
	if err := s.restartMaster(); err != nil {
		s.check.Fail(sc.now, invariant.Peer, 0, "master", "restart: %v", err)
		return
	}
	// Recovery counts from the new master's start: the process start is not Concord's.
	s.faulted("master-restart", time.Now(), nil)
}
