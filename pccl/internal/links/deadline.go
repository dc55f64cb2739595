package links

import "time"

// Progress deadlines: a frame may take at most progressFactor times what the measured send rate
// predicts, and never less than Config.ProgressTimeout.
const progressFactor = 8

// deadline returns how long n bytes may take to move before their link counts as silent.
func (l *Links) deadline(n int) time.Duration {
	floor := l.cfg.ProgressTimeout
	l.rateMu.Lock()
	rate := l.rate
	l.rateMu.Unlock()
	if rate <= 0 {
		return floor
	}
	return max(floor, time.Duration(progressFactor*float64(n)/rate*float64(time.Second)))
}

// observe folds one send of n bytes that took d into the rate estimate. Small sends say more about
// latency than bandwidth and are left out.
func (l *Links) observe(n int, d time.Duration) {
	if n < 64<<10 || d <= 0 {
		return
	}
	r := float64(n) / d.Seconds()
	l.rateMu.Lock()
	if l.rate == 0 {
		l.rate = r
	} else {
		l.rate = 0.8*l.rate + 0.2*r
	}
	l.rateMu.Unlock()
}
