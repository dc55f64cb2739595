// Command schedules measures the failure-aware AllReduce schedules of the intra-site tier on a netns
// testbed and compares the planner's choice with the best measured schedule and the model's bound.
//
//	go run ./bench/schedules --nodes 4 --nics 4 --nic-mbit 400 --size 256MiB
//
// It needs root. It builds a netns testbed (internal/netlab): --nodes namespaces with --nics veth NICs
// each, one bridge per rail, every NIC limited to --nic-mbit in each direction. One node process per
// namespace (this program, re-executed inside it) runs the rdma runtime on the tcp provider: a ring
// over every node, one channel per NIC. The parent drives them over stdin and stdout. As in
// bench/hotrepair, the buffers are in huge pages and the runtime works in the result buffer
// (rdma.Config.Direct); --staged measures the default, staged buffers instead.
//
// Cases, in this order (NICs are taken down inside their namespace between calls, and the one NIC the
// last case no longer needs down is brought up again):
//
//	healthy              no NIC down: the standard ring;
//	one_nic_x25          NIC 1 of node 1 down (X = 0.25): hot repair only, Balance, R²CCL-AllReduce,
//	                     OptCC's schedule (the degraded node as a leaf, its share priced by the runtime
//	                     on these NICs, rdma.Replanner.PlanStrategy), the weighted rings (blocks sized
//	                     and every link split over rails by a linear program, plan.Weighted; also
//	                     priced by the runtime);
//	two_nics_x50         NICs 1 and 2 of node 1 down (X = 0.5): the same five;
//	two_nodes_two_rails  NIC 1 of node 1 and NIC 2 of node 2 down: hot repair, Balance,
//	                     R²CCL-AllReduce, recursive (with bridge re-ranking where the model finds it
//	                     pays), OptCC's schedule, the weighted rings.
//
// Every case also runs the planner's choice for its health and size. Each measurement is --reps
// AllReduce calls of --size bytes of float32 (sum), after one untimed warm-up call; a call's time is
// from the last node's start to the last node's end (one wall clock), and the fastest call counts
// (the machine may be shared; every sample is in the output). A case's calls take turns: one of each
// strategy and one of the planner's choice per round, --reps rounds, so that a slow spell of the
// machine does not fall on one of them only. Once every node has finished a call, every node checks
// every element of its result against the exact sum (inputs are small integers).
// NICs run jumbo frames (--mtu 9000) and pass TCP packets of up to 512 KiB whole (--gso, BIG TCP; see
// below), and chunks are sized from the NIC rate (--chunk 0), as in bench/hotrepair; --cases runs a
// subset of the cases.
//
// The model: before the cases every node's runtime measures every NIC's α and β on the testbed
// (rdma.Node.Calibrate: each NIC alone, a tiny, a 2 MiB and an 8 MiB message to each ring neighbour,
// the fastest of three; α from the tiny one, β from the difference of the other two), every node gets
// the same table, and the planner and the model work from it (the key calibration gives it in Mbit/s
// and µs). --calibrate=false gives them the nominal figures instead: every NIC at --nic-mbit,
// α = alpha_nominal_seconds.
//
// A strategy's predicted_seconds is the model's price of the plan it runs. R²CCL-AllReduce and the
// recursive schedule run with Appendix A's shares, priced as Appendix A prices them, which leaves out
// that a slower node's input for a faster ring's share must first cross that node's own NICs; their
// gated_model_seconds prices the same plan the way the runtime runs it (plan.Model.GatherFirst, the
// model rdma.Replanner chooses by). With two of node 1's NICs down, Y* puts half the message through
// that gather, and the gated price is about twice Appendix A's.
//
// Per case: ideal_seconds is the model's lower bound [plan.Ideal],
//
//	ideal = 2⌈log₂ n⌉·α + max(n·a·D/Σ_i R_i, D/R_min),  a = 2(n−1)/n,
//
// R_i node i's remaining bandwidth (the sum of 1/β over its healthy NICs), D the size and α the largest
// NIC latency of the model; ideal_nominal_seconds is the same bound on the nominal figures.
// best_seconds is the fastest strategy measured; fault_free_seconds is the measured healthy call.
// Targets: planner_seconds ≤ 1.10 × best_seconds and ≤ 1.15 × ideal_seconds, every result correct.
//
// The testbed shares the machine's cores with the nodes: every byte crosses two veth pairs, a bridge
// and two HTB queues in the kernel, besides the nodes' own copies and folds. Each strategy's cpu_busy
// (and a case's planner_cpu_busy) is the share of all cores' time that was busy while its calls ran
// (/proc/stat); near 1 the calls wait for CPU as well as for the NICs, and run slower than the model,
// which knows only the NICs. With the kernel's default of 64 KiB packets (--gso 0), on a 2-core
// machine at 400 Mbit/s, the healthy ring keeps the cores 93% busy and runs 5–9% slower than the
// model (at 200 Mbit/s 80% busy, 2% slower); with packets of up to 512 KiB, 58–63% busy and at
// 0.98–1.00× the model, and the weighted rings with one NIC down 72–79% busy and 1–3% slower than
// theirs.
//
// Progress goes to stderr, the JSON result is the last line on stdout.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/concord-ccl/concord/bench/internal/measure"
	"github.com/concord-ccl/concord/bench/internal/nodeproc"
	"github.com/concord-ccl/concord/internal/netlab"
	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/plan"
)

// Targets of every case.
const (
	targetVsBest  = 1.10
	targetVsIdeal = 1.15
)

// idealFormula states how ideal_seconds is computed.
const idealFormula = "2*ceil(log2 n)*alpha + max(n*a*D/sum_i R_i, D/R_min), a = 2(n-1)/n, R_i = sum of 1/beta over node i's healthy NICs, alpha = the largest NIC alpha (measured per NIC; nominal: nic rate and alpha_nominal_seconds)"

type measured struct {
	Strategy string `json:"strategy"`
	// Seconds is the fastest of the repetitions (the one least disturbed by other load on the
	// machine); Samples lists them all.
	Seconds          float64   `json:"seconds"`
	Samples          []float64 `json:"samples"`
	PredictedSeconds float64   `json:"predicted_seconds"`
	// GatedModelSeconds is, for r2ccl_allreduce and recursive, the plan that ran (Appendix A's
	// shares) priced the way the runtime runs it: its slower nodes' inputs for a faster ring's share
	// cross their own NICs before that ring starts, which Appendix A does not charge
	// (plan.Model.GatherFirst, as rdma.Replanner prices every choice). Absent for other strategies.
	GatedModelSeconds float64 `json:"gated_model_seconds,omitempty"`
	// Failovers counts the path failovers of every node during these calls: a schedule routes around
	// the NICs it knows are down, so any failover is a false alarm or a connection the machine lost.
	Failovers int `json:"failovers"`
	// CPUBusy is the share of the machine's CPU time (all cores) that was busy while these calls ran,
	// from /proc/stat (absent where it cannot be read). Near 1, the testbed itself is short of CPU: its
	// veth NICs, bridges and HTB queues run on the same cores as the nodes.
	CPUBusy float64 `json:"cpu_busy,omitempty"`
	Correct bool    `json:"correct"`
	Err     string  `json:"err,omitempty"`

	cpu measure.CPUTimes // the CPU times of the calls so far
}

type caseResult struct {
	Name                  string     `json:"name"`
	Down                  [][2]int   `json:"down"`
	LostFraction          float64    `json:"lost_fraction"`
	Strategies            []measured `json:"strategies"`
	PlannerChoice         string     `json:"planner_choice"`
	PlannerSeconds        float64    `json:"planner_seconds"`
	PlannerPredicted      float64    `json:"planner_predicted_seconds"`
	PlannerCPUBusy        float64    `json:"planner_cpu_busy,omitempty"`
	BestStrategy          string     `json:"best_strategy"`
	BestSeconds           float64    `json:"best_seconds"`
	IdealSeconds          float64    `json:"ideal_seconds"`
	IdealNominalSeconds   float64    `json:"ideal_nominal_seconds"`
	FaultFreeSeconds      float64    `json:"fault_free_seconds"`
	FaultFreeModelSeconds float64    `json:"fault_free_model_seconds"`
	PlannerVsBest         float64    `json:"planner_vs_best"`
	PlannerVsIdeal        float64    `json:"planner_vs_ideal"`
	PlannerVsIdealNominal float64    `json:"planner_vs_ideal_nominal"`
	PlannerVsFaultFree    float64    `json:"planner_vs_fault_free"`
	Correct               bool       `json:"correct"`
	TargetsMet            bool       `json:"targets_met"`
}

type result struct {
	Nodes         int          `json:"nodes"`
	NICs          int          `json:"nics"`
	NICMbit       int          `json:"nic_mbit"`
	MTU           int          `json:"mtu"`
	GSOMaxBytes   int          `json:"gso_max_bytes"` // 0: the kernel's default, 64 KiB
	Staged        bool         `json:"staged"`
	ChunkBytes    int          `json:"chunk_bytes"`
	Bytes         int64        `json:"bytes"`
	Reps          int          `json:"reps"`
	Alpha         float64      `json:"alpha_seconds"`
	AlphaNominal  float64      `json:"alpha_nominal_seconds"`
	Calibrated    bool         `json:"calibrated"`
	Calibration   *calibration `json:"calibration,omitempty"`
	IdealFormula  string       `json:"ideal_formula"`
	TargetVsBest  float64      `json:"target_planner_vs_best"`
	TargetVsIdeal float64      `json:"target_planner_vs_ideal"`
	Cases         []caseResult `json:"cases"`
	Correct       bool         `json:"correct"`
	TargetsMet    bool         `json:"targets_met"`
	Failure       string       `json:"failure,omitempty"`
}

type scenario struct {
	name       string
	down       [][2]int
	strategies []plan.Strategy
}

func scenarios() []scenario {
	single := []plan.Strategy{plan.HotRepair, plan.Balance, plan.R2CCL, plan.OptCC, plan.Weighted}
	return []scenario{
		{"healthy", nil, []plan.Strategy{plan.Ring}},
		{"one_nic_x25", [][2]int{{1, 1}}, single},
		{"two_nics_x50", [][2]int{{1, 1}, {1, 2}}, single},
		{"two_nodes_two_rails", [][2]int{{1, 1}, {2, 2}}, []plan.Strategy{plan.HotRepair, plan.Balance, plan.R2CCL, plan.Recursive, plan.OptCC, plan.Weighted}},
	}
}

// pickCases returns the scenarios named in list (comma-separated), in their usual order; all of them
// when list is empty.
func pickCases(list string) ([]scenario, error) {
	all := scenarios()
	if list == "" {
		return all, nil
	}
	want := map[string]bool{}
	for _, name := range strings.Split(list, ",") {
		if !slices.ContainsFunc(all, func(sc scenario) bool { return sc.name == name }) {
			return nil, fmt.Errorf("unknown case %q (have healthy, one_nic_x25, two_nics_x50, two_nodes_two_rails)", name)
		}
		want[name] = true
	}
	return slices.DeleteFunc(all, func(sc scenario) bool { return !want[sc.name] }), nil
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("schedules", flag.ContinueOnError)
	nodes := fs.Int("nodes", 4, "number of nodes (namespaces, node processes)")
	nics := fs.Int("nics", 4, "NICs per node (rails)")
	mbit := fs.Int("nic-mbit", 400, "rate limit of every NIC, Mbit/s in each direction")
	sizeStr := fs.String("size", "256MiB", "AllReduce buffer size per node")
	port := fs.Int("port", 7500, "port every NIC listens on, inside its namespace")
	timeout := fs.Duration("timeout", 15*time.Minute, "give up (and remove everything) after this long")
	reps := fs.Int("reps", 3, "timed calls of every strategy in every case (the fastest counts)")
	chunk := fs.Int("chunk", 0, "chunk size in bytes (0: from the NIC rate, see nodeproc.ChunkFor; 1 MiB at 400 Mbit/s)")
	mtu := fs.Int("mtu", 9000, "MTU of every NIC and bridge port: jumbo frames, as training fabrics use (1500: standard frames)")
	gso := fs.Int("gso", netlab.MaxGSOBytes, "largest TCP packet a NIC passes on whole, in bytes (BIG TCP, so that the testbed's own kernel work per byte is small; 0: the kernel's default, 64 KiB; a kernel that refuses it gets 0)")
	cases := fs.String("cases", "", "comma-separated case names to run, in the usual order (empty: all)")
	calibrate := fs.Bool("calibrate", true, "measure every NIC's alpha and beta on the testbed first (rdma.Node.Calibrate) and give them to the planner and the model; false: the nominal --nic-mbit and alpha")
	staged := fs.Bool("staged", false, "work in the node's scratch buffer and copy the result out on success (the runtime's default), not in the result buffer (rdma.Config.Direct)")
	index := fs.Int("node-index", -1, "internal: run as node process INDEX")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	size, err := measure.ParseSize(*sizeStr)
	if err != nil || size <= 0 || size%4 != 0 || *nodes < 3 || *nics < 3 || *mbit <= 0 || *reps < 1 || *chunk < 0 ||
		*mtu < 576 || *mtu > 65535 || *gso != 0 && (*gso < *mtu || *gso > netlab.MaxGSOBytes) {
		fmt.Fprintf(os.Stderr, "schedules: need --nodes >= 3, --nics >= 3, --nic-mbit > 0, --size a positive multiple of 4, --reps >= 1, --chunk >= 0, 576 <= --mtu <= 65535, --gso 0 or --mtu..%d\n", netlab.MaxGSOBytes)
		return 2
	}
	if *chunk == 0 {
		*chunk = nodeproc.ChunkFor(*mbit)
	}
	if *index >= 0 {
		return nodeMain(nodeArgs{Index: *index, Nodes: *nodes, NICs: *nics, Mbit: *mbit, Size: int(size), Port: *port,
			Chunk: *chunk, OpTimeout: *timeout, Staged: *staged, Calibrate: *calibrate})
	}
	if err := netlab.Available(); err != nil {
		fmt.Fprintln(os.Stderr, "schedules:", err)
		return 2
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, *timeout)
	defer cancelT()
	only, err := pickCases(*cases)
	if err != nil {
		fmt.Fprintln(os.Stderr, "schedules:", err)
		return 2
	}
	b := &bench{staged: *staged, calibrate: *calibrate, nodes: *nodes, nics: *nics, mbit: *mbit, size: size, port: *port, timeout: *timeout, reps: *reps,
		chunk: *chunk, mtu: *mtu, gso: *gso, cases: only}
	res, err := b.run(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "schedules: FAILED:", err)
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
	fmt.Fprintf(os.Stderr, "schedules: "+format+"\n", args...)
}

// bench is the parent: it owns the lab and the node processes. One goroutine uses it.
type bench struct {
	staged, calibrate       bool
	nodes, nics, mbit, port int
	size                    int64
	timeout                 time.Duration
	reps                    int
	chunk, mtu, gso         int
	cases                   []scenario

	lab       *netlab.Lab
	nodesP    *nodeproc.Group[report]
	down      map[[2]int]bool
	failovers []int // every node's failovers after the last call
	// model is the planner's topology, healthy: measured (--calibrate) or nominal.
	model plan.Topology
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
	res := result{Nodes: b.nodes, NICs: b.nics, NICMbit: b.mbit, MTU: b.mtu, Staged: b.staged, ChunkBytes: b.chunk, Bytes: b.size, Reps: b.reps,
		Alpha: alpha, AlphaNominal: alpha, Calibrated: b.calibrate, IdealFormula: idealFormula, TargetVsBest: targetVsBest, TargetVsIdeal: targetVsIdeal}
	cfg := netlab.Config{Nodes: b.nodes, NICs: b.nics, NICMbit: b.mbit, MTU: b.mtu, GSOMaxBytes: b.gso}
	lab, err := netlab.New(cfg)
	if errors.Is(err, netlab.ErrGSO) {
		progress("%v; the NICs keep the kernel's default", err)
		b.gso, cfg.GSOMaxBytes = 0, 0
		lab, err = netlab.New(cfg)
	}
	if err != nil {
		return res, err
	}
	res.GSOMaxBytes = b.gso
	b.lab = lab
	b.down = map[[2]int]bool{}
	defer b.teardown(ctx)
	progress("lab %s: %d nodes × %d NICs at %d Mbit/s, AllReduce of %d bytes", lab.Name(), b.nodes, b.nics, b.mbit, b.size)
	if err := b.spawn(); err != nil {
		return res, err
	}
	ready, err := b.collect(ctx, "ready", "")
	if err != nil {
		return res, err
	}
	b.model = topology(b.nodes, b.nics, b.mbit, nil)
	if b.calibrate {
		cal, err := sameCalibration(ready)
		if err != nil {
			return res, err
		}
		b.model = cal.Apply(b.model)
		res.Calibration = calibrationOf(cal)
		res.Alpha = 0
		for _, row := range cal.Alpha {
			res.Alpha = max(res.Alpha, slices.Max(row))
		}
		mlo, mhi := span(res.Calibration.Mbit)
		alo, ahi := span(res.Calibration.AlphaMicros)
		progress("calibrated: NICs at %.0f..%.0f Mbit/s, alpha %.0f..%.0f µs", mlo, mhi, alo, ahi)
	}
	if _, err := b.call(ctx, "warmup", "ring", nil); err != nil {
		return res, err
	}
	res.Correct, res.TargetsMet = true, true
	var faultFree float64
	for _, sc := range b.cases {
		if err := b.setDown(ctx, sc.down); err != nil {
			return res, err
		}
		c, err := b.runCase(ctx, sc)
		if err != nil {
			return res, err
		}
		if sc.down == nil {
			faultFree = c.BestSeconds
		}
		if faultFree > 0 { // not measured when the healthy case is left out
			c.FaultFreeSeconds = faultFree
			c.PlannerVsFaultFree = c.PlannerSeconds / faultFree
		}
		res.Cases = append(res.Cases, c)
		res.Correct = res.Correct && c.Correct
		res.TargetsMet = res.TargetsMet && c.TargetsMet
	}
	return res, nil
}

// runCase measures every strategy of sc and the planner's choice.
func (b *bench) runCase(ctx context.Context, sc scenario) (caseResult, error) {
	nominal := topology(b.nodes, b.nics, b.mbit, sc.down)
	topo := withDown(b.model, sc.down)
	c := caseResult{Name: sc.name, Down: sc.down, Correct: true, BestSeconds: math.Inf(1)}
	for i := range nominal.Nodes {
		c.LostFraction = max(c.LostFraction, 1-nominal.NodeBandwidth(i)/(float64(b.nics)*float64(b.mbit)*1e6/8))
	}
	var err error
	if c.IdealSeconds, err = plan.Ideal(topo, float64(b.size)); err != nil {
		return c, err
	}
	if c.IdealNominalSeconds, err = plan.Ideal(nominal, float64(b.size)); err != nil {
		return c, err
	}
	if c.FaultFreeModelSeconds, err = plan.FaultFree(topo, float64(b.size), planModel); err != nil {
		return c, err
	}
	// One call of each strategy and of the planner's choice in turn, --reps rounds: a slow spell of
	// the machine then falls on all of them alike, not on whichever ran during it.
	names := make([]string, 0, len(sc.strategies)+1)
	for _, st := range sc.strategies {
		names = append(names, st.String())
	}
	names = append(names, "planner")
	ms := make([]measured, len(names))
	for i := range ms {
		ms[i] = newMeasured()
	}
	for rep := range b.reps {
		for i, name := range names {
			if err := b.callOnce(ctx, fmt.Sprintf("%s/%s#%d", sc.name, name, rep), name, sc.down, &ms[i]); err != nil {
				return c, err
			}
		}
	}
	for _, m := range ms[:len(sc.strategies)] {
		gated := ""
		if m.GatedModelSeconds > 0 {
			gated = fmt.Sprintf(", gated %.3fs", m.GatedModelSeconds)
		}
		progress("%s: %s %.3fs (model %.3fs%s) correct %v, %d failovers, cpu busy %.2f", sc.name, m.Strategy, m.Seconds, m.PredictedSeconds, gated, m.Correct, m.Failovers, m.CPUBusy)
		c.Strategies = append(c.Strategies, m)
		c.Correct = c.Correct && m.Correct
		if m.Err == "" && m.Seconds < c.BestSeconds {
			c.BestSeconds, c.BestStrategy = m.Seconds, m.Strategy
		}
	}
	m := ms[len(sc.strategies)]
	progress("%s: planner chose %s: %.3fs (model %.3fs) correct %v, cpu busy %.2f; ideal %.3fs", sc.name, m.Strategy, m.Seconds, m.PredictedSeconds, m.Correct, m.CPUBusy, c.IdealSeconds)
	c.PlannerChoice, c.PlannerSeconds, c.PlannerPredicted, c.PlannerCPUBusy = m.Strategy, m.Seconds, m.PredictedSeconds, m.CPUBusy
	c.Correct = c.Correct && m.Correct
	c.PlannerVsBest = c.PlannerSeconds / c.BestSeconds
	c.PlannerVsIdeal = c.PlannerSeconds / c.IdealSeconds
	c.PlannerVsIdealNominal = c.PlannerSeconds / c.IdealNominalSeconds
	c.TargetsMet = c.Correct && c.PlannerVsBest <= targetVsBest && c.PlannerVsIdeal <= targetVsIdeal
	return c, nil
}

// setDown brings the lab's NICs to the given down set. After bringing NICs up it waits (up to 60s)
// until every node's runtime holds them healthy again, so that their connections are renewed.
func (b *bench) setDown(ctx context.Context, down [][2]int) error {
	want := map[[2]int]bool{}
	for _, d := range down {
		want[d] = true
	}
	var healed [][2]int
	for d := range b.down {
		if !want[d] {
			if err := b.lab.SetNIC(d[0], d[1], true); err != nil {
				return err
			}
			healed = append(healed, d)
			delete(b.down, d)
			progress("nic%d of node %d is up", d[1], d[0])
		}
	}
	for d := range want {
		if !b.down[d] {
			if err := b.lab.SetNIC(d[0], d[1], false); err != nil {
				return err
			}
			b.down[d] = true
			progress("nic%d of node %d is down", d[1], d[0])
		}
	}
	if len(healed) == 0 {
		return nil
	}
	deadline := time.Now().Add(60 * time.Second)
	for i := 0; ; i++ {
		reps, err := b.ask(ctx, command{Op: "health", Label: strconv.Itoa(i)}, "health")
		if err != nil {
			return err
		}
		stale := false
		for _, r := range reps {
			for _, h := range healed {
				stale = stale || slices.Contains(r.Down, h)
			}
		}
		if !stale {
			progress("every node's runtime holds the healed NICs up")
			return nil
		}
		if time.Now().After(deadline) {
			progress("the runtime still holds a healed NIC down after 60s; going on")
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// call runs --reps AllReduce calls of the given strategy on every node and measures them.
func (b *bench) call(ctx context.Context, label, strategy string, down [][2]int) (measured, error) {
	m := newMeasured()
	for rep := range b.reps {
		if err := b.callOnce(ctx, fmt.Sprintf("%s#%d", label, rep), strategy, down, &m); err != nil {
			return m, err
		}
	}
	return m, nil
}

// addCPU counts the CPU times from a to b (read later) as a call's and sets CPUBusy over every call
// counted. An interval that is not one (b not later than a) is left out.
func (m *measured) addCPU(a, b measure.CPUTimes) {
	if math.IsNaN(measure.BusyFraction(a, b)) {
		return
	}
	m.cpu.Busy += b.Busy - a.Busy
	m.cpu.Total += b.Total - a.Total
	m.CPUBusy = measure.BusyFraction(measure.CPUTimes{}, m.cpu)
}

// newMeasured returns a measurement with no calls yet: correct until a check fails.
func newMeasured() measured { return measured{Correct: true, Seconds: math.Inf(1)} }

// callOnce runs one AllReduce call of the given strategy on every node, checks its result and adds
// its time to m.
func (b *bench) callOnce(ctx context.Context, label, strategy string, down [][2]int, m *measured) error {
	cpu0, cpuErr := measure.ReadCPU()
	reps, err := b.ask(ctx, command{Op: "run", Label: label, Strategy: strategy, Down: down}, "done")
	if err != nil {
		return err
	}
	if cpu1, err := measure.ReadCPU(); err == nil && cpuErr == nil {
		m.addCPU(cpu0, cpu1)
	}
	m.Strategy, m.PredictedSeconds, m.GatedModelSeconds = reps[0].Strategy, reps[0].Predicted, reps[0].GatedModel
	var start, end int64
	for _, r := range reps {
		if r.Err != "" {
			return fmt.Errorf("node %d: %s: %s", r.Node, label, r.Err)
		}
		if r.Strategy != m.Strategy {
			return fmt.Errorf("%s: node %d ran %s, node 0 %s", label, r.Node, r.Strategy, m.Strategy)
		}
		start, end = max(start, r.StartNs), max(end, r.EndNs)
		if b.failovers == nil {
			b.failovers = make([]int, b.nodes)
		}
		m.Failovers += r.Failovers - b.failovers[r.Node]
		b.failovers[r.Node] = r.Failovers
	}
	// Results are checked once every node has finished, so that no check takes CPU from a node
	// still in the call.
	checked, err := b.ask(ctx, command{Op: "check", Label: label}, "checked")
	if err != nil {
		return err
	}
	for _, r := range checked {
		m.Correct = m.Correct && r.Correct
	}
	sec := float64(end-start) / 1e9
	m.Samples = append(m.Samples, sec)
	m.Seconds = min(m.Seconds, sec)
	return nil
}

// ask sends cmd to every node and collects one report of event with cmd's label from each.
func (b *bench) ask(ctx context.Context, cmd command, event string) ([]report, error) {
	if err := b.nodesP.Broadcast(cmd); err != nil {
		return nil, err
	}
	return b.nodesP.Collect(ctx, event, cmd.Label)
}

// spawn starts one node process per namespace, inside it.
func (b *bench) spawn() error {
	var err error
	b.nodesP, err = nodeproc.Start(b.lab, b.nodes, func(i int) []string {
		return []string{"--node-index", strconv.Itoa(i), "--nodes", strconv.Itoa(b.nodes),
			"--nics", strconv.Itoa(b.nics), "--nic-mbit", strconv.Itoa(b.mbit), "--size", strconv.FormatInt(b.size, 10),
			"--port", strconv.Itoa(b.port), "--timeout", (b.timeout / 4).String(), "--chunk", strconv.Itoa(b.chunk),
			"--staged=" + strconv.FormatBool(b.staged), "--calibrate=" + strconv.FormatBool(b.calibrate)}
	}, failure)
	return err
}

// collect waits for one report of the given event and label from every node.
func (b *bench) collect(ctx context.Context, event, label string) ([]report, error) {
	return b.nodesP.Collect(ctx, event, label)
}

// teardown stops every node process and removes the lab.
func (b *bench) teardown(ctx context.Context) {
	if b.nodesP != nil {
		b.nodesP.Close(ctx, command{Op: "quit"})
	}
	if err := b.lab.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "schedules: teardown:", err)
	}
}

// sameCalibration returns the nodes' calibration, which must be the same table, bit for bit, on every
// node: each plans its schedules from it.
func sameCalibration(ready []report) (rdma.Calibration, error) {
	var first *rdma.Calibration
	for _, r := range ready {
		if r.Calibration == nil {
			return rdma.Calibration{}, fmt.Errorf("node %d reported no calibration", r.Node)
		}
		if first == nil {
			first = r.Calibration
		} else if !reflect.DeepEqual(*r.Calibration, *first) {
			return rdma.Calibration{}, fmt.Errorf("node %d's calibration differs from node %d's", r.Node, ready[0].Node)
		}
	}
	if first == nil {
		return rdma.Calibration{}, fmt.Errorf("no node reported")
	}
	return *first, nil
}

// calibration is the measured table as the JSON reports it: per node and NIC, the bandwidth (1/beta)
// in Mbit/s and alpha in microseconds; 0 where a NIC was not measured.
type calibration struct {
	Mbit        [][]float64 `json:"nic_mbit"`
	AlphaMicros [][]float64 `json:"alpha_us"`
}

func calibrationOf(c rdma.Calibration) *calibration {
	out := &calibration{}
	for i := range c.Beta {
		var mbit, us []float64
		for j, b := range c.Beta[i] {
			m := 0.0
			if b > 0 {
				m = math.Round(8/b/1e6*10) / 10
			}
			mbit = append(mbit, m)
			us = append(us, math.Round(c.Alpha[i][j]*1e7)/10)
		}
		out.Mbit, out.AlphaMicros = append(out.Mbit, mbit), append(out.AlphaMicros, us)
	}
	return out
}

// span returns the smallest and the largest positive entry of t, zeros when there is none.
func span(t [][]float64) (lo, hi float64) {
	for _, row := range t {
		for _, v := range row {
			if v > 0 {
				if lo == 0 || v < lo {
					lo = v
				}
				hi = max(hi, v)
			}
		}
	}
	return lo, hi
}
