package status

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/concord-ccl/concord/pccl/master"
)

var statusT0 = time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)

const hostileSite = `<script>alert("x")</script>`

// statusSnapshot is a hand-built Snapshot with a hostile site name and event detail.
func statusSnapshot() master.Snapshot {
	return master.Snapshot{
		Time:        statusT0,
		Incarnation: 3,
		Epoch:       7,
		MinPeers:    2,
		Peers: []master.PeerInfo{
			{ID: 1, Addr: "10.0.0.1:7001", Site: "eu-west", State: master.Accepted, Joined: statusT0.Add(-time.Minute), LastSeen: statusT0.Add(-250 * time.Millisecond)},
			{ID: 2, Addr: "10.0.0.2:7001", Site: "us-east", State: master.Accepted, Joined: statusT0.Add(-time.Minute), LastSeen: statusT0.Add(-2 * time.Second)},
			{ID: 5, Addr: "10.0.0.5:7001", Site: hostileSite, State: master.Accepted, Joined: statusT0.Add(-30 * time.Second), LastSeen: statusT0},
			{ID: 9, Group: 1, Addr: "10.0.0.9:7001", Site: "eu-west", State: master.Registered, Joined: statusT0.Add(-time.Second), LastSeen: statusT0.Add(-time.Second)},
		},
		Ring: []master.PeerID{2, 5, 1},
		Groups: []master.GroupInfo{
			{ID: 0, Epoch: 7, Ring: []master.PeerID{2, 5, 1}, Ops: []master.OpInfo{{Tag: 4, Seq: 11, Count: 4096, Done: 1, Peers: 3}}},
			{ID: 1, Epoch: 3<<32 | 2},
		},
		Ops: []master.OpInfo{
			{Tag: 3, Seq: 0, Count: 1024, Voted: 2, Peers: 3},
			{Tag: 4, Seq: 11, Count: 4096, Done: 1, Peers: 3},
			{Tag: 8, Seq: 12, Count: 16, Peers: 3, Failed: true, FailCause: "peer 5 left"},
		},
		Counters: master.Counters{Joined: 10, Accepted: 8, Left: 6, Kicked: 2, Timeouts: 3, OpsDone: 120, OpsAborted: 4, Rounds: 5, LinksCut: 1},
		Bandwidth: [][]float64{
			{0, 1.25e9, 0},
			{3e8, 0, 5e6},
			{math.NaN(), 7e7, 0},
		},
		Delay: nil,
		Events: []master.Event{
			{Time: statusT0.Add(-3 * time.Second), Kind: "joined", Peer: 9, Detail: "from 10.0.0.9:7001"},
			{Time: statusT0.Add(-time.Second), Kind: "kicked", Peer: 4, Detail: `<img src=x onerror="alert(1)">`},
			{Time: statusT0, Kind: "ring", Detail: "epoch 7"},
		},
	}
}

func get(t *testing.T, h http.Handler, path string) (int, http.Header, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, err := io.ReadAll(rec.Result().Body)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Code, rec.Result().Header, string(body)
}

func staticSnap(s master.Snapshot) func() master.Snapshot { return func() master.Snapshot { return s } }

func TestStatusHealthz(t *testing.T) {
	h := Handler(staticSnap(master.Snapshot{}), prometheus.NewRegistry())
	code, _, body := get(t, h, "/healthz")
	if code != http.StatusOK || body != "ok" {
		t.Fatalf("/healthz = %d %q, want 200 \"ok\"", code, body)
	}
	if code, _, _ := get(t, h, "/nope"); code != http.StatusNotFound {
		t.Fatalf("/nope = %d, want 404", code)
	}
}

func TestStatusPage(t *testing.T) {
	h := Handler(staticSnap(statusSnapshot()), nil)
	code, hdr, body := get(t, h, "/")
	if code != http.StatusOK {
		t.Fatalf("/ = %d: %s", code, body)
	}
	if ct := hdr.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("Content-Type = %q", ct)
	}
	if strings.Contains(body, "ZgotmplZ") {
		t.Errorf("the template rejected a value (ZgotmplZ in output)")
	}

	// Every peer has a table row with its id, address, site, state and last-seen time.
	peerRows := regexp.MustCompile(`<tr class="peer">(.*)</tr>`).FindAllStringSubmatch(body, -1)
	wantRows := []string{
		`<td class="num">1</td><td>10.0.0.1:7001</td><td><span class="sw" style="background:#`,
		`<td class="num">2</td><td>10.0.0.2:7001</td>`,
		`<td class="num">5</td><td>10.0.0.5:7001</td>`,
		`<td class="num">9</td><td>10.0.0.9:7001</td>`,
	}
	if len(peerRows) != len(wantRows) {
		t.Fatalf("%d peer rows, want %d", len(peerRows), len(wantRows))
	}
	wantCells := [][]string{
		{"eu-west</td><td>accepted</td><td>250ms ago</td><td>1m0s ago</td>"},
		{"us-east</td><td>accepted</td><td>2s ago</td><td>1m0s ago</td>"},
		{"&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;</td><td>accepted</td><td>0s ago</td><td>30s ago</td>"},
		{"eu-west</td><td>registered</td><td>1s ago</td><td>1s ago</td>"},
	}
	for i, row := range peerRows {
		if !strings.HasPrefix(row[1], wantRows[i]) {
			t.Errorf("peer row %d = %q, want prefix %q", i, row[1], wantRows[i])
		}
		for _, c := range wantCells[i] {
			if !strings.Contains(row[1], c) {
				t.Errorf("peer row %d = %q, want it to contain %q", i, row[1], c)
			}
		}
	}

	// The hostile strings appear only escaped.
	for _, raw := range []string{hostileSite, `<img src=x`} {
		if strings.Contains(body, raw) {
			t.Errorf("page contains unescaped %q", raw)
		}
	}
	if !strings.Contains(body, "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;") {
		t.Errorf("escaped event detail missing")
	}

	// The ring: one node per member, in ring order, and one arrow to each successor.
	nodes := regexp.MustCompile(`<circle class="node"`).FindAllStringIndex(body, -1)
	if len(nodes) != 3 {
		t.Errorf("%d ring nodes, want 3", len(nodes))
	}
	if n := strings.Count(body, `class="edge"`); n != 3 {
		t.Errorf("%d ring arrows, want 3", n)
	}
	ids := regexp.MustCompile(`<title>rank (\d+): peer (\d+) at`).FindAllStringSubmatch(body, -1)
	var got []string
	for _, m := range ids {
		got = append(got, m[1]+":"+m[2])
	}
	if want := []string{"0:2", "1:5", "2:1"}; !slices.Equal(got, want) {
		t.Errorf("ring nodes (rank:peer) = %v, want %v", got, want)
	}
	// Nodes are coloured by site: peers 1 and 9 share eu-west, so their colour appears in the ring
	// for peer 1 and differs from peer 2's.
	if siteColor("eu-west") == siteColor("us-east") {
		t.Errorf("eu-west and us-east have the same colour")
	}
	if !strings.Contains(body, `fill="`+siteColor("eu-west")+`"`) || !strings.Contains(body, `fill="`+siteColor("us-east")+`"`) {
		t.Errorf("ring nodes not coloured by site")
	}

	// Bandwidth heat map has a 3×3 table; delay has no data yet.
	if n := strings.Count(body, `<td class="cell"`); n != 9 {
		t.Errorf("%d heat map cells, want 9", n)
	}
	for _, s := range []string{">1.25 GB/s<", ">300 MB/s<", ">5.00 MB/s<", ">70.0 MB/s<"} {
		if !strings.Contains(body, s) {
			t.Errorf("bandwidth cell %q missing", s)
		}
	}
	// Log scale: the smallest known entry is lightest, the largest darkest.
	for text, bg := range map[string]string{"5.00 MB/s": "#deebf7", "1.25 GB/s": "#08306b"} {
		if !strings.Contains(body, `style="background:`+bg+`;color:#`) || !strings.Contains(body, `: `+text+`" style="background:`+bg+`;`) {
			t.Errorf("cell %s is not coloured %s", text, bg)
		}
	}
	delay := body[strings.Index(body, `<h2 id="delay">`):]
	if !strings.Contains(delay[:200], "No data yet.") {
		t.Errorf("delay section does not say no data yet: %q", delay[:200])
	}

	// Collectives and events.
	for _, s := range []string{"2/3 voted", "1/3 done", "failed: peer 5 left", ">voting<", ">running<", ">12<"} {
		if !strings.Contains(body, s) {
			t.Errorf("collectives table lacks %q", s)
		}
	}
	kinds := regexp.MustCompile(`<tr class="event"><td>[^<]*</td><td>[^<]*</td><td>(\w+)</td>`).FindAllStringSubmatch(body, -1)
	var gotKinds []string
	for _, m := range kinds {
		gotKinds = append(gotKinds, m[1])
	}
	if want := []string{"ring", "kicked", "joined"}; !slices.Equal(gotKinds, want) {
		t.Errorf("event kinds = %v, want newest first %v", gotKinds, want)
	}
}

func TestStatusPageEmpty(t *testing.T) {
	h := Handler(staticSnap(master.Snapshot{}), prometheus.NewRegistry())
	code, _, body := get(t, h, "/")
	if code != http.StatusOK {
		t.Fatalf("/ = %d: %s", code, body)
	}
	for _, s := range []string{"No ring yet.", "No peers connected.", "None yet."} {
		if !strings.Contains(body, s) {
			t.Errorf("empty page lacks %q", s)
		}
	}
	if n := strings.Count(body, "No data yet."); n != 2 {
		t.Errorf("%d \"No data yet.\", want 2", n)
	}
}

func TestStatusRingGeometry(t *testing.T) {
	for _, n := range []int{1, 2, 5, 64} {
		ring := make([]master.PeerID, n)
		for i := range ring {
			ring[i] = master.PeerID(100 + i)
		}
		r := buildStatusRing(ring, nil)
		if len(r.Nodes) != n {
			t.Errorf("n=%d: %d nodes", n, len(r.Nodes))
		}
		wantArcs := n
		if n == 1 {
			wantArcs = 0
		}
		if len(r.Arcs) != wantArcs {
			t.Errorf("n=%d: %d arcs, want %d", n, len(r.Arcs), wantArcs)
		}
		for i, nd := range r.Nodes {
			if nd.ID != ring[i] || nd.Rank != i || !nd.NotInPeers {
				t.Errorf("n=%d: node %d = %+v", n, i, nd)
			}
		}
	}
	// The first node sits at the top of the circle.
	r := buildStatusRing([]master.PeerID{1, 2, 3, 4}, nil)
	if r.Nodes[0].X != "180.0" || r.Nodes[0].Y != "50.0" || r.Nodes[1].X != "310.0" || r.Nodes[1].Y != "180.0" {
		t.Errorf("node positions = %+v, %+v", r.Nodes[0], r.Nodes[1])
	}
}

func TestStatusJSON(t *testing.T) {
	h := Handler(staticSnap(statusSnapshot()), prometheus.NewRegistry())
	code, hdr, body := get(t, h, "/status.json")
	if code != http.StatusOK {
		t.Fatalf("/status.json = %d: %s", code, body)
	}
	if ct := hdr.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q", ct)
	}
	var got statusJSON
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	m := time.Minute
	want := statusJSON{
		Time: statusT0, Incarnation: 3, Epoch: 7, MinPeers: 2,
		Peers: []statusPeerJSON{
			{ID: 1, Addr: "10.0.0.1:7001", Site: "eu-west", State: "accepted", Joined: statusT0.Add(-m), LastSeen: statusT0.Add(-250 * time.Millisecond)},
			{ID: 2, Addr: "10.0.0.2:7001", Site: "us-east", State: "accepted", Joined: statusT0.Add(-m), LastSeen: statusT0.Add(-2 * time.Second)},
			{ID: 5, Addr: "10.0.0.5:7001", Site: hostileSite, State: "accepted", Joined: statusT0.Add(-30 * time.Second), LastSeen: statusT0},
			{ID: 9, Group: 1, Addr: "10.0.0.9:7001", Site: "eu-west", State: "registered", Joined: statusT0.Add(-time.Second), LastSeen: statusT0.Add(-time.Second)},
		},
		Ring: []uint64{2, 5, 1},
		Ops: []statusOpJSON{
			{Tag: 3, Count: 1024, Voted: 2, Peers: 3},
			{Tag: 4, Seq: 11, Count: 4096, Done: 1, Peers: 3},
			{Tag: 8, Seq: 12, Count: 16, Peers: 3, Failed: true, FailCause: "peer 5 left"},
		},
		Counters:  statusCountJSON{Joined: 10, Accepted: 8, Left: 6, Kicked: 2, Timeouts: 3, OpsDone: 120, OpsAborted: 4, Rounds: 5, LinksCut: 1},
		Bandwidth: [][]float64{{0, 1.25e9, 0}, {3e8, 0, 5e6}, {0, 7e7, 0}},
		Delay:     nil,
		Events: []statusEventJSON{
			{Time: statusT0.Add(-3 * time.Second), Kind: "joined", Peer: 9, Detail: "from 10.0.0.9:7001"},
			{Time: statusT0.Add(-time.Second), Kind: "kicked", Peer: 4, Detail: `<img src=x onerror="alert(1)">`},
			{Time: statusT0, Kind: "ring", Detail: "epoch 7"},
		},
		Groups: []statusGroupJSON{
			{ID: 0, Epoch: 7, Ring: []uint64{2, 5, 1}, Ops: []statusOpJSON{{Tag: 4, Seq: 11, Count: 4096, Done: 1, Peers: 3}},
				Syndromes: []statusSyndromeJSON{}, Links: []statusLinkJSON{}, Diagnosis: statusDiagJSON{Raised: map[string]uint64{}}},
			{ID: 1, Epoch: 3<<32 | 2, Ring: []uint64{}, Ops: []statusOpJSON{}, Syndromes: []statusSyndromeJSON{}, Links: []statusLinkJSON{},
				Diagnosis: statusDiagJSON{Raised: map[string]uint64{}}},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decoded status:\n got %+v\nwant %+v", got, want)
	}

	// The keys are the documented lowercase ones.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range raw {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"bandwidth", "counters", "delay", "epoch", "events", "groups", "incarnation", "min_peers", "ops", "peers", "policy", "ring", "time"}; !slices.Equal(keys, want) {
		t.Errorf("keys = %v, want %v", keys, want)
	}
	if string(raw["delay"]) != "null" {
		t.Errorf("delay = %s, want null", raw["delay"])
	}

	// An empty snapshot has empty lists, not nulls.
	_, _, body = get(t, Handler(staticSnap(master.Snapshot{}), prometheus.NewRegistry()), "/status.json")
	if err := json.Unmarshal([]byte(body), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"peers", "ring", "ops", "events", "groups"} {
		if string(raw[k]) != "[]" {
			t.Errorf("empty %s = %s, want []", k, raw[k])
		}
	}
}

// gathered returns name{labels} -> value for the concord_* series in reg, with the metric type.
func gathered(t *testing.T, reg *prometheus.Registry) (map[string]float64, map[string]dto.MetricType) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]float64{}
	types := map[string]dto.MetricType{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "concord_") {
			continue
		}
		types[mf.GetName()] = mf.GetType()
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, lp := range m.GetLabel() {
				key += "{" + lp.GetName() + "=" + lp.GetValue() + "}"
			}
			switch mf.GetType() {
			case dto.MetricType_GAUGE:
				vals[key] = m.GetGauge().GetValue()
			case dto.MetricType_COUNTER:
				vals[key] = m.GetCounter().GetValue()
			case dto.MetricType_SUMMARY:
				vals[key+"_count"] = float64(m.GetSummary().GetSampleCount())
				vals[key+"_sum"] = m.GetSummary().GetSampleSum()
			default:
				t.Errorf("%s has type %v", key, mf.GetType())
			}
		}
	}
	return vals, types
}

func TestStatusMetrics(t *testing.T) {
	var mu sync.Mutex
	s := statusSnapshot()
	snap := func() master.Snapshot {
		mu.Lock()
		defer mu.Unlock()
		return s
	}
	reg := prometheus.NewRegistry()
	h := Handler(snap, reg)

	vals, types := gathered(t, reg)
	vals = withoutDiagnosis(vals)
	want := map[string]float64{
		"concord_peers{state=registered}":  1,
		"concord_peers{state=accepted}":    3,
		"concord_epoch":                    7,
		"concord_ring_size":                3,
		"concord_ops_in_flight":            2,
		"concord_peers_joined_total":       10,
		"concord_peers_left_total":         6,
		"concord_peers_kicked_total":       2,
		"concord_heartbeat_timeouts_total": 3,
		"concord_ops_completed_total":      120,
		"concord_ops_aborted_total":        4,
		"concord_links_cut_total":          1,
		"concord_reorder_policy_enabled":   0,
	}
	if !reflect.DeepEqual(vals, want) {
		t.Errorf("metrics:\n got %v\nwant %v", vals, want)
	}
	for name, typ := range types {
		wantType := dto.MetricType_GAUGE
		switch {
		case strings.HasSuffix(name, "_total"):
			wantType = dto.MetricType_COUNTER
		case name == "concord_recovery_seconds":
			wantType = dto.MetricType_SUMMARY
		}
		if typ != wantType {
			t.Errorf("%s is a %v, want %v", name, typ, wantType)
		}
	}

	// The exposition over HTTP carries the same series.
	code, _, body := get(t, h, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics = %d: %s", code, body)
	}
	for _, line := range []string{
		`concord_peers{state="accepted"} 3`,
		`concord_peers{state="registered"} 1`,
		"concord_epoch 7",
		"concord_ring_size 3",
		"concord_ops_in_flight 2",
		"concord_peers_joined_total 10",
		"concord_peers_left_total 6",
		"concord_peers_kicked_total 2",
		"concord_heartbeat_timeouts_total 3",
		"concord_ops_completed_total 120",
		"concord_ops_aborted_total 4",
		"# TYPE concord_ops_aborted_total counter",
		"# TYPE concord_epoch gauge",
	} {
		if !strings.Contains(body, "\n"+line+"\n") {
			t.Errorf("/metrics lacks line %q", line)
		}
	}

	// Every scrape reads a fresh snapshot.
	mu.Lock()
	s.Epoch = 8
	s.Ring = []master.PeerID{1, 2}
	s.Peers = s.Peers[:2]
	s.Counters.OpsDone = 121
	mu.Unlock()
	vals, _ = gathered(t, reg)
	for k, v := range map[string]float64{"concord_epoch": 8, "concord_ring_size": 2, "concord_ops_completed_total": 121,
		"concord_peers{state=accepted}": 2, "concord_peers{state=registered}": 0} {
		if vals[k] != v {
			t.Errorf("after change %s = %v, want %v", k, vals[k], v)
		}
	}
}

// withoutDiagnosis drops the per-group, per-link and per-peer series, which TestStatusDiagnosis
// checks.
func withoutDiagnosis(vals map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range vals {
		if !strings.Contains(k, "{group=") {
			out[k] = v
		}
	}
	return out
}

func TestStatusMetricsOwnRegistry(t *testing.T) {
	h := Handler(staticSnap(statusSnapshot()), nil)
	_, _, body := get(t, h, "/metrics")
	for _, line := range []string{"concord_epoch 7", "concord_ring_size 3"} {
		if !strings.Contains(body, "\n"+line+"\n") {
			t.Errorf("/metrics lacks line %q", line)
		}
	}
	if !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics lacks the Go runtime metrics")
	}
}

func TestStatusFormatting(t *testing.T) {
	for _, c := range []struct {
		v    float64
		f    func(float64) string
		want string
	}{
		{512, formatBandwidth, "512 B/s"},
		{1.5e3, formatBandwidth, "1.50 kB/s"},
		{12.5e9, formatBandwidth, "12.5 GB/s"},
		{2e15, formatBandwidth, "2000 TB/s"},
		{250e-6, formatDelay, "250 µs"},
		{0.0125, formatDelay, "12.5 ms"},
		{3, formatDelay, "3.00 s"},
	} {
		if got := c.f(c.v); got != c.want {
			t.Errorf("format(%v) = %q, want %q", c.v, got, c.want)
		}
	}
	if got := rampColor(bandwidthRamp, 0); got != "#deebf7" {
		t.Errorf("ramp(0) = %s", got)
	}
	if got := rampColor(bandwidthRamp, 1); got != "#08306b" {
		t.Errorf("ramp(1) = %s", got)
	}
	if got := siteColor(""); got != "#9e9e9e" {
		t.Errorf("siteColor(\"\") = %s", got)
	}
	if siteColor("eu-west") != siteColor("eu-west") {
		t.Errorf("siteColor is not stable")
	}
}

func TestStatusHeatMap(t *testing.T) {
	// Ragged rows and more rows than ring members: missing cells are unknown, extra rows get an index.
	m := [][]float64{{0, 10}, {100}, {1000, math.Inf(1), -1}}
	h := buildHeatMap(m, []string{"7", "8"}, formatDelay, delayRamp)
	if want := []string{"7", "8", "#2"}; !slices.Equal(h.Labels, want) {
		t.Errorf("labels = %v, want %v", h.Labels, want)
	}
	if h.Min != "10.0 s" || h.Max != "1000 s" {
		t.Errorf("min, max = %q, %q", h.Min, h.Max)
	}
	var texts, bgs []string
	for _, r := range h.Rows {
		for _, c := range r.Cells {
			texts = append(texts, c.Text)
			bgs = append(bgs, c.Background)
		}
	}
	if want := []string{"·", "10.0 s", "·", "100 s", "·", "·", "1000 s", "·", "·"}; !slices.Equal(texts, want) {
		t.Errorf("cells = %v, want %v", texts, want)
	}
	mid := rampColor(delayRamp, 0.5)
	if want := []string{"#eeeeee", "#fff5c0", "#eeeeee", mid, "#eeeeee", "#eeeeee", "#a50f15", "#eeeeee", "#eeeeee"}; !slices.Equal(bgs, want) {
		t.Errorf("backgrounds = %v, want %v", bgs, want)
	}

	// One known value is drawn darkest; a matrix with none known has no range.
	h = buildHeatMap([][]float64{{0, 5}}, nil, formatDelay, delayRamp)
	if h.Rows[0].Cells[1].Background != "#a50f15" {
		t.Errorf("single value background = %s", h.Rows[0].Cells[1].Background)
	}
	h = buildHeatMap([][]float64{}, nil, formatDelay, delayRamp)
	if h == nil || h.Max != "" || len(h.Rows) != 0 {
		t.Errorf("empty matrix = %+v", h)
	}
	if buildHeatMap(nil, nil, formatDelay, delayRamp) != nil {
		t.Errorf("nil matrix gives a heat map")
	}
}

func TestStatusConcurrent(t *testing.T) {
	srv := httptest.NewServer(Handler(staticSnap(statusSnapshot()), prometheus.NewRegistry()))
	defer srv.Close()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			path := []string{"/", "/status.json", "/metrics", "/healthz"}[i%4]
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				t.Error(err)
			}
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%s = %d", path, resp.StatusCode)
			}
		})
	}
	wg.Wait()
}

// BenchmarkStatusPage renders the page for a 64-peer ring with full matrices and 100 events.
func BenchmarkStatusPage(b *testing.B) {
	const n = 64
	s := master.Snapshot{Time: statusT0, Epoch: 3, MinPeers: 2, Bandwidth: make([][]float64, n), Delay: make([][]float64, n)}
	for i := range n {
		id := master.PeerID(i + 1)
		s.Peers = append(s.Peers, master.PeerInfo{ID: id, Addr: "10.0.0.1:7001", Site: []string{"a", "b", "c"}[i%3], State: master.Accepted, LastSeen: statusT0})
		s.Ring = append(s.Ring, id)
		s.Bandwidth[i] = make([]float64, n)
		s.Delay[i] = make([]float64, n)
		for k := range n {
			if k != i {
				s.Bandwidth[i][k] = float64(1e6 * (1 + (i*k)%1000))
				s.Delay[i][k] = float64(1e-4 * float64(1+(i+k)%50))
			}
		}
	}
	for i := range 100 {
		s.Events = append(s.Events, master.Event{Time: statusT0, Kind: "joined", Peer: master.PeerID(i), Detail: "x"})
	}
	h := Handler(staticSnap(s), prometheus.NewRegistry())
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatal(rec.Code)
		}
		b.SetBytes(int64(rec.Body.Len()))
	}
}

// TestStatusGroups checks that the page and the metrics show every peer group: group 0 with its
// three accepted peers and one collective in flight, group 1 with one registered peer and no ring.
func TestStatusGroups(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := Handler(staticSnap(statusSnapshot()), reg)
	_, _, body := get(t, h, "/")
	rows := regexp.MustCompile(`<tr class="group">(.*)</tr>`).FindAllStringSubmatch(body, -1)
	want := []string{
		`<td class="num">0</td><td class="num">3</td><td class="num">0</td><td class="num">7</td><td class="num">3</td><td class="num">1</td>`,
		`<td class="num">1</td><td class="num">0</td><td class="num">1</td><td class="num">12884901890</td><td class="num">0</td><td class="num">0</td>`,
	}
	if len(rows) != len(want) {
		t.Fatalf("%d group rows, want %d", len(rows), len(want))
	}
	for i, row := range rows {
		if row[1] != want[i] {
			t.Errorf("group row %d = %q, want %q", i, row[1], want[i])
		}
	}

	vals, _ := gathered(t, reg)
	for k, v := range map[string]float64{
		"concord_group_peers{group=0}{state=accepted}":   3,
		"concord_group_peers{group=0}{state=registered}": 0,
		"concord_group_peers{group=1}{state=accepted}":   0,
		"concord_group_peers{group=1}{state=registered}": 1,
		"concord_group_epoch{group=0}":                   7,
		"concord_group_epoch{group=1}":                   3<<32 | 2,
		"concord_group_ring_size{group=0}":               3,
		"concord_group_ring_size{group=1}":               0,
		"concord_group_ops_in_flight{group=0}":           1,
		"concord_group_ops_in_flight{group=1}":           0,
	} {
		if got, ok := vals[k]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
}
