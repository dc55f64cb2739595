package status

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/concord-ccl/concord/pccl/master"
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
// may be mounted under a prefix with http.StripPrefix. The handler keeps no state between requests
// and serves them concurrently.
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
