package status

import (
	"embed"
	"fmt"
	"html/template"
	"strconv"
	"time"

	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/pccl/master/diagnosis"
)

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
	Policies   []string // what the master does on its own about slow links and peers, one line each
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

// policyLines says on the page what the master does on its own: re-order rings around slow links
// (and how often it did), and evict stragglers.
func policyLines(s master.Snapshot) []string {
	var n, deferred, kept uint64
	var last time.Time
	for _, g := range s.Groups {
		d := g.Diagnosis
		n, deferred, kept = n+d.Reorders, deferred+d.ReordersDeferred, kept+d.ReordersKept
		if d.LastReorder.After(last) {
			last = d.LastReorder
		}
	}
	pol := s.Policy
	var out []string
	if pol.Reorder {
		line := fmt.Sprintf("Re-ordering around slow links: on (a slow link of confidence ≥ %.2f and ≥ %.1f× the group median; at most once per %v per group): %d re-ordered, %d held back by the rate limit, %d with no better ring",
			pol.ReorderMinConfidence, pol.ReorderMinRatio, pol.ReorderInterval, n, deferred, kept)
		if !last.IsZero() {
			line += ", the latest " + agoString(s.Time, last)
		}
		out = append(out, line)
	} else {
		out = append(out, "Re-ordering around slow links: off (a slow link costs more at the next OptimizeTopology)")
	}
	if pol.EvictAfter > 0 {
		out = append(out, fmt.Sprintf("Eviction of stragglers: after %d operations of a slow-sender, slow-receiver or slow-compute syndrome", pol.EvictAfter))
	} else {
		out = append(out, "Eviction of stragglers: off")
	}
	return out
}

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
	p.Policies = policyLines(s)
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
