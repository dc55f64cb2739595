package master

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/concord-ccl/concord/atsp"
	"github.com/concord-ccl/concord/internal/golden"
	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/rings"
	"github.com/concord-ccl/concord/sharedstate"
)

// TestScenarios runs every testdata/*.txt script through a Machine and compares what it did with the
// golden file next to it. One line is one input; the number after the command names the connection
// (which is the peer id of a peer that did not choose one):
//
//	hello C [addr=A] [site=S] [token=T] [peer=P] [group=G] [from=R]
//	                                       a Hello on new connection C; P is the chosen peer id (none:
//	                                       the master assigns one, C when it is free), G the group; R
//	                                       the remote address the connection comes from (Opened)
//	      [rinc=I repoch=E rring=A-B-C rrev=R [rstate=name:hash,...] [rstep=N]]
//	                                       with a Resume report: accepted by incarnation I at epoch E
//	                                       on ring A,B,C, holding revision R of that state, at step N
//	links ID epoch=E [fail=P]              LinksReady (ok unless fail names an unreachable peer)
//	rendezvous ID peer=P mode=reverse|punch|relay  Rendezvous: ID asks to be reached by P
//	topo ID [rewire] [noadmit]             VoteTopology
//	pending ID [leave]                     VotePending (the peer's last, with leave)
//	init ID tag=T count=N [dtype=D] [op=O] [quant=Q] [part=P]
//	done ID tag=T seq=S [code=peer-left|aborted]
//	heartbeat ID | bye ID | close ID
//	illegal ID                             a master-to-peer message sent by a peer
//	sync ID rev=R [strategy=popular|send|receive] [state=name:hash,...]  VoteSync (f32 entries of 4 elements;
//	                                       a name ending in ~ is MayDiffer)
//	syncdone ID [fail]                     SyncDone
//	step ID step=N [opt]                   StepReport
//	optimize ID                            VoteOptimize
//	measure ID round=R to=P bw=B           MeasureReport (bytes/s)
//	force RING [group=G]                   ForceRing (ids joined by commas)
//	advance DURATION                       move the clock (no input)
//	restart incarnation=N                  replace the master by a new one of incarnation N (no input;
//	                                       every connection is gone)
//
// A Solve action is answered at once with the exact solver's ring.
//
//	tick                                   Tick
//	stall DURATION                         the master did not run for DURATION: the clock moves by it,
//	                                       then Stalled{DURATION} is the input
//
// The diagnosis and its policies run on collectives whose Done carry link timings, which macros
// write (the timing model of synthLinks, noise from a fixed seed):
//
//	config [reorder=off] [reorder-every=D] [reorder-confidence=F] [reorder-ratio=F] [evict-after=N]
//	                                       the master's diagnosis settings; the first input only
//	join N [sites=K]                       peers 1..N join and are accepted (the notes are shown); with
//	                                       sites, peer i names site s(i-1)·K/N
//	ops N [tag=T] [slow=A-B] [sender=P] [receiver=P] [sleeper=P] [voter=P] [extra=DURATION] [hier]
//	                                       N AllReduces by every peer of the ring in force under a fault
//	                                       (extra: its time, 60ms by default), as diagRig.collective runs
//	                                       them; with hier, hierarchical ones over the peers' sites, timed
//	                                       as synthHierLinks says. Wiring rounds and the master's bandwidth tests are
//	                                       answered (a slowed link tests at 1/8 of the others' 1e9 B/s);
//	                                       the routine Commence, Outcome, Connect, LinksReady, Topology and
//	                                       MeasureRound are summed up in one line per operation
//
// Run `go test ./pccl/master -run Scenarios -update` to accept new output.
func TestScenarios(t *testing.T) {
	golden.Run(t, "testdata/*.txt", runScenario)
}

// parseState reads a digest written name:hash,... (f32 entries of 4 elements; a name ending in ~ is
// MayDiffer).
func parseState(t *testing.T, st string, rev uint64) sharedstate.Digest {
	d := sharedstate.Digest{Revision: rev}
	if st == "" {
		return d
	}
	for _, kv := range strings.Split(st, ",") {
		name, h, _ := strings.Cut(kv, ":")
		hash, err := strconv.ParseUint(h, 10, 64)
		if err != nil {
			t.Fatalf("state %q: %v", st, err)
		}
		may := strings.HasSuffix(name, "~")
		d.Entries = append(d.Entries, sharedstate.EntryDigest{Name: strings.TrimSuffix(name, "~"), DType: rings.F32, Count: 4, Hash: hash, MayDiffer: may})
	}
	return d
}

func runScenario(t *testing.T, file string) string {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg := Config{Token: "tok", MinPeers: 2}
	m := New(cfg)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var out strings.Builder
	rng := rand.New(rand.NewPCG(7, 11))
	inputs := 0
	// drive applies in and what it leads to: every Solve is answered with the exact solver's ring;
	// with auto (the macros), every Connect with LinksReady and every bandwidth test the diagnosis
	// asks for with its result under fault. It writes every action, or with quiet only those that
	// are not routine, and returns them all.
	drive := func(n int, in Input, auto, quiet bool, fault timing) []Action {
		var all []Action
		queue := []Input{in}
		for len(queue) > 0 {
			actions := m.Step(now, queue[0])
			queue = queue[1:]
			for _, a := range actions {
				all = append(all, a)
				if !quiet || !routine(a) {
					out.WriteString("  " + formatAction(a) + "\n")
				}
				switch a := a.(type) {
				case Solve:
					ring := exactRing(t, file, n, a)
					out.WriteString(fmt.Sprintf("  (solved %v)\n", ring))
					queue = append(queue, Solved{ID: a.ID, Ring: ring})
				case Send:
					if !auto {
						continue
					}
					switch msg := a.Msg.(type) {
					case *wire.Connect:
						queue = append(queue, Received{a.To, &wire.LinksReady{Epoch: msg.Epoch, OK: true}})
					case *wire.MeasureRound:
						if msg.Round == 0 {
							bw := 1e9
							if fault.slows(a.To, msg.Target.ID) {
								bw /= 8
							}
							queue = append(queue, Received{a.To, &wire.MeasureReport{To: msg.Target.ID, BytesPerSec: bw}})
						}
					}
				}
			}
		}
		return all
	}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			continue
		}
		fields := strings.Fields(line)
		args := map[string]string{}
		for _, f := range fields[1:] {
			k, v, _ := strings.Cut(f, "=")
			args[k] = v
		}
		id := func() PeerID {
			if len(fields) < 2 {
				t.Fatalf("%s:%d: missing peer id", file, n)
			}
			v, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				t.Fatalf("%s:%d: %v", file, n, err)
			}
			return v
		}
		num := func(k string, def uint64) uint64 {
			s, ok := args[k]
			if !ok {
				return def
			}
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				t.Fatalf("%s:%d: %s: %v", file, n, k, err)
			}
			return v
		}
		var in Input
		inputs++
		switch fields[0] {
		case "config":
			if inputs > 1 {
				t.Fatalf("%s:%d: config after the first input", file, n)
			}
			d := &cfg.Diagnosis
			if v, ok := args["reorder"]; ok {
				d.Reorder.Off = v == "off"
			}
			if v, ok := args["reorder-every"]; ok {
				if d.Reorder.Interval, err = time.ParseDuration(v); err != nil {
					t.Fatalf("%s:%d: %v", file, n, err)
				}
			}
			fl := func(k string) float64 {
				v, err := strconv.ParseFloat(args[k], 64)
				if err != nil && args[k] != "" {
					t.Fatalf("%s:%d: %s: %v", file, n, k, err)
				}
				return v
			}
			d.Reorder.MinConfidence, d.Reorder.MinRatio = fl("reorder-confidence"), fl("reorder-ratio")
			d.EvictAfter = int(num("evict-after", 0))
			if err := cfg.Validate(); err != nil {
				t.Fatalf("%s:%d: %v", file, n, err)
			}
			m = New(cfg)
			out.WriteString("> " + line + "\n")
			continue
		case "join":
			out.WriteString("> " + line + "\n")
			sites := num("sites", 0)
			for c := range id() {
				var site string
				if sites > 0 {
					site = fmt.Sprintf("s%d", c*sites/id())
				}
				drive(n, Received{c + 1, &wire.Hello{Token: "tok", Addr: fmt.Sprintf("10.0.0.%d:7000", c+1), Site: site}}, true, true, timing{})
			}
			for _, p := range m.Snapshot(now).Peers {
				if p.State == Accepted {
					drive(n, Received{p.ID, &wire.VoteTopology{}}, true, true, timing{})
				}
			}
			checkInvariants(t, m, file, n)
			continue
		case "ops":
			out.WriteString("> " + line + "\n")
			f := timing{sender: num("sender", 0), receiver: num("receiver", 0), sleeper: num("sleeper", 0),
				voter: num("voter", 0), extra: 60 * time.Millisecond}
			_, f.hier = args["hier"]
			if s := args["slow"]; s != "" {
				a, b, _ := strings.Cut(s, "-")
				x, _ := strconv.ParseUint(a, 10, 64)
				y, _ := strconv.ParseUint(b, 10, 64)
				f.slow = [2]PeerID{x, y}
			}
			if s := args["extra"]; s != "" {
				if f.extra, err = time.ParseDuration(s); err != nil {
					t.Fatalf("%s:%d: %v", file, n, err)
				}
			}
			for range id() {
				scriptOp(t, file, n, m, &now, rng, num("tag", 1), f, func(in Input) []Action { return drive(n, in, true, true, f) }, &out)
				checkInvariants(t, m, file, n)
			}
			continue
		case "hello":
			addr := args["addr"]
			if addr == "" {
				addr = fmt.Sprintf("10.0.0.%d:7000", id())
			}
			tok, ok := args["token"]
			if !ok {
				tok = "tok"
			}
			h := &wire.Hello{Token: tok, Addr: addr, Site: args["site"], Peer: num("peer", 0),
				Group: uint32(num("group", 0))}
			if _, ok := args["rinc"]; ok {
				h.Resume = &wire.Resume{Incarnation: num("rinc", 0), Epoch: num("repoch", 0), Revision: num("rrev", 0)}
				for _, f := range strings.Split(args["rring"], "-") {
					v, _ := strconv.ParseUint(f, 10, 64)
					h.Resume.Ring = append(h.Resume.Ring, v)
				}
				if st := args["rstate"]; st != "" {
					h.Resume.Digest = sharedstate.EncodeDigest(parseState(t, st, num("rrev", 0)))
				}
				if _, ok := args["rstep"]; ok {
					h.Resume.Step, h.Resume.HasStep = num("rstep", 0), true
				}
			}
			in = Received{id(), h}
			if from := args["from"]; from != "" {
				m.Step(now, Opened{Conn: id(), Remote: from})
			}
		case "rendezvous":
			mode := map[string]uint8{"reverse": wire.RendezvousReverse, "punch": wire.RendezvousPunch, "relay": wire.RendezvousRelay}[args["mode"]]
			in = Received{id(), &wire.Rendezvous{Mode: mode, Key: wire.RendezvousKey{byte(num("peer", 0))}, Peer: num("peer", 0)}}
		case "links":
			l := &wire.LinksReady{Epoch: num("epoch", 0), OK: true}
			if _, ok := args["fail"]; ok {
				l.OK, l.Failed, l.Detail = false, []uint64{num("fail", 0)}, "refused"
			}
			in = Received{id(), l}
		case "topo":
			_, rewire := args["rewire"]
			_, noAdmit := args["noadmit"]
			in = Received{id(), &wire.VoteTopology{Rewire: rewire, NoAdmit: noAdmit}}
		case "pending":
			_, leave := args["leave"]
			in = Received{id(), &wire.VotePending{Leave: leave}}
		case "init":
			in = Received{id(), &wire.Initiate{Tag: num("tag", 0), Desc: wire.Desc{Count: num("count", 0),
				DType: uint8(num("dtype", 3)), Op: uint8(num("op", 1)), Quant: uint8(num("quant", 0)),
				Part: uint32(num("part", 0))}}}
		case "done":
			d := &wire.Done{Tag: num("tag", 0), Seq: num("seq", 0)}
			switch args["code"] {
			case "peer-left":
				d.Code, d.Detail = wire.CodePeerLeft, "link failed"
			case "aborted":
				d.Code, d.Detail = wire.CodeAborted, "cancelled"
			}
			if _, ok := args["silent-out"]; ok {
				d.Silent = wire.LinkRef{Peer: num("silent-out", 0), Dir: wire.LinkOut}
			}
			if _, ok := args["silent-in"]; ok {
				d.Silent = wire.LinkRef{Peer: num("silent-in", 0), Dir: wire.LinkIn}
			}
			in = Received{id(), d}
		case "sync":
			d := parseState(t, args["state"], num("rev", 0))
			strategy := map[string]sharedstate.Strategy{"": sharedstate.EnforcePopular, "popular": sharedstate.EnforcePopular,
				"send": sharedstate.SendOnly, "receive": sharedstate.ReceiveOnly}[args["strategy"]]
			in = Received{id(), &wire.VoteSync{Strategy: uint8(strategy), Digest: sharedstate.EncodeDigest(d)}}
		case "syncdone":
			_, fail := args["fail"]
			in = Received{id(), &wire.SyncDone{OK: !fail, Detail: map[bool]string{true: "donor died"}[fail]}}
		case "optimize":
			in = Received{id(), &wire.VoteOptimize{}}
		case "measure":
			bw, err := strconv.ParseFloat(args["bw"], 64)
			if err != nil {
				t.Fatalf("%s:%d: %v", file, n, err)
			}
			in = Received{id(), &wire.MeasureReport{Round: uint32(num("round", 0)), To: num("to", 0), BytesPerSec: bw}}
		case "force":
			var ring []PeerID
			for _, f := range strings.Split(fields[1], ",") {
				v, _ := strconv.ParseUint(f, 10, 64)
				ring = append(ring, v)
			}
			in = ForceRing{Group: uint32(num("group", 0)), Ring: ring}
		case "step":
			_, opt := args["opt"]
			in = Received{id(), &wire.StepReport{Step: num("step", 0), InOptimizer: opt}}
		case "heartbeat":
			in = Received{id(), &wire.Heartbeat{Seq: 1}}
		case "bye":
			in = Received{id(), &wire.Bye{}}
		case "close":
			in = Closed{id(), "EOF"}
		case "illegal":
			in = Received{id(), &wire.Welcome{Peer: 9}}
		case "advance":
			d, err := time.ParseDuration(fields[1])
			if err != nil {
				t.Fatalf("%s:%d: %v", file, n, err)
			}
			now = now.Add(d)
			out.WriteString("> " + line + "\n")
			continue
		case "tick":
			in = Tick{}
		case "stall":
			d, err := time.ParseDuration(fields[1])
			if err != nil {
				t.Fatalf("%s:%d: %v", file, n, err)
			}
			now = now.Add(d)
			in = Stalled{Gap: d}
		case "restart":
			cfg.Incarnation = num("incarnation", 0)
			m = New(cfg)
			out.WriteString("> " + line + "\n")
			continue
		default:
			t.Fatalf("%s:%d: unknown input %q", file, n, fields[0])
		}
		out.WriteString("> " + line + "\n")
		drive(n, in, false, false, timing{})
		checkInvariants(t, m, file, n)
	}
	snap := m.Snapshot(now)
	fmt.Fprintf(&out, "= epoch %d ring %v peers %d ops %d counters %+v\n", snap.Epoch, snap.Ring, len(snap.Peers), len(snap.Ops), snap.Counters)
	for _, g := range snap.Groups {
		if g.ID != 0 {
			fmt.Fprintf(&out, "= group %d epoch %d ring %v ops %d\n", g.ID, g.Epoch, g.Ring, len(g.Ops))
		}
		if d := g.Diagnosis; len(d.Raised) > 0 {
			fmt.Fprintf(&out, "= group %d diagnosis raised %v cleared %d evicted %d reorders %d deferred %d kept %d\n",
				g.ID, d.Raised, d.Cleared, d.Evicted, d.Reorders, d.ReordersDeferred, d.ReordersKept)
		}
	}
	return out.String()
}

// exactRing answers a Solve with the exact solver's ring: the best bottleneck, then the least fill
// among the rings within the tolerance of it, as the server's solve does.
func exactRing(t *testing.T, file string, n int, sv Solve) []PeerID {
	tour, sc, err := atsp.Solve(sv.Cost, atsp.Options{Objective: atsp.Bottleneck, ExactMax: 17})
	if err != nil {
		t.Fatalf("%s:%d: solve: %v", file, n, err)
	}
	if tour, _, err = atsp.Solve(Restrict(sv.Cost, sv.Hop, sc.Bottleneck, sv.Tol), atsp.Options{Objective: atsp.Total, ExactMax: 17}); err != nil {
		t.Fatalf("%s:%d: solve: %v", file, n, err)
	}
	ring := make([]PeerID, len(tour))
	for i, k := range tour {
		ring[i] = sv.Nodes[k]
	}
	return ring
}

// slows reports whether fault f slows the link from a to b.
func (f timing) slows(a, b PeerID) bool {
	return f.slow == [2]PeerID{a, b} || (f.sender != 0 && f.sender == a) || (f.receiver != 0 && f.receiver == b)
}

// routine reports whether an action is one the macros of a script sum up instead of writing it.
func routine(a Action) bool {
	s, ok := a.(Send)
	if !ok {
		return false
	}
	switch msg := s.Msg.(type) {
	case *wire.Commence, *wire.Connect, *wire.Topology, *wire.Welcome, *wire.MeasureRound:
		return true
	case *wire.Outcome:
		return msg.Code == wire.CodeOK
	}
	return false
}

// scriptOp runs one AllReduce on tag by every peer of m's ring in force under fault f, as
// diagRig.collective does, through drive, and writes one line for it.
func scriptOp(t *testing.T, file string, n int, m *Machine, now *time.Time, rng *rand.Rand, tag uint64, f timing,
	drive func(Input) []Action, out *strings.Builder) {
	ring := m.Snapshot(*now).Ring
	voters := slices.DeleteFunc(slices.Clone(ring), func(id PeerID) bool { return id == f.voter })
	if f.voter != 0 && slices.Contains(ring, f.voter) {
		voters = append(voters, f.voter) // the late voter votes last
	}
	var seq, epoch uint64
	for _, id := range voters {
		if id == f.voter {
			*now = now.Add(f.extra)
		}
		for _, a := range drive(Received{id, &wire.Initiate{Tag: tag, Desc: wire.Desc{Count: 1 << 20, DType: 3, Op: 1}}}) {
			if s, ok := a.(Send); ok {
				if c, ok := s.Msg.(*wire.Commence); ok {
					seq, epoch = c.Seq, c.Epoch
				}
			}
		}
	}
	if seq == 0 {
		t.Fatalf("%s:%d: tag %d did not commence", file, n, tag)
	}
	// The ring it commenced on: a re-ordering may have wired a new one in between.
	ring = m.Snapshot(*now).Ring
	fmt.Fprintf(out, "  (tag %d seq %d epoch %d on %v)\n", tag, seq, epoch, ring)
	for i, id := range ring {
		*now = now.Add(time.Millisecond)
		links := synthLinks(rng, ring, i, f)
		if f.hier {
			links = synthHierLinks(rng, ring, m.siteOf, i, f)
		}
		drive(Received{id, &wire.Done{Tag: tag, Seq: seq, Code: wire.CodeOK, LinkBytes: links[0].Bytes, LinkNanos: links[0].Wait,
			Links: links}})
	}
}

func formatAction(a Action) string {
	switch a := a.(type) {
	case Send:
		v := reflect.ValueOf(a.Msg).Elem()
		return fmt.Sprintf("send %d %s%+v", a.To, v.Type().Name(), v.Interface())
	case Drop:
		return fmt.Sprintf("drop %d: %s", a.Conn, a.Reason)
	case Note:
		return fmt.Sprintf("note %s peer=%d: %s", a.Event.Kind, a.Event.Peer, a.Event.Detail)
	case Solve:
		return fmt.Sprintf("solve id=%d nodes=%v", a.ID, a.Nodes)
	}
	return fmt.Sprintf("%T", a)
}

// checkInvariants asserts what must hold after every step, whatever the script does.
func checkInvariants(t *testing.T, m *Machine, file string, line int) {
	t.Helper()
	for c, id := range m.conns {
		if p := m.peers[id]; p == nil || p.conn != c {
			t.Fatalf("%s:%d: connection %d maps to peer %d, which is not on it", file, line, c, id)
		}
	}
	if len(m.conns) != len(m.peers) {
		t.Fatalf("%s:%d: %d connections for %d peers", file, line, len(m.conns), len(m.peers))
	}
	for _, gid := range m.gids {
		g := m.groups[gid]
		seen := map[PeerID]bool{}
		for _, id := range g.ring {
			p := m.peers[id]
			if p == nil || p.state != Accepted || p.group != g {
				t.Fatalf("%s:%d: group %d: ring member %d is not an accepted peer of the group", file, line, gid, id)
			}
			if seen[id] {
				t.Fatalf("%s:%d: group %d: peer %d twice in the ring", file, line, gid, id)
			}
			seen[id] = true
		}
		for _, id := range m.accepted(g) {
			if !seen[id] {
				t.Fatalf("%s:%d: group %d: accepted peer %d is not in the ring", file, line, gid, id)
			}
		}
		if g.counter > 0 && g.epoch>>32 != m.cfg.Incarnation { // no epoch yet: none handed out
			t.Fatalf("%s:%d: group %d: epoch %#x is not of incarnation %d", file, line, gid, g.epoch, m.cfg.Incarnation)
		}
		for tag, o := range g.ops {
			for _, id := range o.members {
				if p := m.peers[id]; p == nil || p.group != g {
					t.Fatalf("%s:%d: group %d: op tag %d has member %d, gone or of another group", file, line, gid, tag, id)
				}
			}
		}
	}
}
