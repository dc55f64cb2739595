// Package virtual runs a function in a testing/synctest bubble from an ordinary program, for the
// benchmarks that measure in virtual time (bench/scale --virtual, bench/sharedstate --virtual).
//
// synctest.Test needs the *testing.T of a running test. Run makes a test run of one test around the
// function through testing.MainStart, the entry point 'go test' generates its main from. That entry
// point is outside Go's compatibility promise: a release that changes it breaks this package's
// build, loudly, not its results.
package virtual

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"runtime/pprof"
	"testing"
	"testing/synctest"
	"time"
)

// Run calls f inside a synctest bubble, on the bubble's goroutine, and returns once f and every
// goroutine it started have returned. It fails if f calls t.Fatal or t.Error, if a goroutine of the
// bubble is left blocked forever, or if Run is already running. The program's command line is
// not looked at.
func Run(f func(t *testing.T)) error {
	tests := []testing.InternalTest{{Name: "virtual", F: func(t *testing.T) { synctest.Test(t, f) }}}
	m := testing.MainStart(deps{}, tests, nil, nil, nil)
	// The test run parses the process's flags unless they were parsed; the program's are its own.
	if !flag.Parsed() {
		flag.CommandLine.Parse(nil)
	}
	if code := m.Run(); code != 0 {
		return errors.New("virtual: the run failed (its log is above)")
	}
	return nil
}

// corpusEntry is testing's fuzzing corpus entry, which testDeps names.
type corpusEntry = struct {
	Parent     string
	Path       string
	Data       []byte
	Values     []any
	Generation int
	IsSeed     bool
}

// deps is the least testing.MainStart needs: no fuzzing, no coverage, no test log.
type deps struct{}

func (deps) ImportPath() string                        { return "" }
func (deps) ModulePath() string                        { return "" }
func (deps) MatchString(pat, str string) (bool, error) { return true, nil }
func (deps) SetPanicOnExit0(bool)                      {}
func (deps) StartCPUProfile(w io.Writer) error         { return pprof.StartCPUProfile(w) }
func (deps) StopCPUProfile()                           { pprof.StopCPUProfile() }
func (deps) StartTestLog(io.Writer)                    {}
func (deps) StopTestLog() error                        { return nil }
func (deps) WriteProfileTo(name string, w io.Writer, debug int) error {
	return pprof.Lookup(name).WriteTo(w, debug)
}
func (deps) CoordinateFuzzing(time.Duration, int64, time.Duration, int64, int, []corpusEntry, []reflect.Type, string, string) error {
	return errors.New("virtual: no fuzzing")
}
func (deps) RunFuzzWorker(func(corpusEntry) error) error { return errors.New("virtual: no fuzzing") }
func (deps) ReadCorpus(string, []reflect.Type) ([]corpusEntry, error) {
	return nil, errors.New("virtual: no fuzzing")
}
func (deps) CheckCorpus([]any, []reflect.Type) error { return nil }
func (deps) ResetCoverage()                          {}
func (deps) SnapshotCoverage()                       {}
func (deps) InitRuntimeCoverage() (string, func(string, string) (string, error), func() float64) {
	return "", nil, nil
}
