// Command hotrepair takes one NIC down in the middle of a multi-rail AllReduce and measures how the
// intra-site tier repairs it.
//
//	go run ./bench/hotrepair --nodes 4 --nics 4 --nic-mbit 400 --size 256MiB
//
// It needs root. It builds a netns testbed (internal/netlab): --nodes namespaces with --nics veth NICs
// each, one bridge per rail, every NIC limited to --nic-mbit in each direction by HTB, with jumbo
// frames (--mtu 9000) as on training fabrics; HTB counts headers against the rate, so standard
// frames (--mtu 1500) cost about 4% of it. One node
// process per namespace (this program, re-executed inside the namespace) opens the tcp provider on
// its NICs and runs the rdma runtime: a ring over every node, one channel per NIC, with backup
// connections on every NIC. The parent drives them over their stdin and stdout. The nodes' buffers
// are in huge pages, as a trainer's large tensors would be, and the runtime works in the result
// buffer itself (rdma.Config.Direct), as NCCL does; --staged measures the default instead, which
// works in a scratch buffer and copies the result out only on success (two more passes over the
// message per call).
//
// After --warmup untimed calls, two AllReduce calls of --size bytes (float32 sum) follow. The healthy
// one gives healthy_seconds, compared to the ring bound at --nics × --nic-mbit per node,
// 2(n−1)/n × size / (nics × rate). In the second, as soon as node --fail-node reports that it has
// received --fault-at (half) of its data, the parent takes its NIC --fail-nic down inside its namespace
// (the interface goes down, as when a NIC fails); that call gives failed_seconds. From the nodes'
// counters:
//
//   - detect_ms: from the interface going down until both ends of every affected path know (the
//     later of the two ends' first detection), the worst path;
//   - repair_ms: from both ends knowing until the sender resumed on another NIC, the worst path (0
//     when the sender resumed before the receiver knew: the sender resumes on its own detection and
//     tells the receiver in parallel); sender_repair_ms: from the sender's own first detection until
//     it resumed, the worst path;
//   - retransmitted_bytes: data posted again after failovers, compared to 2 chunks per affected path;
//   - correct: every element of every node's result equals the exact sum.
//
// Times come from one wall clock (one machine). Progress goes to stderr, the JSON result is the last
// line on stdout. Every namespace is removed at the end, on failure, and on Ctrl-C; a run killed
// harder than that is swept by the next one (namespaces named after a dead process id).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/concord-ccl/concord/bench/internal/measure"
	"github.com/concord-ccl/concord/bench/internal/nodeproc"
	"github.com/concord-ccl/concord/internal/netlab"
)

// Targets the result is compared to.
const (
	targetHealthyRatio  = 1.11  // healthy_seconds / ideal_healthy_seconds
	targetDetectMs      = 100.0 // ms
	targetRepairMs      = 10.0  // ms
	targetChunksPerPath = 2     // retransmitted chunks per affected path
)

type result struct {
	Nodes    int   `json:"nodes"`
	NICs     int   `json:"nics"`
	NICMbit  int   `json:"nic_mbit"`
	MTU      int   `json:"mtu"`
	Bytes    int64 `json:"bytes"`
	Staged   bool  `json:"staged"`
	FailNode int   `json:"fail_node"`
	FailNIC  int   `json:"fail_nic"`

	HealthySeconds      float64  `json:"healthy_seconds"`
	IdealHealthySeconds float64  `json:"ideal_healthy_seconds"`
	HealthyLimitSeconds float64  `json:"healthy_limit_seconds"`
	ChunkBytes          int      `json:"chunk_bytes"`
	AffectedChannels    int      `json:"affected_channels"`
	AffectedPaths       []string `json:"affected_paths"`
	FailedSeconds       float64  `json:"failed_seconds"`
	FaultAtSeconds      float64  `json:"fault_at_seconds"`
	// FaultDuringCall says the NIC went down before every node had finished the call (calls on a
	// shared machine vary in length, so a fault timed by the healthy call may come too late).
	FaultDuringCall bool    `json:"fault_during_call"`
	DetectMs        float64 `json:"detect_ms"`
	DetectMsLimit   float64 `json:"detect_ms_limit"`
	RepairMs        float64 `json:"repair_ms"`
	RepairMsLimit   float64 `json:"repair_ms_limit"`
	// SenderRepairMs is the sender's own time from its first detection to its resumption, the worst
	// path: what the failover costs the data flow.
	SenderRepairMs     float64 `json:"sender_repair_ms"`
	RetransmittedBytes int64   `json:"retransmitted_bytes"`
	RetransmittedLimit int64   `json:"retransmitted_bytes_limit"`
	Failovers          int     `json:"failovers"`
	HealthyFailovers   int     `json:"healthy_run_failovers"`
	// EarlyDetections counts nodes whose first detection came before the fault (false alarms of
	// deadlines on a slow machine): their detect and repair figures are not the fault's.
	EarlyDetections int    `json:"early_detections"`
	Correct         bool   `json:"correct"`
	TargetsMet      bool   `json:"targets_met"`
	Failure         string `json:"failure,omitempty"`
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("hotrepair", flag.ContinueOnError)
	nodes := fs.Int("nodes", 4, "number of nodes (namespaces, node processes)")
	nics := fs.Int("nics", 4, "NICs per node (rails)")
	mbit := fs.Int("nic-mbit", 400, "rate limit of every NIC, Mbit/s in each direction")
	sizeStr := fs.String("size", "256MiB", "AllReduce buffer size per node")
	chunk := fs.Int("chunk", 0, "chunk size in bytes (0: from the NIC rate, see nodeproc.ChunkFor)")
	failNode := fs.Int("fail-node", 1, "node whose NIC goes down")
	failNIC := fs.Int("fail-nic", 1, "NIC that goes down")
	ackTimeout := fs.Duration("min-ack-timeout", 0, "smallest per-chunk ack deadline (0: 4 windows of chunks at the NIC rate, at least 1s)")
	probeTimeout := fs.Duration("probe-timeout", time.Second, "how long a probe may go unanswered")
	warmup := fs.Int("warmup", 1, "untimed AllReduce calls before the healthy one")
	faultAt := fs.Float64("fault-at", 0.5, "when the NIC goes down: once the failing node has received this fraction of its data")
	port := fs.Int("port", 7400, "port every NIC listens on, inside its namespace")
	mtu := fs.Int("mtu", 9000, "MTU of every NIC and bridge port: jumbo frames, as training fabrics use (1500: standard frames, whose headers take 4% of the rate)")
	timeout := fs.Duration("timeout", 3*time.Minute, "give up (and remove everything) after this long")
	staged := fs.Bool("staged", false, "work in the node's scratch buffer and copy the result out on success (the runtime's default), not in the result buffer (rdma.Config.Direct)")
	index := fs.Int("node-index", -1, "internal: run as node process INDEX")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	size, err := measure.ParseSize(*sizeStr)
	if err != nil || size <= 0 || size%4 != 0 || *nodes < 3 || *nics < 2 || *mbit <= 0 ||
		*failNode < 0 || *failNode >= *nodes || *failNIC < 0 || *failNIC >= *nics || *chunk < 0 || *faultAt <= 0 || *faultAt >= 1 ||
		*mtu < 576 || *mtu > 65535 {
		fmt.Fprintln(os.Stderr, "hotrepair: need --nodes >= 3, --nics >= 2, --nic-mbit > 0, --size a positive multiple of 4, --fail-node and --fail-nic in range, 0 < --fault-at < 1, 576 <= --mtu <= 65535")
		return 2
	}
	if *chunk == 0 {
		*chunk = nodeproc.ChunkFor(*mbit)
	}
	if *index >= 0 {
		return nodeMain(nodeArgs{Index: *index, Nodes: *nodes, NICs: *nics, Mbit: *mbit, Size: int(size), FaultAt: *faultAt,
			Port: *port, Chunk: *chunk, OpTimeout: *timeout, AckTimeout: *ackTimeout, ProbeTimeout: *probeTimeout, Staged: *staged})
	}
	if err := netlab.Available(); err != nil {
		fmt.Fprintln(os.Stderr, "hotrepair:", err)
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, *timeout)
	defer cancelT()

	b := &bench{nodes: *nodes, nics: *nics, mbit: *mbit, size: size, chunk: *chunk, port: *port,
		failNode: *failNode, failNIC: *failNIC, timeout: *timeout, ackTimeout: *ackTimeout, probeTimeout: *probeTimeout,
		warmup: *warmup, faultAt: *faultAt, mtu: *mtu, staged: *staged}
	res, err := b.run(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "hotrepair: FAILED:", err)
		res.Failure = err.Error()
		res.TargetsMet = false
	}
	js, _ := json.Marshal(res)
	fmt.Println(string(js))
	if err != nil {
		return 1
	}
	return 0
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "hotrepair: "+format+"\n", args...)
}

// bench is the parent: it owns the lab and the node processes. It is used by one goroutine.
type bench struct {
	staged            bool
	nodes, nics, mbit int
	size              int64
	chunk, port       int
	failNode, failNIC int
	timeout           time.Duration
	ackTimeout        time.Duration
	probeTimeout      time.Duration
	warmup            int
	faultAt           float64
	mtu               int

	lab     *netlab.Lab
	nodesP  *nodeproc.Group[report]
	faultNs int64 // when the NIC went down (Unix nanoseconds)
}

// Meta is what the node-process group reads of a report.
func (r report) Meta() nodeproc.Meta {
	return nodeproc.Meta{Event: r.Event, Label: r.Label, Node: r.Node, Err: r.Err}
}

// failure is the report that stands for a node's unreadable line or its exit.
func failure(event string, node int, detail string) report {
	return report{Event: event, Node: node, Err: detail}
}

func (b *bench) run(ctx context.Context) (result, error) {
	res := result{Nodes: b.nodes, NICs: b.nics, NICMbit: b.mbit, MTU: b.mtu, Bytes: b.size, Staged: b.staged, FailNode: b.failNode,
		FailNIC: b.failNIC, DetectMsLimit: targetDetectMs, RepairMsLimit: targetRepairMs}
	rate := float64(b.nics) * float64(b.mbit) * 1e6 / 8
	res.IdealHealthySeconds = 2 * float64(b.nodes-1) / float64(b.nodes) * float64(b.size) / rate
	res.HealthyLimitSeconds = targetHealthyRatio * res.IdealHealthySeconds

	lab, err := netlab.New(netlab.Config{Nodes: b.nodes, NICs: b.nics, NICMbit: b.mbit, MTU: b.mtu})
	if err != nil {
		return res, err
	}
	b.lab = lab
	defer b.teardown(ctx)
	progress("lab %s: %d nodes × %d NICs at %d Mbit/s; ideal AllReduce of %d bytes %.3fs",
		lab.Name(), b.nodes, b.nics, b.mbit, b.size, res.IdealHealthySeconds)
	if err := b.spawn(); err != nil {
		return res, err
	}
	if _, err := b.collect(ctx, "ready", ""); err != nil {
		return res, err
	}

	before := make([]report, b.nodes) // the nodes' counters before the healthy call
	for i := range b.warmup {
		warm, err := b.op(ctx, fmt.Sprintf("warmup-%d", i), false)
		if err != nil {
			return res, err
		}
		before = warm
		progress("warm-up AllReduce: %.3fs", span(warm))
	}
	healthy, err := b.op(ctx, "healthy", false)
	if err != nil {
		return res, err
	}
	res.HealthySeconds = span(healthy)
	res.ChunkBytes = healthy[0].Stats.ChunkBytes
	for _, r := range healthy {
		res.HealthyFailovers += r.Stats.Failovers - before[r.Node].Stats.Failovers
	}
	progress("healthy AllReduce: %.3fs (ideal %.3fs), %d failovers", res.HealthySeconds, res.IdealHealthySeconds, res.HealthyFailovers)

	failed, err := b.op(ctx, "failed", true)
	if err != nil {
		return res, err
	}
	res.FailedSeconds = span(failed)
	res.FaultAtSeconds = float64(b.faultNs-maxStart(failed)) / 1e9
	res.FaultDuringCall = b.faultNs != 0
	for _, r := range failed {
		res.FaultDuringCall = res.FaultDuringCall && b.faultNs < r.EndNs
	}
	if !res.FaultDuringCall {
		progress("the NIC did not go down while every node was in the call: this call measures no repair")
	}
	progress("AllReduce with nic%d of node %d down at +%.3fs: %.3fs", b.failNIC, b.failNode, res.FaultAtSeconds, res.FailedSeconds)

	res.Correct = true
	for _, set := range [][]report{healthy, failed} {
		for _, r := range set {
			res.Correct = res.Correct && r.Correct
		}
	}
	b.measureRepair(&res, healthy, failed)
	res.TargetsMet = res.Correct && res.FaultDuringCall && res.AffectedChannels > 0 && res.EarlyDetections == 0 &&
		res.HealthySeconds <= res.HealthyLimitSeconds && res.DetectMs <= targetDetectMs &&
		res.RepairMs <= targetRepairMs && res.RetransmittedBytes <= res.RetransmittedLimit
	return res, nil
}

// spawn starts one node process per namespace, inside it.
func (b *bench) spawn() error {
	var err error
	b.nodesP, err = nodeproc.Start(b.lab, b.nodes, func(i int) []string {
		return []string{"--node-index", strconv.Itoa(i), "--nodes", strconv.Itoa(b.nodes),
			"--nics", strconv.Itoa(b.nics), "--nic-mbit", strconv.Itoa(b.mbit), "--size", strconv.FormatInt(b.size, 10),
			"--chunk", strconv.Itoa(b.chunk), "--port", strconv.Itoa(b.port), "--timeout", (b.timeout * 3 / 4).String(),
			"--fail-node", strconv.Itoa(b.failNode), "--fail-nic", strconv.Itoa(b.failNIC),
			"--min-ack-timeout", b.ackTimeout.String(), "--probe-timeout", b.probeTimeout.String(),
			"--fault-at", strconv.FormatFloat(b.faultAt, 'g', -1, 64), "--staged=" + strconv.FormatBool(b.staged)}
	}, failure)
	return err
}

// collect waits for one report of the given event (and label) from every node.
func (b *bench) collect(ctx context.Context, event, label string) ([]report, error) {
	return b.nodesP.Collect(ctx, event, label)
}

// op runs one AllReduce on every node. With fault set, it takes the failing NIC down as soon as the
// failing node reports that it has received --fault-at of its data.
func (b *bench) op(ctx context.Context, label string, fault bool) ([]report, error) {
	if err := b.nodesP.Broadcast(command{Op: "run", Label: label, Watch: fault}); err != nil {
		return nil, err
	}
	done := make([]report, b.nodes)
	finished := 0
	for finished < b.nodes {
		var r report
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s AllReduce: %d of %d nodes done: %w", label, finished, b.nodes, ctx.Err())
		case r = <-b.nodesP.Reports():
		}
		if r.Event == "fatal" || r.Event == "exit" {
			return nil, fmt.Errorf("node %d: %s %s", r.Node, r.Event, r.Err)
		}
		if r.Label != label {
			continue
		}
		switch r.Event {
		case "progress":
			if fault && r.Node == b.failNode && b.faultNs == 0 {
				b.faultNs = time.Now().UnixNano()
				if err := b.lab.SetNIC(b.failNode, b.failNIC, false); err != nil {
					return nil, err
				}
				progress("nic%d of node %d is down", b.failNIC, b.failNode)
			}
		case "done":
			if done[r.Node].Event == "" {
				done[r.Node] = r
				finished++
			}
		}
	}
	for _, r := range done {
		if r.Err != "" {
			return done, fmt.Errorf("node %d: %s AllReduce: %s", r.Node, label, r.Err)
		}
	}
	if err := b.nodesP.Broadcast(command{Op: "check", Label: label}); err != nil {
		return nil, err
	}
	checked, err := b.collect(ctx, "checked", label)
	if err != nil {
		return nil, err
	}
	for _, r := range checked {
		done[r.Node].Correct = r.Correct
	}
	return done, nil
}

// measureRepair fills the repair figures from the nodes' counters after the healthy and failed calls.
// The runtime's counters are cumulative and keep only the first detection and resumption of a node,
// so: affected paths are those first failed over during the failed call; a node whose first detection
// came before the fault (a false alarm earlier) counts in early_detections and its times are unknown;
// a path with an end of unknown time is left out of detect_ms and repair_ms (-1 when none is left).
func (b *bench) measureRepair(res *result, healthy, failed []report) {
	detect := make(map[int]int64) // first detection at or after the fault, by node
	resume := make(map[int]int64) // first resumption after it, by node
	for _, r := range failed {
		before := healthy[r.Node].Stats
		res.RetransmittedBytes += r.Stats.RetransmittedBytes - before.RetransmittedBytes
		res.Failovers += r.Stats.Failovers - before.Failovers
		if r.Stats.FirstDetectNs != 0 && r.Stats.FirstDetectNs < b.faultNs {
			res.EarlyDetections++
		} else {
			detect[r.Node] = r.Stats.FirstDetectNs
			resume[r.Node] = r.Stats.FirstResumeNs
		}
		for _, p := range r.Stats.AffectedPaths {
			if !slices.Contains(before.AffectedPaths, p) {
				res.AffectedPaths = append(res.AffectedPaths, p)
			}
		}
	}
	res.AffectedChannels = len(res.AffectedPaths)
	res.RetransmittedLimit = int64(targetChunksPerPath * res.ChunkBytes * max(res.AffectedChannels, 1))
	res.DetectMs, res.RepairMs, res.SenderRepairMs = -1, -1, -1
	for _, p := range res.AffectedPaths {
		var src, dst, ch int
		if _, err := fmt.Sscanf(p, "%d->%d/ch%d", &src, &dst, &ch); err != nil {
			continue
		}
		if detect[src] == 0 || detect[dst] == 0 {
			continue
		}
		both := max(detect[src], detect[dst])
		res.DetectMs = max(res.DetectMs, float64(both-b.faultNs)/1e6)
		if resume[src] != 0 {
			// 0 when the sender resumed before the receiver knew: the runtime does not wait for it.
			res.RepairMs = max(res.RepairMs, float64(max(resume[src]-both, 0))/1e6)
			res.SenderRepairMs = max(res.SenderRepairMs, float64(resume[src]-detect[src])/1e6)
		}
	}
}

// teardown stops every node process and removes the lab. After a clean run the nodes are asked to
// quit and get 5 seconds; after a failure or Ctrl-C (ctx done) they are killed at once. The lab's
// Close would kill any that is left anyway, through their parent-death signal.
func (b *bench) teardown(ctx context.Context) {
	if b.nodesP != nil {
		b.nodesP.Close(ctx, command{Op: "quit"})
	}
	if err := b.lab.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "hotrepair: teardown:", err)
	}
}

// span is the duration of one collective: from the last node's start to the last node's end.
func span(rs []report) float64 {
	var end int64
	for _, r := range rs {
		end = max(end, r.EndNs)
	}
	return float64(end-maxStart(rs)) / 1e9
}

func maxStart(rs []report) int64 {
	var s int64
	for _, r := range rs {
		s = max(s, r.StartNs)
	}
	return s
}
