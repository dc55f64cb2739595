package rdma

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"

	"github.com/concord-ccl/concord/rdma/plan"
	"github.com/concord-ccl/concord/rings"
)

// Measuring every NIC's α and β for the planner.
//
// The planner's cost model needs, per NIC, the latency of a message (α, seconds) and the time per byte
// (β, seconds per byte). A calibration measures them on the fabric as it runs: for each NIC index j in
// turn, every node of the ring sends a tiny message, a medium one (a quarter of Bytes) and a large one
// (Bytes) over NIC j alone, first to its successor (receiving from its predecessor), then to its
// predecessor (receiving from its successor), so that each NIC is loaded in both directions as a ring
// collective loads it. A send is timed on the endpoint's clock from its start until its last chunk is
// acknowledged (it does not wait for the receiver to have started: a provider acknowledges what
// reached the remote endpoint), Reps times for each size and direction, and the fastest counts:
//
//	α = t(tiny),    β = (t(large) − t(medium)) / (large − medium)
//
// t(tiny) is a whole exchange of one tiny chunk (the chunk leaving, arriving and its completion
// coming back): the per-message cost the model charges, not a one-way wire latency. β comes from the
// difference of two bulk sends rather than from one, so that what any send pays once (the first
// round trip, a rate limiter's burst allowance, a congestion window opening) cancels out and β is
// the sustained rate a collective gets. A link runs at the
// slower of its two NICs, so each NIC keeps the faster of its two directions: a NIC is credited with
// less than it has only when both its neighbours' NICs are slower. Finally the nodes gather every
// node's figures (an AllGather of the float64 bits), so that every node holds the same table, bit for
// bit, and plans the same schedules from it.
//
// A NIC whose sends failed over to another NIC in both directions (it is down, or both neighbours'
// NICs of its rail are) is not measured: its entry stays zero and [Calibration.Apply] keeps the base
// topology's figures for it.

// CalibrateConfig tunes a calibration. The zero value works.
type CalibrateConfig struct {
	// Bytes is the large message per NIC (the medium one is a quarter of it). Zero means 4 MiB. The
	// difference should take long enough on one NIC to swamp the clock's and the scheduler's noise
	// (tens of milliseconds).
	Bytes int
	// Reps is how often each size is timed per NIC; the fastest counts. Zero means 3.
	Reps int
}

// Bounds of a calibration's sizes.
const (
	// calibrateTiny is the message that measures α.
	calibrateTiny = 64
	// calibrateMinBytes and calibrateMaxBytes bound CalibrateConfig.Bytes: a calibration allocates
	// twice it.
	calibrateMinBytes = 64 << 10
	calibrateMaxBytes = 1 << 30
	calibrateMaxReps  = 100
)

func (c CalibrateConfig) withDefaults() CalibrateConfig {
	if c.Bytes == 0 {
		c.Bytes = 4 << 20
	}
	if c.Reps == 0 {
		c.Reps = 3
	}
	return c
}

// Validate names the first invalid field.
func (c CalibrateConfig) Validate() error {
	if c.Bytes != 0 && (c.Bytes < calibrateMinBytes || c.Bytes > calibrateMaxBytes) {
		return fmt.Errorf("%w: CalibrateConfig.Bytes is %d, must be 0 or %d..%d", ErrInvalid, c.Bytes, calibrateMinBytes, calibrateMaxBytes)
	}
	if c.Reps < 0 || c.Reps > calibrateMaxReps {
		return fmt.Errorf("%w: CalibrateConfig.Reps is %d, must be 0..%d", ErrInvalid, c.Reps, calibrateMaxReps)
	}
	return nil
}

// Calibration is what a calibration measured, the same on every node of the ring.
type Calibration struct {
	// Alpha[i][j] is the per-message latency in seconds of NIC j of the node at ring position i, as
	// a sender; zero where it was not measured.
	Alpha [][]float64 `json:"alpha_seconds"`
	// Beta[i][j] is its transfer time in seconds per byte (the inverse of its bandwidth); zero where
	// it was not measured.
	Beta [][]float64 `json:"beta_seconds_per_byte"`
}

// Apply returns t with every measured NIC's Alpha and Beta replaced by the calibration's. Node i of
// t is the node at ring position i, as the planner's topologies number them; NICs the calibration
// did not measure, or that t does not have, keep t's figures.
//
// Measured NICs of one rate differ by a few percent, and so do healthy nodes. Give the planner a
// plan.Model.LevelTolerance above that spread (bench/schedules measures it and uses 0.05) and a
// Config.Margin of about the same order, or it takes a healthy node for a faster or a degraded one,
// and noise for a gain.
func (c Calibration) Apply(t plan.Topology) plan.Topology {
	out := t.Clone()
	for i, nd := range out.Nodes {
		for j := range nd.NICs {
			if i < len(c.Beta) && j < len(c.Beta[i]) && c.Beta[i][j] > 0 {
				nd.NICs[j].Alpha, nd.NICs[j].Beta = c.Alpha[i][j], c.Beta[i][j]
			}
		}
	}
	return out
}

// calibration is a calibration in progress at one node: a chain of sends, then the gather.
type calibration struct {
	n    *Node
	cfg  CalibrateConfig
	done func(Calibration, error)
	buf  []byte // sent from the first half, received into the second
	// best holds the fastest send of each size (tiny, medium, large) per NIC and direction (seconds;
	// +Inf while none went out on that NIC without a failover).
	best [][2][3]float64
	// The send under way: NIC nic, direction dir (0: to the successor), repetition rep, size size.
	nic, dir, rep, size int
}

// sizes returns the tiny, medium and large messages.
func (c *calibration) sizes() [3]int {
	return [3]int{calibrateTiny, c.cfg.Bytes / 4, c.cfg.Bytes}
}

// StartCalibrate measures every NIC's α and β (see the notes on calibration above) and calls done
// with the table, in the event context. Every node of the ring must start it, with the same
// configuration, while no other collective runs; every node must have the same number of NICs (their
// declared bandwidths may differ: nothing here is split by them). Call it in the event context.
func (n *Node) StartCalibrate(cfg CalibrateConfig, done func(Calibration, error)) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if len(n.ring) < 2 {
		return fmt.Errorf("%w: a calibration needs a ring of at least 2 nodes", ErrInvalid)
	}
	if n.op != nil {
		return ErrBusy
	}
	cfg = cfg.withDefaults()
	k := len(n.nics)
	c := &calibration{n: n, cfg: cfg, done: done, buf: make([]byte, 2*cfg.Bytes), best: make([][2][3]float64, k)}
	for j := range k {
		for d := range 2 {
			for s := range 3 {
				c.best[j][d][s] = math.Inf(1)
			}
		}
	}
	return c.next()
}

// Calibrate is the blocking form of StartCalibrate (see [Node.AllReduce] for the rules).
func (n *Node) Calibrate(ctx context.Context, cfg CalibrateConfig) (Calibration, error) {
	var out Calibration
	err := n.run(ctx, func(done func(error)) error {
		return n.StartCalibrate(cfg, func(c Calibration, err error) {
			out = c
			done(err)
		})
	})
	return out, err
}

// next starts the send that c names, or the gather once every NIC is timed.
func (c *calibration) next() error {
	if c.nic == len(c.n.nics) {
		return c.gather()
	}
	size := c.sizes()[c.size]
	n := c.n
	to, from := n.neighbours()
	if c.dir == 1 {
		to, from = from, to
	}
	var out []sendFrame
	var in []recvFrame
	parts(0, size, n.cfg.ChunkBytes, 1, func(off, m int) {
		out = append(out, sendFrame{off: off, n: m, dep: -1})
		in = append(in, recvFrame{off: c.cfg.Bytes + off, n: m, mode: recvCopy})
	})
	plans := []channelPlan{{channel: uint16(c.nic), out: &outPlan{to: to, frames: out}, in: &inPlan{from: from, frames: in}}}
	failovers := n.stats.Failovers
	start := n.ep.Now()
	took := math.Inf(1)
	err := n.start(c.buf, rings.U8, rings.Sum, plans, nil, func(err error) {
		if err != nil {
			c.done(Calibration{}, fmt.Errorf("calibrating NIC %d: %w", c.nic, err))
			return
		}
		if n.stats.Failovers == failovers && !math.IsInf(took, 1) {
			best := &c.best[c.nic][c.dir][c.size]
			*best = min(*best, took)
		}
		c.advance()
		// The next send starts from a fresh event: this callback runs inside the finished
		// operation's finish.
		n.ep.Post(func() {
			if err := c.next(); err != nil {
				c.done(Calibration{}, err)
			}
		})
	})
	if o := n.op; err == nil && o != nil {
		o.sent = func() {
			// Only a send that went out on the NIC under test, at both ends, times it.
			if s := o.outs[0]; s.local == NICID(c.nic) && s.remote == NICID(c.nic) {
				took = n.ep.Now().Sub(start).Seconds()
			}
		}
	}
	return err
}

// advance moves c to the next send: the sizes take turns, repetition by repetition (a slow spell of
// the machine spoils them alike), then the other direction, then the next NIC.
func (c *calibration) advance() {
	if c.size++; c.size < 3 {
		return
	}
	c.size = 0
	if c.rep++; c.rep < c.cfg.Reps {
		return
	}
	c.rep = 0
	if c.dir++; c.dir == 2 {
		c.dir, c.nic = 0, c.nic+1
	}
}

// figures returns NIC j's α and β from its fastest direction, zeros when neither was measured.
func (c *calibration) figures(j int) (alpha, beta float64) {
	beta = math.Inf(1)
	sz := c.sizes()
	for d := range 2 {
		t := c.best[j][d]
		if math.IsInf(t[0], 1) || math.IsInf(t[1], 1) || math.IsInf(t[2], 1) {
			continue
		}
		// A large send no slower than the medium one says nothing (the machine stalled the medium).
		if b := (t[2] - t[1]) / float64(sz[2]-sz[1]); b > 0 && b < beta {
			alpha, beta = t[0], b
		}
	}
	if math.IsInf(beta, 1) {
		return 0, 0
	}
	return alpha, beta
}

// gather shares every node's figures with every node.
func (c *calibration) gather() error {
	n := c.n
	k := len(n.nics)
	row := make([]byte, 16*k)
	for j := range k {
		a, b := c.figures(j)
		binary.LittleEndian.PutUint64(row[16*j:], math.Float64bits(a))
		binary.LittleEndian.PutUint64(row[16*j+8:], math.Float64bits(b))
	}
	// The gather splits its channels evenly, whatever Config.ChannelWeights say, so that a
	// calibration needs nothing of the nodes but their NIC count to cut the rows alike.
	world := len(n.ring)
	all := make([]byte, world*len(row))
	copy(all[n.rank*len(row):], row)
	even := make([]float64, k)
	for j := range even {
		even[j] = 1
	}
	succ, pred := n.neighbours()
	plans := planAllGather(n.rank, world, splitChannels(2*k, even), 2*k, 8, n.cfg.ChunkBytes, succ, pred)
	return n.start(all, rings.F64, rings.Sum, plans, nil, func(err error) {
		if err != nil {
			c.done(Calibration{}, fmt.Errorf("gathering the calibration: %w", err))
			return
		}
		cal := Calibration{Alpha: make([][]float64, world), Beta: make([][]float64, world)}
		for i := range world {
			cal.Alpha[i], cal.Beta[i] = make([]float64, k), make([]float64, k)
			for j := range k {
				at := i*len(row) + 16*j
				cal.Alpha[i][j] = math.Float64frombits(binary.LittleEndian.Uint64(all[at:]))
				cal.Beta[i][j] = math.Float64frombits(binary.LittleEndian.Uint64(all[at+8:]))
			}
		}
		c.done(cal, nil)
	})
}
