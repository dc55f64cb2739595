package status

import (
	"encoding/json"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/concord-ccl/concord/pccl/master"
)

// diagSnapshot is statusSnapshot with a delay matrix, a slow link and a slow peer, training steps
// and recovery figures.
func diagSnapshot() master.Snapshot {
	s := statusSnapshot()
	s.Delay = [][]float64{{0, 2e-4, 0}, {0, 0, 9e-3}, {1.5e-4, 0, 0}}
	s.Peers[0].Step, s.Peers[0].HasStep = 120, true
	s.Peers[1].Step, s.Peers[1].HasStep, s.Peers[1].InOptimizer = 121, true, true
	s.Peers[2].SiteNICRates = []float64{1.25e8, 0}
	g := &s.Groups[0]
	g.Bandwidth, g.Delay = s.Bandwidth, s.Delay
	g.Syndromes = []master.Syndrome{
		{Kind: "slow-compute", Peer: 2, Confidence: 0.75, Ratio: 4, Ops: 6, Evidence: "peer 2 busy outside communication"},
		{Kind: "slow-link", Peer: 5, From: 5, To: 1, Confidence: 0.62, Ratio: 21.4, Ops: 3, Evidence: `link 5→1 <b>slow</b>`},
	}
	g.Links = []master.LinkDelay{{From: 5, To: 1, Transfer: 1e-9, Stall: 9e-3 / (1 << 20), Wait: 0.25, Age: 0}}
	g.Diagnosis = master.DiagnosisStats{Raised: map[string]uint64{"slow-link": 2, "slow-compute": 1}, Cleared: 1,
		Evicted: 1, Recoveries: 2, RecoverySeconds: 3.5, LastRecovery: 1500 * time.Millisecond,
		Reorders: 2, ReordersDeferred: 3, ReordersKept: 1, LastReorder: statusT0.Add(-90 * time.Second)}
	s.Policy = master.PolicyInfo{Reorder: true, ReorderMinConfidence: 0.5, ReorderMinRatio: 4, ReorderInterval: time.Minute, EvictAfter: 0}
	s.Events = append(s.Events, master.Event{Time: statusT0, Kind: "slow-link", Peer: 5, Detail: "slow-link 5→1 (confidence 0.62)"})
	return s
}

func TestStatusDiagnosisPage(t *testing.T) {
	h := Handler(staticSnap(diagSnapshot()), prometheus.NewRegistry())
	_, _, body := get(t, h, "/")
	// Both heat maps: 9 bandwidth cells and 9 delay cells, the delay ones in its section.
	if n := strings.Count(body, `<td class="cell"`); n != 18 {
		t.Errorf("%d heat map cells, want 18", n)
	}
	delay := body[strings.Index(body, `<h2 id="delay">`):]
	delay = delay[:strings.Index(delay, "</section>")]
	for _, s := range []string{">200 µs<", ">9.00 ms<", ">150 µs<", "a slow link is a hot cell"} {
		if !strings.Contains(delay, s) {
			t.Errorf("delay heat map lacks %q", s)
		}
	}
	// Steps: the peer table's last column.
	steps := regexp.MustCompile(`<td class="num step">([^<]*)</td>`).FindAllStringSubmatch(body, -1)
	var got []string
	for _, m := range steps {
		got = append(got, m[1])
	}
	if want := []string{"120", "121 (optimizer)", "-", "-"}; !slices.Equal(got, want) {
		t.Errorf("steps %q, want %q", got, want)
	}
	// Active syndromes, escaped.
	rows := regexp.MustCompile(`<tr class="syndrome">(.*)</tr>`).FindAllStringSubmatch(body, -1)
	if len(rows) != 2 {
		t.Fatalf("%d syndrome rows, want 2", len(rows))
	}
	for i, want := range []string{
		`<td class="num">0</td><td>slow-compute</td><td>peer 2</td><td class="num">0.75</td><td class="num">4.0×</td><td class="num">6</td>`,
		`<td>slow-link</td><td>link 5 → 1</td><td class="num">0.62</td><td class="num">21.4×</td><td class="num">3</td><td>link 5→1 &lt;b&gt;slow&lt;/b&gt;</td>`,
	} {
		if !strings.Contains(rows[i][1], want) {
			t.Errorf("syndrome row %d = %q, want it to contain %q", i, rows[i][1], want)
		}
	}
	if !strings.Contains(body, `<td>slow-link</td><td class="num">5</td><td>slow-link 5→1 (confidence 0.62)</td>`) {
		t.Errorf("the syndrome event is not in the event list")
	}
	for _, want := range []string{
		`<p class="policy">Re-ordering around slow links: on (a slow link of confidence ≥ 0.50 and ≥ 4.0× the group median; at most once per 1m0s per group): 2 re-ordered, 3 held back by the rate limit, 1 with no better ring, the latest 1m30s ago</p>`,
		`<p class="policy">Eviction of stragglers: off</p>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks policy line %q", want)
		}
	}
	_, _, empty := get(t, Handler(staticSnap(master.Snapshot{}), prometheus.NewRegistry()), "/")
	if !strings.Contains(empty, "None diagnosed.") {
		t.Errorf("empty page lacks \"None diagnosed.\"")
	}
	if !strings.Contains(empty, `<p class="policy">Re-ordering around slow links: off`) {
		t.Errorf("empty page does not say the re-ordering policy is off")
	}
}

func TestStatusDiagnosisJSON(t *testing.T) {
	_, _, body := get(t, Handler(staticSnap(diagSnapshot()), prometheus.NewRegistry()), "/status.json")
	var got statusJSON
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	if got.Peers[0].Step == nil || *got.Peers[0].Step != 120 || got.Peers[0].InOptimizer ||
		got.Peers[1].Step == nil || *got.Peers[1].Step != 121 || !got.Peers[1].InOptimizer || got.Peers[2].Step != nil {
		t.Errorf("steps %+v", got.Peers)
	}
	if m := got.Peers[2].SiteNICMbit; len(m) != 2 || m[0] != 1000 || m[1] != 0 || got.Peers[0].SiteNICMbit != nil {
		t.Errorf("site NIC figures %v and %v, want [1000 0] for peer 5 and none for peer 1", m, got.Peers[0].SiteNICMbit)
	}
	g := got.Groups[0]
	if !reflect.DeepEqual(g.Delay, diagSnapshot().Delay) || !reflect.DeepEqual(got.Delay, g.Delay) {
		t.Errorf("delay %v, group delay %v", got.Delay, g.Delay)
	}
	want := []statusSyndromeJSON{
		{Kind: "slow-compute", Peer: 2, Confidence: 0.75, Ratio: 4, Ops: 6, Evidence: "peer 2 busy outside communication"},
		{Kind: "slow-link", Peer: 5, From: 5, To: 1, Confidence: 0.62, Ratio: 21.4, Ops: 3, Evidence: `link 5→1 <b>slow</b>`},
	}
	if wantLinks := []statusLinkJSON{{From: 5, To: 1, Transfer: 1e-9, Stall: 9e-3 / (1 << 20), Wait: 0.25}}; !reflect.DeepEqual(g.Links, wantLinks) {
		t.Errorf("links %+v, want %+v", g.Links, wantLinks)
	}
	if !reflect.DeepEqual(g.Syndromes, want) {
		t.Errorf("syndromes %+v, want %+v", g.Syndromes, want)
	}
	wantDiag := statusDiagJSON{Raised: map[string]uint64{"slow-link": 2, "slow-compute": 1}, Cleared: 1, Evicted: 1,
		Recoveries: 2, RecoverySeconds: 3.5, LastRecovery: 1.5, Reorders: 2, ReordersDeferred: 3, ReordersKept: 1}
	if g.Diagnosis.LastReorder == nil || !g.Diagnosis.LastReorder.Equal(statusT0.Add(-90*time.Second)) {
		t.Errorf("last_reorder %v, want %v", g.Diagnosis.LastReorder, statusT0.Add(-90*time.Second))
	}
	g.Diagnosis.LastReorder = nil
	if !reflect.DeepEqual(g.Diagnosis, wantDiag) {
		t.Errorf("diagnosis %+v, want %+v", g.Diagnosis, wantDiag)
	}
	if wantPol := (statusPolicyJSON{Reorder: true, ReorderMinConfidence: 0.5, ReorderMinRatio: 4, ReorderInterval: 60}); got.Policy != wantPol {
		t.Errorf("policy %+v, want %+v", got.Policy, wantPol)
	}
}

func TestStatusDiagnosisMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := Handler(staticSnap(diagSnapshot()), reg)
	vals, _ := gathered(t, reg)
	want := map[string]float64{
		// Ring 2, 5, 1: its links with a known figure only (1→2 has none; 5→2 is no ring link).
		"concord_link_bandwidth_bytes_per_second{from=2}{group=0}{to=5}": 1.25e9,
		"concord_link_bandwidth_bytes_per_second{from=5}{group=0}{to=1}": 5e6,
		"concord_link_delay_seconds_per_mebibyte{from=2}{group=0}{to=5}": 2e-4,
		"concord_link_delay_seconds_per_mebibyte{from=5}{group=0}{to=1}": 9e-3,
		"concord_link_delay_seconds_per_mebibyte{from=1}{group=0}{to=2}": 1.5e-4,
		"concord_peer_training_step{group=0}{peer=1}":                    120,
		"concord_peer_training_step{group=0}{peer=2}":                    121,
		"concord_site_nic_bytes_per_second{group=0}{nic=0}{peer=5}":      1.25e8,
		"concord_site_nic_bytes_per_second{group=0}{nic=1}{peer=5}":      0,
		"concord_syndromes_active{group=0}{kind=slow-link}":              1,
		"concord_syndromes_active{group=0}{kind=slow-sender}":            0,
		"concord_syndromes_active{group=0}{kind=slow-receiver}":          0,
		"concord_syndromes_active{group=0}{kind=slow-compute}":           1,
		"concord_syndromes_raised_total{group=0}{kind=slow-link}":        2,
		"concord_syndromes_raised_total{group=0}{kind=slow-sender}":      0,
		"concord_syndromes_raised_total{group=0}{kind=slow-receiver}":    0,
		"concord_syndromes_raised_total{group=0}{kind=slow-compute}":     1,
		"concord_syndromes_cleared_total{group=0}":                       1,
		"concord_stragglers_evicted_total{group=0}":                      1,
		"concord_recovery_seconds{group=0}_count":                        2,
		"concord_recovery_seconds{group=0}_sum":                          3.5,
		"concord_last_recovery_seconds{group=0}":                         1.5,
		"concord_group_ops_in_flight{group=0}":                           1,
		"concord_group_epoch{group=0}":                                   7,
		"concord_group_ring_size{group=0}":                               3,
		"concord_group_peers{group=0}{state=accepted}":                   3,
		"concord_group_peers{group=0}{state=registered}":                 0,
		"concord_ring_reorders_total{group=0}{outcome=installed}":        2,
		"concord_ring_reorders_total{group=0}{outcome=deferred}":         3,
		"concord_ring_reorders_total{group=0}{outcome=kept}":             1,
	}
	for k, v := range vals {
		if strings.Contains(k, "{group=0}") {
			if w, ok := want[k]; !ok || w != v {
				t.Errorf("%s = %v, want %v (listed: %v)", k, v, w, ok)
			}
		}
	}
	for k, v := range want {
		if got, ok := vals[k]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	_, _, body := get(t, h, "/metrics")
	for _, line := range []string{
		`concord_link_delay_seconds_per_mebibyte{from="5",group="0",to="1"} 0.009`,
		`concord_recovery_seconds_count{group="0"} 2`,
		"# TYPE concord_recovery_seconds summary",
	} {
		if !strings.Contains(body, "\n"+line+"\n") {
			t.Errorf("/metrics lacks line %q", line)
		}
	}
}
