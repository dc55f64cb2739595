// Package status serves a Concord master's status page, its JSON form and its Prometheus metrics. It
// reads the master only through snapshots (master.Snapshot), so the protocol package needs no HTTP
// or metrics code: the binary wires a Server's Snapshot method into Handler.
package status
