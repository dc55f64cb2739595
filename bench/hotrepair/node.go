package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"github.com/concord-ccl/concord/bench/internal/nodeproc"
	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/tcp"
	"github.com/concord-ccl/concord/rings"
)

// nodeArgs is what the parent tells a node process on its command line.
type nodeArgs struct {
	Index, Nodes, NICs int
	Mbit               int
	Size               int
	Port               int
	Chunk              int
	OpTimeout          time.Duration
	FaultAt            float64       // fraction of its bytes a node has received when it reports "progress"
	AckTimeout         time.Duration // 0: derived from the chunk size and the NIC rate
	ProbeTimeout       time.Duration
	Staged             bool // the runtime's default buffers, not rdma.Config.Direct
}

// repairConfig sets the runtime's deadlines for the testbed: an ack deadline of at least four windows
// of chunks at the NIC's rate (a chunk is acknowledged once the window ahead of it went out), and
// never below 1s, since node processes share a few CPUs and a late answer must not look like a
// failure. A NIC going down is seen at once through link state, whatever the deadlines.
func (a nodeArgs) repairConfig() rdma.Config {
	cfg := rdma.Config{ChunkBytes: a.Chunk, Direct: !a.Staged}
	chunk := a.Chunk
	if chunk == 0 {
		chunk = 256 << 10
	}
	ack := a.AckTimeout
	if ack == 0 {
		perChunk := time.Duration(float64(chunk) * 8 / (float64(a.Mbit) * 1e6) * float64(time.Second))
		ack = max(4*time.Duration(nodeproc.Window)*perChunk, time.Second)
	}
	cfg.Repair = rdma.RepairConfig{MinAckTimeout: ack, ProbeTimeout: a.ProbeTimeout}
	return cfg
}

// userTimeout is the nodes' TCP_USER_TIMEOUT.
const userTimeout = 10 * time.Second

// cpuProfileEnv names an environment variable: when set to a directory, every node process writes its
// CPU profile there (node-INDEX.pprof), for finding where a run's time goes.
const cpuProfileEnv = "HOTREPAIR_CPUPROFILE"

// command is one line from the parent on a node's stdin.
type command struct {
	Op    string `json:"op"` // "run", "check" (the last run's result) or "quit"
	Label string `json:"label"`
	// Watch asks for a "progress" report during the run (the call that takes a NIC down); other
	// calls run without the watcher's polling.
	Watch bool `json:"watch,omitempty"`
}

// report is one line from a node on its stdout.
type report struct {
	Event string `json:"event"` // "ready", "started", "progress", "done" or "fatal"
	Node  int    `json:"node"`
	Label string `json:"label,omitempty"`
	// StartNs and EndNs bound the node's AllReduce call (Unix nanoseconds, the machine's wall clock).
	StartNs int64  `json:"start_ns,omitempty"`
	EndNs   int64  `json:"end_ns,omitempty"`
	Err     string `json:"err,omitempty"`
	// Correct says every element of the result equals the sum of every node's input (in the
	// "checked" report that answers a "check" command).
	Correct bool `json:"correct"`
	// Stats of the node's runtime after the call (cumulative since the node started).
	Stats nodeStats `json:"stats"`
}

// nodeStats is the part of rdma.Stats the parent uses, with times as Unix nanoseconds (0: never).
type nodeStats struct {
	Failovers          int      `json:"failovers"`
	RetransmittedBytes int64    `json:"retransmitted_bytes"`
	ChunkBytes         int      `json:"chunk_bytes"`
	FirstDetectNs      int64    `json:"first_detect_ns"`
	FirstResumeNs      int64    `json:"first_resume_ns"`
	AffectedPaths      []string `json:"affected_paths"`
	Notes              []string `json:"notes"`
}

func unixNs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// nodeMain runs one node, inside its namespace: an endpoint on the namespace's NICs, the hot-repair
// runtime on a ring of every node, and one AllReduce per "run" line on stdin.
func nodeMain(a nodeArgs) int {
	out := json.NewEncoder(os.Stdout)
	fatal := func(err error) int {
		out.Encode(report{Event: "fatal", Node: a.Index, Err: err.Error()})
		return 1
	}
	if dir := os.Getenv(cpuProfileEnv); dir != "" {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("node-%d.pprof", a.Index)))
		if err != nil {
			return fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	// The kernel's own failure timer is set well above the runtime's deadlines: behind the HTB shaper
	// and on a busy machine data may sit unacknowledged for a while without anything having failed, and
	// a NIC going down is seen through link state at once anyway.
	ep, ring, err := nodeproc.TCPNode{Index: a.Index, Nodes: a.Nodes, NICs: a.NICs, Mbit: a.Mbit, Port: a.Port,
		UserTimeout: userTimeout}.Listen()
	if err != nil {
		return fatal(err)
	}
	defer ep.Close()
	node, err := rdma.NewNode(ep, ring, a.repairConfig())
	if err != nil {
		return fatal(err)
	}

	count := a.Size / 4
	send, recv := nodeproc.Buffer(count), nodeproc.Buffer(count)
	nodeproc.Fill(send, a.Index)
	out.Encode(report{Event: "ready", Node: a.Index})

	seenNotes := 0  // notes of the runtime already printed to stderr
	lastOK := false // the last call succeeded (its result is checked on "check")
	for cmd, err := range nodeproc.Commands[command](os.Stdin) {
		if err != nil {
			return fatal(err)
		}
		switch cmd.Op {
		case "quit":
			return 0
		case "check":
			// Checked only once every node has finished: a check right after the call would take
			// CPU from the nodes still in it.
			out.Encode(report{Event: "checked", Node: a.Index, Label: cmd.Label, Correct: lastOK && nodeproc.Check(recv, a.Nodes)})
			continue
		}
		nodeproc.Poison(recv)
		start := time.Now()
		out.Encode(report{Event: "started", Node: a.Index, Label: cmd.Label, StartNs: start.UnixNano()})
		ctx, cancel := context.WithTimeout(context.Background(), a.OpTimeout)
		var watched <-chan struct{} // nil: no watcher
		if cmd.Watch {
			watched = watchProgress(ctx, ep, a, cmd.Label, out)
		}
		err := node.AllReduce(ctx, rings.Bytes(send), rings.Bytes(recv), rings.F32, rings.Sum)
		end := time.Now()
		cancel()
		if watched != nil {
			<-watched
		}
		rep := report{Event: "done", Node: a.Index, Label: cmd.Label, StartNs: start.UnixNano(), EndNs: end.UnixNano()}
		lastOK = err == nil
		if err != nil {
			rep.Err = err.Error()
		}
		rep.Stats = stats(ep, node)
		for _, n := range rep.Stats.Notes[min(seenNotes, len(rep.Stats.Notes)):] {
			fmt.Fprintf(os.Stderr, "node %d: %s: %s\n", a.Index, cmd.Label, n)
		}
		seenNotes = len(rep.Stats.Notes)
		out.Encode(rep)
	}
	return 0
}

// progressPoll is how often a node looks at how much it has received during a call.
const progressPoll = time.Millisecond

// watchProgress reports "progress" once the node has received FaultAt of the bytes a ring AllReduce
// brings it, 2(n−1)/n × size, or never if ctx ends first. The returned channel closes when it stops.
// The parent takes the NIC down on that report, so the fault lands in the middle of the data
// transfer however long the call takes on a busy machine.
func watchProgress(ctx context.Context, ep *tcp.Endpoint, a nodeArgs, label string, out *json.Encoder) <-chan struct{} {
	done := make(chan struct{})
	base := ep.ReceivedBytes()
	goal := int64(a.FaultAt * 2 * float64(a.Nodes-1) / float64(a.Nodes) * float64(a.Size))
	go func() {
		defer close(done)
		tick := time.NewTicker(progressPoll)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if ep.ReceivedBytes()-base >= goal {
					out.Encode(report{Event: "progress", Node: a.Index, Label: label})
					return
				}
			}
		}
	}()
	return done
}

// stats reads the runtime's counters in the endpoint's event context, which owns them.
func stats(ep rdma.Endpoint, node *rdma.Node) nodeStats {
	ch := make(chan rdma.Stats, 1)
	ep.Post(func() { ch <- node.Stats() })
	s := <-ch
	ns := nodeStats{
		Failovers: s.Failovers, RetransmittedBytes: s.RetransmittedBytes, ChunkBytes: s.ChunkBytes,
		FirstDetectNs: unixNs(s.FirstDetect), FirstResumeNs: unixNs(s.FirstResume), Notes: s.Notes,
	}
	for _, p := range s.AffectedPaths {
		ns.AffectedPaths = append(ns.AffectedPaths, p.String())
	}
	return ns
}
