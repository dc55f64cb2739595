package diagnosis

import "fmt"

// judge applies the hysteresis to this operation's syndromes.
func (d *Detector) judge(now map[string]Event) []Event {
	var out []Event
	for _, key := range sortedKeys(now) {
		ev := now[key]
		s := d.synd[key]
		if s == nil {
			s = &syndrome{}
			d.synd[key] = s
		}
		s.ev, s.clean = ev, 0
		s.held++
		if !s.active {
			s.streak++
			if s.streak >= d.cfg.Confirm {
				s.active = true
				ev.Ops = s.held
				out = append(out, ev)
			}
		}
	}
	// Broader syndromes explain narrower ones at once; the others clear after Release absences, or
	// at once when their links are no longer observed.
	for _, key := range sortedKeys(d.synd) {
		s := d.synd[key]
		if _, ok := now[key]; ok {
			continue
		}
		if !s.active {
			delete(d.synd, key)
			continue
		}
		s.held++
		s.clean++
		reason := ""
		switch {
		case d.explainedBy(s.ev) != "":
			reason = d.explainedBy(s.ev)
		case !d.observed(s.ev):
			reason = "its links are no longer observed"
		case s.clean >= d.cfg.Release:
			reason = fmt.Sprintf("absent for %d operations", s.clean)
		default:
			continue
		}
		ev := s.ev
		ev.Cleared, ev.Ops, ev.Evidence = true, s.held, "cleared: "+reason
		out = append(out, ev)
		delete(d.synd, key)
	}
	return out
}

// explainedBy names an active syndrome that covers ev, or "".
func (d *Detector) explainedBy(ev Event) string {
	if ev.Kind != SlowLink {
		return ""
	}
	for _, key := range sortedKeys(d.synd) {
		s := d.synd[key]
		if !s.active {
			continue
		}
		o := s.ev
		switch {
		case o.Kind == SlowSender && o.Peer == ev.Link.From,
			o.Kind == SlowReceiver && o.Peer == ev.Link.To,
			o.Kind == SlowCompute && o.Peer == ev.Link.To:
			return "explained by " + o.Key()
		}
	}
	return ""
}

// observed reports whether the cells of ev are still in the matrix.
func (d *Detector) observed(ev Event) bool {
	for _, l := range ev.Cells {
		if c := d.cells[l]; c != nil && c.last+uint64(d.cfg.Stale) >= d.op {
			return true
		}
	}
	if ev.Kind == SlowCompute {
		p := d.peers[ev.Peer]
		return p != nil && p.last+uint64(d.cfg.Stale) >= d.op
	}
	return len(ev.Cells) == 0
}
