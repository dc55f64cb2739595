package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/concord-ccl/concord/bench/internal/nodeproc"
	"github.com/concord-ccl/concord/rdma"
	"github.com/concord-ccl/concord/rdma/plan"
	"github.com/concord-ccl/concord/rings"
)

// nodeArgs is what the parent tells a node process on its command line.
type nodeArgs struct {
	Index, Nodes, NICs, Mbit, Size, Port, Chunk int
	OpTimeout                                   time.Duration
	Staged                                      bool // the runtime's default buffers, not rdma.Config.Direct
	Calibrate                                   bool // measure every NIC's alpha and beta first
}

// command is one line from the parent on a node's stdin.
type command struct {
	Op       string   `json:"op"` // "run", "health" or "quit"
	Label    string   `json:"label,omitempty"`
	Strategy string   `json:"strategy,omitempty"` // a plan.Strategy name, or "planner"
	Down     [][2]int `json:"down,omitempty"`     // (node, NIC) pairs that are down
}

// report is one line from a node on its stdout.
type report struct {
	Event string `json:"event"` // "ready", "done", "health" or "fatal"
	Node  int    `json:"node"`
	Label string `json:"label,omitempty"`
	// StartNs and EndNs bound the node's AllReduce call (Unix nanoseconds, the machine's wall clock).
	StartNs int64  `json:"start_ns,omitempty"`
	EndNs   int64  `json:"end_ns,omitempty"`
	Err     string `json:"err,omitempty"`
	// Correct says every element of the result equals the exact sum of every node's input.
	Correct bool `json:"correct"`
	// Strategy is the strategy that ran and Predicted its modelled time. GatedModel is, for
	// R²CCL-AllReduce and the recursive schedule, the same plan priced the way package rdma runs it
	// (plan.Model.GatherFirst: a faster ring starts once the slower nodes' inputs for its share have
	// arrived whole), where Predicted is Appendix A's price of the shares it chose.
	Strategy   string  `json:"strategy,omitempty"`
	Predicted  float64 `json:"predicted,omitempty"`
	GatedModel float64 `json:"gated_model,omitempty"`
	// Down lists the (node, NIC) pairs the runtime's hot-repair view holds down ("health").
	Down [][2]int `json:"down,omitempty"`
	// Failovers counts the node's path failovers so far (cumulative).
	Failovers int `json:"failovers"`
	// Calibration is what the node's runtime measured of every NIC ("ready", with --calibrate).
	Calibration *rdma.Calibration `json:"calibration,omitempty"`
}

// topology is the nominal view of the testbed: every NIC at the shaped rate, one NUMA domain,
// latency alpha, one rank per node, and the given NICs down.
func topology(nodes, nics, mbit int, down [][2]int) plan.Topology {
	t := plan.Uniform(nodes, nics, 1, alpha, float64(mbit)*1e6/8)
	t.GPUsPerNode = 1
	return withDown(t, down)
}

// withDown returns a copy of t with exactly the given NICs down.
func withDown(t plan.Topology, down [][2]int) plan.Topology {
	out := t.Clone()
	for i, nd := range out.Nodes {
		for j := range nd.NICs {
			nd.NICs[j].Down = slices.Contains(down, [2]int{i, j})
		}
	}
	return out
}

// alpha is the per-message latency the nominal model is given for the testbed (veth, bridge, HTB,
// TCP).
const alpha = 100e-6

// planMargin is the planner's Config.Margin: the calibration measures NICs of one rate within about
// ±2% of each other, so a modelled gain below that is noise (on the healthy testbed Balance and the
// weighted rings model 0.3–1% ahead of the ring only because one NIC measured slower).
const planMargin = 0.02

// planModel is the model every price, plan and bound of the benchmark uses. Its level tolerance is
// 5%: measured, the nodes of a healthy fabric differ by up to about 3% (their NICs by ±2.5%), and
// with the default 1% the recursive schedule, R²CCL-AllReduce and OptCC took one healthy node for
// faster than the others, or the others for degraded ones. A failed NIC takes a quarter of a node
// here.
var planModel = plan.Model{LevelTolerance: 0.05}

// calibrateConfig is the NIC calibration's: 2 and 8 MiB messages, whose difference takes about 130 ms
// on one NIC at 400 Mbit/s, three times each way on every NIC (about 5 s in all).
var calibrateConfig = rdma.CalibrateConfig{Bytes: 8 << 20, Reps: 3}

func strategyByName(s string) (plan.Strategy, bool) {
	for _, st := range plan.AllStrategies {
		if st.String() == s {
			return st, true
		}
	}
	return 0, false
}

// nodeMain runs one node inside its namespace: a tcp endpoint on the namespace's NICs, the runtime
// on a ring of every node, and one AllReduce per "run" line on stdin.
func nodeMain(a nodeArgs) int {
	out := json.NewEncoder(os.Stdout)
	fatal := func(err error) int {
		out.Encode(report{Event: "fatal", Node: a.Index, Err: err.Error()})
		return 1
	}
	// TCP_USER_TIMEOUT well above the default: on a loaded machine, data queued behind the shaper
	// for seconds must not kill a connection (that would count as a failure and fail the path over).
	ep, ring, err := nodeproc.TCPNode{Index: a.Index, Nodes: a.Nodes, NICs: a.NICs, Mbit: a.Mbit, Port: a.Port,
		UserTimeout: 10 * time.Second}.Listen()
	if err != nil {
		return fatal(err)
	}
	defer ep.Close()
	// Deadlines for a shared, loaded machine: a late answer must not look like a failure (the plans
	// route around NICs known to be down, and a NIC going down is seen at once through link state).
	node, err := rdma.NewNode(ep, ring, rdma.Config{ChunkBytes: a.Chunk, Direct: !a.Staged, Repair: rdma.RepairConfig{MinAckTimeout: 5 * time.Second,
		MaxAckTimeout: 10 * time.Second, ProbeTimeout: 2 * time.Second, StallTimeout: 20 * time.Second}})
	if err != nil {
		return fatal(err)
	}
	// The planner's topology: the NICs' measured alpha and beta (rdma.Node.Calibrate, every node
	// gets the same table), or without --calibrate the nominal rate and alpha.
	base := topology(a.Nodes, a.NICs, a.Mbit, nil)
	var cal *rdma.Calibration
	if a.Calibrate {
		ctx, cancel := context.WithTimeout(context.Background(), a.OpTimeout)
		c, err := node.Calibrate(ctx, calibrateConfig)
		cancel()
		if err != nil {
			return fatal(fmt.Errorf("calibrating the NICs: %w", err))
		}
		base, cal = c.Apply(base), &c
	}
	replanner, err := rdma.NewReplanner(node, base, plan.Config{Align: 4, Margin: planMargin, Model: planModel})
	if err != nil {
		return fatal(err)
	}

	count := a.Size / 4
	send, recv := nodeproc.Buffer(count), nodeproc.Buffer(count)
	nodeproc.Fill(send, a.Index)
	out.Encode(report{Event: "ready", Node: a.Index, Calibration: cal})

	lastOK := false // the last call succeeded (its result is checked on "check")
	for cmd, err := range nodeproc.Commands[command](os.Stdin) {
		if err != nil {
			return fatal(err)
		}
		switch cmd.Op {
		case "quit":
			return 0
		case "check":
			out.Encode(report{Event: "checked", Node: a.Index, Label: cmd.Label, Correct: lastOK && nodeproc.Check(recv, a.Nodes)})
			continue
		case "health":
			rep := report{Event: "health", Node: a.Index, Label: cmd.Label}
			node.Do(func() {
				for u := range a.Nodes {
					for j := range a.NICs {
						if node.Repair().Health(rdma.NICRef{Node: rdma.NodeID(u), NIC: rdma.NICID(j)}) == rdma.Down {
							rep.Down = append(rep.Down, [2]int{u, j})
						}
					}
				}
			})
			out.Encode(rep)
			continue
		}
		rep := runOne(a, node, ep.NICs(), replanner, withDown(base, cmd.Down), cmd, send, recv)
		lastOK = rep.Err == ""
		out.Encode(rep)
	}
	return 0
}

// runOne runs one AllReduce by the command's strategy (or the planner's choice) on topo, the
// planner's view of the testbed with the command's NICs down, and reports it.
func runOne(a nodeArgs, node *rdma.Node, nics []rdma.NIC, replanner *rdma.Replanner, topo plan.Topology, cmd command, send, recv []float32) report {
	rep := report{Event: "done", Node: a.Index, Label: cmd.Label}
	var p plan.Plan
	var err error
	node.Do(func() {
		for u := range a.Nodes {
			for j := range a.NICs {
				if err == nil {
					err = replanner.SetNICDown(u, j, topo.Nodes[u].NICs[j].Down)
				}
			}
		}
		if err != nil {
			return
		}
		if cmd.Strategy == "planner" {
			p, err = replanner.Plan(int64(a.Size), 4)
			return
		}
		st, ok := strategyByName(cmd.Strategy)
		if !ok {
			err = fmt.Errorf("unknown strategy %q", cmd.Strategy)
			return
		}
		if st == plan.OptCC || st == plan.Weighted {
			// OptCC and the weighted rings as the runtime prices and splits them on these NICs
			// (rdma.Replanner).
			p, err = replanner.PlanStrategy(st, int64(a.Size), 4)
			return
		}
		var e plan.Estimate
		if e, err = plan.Cost(topo, st, float64(a.Size), planModel); err != nil {
			return
		}
		if math.IsInf(e.Seconds, 1) {
			err = fmt.Errorf("strategy %v does not apply", st)
			return
		}
		if p, err = plan.Build(topo, e, int64(a.Size), 4, planModel); err == nil {
			p.Routes = rdma.RoutesFor(topo, st, nics)
		}
		if err == nil && (st == plan.R2CCL || st == plan.Recursive) {
			gated := planModel
			gated.GatherFirst = true
			rep.GatedModel, err = plan.Reprice(topo, e, float64(a.Size), gated)
		}
	})
	if err != nil {
		rep.Err = err.Error()
		return rep
	}
	rep.Strategy, rep.Predicted = p.Strategy.String(), p.Seconds
	nodeproc.Poison(recv) // a call that claims success without writing is caught
	ctx, cancel := context.WithTimeout(context.Background(), a.OpTimeout)
	defer cancel()
	start := time.Now()
	err = node.AllReduceWithPlan(ctx, topo, p, rings.Bytes(send), rings.Bytes(recv), rings.F32, rings.Sum)
	rep.StartNs, rep.EndNs = start.UnixNano(), time.Now().UnixNano()
	node.Do(func() { rep.Failovers = node.Stats().Failovers })
	if err != nil {
		rep.Err = err.Error()
		return rep
	}
	return rep
}
