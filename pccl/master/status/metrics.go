package status

import (
	"strconv"

	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/pccl/master/diagnosis"
	"github.com/prometheus/client_golang/prometheus"
)

// metricsCollector exposes a Snapshot as Prometheus metrics. It keeps no state of its own: every
// Collect reads a fresh Snapshot, so the metrics can never disagree with the status page.
type metricsCollector struct {
	snap func() master.Snapshot

	peers, epoch, ringSize, opsInFlight                           *prometheus.Desc
	joined, left, kicked, timeouts, opsDone, opsAborted, linksCut *prometheus.Desc

	// Per group, per link and per peer: the diagnosis.
	linkBandwidth, linkDelay, peerStep  *prometheus.Desc
	siteNIC                             *prometheus.Desc
	syndromesActive, syndromesRaised    *prometheus.Desc
	syndromesCleared, evicted, recovery *prometheus.Desc
	groupOpsInFlight, lastRecovery      *prometheus.Desc
	groupPeers, groupEpoch, groupRing   *prometheus.Desc
	reorders, reorderPolicy             *prometheus.Desc
}

func newMetricsCollector(snap func() master.Snapshot) *metricsCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &metricsCollector{
		snap:        snap,
		peers:       d("concord_peers", "Peers known to the master, by state (registered: waiting to join the ring; accepted: in the ring).", "state"),
		epoch:       d("concord_epoch", "Ring epoch in force."),
		ringSize:    d("concord_ring_size", "Peers in the ring in force (the world size)."),
		opsInFlight: d("concord_ops_in_flight", "Collectives voting or running that have not failed."),
		joined:      d("concord_peers_joined_total", "Peers registered with the master since it started."),
		left:        d("concord_peers_left_total", "Peers gone since the master started: closed, said goodbye, timed out or kicked."),
		kicked:      d("concord_peers_kicked_total", "Peers kicked since the master started."),
		timeouts:    d("concord_heartbeat_timeouts_total", "Peers declared gone for missed heartbeats since the master started."),
		opsDone:     d("concord_ops_completed_total", "Collectives completed since the master started."),
		opsAborted:  d("concord_ops_aborted_total", "Collectives aborted since the master started."),
		linksCut:    d("concord_links_cut_total", "Links between two reachable peers taken out of the rings since the master started, after going silent on the data path or failing to dial."),

		linkBandwidth: d("concord_link_bandwidth_bytes_per_second",
			"Estimated bandwidth of each link of the ring in force, from bandwidth tests and real collectives.", "group", "from", "to"),
		linkDelay: d("concord_link_delay_seconds_per_mebibyte",
			"Delay matrix on the links of the ring in force: recent time the link held its sender back per MiB (a slow link, sender or receiver stands out).", "group", "from", "to"),
		peerStep: d("concord_peer_training_step", "Training step the peer reported last.", "group", "peer"),
		siteNIC: d("concord_site_nic_bytes_per_second",
			"What each NIC of a peer carried over its last collective on the intra-site fabric (0: down or unused).", "group", "peer", "nic"),
		syndromesActive:  d("concord_syndromes_active", "Slow links and slow peers diagnosed and not cleared, by syndrome.", "group", "kind"),
		syndromesRaised:  d("concord_syndromes_raised_total", "Syndromes raised since the master started, by syndrome.", "group", "kind"),
		syndromesCleared: d("concord_syndromes_cleared_total", "Syndromes cleared since the master started.", "group"),
		evicted:          d("concord_stragglers_evicted_total", "Peers evicted as chronic stragglers since the master started.", "group"),
		recovery: d("concord_recovery_seconds",
			"Time from a group's first aborted collective to its next completed one (count: recoveries).", "group"),
		lastRecovery:     d("concord_last_recovery_seconds", "The latest recovery time of the group (see concord_recovery_seconds).", "group"),
		groupPeers:       d("concord_group_peers", "Peers of each group known to the master, by state (see concord_peers).", "group", "state"),
		groupEpoch:       d("concord_group_epoch", "Epoch of each group's ring in force or being wired.", "group"),
		groupRing:        d("concord_group_ring_size", "Peers in each group's ring in force (the group's world size).", "group"),
		groupOpsInFlight: d("concord_group_ops_in_flight", "Collectives voting or running that have not failed, per group.", "group"),
		reorders: d("concord_ring_reorders_total",
			"Slow links the master's re-ordering policy acted on since it started, by outcome (installed: the ring was re-ordered around the link with no application call; deferred: held back by the rate limit; kept: no better ring avoids it).", "group", "outcome"),
		reorderPolicy: d("concord_reorder_policy_enabled", "1 when the master re-orders rings around slow links on its own, 0 when the policy is off."),
	}
}

// Describe implements prometheus.Collector.
func (c *metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.peers, c.epoch, c.ringSize, c.opsInFlight,
		c.joined, c.left, c.kicked, c.timeouts, c.opsDone, c.opsAborted, c.linksCut,
		c.linkBandwidth, c.linkDelay, c.peerStep, c.siteNIC, c.syndromesActive, c.syndromesRaised, c.syndromesCleared,
		c.evicted, c.recovery, c.lastRecovery, c.groupOpsInFlight,
		c.groupPeers, c.groupEpoch, c.groupRing, c.reorders, c.reorderPolicy} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *metricsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.snap()
	var registered, accepted, unknown int
	for _, p := range s.Peers {
		switch p.State {
		case master.Registered:
			registered++
		case master.Accepted:
			accepted++
		default:
			unknown++
		}
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge(c.peers, float64(registered), master.Registered.String())
	gauge(c.peers, float64(accepted), master.Accepted.String())
	if unknown > 0 {
		gauge(c.peers, float64(unknown), master.PeerState(0).String())
	}
	gauge(c.epoch, float64(s.Epoch))
	gauge(c.ringSize, float64(len(s.Ring)))
	gauge(c.opsInFlight, float64(opsInFlight(s.Ops)))
	counter(c.joined, s.Counters.Joined)
	counter(c.left, s.Counters.Left)
	counter(c.kicked, s.Counters.Kicked)
	counter(c.timeouts, s.Counters.Timeouts)
	counter(c.opsDone, s.Counters.OpsDone)
	counter(c.opsAborted, s.Counters.OpsAborted)
	counter(c.linksCut, s.Counters.LinksCut)
	c.collectDiagnosis(ch, s)
}

// collectDiagnosis exposes the per-group, per-link and per-peer series.
func (c *metricsCollector) collectDiagnosis(ch chan<- prometheus.Metric, s master.Snapshot) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	for _, r := range groupRows(s) {
		gid := u(uint64(r.ID))
		gauge(c.groupPeers, float64(r.Registered), gid, master.Registered.String())
		gauge(c.groupPeers, float64(r.Accepted), gid, master.Accepted.String())
		gauge(c.groupEpoch, float64(r.Epoch), gid)
		gauge(c.groupRing, float64(r.RingSize), gid)
	}
	for _, g := range s.Groups {
		gid := u(uint64(g.ID))
		// Only the ring's own links: the matrices may hold every pair, which would be n² series.
		n := len(g.Ring)
		for _, m := range []struct {
			d *prometheus.Desc
			v [][]float64
		}{{c.linkBandwidth, g.Bandwidth}, {c.linkDelay, g.Delay}} {
			for i := range min(len(m.v), n) {
				j := (i + 1) % n
				if n > 1 && j < len(m.v[i]) && known(m.v[i][j]) {
					gauge(m.d, m.v[i][j], gid, u(g.Ring[i]), u(g.Ring[j]))
				}
			}
		}
		active := map[string]int{}
		for _, sy := range g.Syndromes {
			active[sy.Kind]++
		}
		for _, k := range diagnosis.Kinds {
			gauge(c.syndromesActive, float64(active[k.String()]), gid, k.String())
			counter(c.syndromesRaised, float64(g.Diagnosis.Raised[k.String()]), gid, k.String())
		}
		st := g.Diagnosis
		counter(c.syndromesCleared, float64(st.Cleared), gid)
		counter(c.evicted, float64(st.Evicted), gid)
		ch <- prometheus.MustNewConstSummary(c.recovery, st.Recoveries, st.RecoverySeconds, nil, gid)
		gauge(c.lastRecovery, st.LastRecovery.Seconds(), gid)
		gauge(c.groupOpsInFlight, float64(opsInFlight(g.Ops)), gid)
		counter(c.reorders, float64(st.Reorders), gid, "installed")
		counter(c.reorders, float64(st.ReordersDeferred), gid, "deferred")
		counter(c.reorders, float64(st.ReordersKept), gid, "kept")
	}
	enabled := 0.0
	if s.Policy.Reorder {
		enabled = 1
	}
	gauge(c.reorderPolicy, enabled)
	for _, p := range s.Peers {
		if p.HasStep {
			gauge(c.peerStep, float64(p.Step), u(uint64(p.Group)), u(p.ID))
		}
		for i, r := range p.SiteNICRates {
			gauge(c.siteNIC, r, u(uint64(p.Group)), u(p.ID), u(uint64(i)))
		}
	}
}
