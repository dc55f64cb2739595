// Package status serves a Concord master's status page, its JSON form and its Prometheus metrics. It
// reads the master only through snapshots (master.Snapshot), so the protocol package needs no HTTP
// or metrics code: the binary wires a Server's Snapshot method into Handler.
package status

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"html/template"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/pccl/master/diagnosis"
)

// Handler serves the status page and metrics for snapshots produced by snap, which is called once
// per request (and once per scrape) and must be safe to call from many goroutines at once.
//
// Routes:
//   - "/" is a self-contained HTML page that refreshes itself every 2s: run summary, peers, the ring
//     drawn as a ring, the bandwidth and delay matrices as heat maps, in-flight collectives and recent
//     events.
//   - "/status.json" is the Snapshot as JSON with stable lowercase keys.
//   - "/metrics" is the Prometheus exposition of the concord_* series, read from a fresh Snapshot on
//     every scrape.
//   - "/healthz" answers 200 "ok".
//
// The metrics are registered on reg when it is non-nil; otherwise on a new registry that also carries
// the Go runtime and process collectors. Handler panics if reg already holds concord_* metrics,
// as prometheus.Registry.MustRegister does. Links between the routes are relative, so the handler
// may be mounted under a prefix with http.StripPrefix.
func Handler(snap func() master.Snapshot, reg *prometheus.Registry) http.Handler {
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	reg.MustRegister(newMetricsCollector(snap))

	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		if err := statusTemplate.Execute(&buf, buildStatusPage(snap())); err != nil {
			http.Error(w, "render status page: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(buf.Bytes())
	})
	mux.HandleFunc("GET /status.json", func(w http.ResponseWriter, r *http.Request) {
		b, err := json.MarshalIndent(newStatusJSON(snap()), "", "  ")
		if err != nil {
			http.Error(w, "encode status: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(append(b, '\n'))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok"))
	})
	return mux
}

// ---- /metrics ----

// metricsCollector exposes a Snapshot as Prometheus metrics. It keeps no state of its own: every
// Collect reads a fresh Snapshot, so the metrics can never disagree with the status page.
type metricsCollector struct {
	snap func() master.Snapshot

	peers, epoch, ringSize, opsInFlight                           *prometheus.Desc
	joined, left, kicked, timeouts, opsDone, opsAborted, linksCut *prometheus.Desc

	// Per group, per link and per peer: the diagnosis.
	linkBandwidth, linkDelay, peerStep  *prometheus.Desc
	syndromesActive, syndromesRaised    *prometheus.Desc
	syndromesCleared, evicted, recovery *prometheus.Desc
	groupOpsInFlight, lastRecovery      *prometheus.Desc
	groupPeers, groupEpoch, groupRing   *prometheus.Desc
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
		peerStep:         d("concord_peer_training_step", "Training step the peer reported last.", "group", "peer"),
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
	}
}

// Describe implements prometheus.Collector.
func (c *metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.peers, c.epoch, c.ringSize, c.opsInFlight,
		c.joined, c.left, c.kicked, c.timeouts, c.opsDone, c.opsAborted, c.linksCut,
		c.linkBandwidth, c.linkDelay, c.peerStep, c.syndromesActive, c.syndromesRaised, c.syndromesCleared,
		c.evicted, c.recovery, c.lastRecovery, c.groupOpsInFlight,
		c.groupPeers, c.groupEpoch, c.groupRing} {
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
	}
	for _, p := range s.Peers {
		if p.HasStep {
			gauge(c.peerStep, float64(p.Step), u(uint64(p.Group)), u(p.ID))
		}
	}
}

// groupRows returns a row for every group, in id order, with its peers counted by state.
func groupRows(s master.Snapshot) []statusGroupRow {
	rows := make([]statusGroupRow, len(s.Groups))
	at := make(map[master.GroupID]int, len(s.Groups))
	for i, g := range s.Groups {
		rows[i] = statusGroupRow{ID: g.ID, Epoch: g.Epoch, RingSize: len(g.Ring), OpsInFlight: opsInFlight(g.Ops)}
		at[g.ID] = i
	}
	for _, p := range s.Peers {
		i, ok := at[p.Group]
		if !ok {
			continue
		}
		switch p.State {
		case master.Accepted:
			rows[i].Accepted++
		case master.Registered:
			rows[i].Registered++
		}
	}
	return rows
}

// opsInFlight counts the collectives that are voting or running and have not failed.
func opsInFlight(ops []master.OpInfo) int {
	n := 0
	for _, o := range ops {
		if !o.Failed {
			n++
		}
	}
	return n
}

// ---- /status.json ----

// statusJSON is the wire form of a Snapshot on /status.json. Its keys are part of the interface and
// stay stable when Snapshot's Go fields are renamed.
type statusJSON struct {
	Time        time.Time `json:"time"`
	Incarnation uint64    `json:"incarnation"`
	// Epoch, Ring and Ops describe the default group (0); Groups lists every group.
	Epoch    uint64           `json:"epoch"`
	MinPeers int              `json:"min_peers"`
	Peers    []statusPeerJSON `json:"peers"`
	Ring     []uint64         `json:"ring"`
	Ops      []statusOpJSON   `json:"ops"`
	Counters statusCountJSON  `json:"counters"`
	// Bandwidth and Delay are null while there is no data; non-finite entries are written as 0.
	Bandwidth [][]float64       `json:"bandwidth"`
	Delay     [][]float64       `json:"delay"`
	Events    []statusEventJSON `json:"events"`
	Groups    []statusGroupJSON `json:"groups"`
}

type statusGroupJSON struct {
	ID    uint32         `json:"id"`
	Epoch uint64         `json:"epoch"`
	Ring  []uint64       `json:"ring"`
	Ops   []statusOpJSON `json:"ops"`
	// Delay is the group's delay matrix in ring order (seconds per MiB), null while there is none.
	Delay     [][]float64          `json:"delay"`
	Links     []statusLinkJSON     `json:"links"`
	Syndromes []statusSyndromeJSON `json:"syndromes"`
	Diagnosis statusDiagJSON       `json:"diagnosis"`
}

// statusLinkJSON is one link's estimates of the delay matrix.
type statusLinkJSON struct {
	From     uint64  `json:"from"`
	To       uint64  `json:"to"`
	Transfer float64 `json:"transfer_seconds_per_byte"`
	Stall    float64 `json:"stall_seconds_per_byte"`
	Wait     float64 `json:"wait_seconds"`
	Age      uint64  `json:"age_ops"`
}

type statusSyndromeJSON struct {
	Kind       string  `json:"kind"`
	Peer       uint64  `json:"peer"`
	From       uint64  `json:"from,omitempty"`
	To         uint64  `json:"to,omitempty"`
	Confidence float64 `json:"confidence"`
	Ratio      float64 `json:"ratio"`
	Ops        int     `json:"ops"`
	Evidence   string  `json:"evidence"`
}

type statusDiagJSON struct {
	Raised          map[string]uint64 `json:"raised"`
	Cleared         uint64            `json:"cleared"`
	Evicted         uint64            `json:"evicted"`
	Recoveries      uint64            `json:"recoveries"`
	RecoverySeconds float64           `json:"recovery_seconds"`
	LastRecovery    float64           `json:"last_recovery_seconds"`
}

type statusPeerJSON struct {
	ID       uint64    `json:"id"`
	Group    uint32    `json:"group"`
	Addr     string    `json:"addr"`
	Site     string    `json:"site"`
	State    string    `json:"state"`
	Joined   time.Time `json:"joined"`
	LastSeen time.Time `json:"last_seen"`
	// Step is the training step the peer reported last; null while it reported none.
	Step        *uint64 `json:"step"`
	InOptimizer bool    `json:"in_optimizer,omitempty"`
}

type statusOpJSON struct {
	Tag       uint64 `json:"tag"`
	Seq       uint64 `json:"seq"`
	Count     uint64 `json:"count"`
	Voted     int    `json:"voted"`
	Done      int    `json:"done"`
	Peers     int    `json:"peers"`
	Failed    bool   `json:"failed"`
	FailCause string `json:"fail_cause,omitempty"`
}

type statusCountJSON struct {
	Joined     uint64 `json:"joined"`
	Accepted   uint64 `json:"accepted"`
	Left       uint64 `json:"left"`
	Kicked     uint64 `json:"kicked"`
	Timeouts   uint64 `json:"timeouts"`
	OpsDone    uint64 `json:"ops_done"`
	OpsAborted uint64 `json:"ops_aborted"`
	Rounds     uint64 `json:"rounds"`
	LinksCut   uint64 `json:"links_cut"`
}

type statusEventJSON struct {
	Time   time.Time `json:"time"`
	Kind   string    `json:"kind"`
	Peer   uint64    `json:"peer"`
	Detail string    `json:"detail"`
}

func opJSON(o master.OpInfo) statusOpJSON {
	return statusOpJSON{Tag: o.Tag, Seq: o.Seq, Count: o.Count, Voted: o.Voted, Done: o.Done, Peers: o.Peers,
		Failed: o.Failed, FailCause: o.FailCause}
}

// newStatusJSON converts s. Empty lists become [] rather than null, so clients need not tell the two
// apart; nil matrices stay null, which means "no data yet".
func newStatusJSON(s master.Snapshot) statusJSON {
	j := statusJSON{
		Time:        s.Time,
		Incarnation: s.Incarnation,
		Epoch:       s.Epoch,
		MinPeers:    s.MinPeers,
		Peers:       make([]statusPeerJSON, 0, len(s.Peers)),
		Ring:        make([]uint64, 0, len(s.Ring)),
		Ops:         make([]statusOpJSON, 0, len(s.Ops)),
		Counters: statusCountJSON{
			Joined: s.Counters.Joined, Accepted: s.Counters.Accepted, Left: s.Counters.Left,
			Kicked: s.Counters.Kicked, Timeouts: s.Counters.Timeouts, OpsDone: s.Counters.OpsDone,
			OpsAborted: s.Counters.OpsAborted, Rounds: s.Counters.Rounds, LinksCut: s.Counters.LinksCut,
		},
		Bandwidth: finiteMatrix(s.Bandwidth),
		Delay:     finiteMatrix(s.Delay),
		Events:    make([]statusEventJSON, 0, len(s.Events)),
		Groups:    make([]statusGroupJSON, 0, len(s.Groups)),
	}
	for _, g := range s.Groups {
		gj := statusGroupJSON{ID: g.ID, Epoch: g.Epoch, Ring: append(make([]uint64, 0, len(g.Ring)), g.Ring...),
			Ops: make([]statusOpJSON, 0, len(g.Ops)), Delay: finiteMatrix(g.Delay),
			Syndromes: make([]statusSyndromeJSON, 0, len(g.Syndromes)), Links: make([]statusLinkJSON, 0, len(g.Links)),
			Diagnosis: statusDiagJSON{Raised: map[string]uint64{}, Cleared: g.Diagnosis.Cleared, Evicted: g.Diagnosis.Evicted,
				Recoveries: g.Diagnosis.Recoveries, RecoverySeconds: g.Diagnosis.RecoverySeconds,
				LastRecovery: g.Diagnosis.LastRecovery.Seconds()}}
		for _, o := range g.Ops {
			gj.Ops = append(gj.Ops, opJSON(o))
		}
		for k, v := range g.Diagnosis.Raised {
			gj.Diagnosis.Raised[k] = v
		}
		for _, l := range g.Links {
			gj.Links = append(gj.Links, statusLinkJSON{From: l.From, To: l.To, Transfer: finite(l.Transfer), Stall: finite(l.Stall),
				Wait: finite(l.Wait), Age: l.Age})
		}
		for _, sy := range g.Syndromes {
			gj.Syndromes = append(gj.Syndromes, statusSyndromeJSON{Kind: sy.Kind, Peer: sy.Peer, From: sy.From, To: sy.To,
				Confidence: finite(sy.Confidence), Ratio: finite(sy.Ratio), Ops: sy.Ops, Evidence: sy.Evidence})
		}
		j.Groups = append(j.Groups, gj)
	}
	for _, p := range s.Peers {
		pj := statusPeerJSON{ID: p.ID, Group: p.Group, Addr: p.Addr, Site: p.Site, State: p.State.String(),
			Joined: p.Joined, LastSeen: p.LastSeen, InOptimizer: p.InOptimizer}
		if p.HasStep {
			step := p.Step
			pj.Step = &step
		}
		j.Peers = append(j.Peers, pj)
	}
	j.Ring = append(j.Ring, s.Ring...)
	for _, o := range s.Ops {
		j.Ops = append(j.Ops, opJSON(o))
	}
	for _, e := range s.Events {
		j.Events = append(j.Events, statusEventJSON{Time: e.Time, Kind: e.Kind, Peer: e.Peer, Detail: e.Detail})
	}
	return j
}

// finite returns v, or 0 for NaN and ±Inf, which JSON cannot carry.
func finite(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// finiteMatrix copies m with NaN and ±Inf replaced by 0 (unknown), which JSON cannot carry.
func finiteMatrix(m [][]float64) [][]float64 {
	if m == nil {
		return nil
	}
	out := make([][]float64, len(m))
	for i, row := range m {
		out[i] = make([]float64, len(row))
		for k, v := range row {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				out[i][k] = v
			}
		}
	}
	return out
}

// ---- / (HTML page) ----

//go:embed static/status.html
var statusFS embed.FS

var statusTemplate = template.Must(template.ParseFS(statusFS, "static/status.html"))

// statusPage is everything the page template shows, already formatted: the template only lays it out.
type statusPage struct {
	Time       string
	Epoch      uint64
	WorldSize  int
	Pending    int
	MinPeers   int
	InFlight   int
	Counters   master.Counters
	Peers      []statusPeerRow
	Ring       statusRing
	Sites      []statusSite
	Heat       []statusHeatSection // bandwidth, then delay
	Syndromes  []statusSyndromeRow
	Groups     []statusGroupRow
	Ops        []statusOpRow
	Events     []statusEventRow // newest first
	HasEvents  bool
	HasOps     bool
	HasPeers   bool
	ShortOfMin bool
}

type statusPeerRow struct {
	ID                  uint64
	Addr, Site, State   string
	Color               string
	LastSeen, JoinedAgo string
	Step                string // "-" while the peer reported none
}

// statusGroupRow is one peer group on the page.
type statusGroupRow struct {
	ID                    uint32
	Accepted, Registered  int
	Epoch                 uint64
	RingSize, OpsInFlight int
}

// statusSyndromeRow is one active syndrome on the page.
type statusSyndromeRow struct {
	Group, Kind, Culprit, Confidence, Ratio, Ops, Evidence string
}

type statusSite struct{ Name, Color string }

// statusRing is the geometry of the ring drawing in a Size×Size SVG viewport.
type statusRing struct {
	Size    int
	Width   int    // Size plus room for labels left and right
	ViewBox string // SVG viewBox that shows the circle and its labels
	Center  string
	Radius  string
	Nodes   []statusRingNode
	Arcs    []string // SVG path data, one arc from each member to its successor
}

type statusRingNode struct {
	ID          uint64
	X, Y, R     string
	LX, LY      string // label position, outside the circle
	Color       string
	Title       string
	FontSize    string
	NotInPeers  bool
	Rank        int
	LabelAnchor string
}

// statusHeatSection is one heat map with its heading; a nil Map shows "no data yet".
type statusHeatSection struct {
	ID, Title, Note string
	Map             *statusHeatMap
}

// statusHeatMap is a matrix drawn as a coloured table.
type statusHeatMap struct {
	Labels   []string
	Rows     []statusHeatRow
	Min, Max string // smallest and largest known entry, formatted; empty when none is known
}

type statusHeatRow struct {
	Label string
	Cells []statusHeatCell
}

type statusHeatCell struct {
	Text, Background, Foreground, Title string
}

type statusOpRow struct {
	Tag, Seq, Count, Progress, State string
	Failed                           bool
}

type statusEventRow struct {
	Time, Ago, Kind, Peer, Detail string
}

// buildStatusPage lays out s for the page template. It is pure: "now" is s.Time.
func buildStatusPage(s master.Snapshot) statusPage {
	p := statusPage{
		Time:      s.Time.UTC().Format("2006-01-02 15:04:05.000 MST"),
		Epoch:     s.Epoch,
		WorldSize: len(s.Ring),
		MinPeers:  s.MinPeers,
		InFlight:  opsInFlight(s.Ops),
		Counters:  s.Counters,
	}
	p.ShortOfMin = len(s.Ring) < s.MinPeers
	siteOf := make(map[master.PeerID]string, len(s.Peers))
	seenSite := make(map[string]bool)
	for _, pi := range s.Peers {
		siteOf[pi.ID] = pi.Site
		if pi.State == master.Registered {
			p.Pending++
		}
		step := "-"
		if pi.HasStep {
			step = strconv.FormatUint(pi.Step, 10)
			if pi.InOptimizer {
				step += " (optimizer)"
			}
		}
		p.Peers = append(p.Peers, statusPeerRow{
			ID: pi.ID, Addr: pi.Addr, Site: pi.Site, State: pi.State.String(), Color: siteColor(pi.Site),
			LastSeen: agoString(s.Time, pi.LastSeen), JoinedAgo: agoString(s.Time, pi.Joined), Step: step,
		})
		if !seenSite[pi.Site] {
			seenSite[pi.Site] = true
			p.Sites = append(p.Sites, statusSite{Name: siteLabel(pi.Site), Color: siteColor(pi.Site)})
		}
	}
	p.HasPeers = len(p.Peers) > 0
	p.Ring = buildStatusRing(s.Ring, s.Peers)
	labels := make([]string, len(s.Ring))
	for i, id := range s.Ring {
		labels[i] = strconv.FormatUint(id, 10)
	}
	p.Heat = []statusHeatSection{
		{ID: "bandwidth", Title: "Bandwidth", Note: "measured from row peer to column peer",
			Map: buildHeatMap(s.Bandwidth, labels, formatBandwidth, bandwidthRamp)},
		{ID: "delay", Title: "Delay", Note: "time the row peer was held back sending 1 MiB to the column peer, recent median; a slow link is a hot cell, a slow sender a hot row, a slow receiver a hot column",
			Map: buildHeatMap(s.Delay, labels, formatDelay, delayRamp)},
	}
	p.Groups = groupRows(s)
	for _, g := range s.Groups {
		for _, sy := range g.Syndromes {
			row := statusSyndromeRow{Group: strconv.FormatUint(uint64(g.ID), 10), Kind: sy.Kind,
				Culprit: "peer " + strconv.FormatUint(sy.Peer, 10), Confidence: strconv.FormatFloat(sy.Confidence, 'f', 2, 64),
				Ratio: strconv.FormatFloat(sy.Ratio, 'f', 1, 64) + "×", Ops: strconv.Itoa(sy.Ops), Evidence: sy.Evidence}
			if sy.Kind == diagnosis.SlowLink.String() {
				row.Culprit = fmt.Sprintf("link %d → %d", sy.From, sy.To)
			}
			p.Syndromes = append(p.Syndromes, row)
		}
	}
	for _, o := range s.Ops {
		row := statusOpRow{Tag: strconv.FormatUint(o.Tag, 10), Count: strconv.FormatUint(o.Count, 10),
			Failed: o.Failed}
		if o.Seq == 0 {
			row.Seq, row.State = "-", "voting"
			row.Progress = fmt.Sprintf("%d/%d voted", o.Voted, o.Peers)
		} else {
			row.Seq, row.State = strconv.FormatUint(o.Seq, 10), "running"
			row.Progress = fmt.Sprintf("%d/%d done", o.Done, o.Peers)
		}
		if o.Failed {
			row.State = "failed: " + o.FailCause
		}
		p.Ops = append(p.Ops, row)
	}
	p.HasOps = len(p.Ops) > 0
	for i := len(s.Events) - 1; i >= 0; i-- {
		e := s.Events[i]
		row := statusEventRow{Time: e.Time.UTC().Format("15:04:05.000"), Ago: agoString(s.Time, e.Time),
			Kind: e.Kind, Detail: e.Detail}
		if e.Peer != 0 {
			row.Peer = strconv.FormatUint(e.Peer, 10)
		}
		p.Events = append(p.Events, row)
	}
	p.HasEvents = len(p.Events) > 0
	return p
}

// Ring drawing geometry, in SVG user units.
const (
	ringSize   = 360
	ringRadius = 130.0
	// ringLabelRoom is the extra width on each side for peer ids written beside the nodes: room for
	// the 15 digits of a 48-bit id.
	ringLabelRoom = 100
)

// buildStatusRing places the ring members on a circle, clockwise from the top in ring order, and
// joins each to its successor with an arc of the circle.
func buildStatusRing(ring []master.PeerID, peers []master.PeerInfo) statusRing {
	r := statusRing{Size: ringSize, Width: ringSize + 2*ringLabelRoom, Center: f1(ringSize / 2), Radius: f1(ringRadius),
		ViewBox: fmt.Sprintf("%d 0 %d %d", -ringLabelRoom, ringSize+2*ringLabelRoom, ringSize)}
	n := len(ring)
	if n == 0 {
		return r
	}
	byID := make(map[master.PeerID]master.PeerInfo, len(peers))
	for _, p := range peers {
		byID[p.ID] = p
	}
	// Node radius: at most 18, and small enough that neighbours do not overlap.
	nodeR := math.Min(18, 0.8*math.Pi*ringRadius/float64(n))
	font := math.Max(7, math.Min(12, nodeR))
	c := float64(ringSize) / 2
	angle := func(i int) float64 { return -math.Pi/2 + 2*math.Pi*float64(i)/float64(n) }
	for i, id := range ring {
		a := angle(i)
		x, y := c+ringRadius*math.Cos(a), c+ringRadius*math.Sin(a)
		lr := ringRadius + nodeR + font
		lx, ly := c+lr*math.Cos(a), c+lr*math.Sin(a)+font/3
		anchor := "middle"
		if math.Cos(a) > 0.3 {
			anchor = "start"
		} else if math.Cos(a) < -0.3 {
			anchor = "end"
		}
		p, ok := byID[id]
		title := fmt.Sprintf("rank %d: peer %d", i, id)
		if ok {
			title += fmt.Sprintf(" at %s, site %s, %s", p.Addr, siteLabel(p.Site), p.State)
		} else {
			title += " (not in the peer list)"
		}
		r.Nodes = append(r.Nodes, statusRingNode{
			ID: id, X: f1(x), Y: f1(y), R: f1(nodeR), LX: f1(lx), LY: f1(ly), Color: siteColor(p.Site),
			Title: title, FontSize: f1(font), NotInPeers: !ok, Rank: i, LabelAnchor: anchor,
		})
	}
	if n < 2 {
		return r
	}
	// Each arc leaves its node's circle and stops short of the next one, where the arrowhead sits.
	gap := (nodeR + 3) / ringRadius
	for i := range n {
		a0, a1 := angle(i)+gap, angle(i+1)-gap
		x0, y0 := c+ringRadius*math.Cos(a0), c+ringRadius*math.Sin(a0)
		x1, y1 := c+ringRadius*math.Cos(a1), c+ringRadius*math.Sin(a1)
		r.Arcs = append(r.Arcs, fmt.Sprintf("M %s %s A %s %s 0 0 1 %s %s",
			f1(x0), f1(y0), f1(ringRadius), f1(ringRadius), f1(x1), f1(y1)))
	}
	return r
}

// buildHeatMap colours m's cells on a log scale from the smallest known entry (lightest) to the largest
// (darkest), since link figures across sites span orders of magnitude. It returns nil for a nil m,
// which the page shows as "no data yet". Zero, negative and non-finite entries are unknown.
func buildHeatMap(m [][]float64, labels []string, format func(float64) string, ramp [2][3]float64) *statusHeatMap {
	if m == nil {
		return nil
	}
	label := func(i int) string {
		if i < len(labels) {
			return labels[i]
		}
		return "#" + strconv.Itoa(i)
	}
	cols := 0
	minV, maxV := math.Inf(1), 0.0
	for _, row := range m {
		cols = max(cols, len(row))
		for _, v := range row {
			if known(v) {
				minV, maxV = math.Min(minV, v), math.Max(maxV, v)
			}
		}
	}
	h := &statusHeatMap{}
	if maxV > 0 {
		h.Min, h.Max = format(minV), format(maxV)
	}
	shade := func(v float64) float64 {
		if maxV <= minV {
			return 1
		}
		return math.Log(v/minV) / math.Log(maxV/minV)
	}
	for k := range cols {
		h.Labels = append(h.Labels, label(k))
	}
	for i, row := range m {
		hr := statusHeatRow{Label: label(i)}
		for k := range cols {
			cell := statusHeatCell{Text: "·", Background: "#eeeeee", Foreground: "#888888",
				Title: label(i) + " → " + label(k) + ": unknown"}
			if k < len(row) && known(row[k]) {
				t := shade(row[k])
				cell.Text = format(row[k])
				cell.Background = rampColor(ramp, t)
				cell.Foreground = "#111111"
				if t > 0.55 {
					cell.Foreground = "#ffffff"
				}
				cell.Title = label(i) + " → " + label(k) + ": " + cell.Text
			}
			hr.Cells = append(hr.Cells, cell)
		}
		h.Rows = append(h.Rows, hr)
	}
	return h
}

func known(v float64) bool { return v > 0 && !math.IsInf(v, 0) }

// Heat map colour ramps, from the smallest to the largest value: bandwidth goes pale to deep blue,
// delay goes pale yellow to deep red.
var (
	bandwidthRamp = [2][3]float64{{0xde, 0xeb, 0xf7}, {0x08, 0x30, 0x6b}}
	delayRamp     = [2][3]float64{{0xff, 0xf5, 0xc0}, {0xa5, 0x0f, 0x15}}
)

func rampColor(ramp [2][3]float64, t float64) string {
	t = math.Max(0, math.Min(1, t))
	var c [3]uint8
	for i := range c {
		c[i] = uint8(math.Round(ramp[0][i] + t*(ramp[1][i]-ramp[0][i])))
	}
	return fmt.Sprintf("#%02x%02x%02x", c[0], c[1], c[2])
}

// siteColor gives every site a fixed colour derived from its name, so colours stay put across
// refreshes as peers come and go. Peers without a site are grey.
func siteColor(site string) string {
	if site == "" {
		return "#9e9e9e"
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(site))
	hue := float64(h.Sum32()%360) / 360
	r, g, b := hslToRGB(hue, 0.62, 0.48)
	return fmt.Sprintf("#%02x%02x%02x", r, g, b)
}

func siteLabel(site string) string {
	if site == "" {
		return "(none)"
	}
	return site
}

// hslToRGB converts hue, saturation and lightness in [0,1] to 8-bit RGB.
func hslToRGB(h, s, l float64) (r, g, b uint8) {
	q := l + s - l*s
	if l < 0.5 {
		q = l * (1 + s)
	}
	p := 2*l - q
	ch := func(t float64) uint8 {
		t -= math.Floor(t)
		var v float64
		switch {
		case t < 1.0/6:
			v = p + (q-p)*6*t
		case t < 0.5:
			v = q
		case t < 2.0/3:
			v = p + (q-p)*(2.0/3-t)*6
		default:
			v = p
		}
		return uint8(math.Round(255 * v))
	}
	return ch(h + 1.0/3), ch(h), ch(h - 1.0/3)
}

// agoString says how long before now t was: "never" for a zero t.
func agoString(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := max(now.Sub(t), 0)
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String() + " ago"
	case d < time.Minute:
		return d.Round(100*time.Millisecond).String() + " ago"
	default:
		return d.Round(time.Second).String() + " ago"
	}
}

// formatBandwidth writes bytes per second with a decimal unit.
func formatBandwidth(v float64) string {
	units := []string{"B/s", "kB/s", "MB/s", "GB/s", "TB/s"}
	i := 0
	for v >= 1000 && i < len(units)-1 {
		v /= 1000
		i++
	}
	return strconv.FormatFloat(v, 'f', precisionFor(v), 64) + " " + units[i]
}

// formatDelay writes seconds in the unit that keeps the number readable.
func formatDelay(v float64) string {
	switch {
	case v < 1e-3:
		v *= 1e6
		return strconv.FormatFloat(v, 'f', precisionFor(v), 64) + " µs"
	case v < 1:
		v *= 1e3
		return strconv.FormatFloat(v, 'f', precisionFor(v), 64) + " ms"
	default:
		return strconv.FormatFloat(v, 'f', precisionFor(v), 64) + " s"
	}
}

// precisionFor keeps about three significant digits.
func precisionFor(v float64) int {
	switch {
	case v >= 100:
		return 0
	case v >= 10:
		return 1
	default:
		return 2
	}
}

// f1 formats an SVG coordinate.
func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
