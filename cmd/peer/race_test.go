//go:build race

package main

// raceBuild says that the tests were built with the race detector. The tests on hosts run the
// commands as separate binaries, built without it, so under -race they would take their minutes
// and check nothing more: they skip, and run in the plain `go test ./...`.
const raceBuild = true
