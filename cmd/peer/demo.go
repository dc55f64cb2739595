package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/pccl/master"
)

func demoCommand() *cli.Command {
	return &cli.Command{
		Name:  "demo",
		Usage: "train on this machine with a master and several peer processes while peers are killed and replaced",
		Description: "Starts a master and --peers peer processes on loopback. They train a 784-256-10 MLP on the\n" +
			"embedded Fashion-MNIST subset with --trainer (DiLoCo by default). Every --kill-min..--kill-max\n" +
			"a random peer is killed with SIGKILL and a replacement started; the survivors abort, re-wire\n" +
			"and retry, and the newcomer gets the model from its peers. After --duration the group stops\n" +
			"at a common step; the demo prints the test accuracy and checks that every peer holds\n" +
			"bit-identical state. --trainer allreduce runs a plain loop of checked AllReduces instead.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "trainer", Value: "diloco", EnvVars: []string{"CONCORD_TRAINER"},
				Usage: "ddp, diloco, async-diloco, or allreduce (a loop of checked AllReduces)"},
			&cli.IntFlag{Name: "peers", Value: 4, EnvVars: []string{"CONCORD_PEERS"}, Usage: "number of peer processes"},
			&cli.IntFlag{Name: "sites", EnvVars: []string{"CONCORD_SITES"},
				Usage: "simulated sites; with --per-site, replaces --peers, and AllReduce runs hierarchically (0: one flat ring)"},
			&cli.IntFlag{Name: "per-site", Value: 2, EnvVars: []string{"CONCORD_PER_SITE"}, Usage: "peer processes per site with --sites"},
			&cli.StringSliceFlag{Name: "nics", EnvVars: []string{"CONCORD_NICS"},
				Usage: "with --sites, the interfaces every peer runs the intra-site tier on (for example 127.0.0.1: each peer gets its own ports)"},
			&cli.IntFlag{Name: "inner-steps", Value: 20, EnvVars: []string{"CONCORD_H"}, Usage: "H: DiLoCo inner steps per outer step"},
			&cli.IntFlag{Name: "batch", Value: 64, EnvVars: []string{"CONCORD_BATCH"}, Usage: "minibatch size per peer"},
			&cli.DurationFlag{Name: "duration", Value: 90 * time.Second, EnvVars: []string{"CONCORD_DURATION"},
				Usage: "training time before the group is told to stop"},
			&cli.DurationFlag{Name: "kill-min", Value: 15 * time.Second, EnvVars: []string{"CONCORD_KILL_MIN"},
				Usage: "shortest time between two kills (0 disables churn)"},
			&cli.DurationFlag{Name: "kill-max", Value: 20 * time.Second, EnvVars: []string{"CONCORD_KILL_MAX"},
				Usage: "longest time between two kills"},
			&cli.IntFlag{Name: "size", Value: 4 << 20, EnvVars: []string{"CONCORD_SIZE"},
				Usage: "bytes per AllReduce with --trainer allreduce"},
			&cli.Uint64Flag{Name: "seed", Value: 1, EnvVars: []string{"CONCORD_SEED"}, Usage: "seed of the model and of the kills"},
		},
		Action: demo,
	}
}

// peerView is what the demo knows of one peer process.
type peerView struct {
	proc  *cluster.Proc
	site  string
	last  event
	done  *event
	alive bool
}

type demoState struct {
	start    time.Time
	siteTier bool // the peers run the intra-site tier (--sites with --nics): the summary counts its use
	peers    map[string]*peerView
	order    []string
	step     uint64
	loss     float32
	acc      float64
	world    int
	rev      uint64
	ops      int64
	kills    int
	spawned  int
	initial  int
	killAt   []time.Time // kill times not yet recovered
	killStep []uint64
	recover  []time.Duration
	tty      bool
	lastLine time.Time
}

func demo(cc *cli.Context) error {
	trainer := cc.String("trainer")
	switch trainer {
	case "ddp", "diloco", "async-diloco", "allreduce":
	default:
		return cli.Exit(fmt.Sprintf("--trainer %q: want ddp, diloco, async-diloco or allreduce", trainer), 2)
	}
	n := cc.Int("peers")
	sites, perSite := cc.Int("sites"), cc.Int("per-site")
	if sites > 0 {
		if perSite < 1 {
			return cli.Exit("--per-site must be at least 1", 2)
		}
		n = sites * perSite
	}
	if sites == 0 && len(cc.StringSlice("nics")) > 0 {
		return cli.Exit("--nics needs --sites: the intra-site tier runs inside sites", 2)
	}
	if n < 2 {
		return cli.Exit("--peers (or --sites times --per-site) must be at least 2", 2)
	}
	duration := cc.Duration("duration")
	killMin, killMax := cc.Duration("kill-min"), cc.Duration("kill-max")
	if killMax < killMin {
		killMax = killMin
	}
	rng := rand.New(rand.NewPCG(cc.Uint64("seed"), 17))
	ctx, cancel := context.WithTimeout(cc.Context, duration+2*time.Minute)
	defer cancel()

	errs := &lineBuffer{}
	cl := cluster.New(cluster.Config{Stderr: errs})
	defer cl.Close()
	_, addr, err := cl.StartMaster(ctx, master.LAN())
	if err != nil {
		return cli.Exit(fmt.Sprintf("start master: %v", err), 1)
	}
	wcfg := workerConfig{Master: addr, Trainer: trainer, H: cc.Int("inner-steps"), Batch: cc.Int("batch"), Seed: cc.Uint64("seed"),
		Size: cc.Int("size"), Life: duration + 90*time.Second}
	st := &demoState{start: time.Now(), peers: map[string]*peerView{}}
	if fi, err := os.Stdout.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		st.tty = true
	}
	// spawn starts a peer process in site (empty without --sites).
	spawn := func(site string) error {
		c := wcfg
		c.Site = site
		if site != "" {
			c.NICs = cc.StringSlice("nics")
		}
		raw, _ := json.Marshal(c)
		p, err := cl.Spawn(cluster.Spec{Role: roleWorker, Env: []string{envWorkerCfg + "=" + string(raw)}})
		if err != nil {
			return err
		}
		st.spawned++
		st.peers[p.Name()] = &peerView{proc: p, site: site, alive: true}
		st.order = append(st.order, p.Name())
		return nil
	}
	fmt.Printf("Concord demo: master on %s, %d peers, trainer %s, %v", addr, n, trainer, duration)
	if sites > 0 {
		fmt.Printf(", %d sites of %d peers", sites, perSite)
	}
	if killMin > 0 {
		fmt.Printf(", a peer killed every %v-%v\n", killMin, killMax)
	} else {
		fmt.Println(", no churn")
	}
	for i := range n {
		site := ""
		if sites > 0 {
			site = fmt.Sprintf("site%d", i%sites)
		}
		if err := spawn(site); err != nil {
			return cli.Exit(err.Error(), 1)
		}
	}
	st.initial = n
	nextKill := time.Now().Add(randBetween(rng, killMin, killMax))
	stopAt := uint64(0)
	deadline := st.start.Add(duration)
	ticker := time.NewTicker(250 * time.Millisecond)
	defer ticker.Stop()
	lines := cl.Lines()
	for {
		select {
		case <-ctx.Done():
			return cli.Exit("demo did not finish in time: "+errs.tail(), 1)
		case l := <-lines:
			st.handle(l)
		case <-ticker.C:
		}
		now := time.Now()
		if stopAt == 0 && killMin > 0 && now.After(nextKill) && now.Before(deadline.Add(-5*time.Second)) {
			if v := st.victim(rng); v != nil {
				v.proc.Kill()
				v.alive = false
				st.kills++
				st.killAt = append(st.killAt, now)
				st.killStep = append(st.killStep, st.step)
				st.print(fmt.Sprintf("killed %s (SIGKILL) at step %d; starting a replacement", v.proc.Name(), st.step))
				if err := spawn(v.site); err != nil { // the replacement joins the victim's site
					return cli.Exit(err.Error(), 1)
				}
			}
			nextKill = now.Add(randBetween(rng, killMin, killMax))
		}
		if stopAt == 0 && now.After(deadline) && st.step > 0 {
			stopAt = st.step + 3
			st.print(fmt.Sprintf("time is up: every peer stops after step %d", stopAt))
			for _, name := range st.order {
				if v := st.peers[name]; v.alive {
					v.proc.Send(control{StopAt: stopAt})
				}
			}
		}
		st.progress()
		if stopAt > 0 && st.finished() {
			break
		}
		if st.failed() != "" {
			return cli.Exit("a peer failed: "+st.failed()+"\n"+errs.tail(), 1)
		}
	}
	st.siteTier = sites > 0 && len(cc.StringSlice("nics")) > 0
	return st.summary(trainer)
}

func randBetween(r *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int64N(int64(hi-lo)))
}

// handle folds one line of a peer into the state.
func (st *demoState) handle(l cluster.Line) {
	v := st.peers[l.Proc.Name()]
	var e event
	if v == nil || l.Decode(&e) != nil {
		return
	}
	switch e.Event {
	case "step":
		v.last = e
		if e.Step > st.step {
			st.step = e.Step
			st.world, st.rev = e.World, e.Rev
			if e.Loss != 0 {
				st.loss = e.Loss
			}
			if e.Ops > 0 {
				st.ops = max(st.ops, e.Ops)
			}
		}
		if e.Acc > 0 {
			st.acc = e.Acc
		}
		// A kill is recovered when the survivors complete a step after it (lines may arrive late, so
		// the step's own time decides).
		for i := 0; i < len(st.killAt); i++ {
			if at := time.Unix(0, e.Time); at.After(st.killAt[i]) && e.Step > st.killStep[i] {
				st.recover = append(st.recover, at.Sub(st.killAt[i]))
				st.killAt = slices.Delete(st.killAt, i, i+1)
				st.killStep = slices.Delete(st.killStep, i, i+1)
				i--
			}
		}
	case "done":
		ev := e
		v.done = &ev
	case "error":
		v.last = e
	}
}

// victim picks a live peer that has trained at least one step.
func (st *demoState) victim(r *rand.Rand) *peerView {
	var live []*peerView
	for _, name := range st.order {
		if v := st.peers[name]; v.alive && v.last.Step > 0 {
			live = append(live, v)
		}
	}
	if len(live) < 2 {
		return nil
	}
	return live[r.IntN(len(live))]
}

func (st *demoState) finished() bool {
	for _, v := range st.peers {
		if v.alive && v.done == nil && v.last.Step > 0 {
			select {
			case <-v.proc.Done():
			default:
				return false
			}
		}
	}
	return true
}

func (st *demoState) failed() string {
	for _, name := range st.order {
		if v := st.peers[name]; v.alive && v.last.Event == "error" {
			return name + ": " + v.last.Detail
		}
	}
	return ""
}

func (st *demoState) line() string {
	el := time.Since(st.start).Truncate(time.Second)
	s := fmt.Sprintf("[%4s] step %4d  world %d  revision %4d", el, st.step, st.world, st.rev)
	if st.loss != 0 {
		s += fmt.Sprintf("  loss %.3f", st.loss)
	}
	if st.acc != 0 {
		s += fmt.Sprintf("  test acc %.3f", st.acc)
	}
	if st.ops != 0 {
		s += fmt.Sprintf("  ops %d", st.ops)
	}
	return s + fmt.Sprintf("  kills %d  joins %d", st.kills, st.spawned-st.initial)
}

// progress redraws the live line (a terminal) or prints one every 5 s.
func (st *demoState) progress() {
	if st.tty {
		fmt.Printf("\r%-110s", st.line())
		return
	}
	if time.Since(st.lastLine) >= 5*time.Second {
		st.lastLine = time.Now()
		fmt.Println(st.line())
	}
}

func (st *demoState) print(msg string) {
	if st.tty {
		fmt.Printf("\r%-110s\r", "")
	}
	fmt.Printf("[%4s] %s\n", time.Since(st.start).Truncate(time.Second), msg)
}

func (st *demoState) summary(trainer string) error {
	if st.tty {
		fmt.Println()
	}
	var finals []*event
	for _, name := range st.order {
		if v := st.peers[name]; v.alive && v.done != nil {
			finals = append(finals, v.done)
		}
	}
	if len(finals) == 0 {
		return cli.Exit("no peer finished", 1)
	}
	same := true
	for _, f := range finals {
		same = same && f.State == finals[0].State && f.Step == finals[0].Step
	}
	aborts := 0
	for _, name := range st.order {
		aborts += st.peers[name].last.Aborts
	}
	sort.Slice(st.recover, func(i, j int) bool { return st.recover[i] < st.recover[j] })
	fmt.Printf("\nSummary after %v:\n", time.Since(st.start).Truncate(time.Second))
	fmt.Printf("  outer steps        %d (trainer %s)\n", finals[0].Step, trainer)
	if finals[0].Ops > 0 {
		fmt.Printf("  allreduces done    %d per peer\n", finals[0].Ops)
	}
	fmt.Printf("  peers started      %d, killed %d (SIGKILL), finished %d\n", st.spawned, st.kills, len(finals))
	fmt.Printf("  aborted collectives %d (summed over peers; each retried after re-wiring)\n", aborts)
	if len(st.recover) > 0 {
		fmt.Printf("  time to recover    median %v, max %v over %d kills (kill -> survivors complete a step after it)\n",
			st.recover[len(st.recover)/2].Round(time.Millisecond), st.recover[len(st.recover)-1].Round(time.Millisecond), len(st.recover))
	}
	if trainer != "allreduce" {
		fmt.Printf("  final test accuracy %.4f\n", finals[0].Acc)
	}
	if st.siteTier {
		var ops, gens uint64
		for _, f := range finals {
			ops, gens = ops+f.SiteOps, gens+f.SiteGens
		}
		fmt.Printf("  intra-site tier    %d collectives on the fabric, %d fabrics opened (summed over the finishers)\n", ops, gens)
	}
	if !same {
		for _, f := range finals {
			fmt.Printf("  peer state step %d hash %s\n", f.Step, f.State)
		}
		return cli.Exit("state hashes differ between peers", 1)
	}
	fmt.Printf("  state hashes       equal on all %d peers (%s)\n", len(finals), finals[0].State)
	return nil
}

// lineBuffer keeps the last lines of the children's stderr for error reports. The cluster writes it
// from its goroutines; tail reads it from the demo's.
type lineBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *lineBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		b.lines = append(b.lines, l)
	}
	if len(b.lines) > 40 {
		b.lines = b.lines[len(b.lines)-40:]
	}
	return len(p), nil
}

func (b *lineBuffer) tail() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines, "\n")
}

var _ io.Writer = (*lineBuffer)(nil)
