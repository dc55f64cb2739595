package pccl

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/golden"
	"github.com/concord-ccl/concord/internal/wire"
)

// TestPeerScenarios runs every testdata/*.txt script through a peer machine (id 2, heartbeat 250ms,
// master timeout 2s) and compares what it did with the golden file next to it. One line is one input:
//
//	call N connect | topology [rewire] [noadmit] | pending | optimize     an API call with call id N
//	call N init tag=T [count=C]                                 AllReduce's vote
//	call N report tag=T [code=ok|peer-left|aborted]             the data path of call N ended
//	call N sync | call N syncdone prev=P [fail]                 SyncSharedState's two steps
//	step S                                                      ReportStep
//	cancel N                                                    the caller of call N gave up
//	close                                                       Close
//	recv topology epoch=E ring=A,B,...                          a message from the master
//	recv connect epoch=E ring=A,B,...
//	recv commence tag=T seq=S epoch=E
//	recv outcome tag=T seq=S [code=ok|peer-left|aborted|mismatch|too-few]
//	recv pending yes|no | recv measure round=R to=P | recv plan [fail] | recv complete [fail]
//	recv ack | recv kick | recv illegal
//	lost | writefail                                            the master connection failed
//	redialed [fail | kick] [inc=I]                              a dial of the master ended: a
//	                                                            Welcome of incarnation I on a new
//	                                                            connection, an error, or a Kick
//	redialed resumed recv=R next=N                              the master resumed the session on a
//	                                                            new connection; it had R of ours,
//	                                                            resends from its N
//	wired epoch=E [fail=P]                                      the links of a Connect round
//	measured round=R to=P bw=B                                  a bandwidth test ended
//	advance DURATION                                            move the clock (no input)
//	tick                                                        a tick
//
// Errors print as the sentinels they wrap, so the scripts pin the classification, not the wording.
// A dial that succeeded names its connection by a number, 1 for the script's first; the step that
// takes it must adopt it or drop it (checkConns).
// Run `go test ./pccl -run PeerScenarios -update` to accept new output.
func TestPeerScenarios(t *testing.T) {
	golden.Run(t, "testdata/*.txt", runPeerScenario)
}

func runPeerScenario(t *testing.T, file string) string {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := newMachine(2, 250*time.Millisecond, 2*time.Second, now)
	var out strings.Builder
	var conns connID
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
		fail := func(format string, a ...any) {
			t.Helper()
			t.Fatalf("%s:%d: %s", file, n, fmt.Sprintf(format, a...))
		}
		num := func(k string, def uint64) uint64 {
			s, ok := args[k]
			if !ok {
				return def
			}
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				fail("%s: %v", k, err)
			}
			return v
		}
		ring := func() []uint64 {
			var r []uint64
			for _, s := range strings.Split(args["ring"], ",") {
				v, err := strconv.ParseUint(s, 10, 64)
				if err != nil {
					fail("ring: %v", err)
				}
				r = append(r, v)
			}
			return r
		}
		arg := func(i int) string {
			if len(fields) <= i {
				fail("missing argument %d", i)
			}
			return fields[i]
		}
		var in input
		switch fields[0] {
		case "call":
			call, err := strconv.ParseUint(arg(1), 10, 64)
			if err != nil {
				fail("call id: %v", err)
			}
			switch arg(2) {
			case "connect":
				in = connectCall{call}
			case "topology":
				in = topologyCall{call: call, rewire: strings.Contains(line, "rewire"), noAdmit: strings.Contains(line, "noadmit")}
			case "pending":
				in = pendingCall{call: call, leave: strings.Contains(line, "leave")}
			case "optimize":
				in = optimizeCall{call}
			case "init":
				in = initiateCall{call: call, tag: num("tag", 0), desc: wire.Desc{Count: num("count", 4), DType: 3, Op: 1}}
			case "report":
				d := &wire.Done{Code: codeNamed(t, args["code"])}
				if d.Code != wire.CodeOK {
					d.Detail = "link failed"
				}
				in = reportCall{call: call, tag: num("tag", 0), done: d}
			case "sync":
				in = syncCall{call: call, vote: &wire.VoteSync{Strategy: 0}}
			case "syncdone":
				_, failed := args["fail"]
				in = syncDoneCall{call: call, prev: num("prev", 0), done: &wire.SyncDone{OK: !failed}}
			default:
				fail("unknown call %q", fields[2])
			}
		case "step":
			s, _ := strconv.ParseUint(arg(1), 10, 64)
			in = stepCall{&wire.StepReport{Step: s}}
		case "cancel":
			call, err := strconv.ParseUint(arg(1), 10, 64)
			if err != nil {
				fail("call id: %v", err)
			}
			in = cancelCall{call: call, reason: context.Canceled}
		case "close":
			in = closeCall{}
		case "recv":
			var msg wire.Message
			_, failed := args["fail"]
			switch arg(1) {
			case "topology":
				msg = &wire.Topology{Epoch: num("epoch", 0), Changed: true, Ring: ring()}
			case "connect":
				var ps []wire.PeerInfo
				for _, id := range ring() {
					ps = append(ps, wire.PeerInfo{ID: id, Addr: fmt.Sprintf("10.0.0.%d:9000", id)})
				}
				msg = &wire.Connect{Epoch: num("epoch", 0), Ring: ps}
			case "commence":
				msg = &wire.Commence{Tag: num("tag", 0), Seq: num("seq", 0), Epoch: num("epoch", 0), Alone: args["alone"] == "yes"}
			case "outcome":
				o := &wire.Outcome{Tag: num("tag", 0), Seq: num("seq", 0), Code: codeNamed(t, args["code"])}
				if o.Code != wire.CodeOK {
					o.Detail = "peer 3: link failed"
				}
				msg = o
			case "pending":
				msg = &wire.Pending{Answer: arg(2) == "yes"}
			case "measure":
				msg = &wire.MeasureRound{Round: uint32(num("round", 0)), Target: wire.PeerInfo{ID: num("to", 0), Addr: "10.0.0.9:9000"}, Nanos: uint64(time.Millisecond)}
			case "plan":
				p := &wire.SyncPlan{Code: wire.CodeOK, Revision: 1}
				if failed {
					p.Code, p.Detail = wire.CodeAborted, "revision rule"
				}
				msg = p
			case "complete":
				c := &wire.SyncComplete{Code: wire.CodeOK, Revision: 1}
				if failed {
					c.Code, c.Detail = wire.CodeAborted, "a peer failed"
				}
				msg = c
			case "ack":
				msg = &wire.HeartbeatAck{}
			case "kick":
				msg = &wire.Kick{Reason: "illegal message"}
			case "illegal":
				msg = &wire.Hello{}
			default:
				fail("unknown message %q", fields[1])
			}
			in = masterIn{msg}
		case "lost":
			in = masterLost{errors.New("EOF")}
		case "writefail":
			in = writeFailed{errors.New("broken pipe")}
		case "redialed":
			var r redialedIn
			switch {
			case strings.Contains(line, "resumed"):
				conns++
				r.conn, r.resumed, r.masterRecv, r.masterNext = conns, true, num("recv", 0), num("next", 1)
			case strings.Contains(line, "kick"):
				r.err, r.kicked = fmt.Errorf("%w: run token mismatch", ErrKicked), true
			case strings.Contains(line, "fail"):
				r.err = errors.New("connection refused")
			default:
				conns++
				r.conn = conns
				r.welcome = &wire.Welcome{Peer: 2, HeartbeatInterval: uint64(250 * time.Millisecond), Incarnation: num("inc", 0)}
			}
			in = r
		case "wired":
			w := wiredIn{epoch: num("epoch", 0)}
			if p, ok := args["fail"]; ok {
				id, _ := strconv.ParseUint(p, 10, 64)
				w.failed, w.err = []uint64{id}, errors.New("refused")
			}
			in = w
		case "measured":
			bw, err := strconv.ParseFloat(args["bw"], 64)
			if err != nil {
				fail("bw: %v", err)
			}
			in = measuredIn{round: uint32(num("round", 0)), to: num("to", 0), rate: bw}
		case "advance":
			d, err := time.ParseDuration(arg(1))
			if err != nil {
				fail("%v", err)
			}
			now = now.Add(d)
			out.WriteString("> " + line + "\n")
			continue
		case "tick":
			in = tickIn{}
		default:
			fail("unknown input %q", fields[0])
		}
		out.WriteString("> " + line + "\n")
		acts := m.step(now, in)
		for _, a := range acts {
			out.WriteString("  " + formatPeerAction(a) + "\n")
		}
		checkMachine(t, m, file, n)
		checkConns(t, in, acts, file, n)
	}
	fatal := "none"
	if m.fatal != nil {
		fatal = errorKinds(m.fatal)
	}
	fmt.Fprintf(&out, "= epoch %d ring %v ops %d optimize %+v fatal %s\n", m.epoch, m.ring, len(m.ops), m.opt.stats, fatal)
	return out.String()
}

func codeNamed(t *testing.T, name string) wire.Code {
	switch name {
	case "", "ok":
		return wire.CodeOK
	case "peer-left":
		return wire.CodePeerLeft
	case "aborted":
		return wire.CodeAborted
	case "mismatch":
		return wire.CodeMismatch
	case "too-few":
		return wire.CodeTooFewPeers
	case "local-failure":
		return wire.CodeLocalFailure
	}
	t.Fatalf("unknown code %q", name)
	return 0
}

// errorKinds names the sentinels err wraps.
func errorKinds(err error) string {
	if err == nil {
		return "ok"
	}
	var kinds []string
	for _, k := range []struct {
		name string
		err  error
	}{
		{"peer-left", ErrPeerLeft}, {"aborted", ErrAborted}, {"too-few-peers", ErrTooFewPeers},
		{"kicked", ErrKicked}, {"closed", ErrClosed}, {"mismatch", ErrDescriptorMismatch},
		{"master-lost", ErrMasterLost}, {"busy", ErrBusy}, {"invalid", ErrInvalid}, {"sync", ErrSync},
		{"local-failure", ErrLocalFailure}, {"canceled", context.Canceled},
	} {
		if errors.Is(err, k.err) {
			kinds = append(kinds, k.name)
		}
	}
	if len(kinds) == 0 {
		return "error(" + err.Error() + ")"
	}
	return "error(" + strings.Join(kinds, ",") + ")"
}

func formatMsg(msg wire.Message) string {
	v := reflect.ValueOf(msg).Elem()
	return fmt.Sprintf("%s%+v", v.Type().Name(), v.Interface())
}

func formatPeerAction(a action) string {
	switch a := a.(type) {
	case sendAct:
		return "send " + formatMsg(a.msg)
	case replyAct:
		r := a.r
		switch {
		case r.start != nil:
			s := fmt.Sprintf("reply %d start seq=%d epoch=%d ring=%v", r.call, r.start.seq, r.start.epoch, r.start.ring)
			if r.start.alone {
				s += " alone"
			}
			if r.start.siteGen != 0 {
				s += fmt.Sprintf(" site-gen=%d", r.start.siteGen)
			}
			if r.start.siteOff {
				s += " site-off"
			}
			return s
		case r.err != nil:
			return fmt.Sprintf("reply %d %s", r.call, errorKinds(r.err))
		case r.msg != nil:
			return fmt.Sprintf("reply %d %s", r.call, formatMsg(r.msg))
		}
		if r.answer {
			return fmt.Sprintf("reply %d ok answer=true", r.call)
		}
		return fmt.Sprintf("reply %d ok", r.call)
	case wireAct:
		return fmt.Sprintf("wire epoch=%d peers=%d", a.m.Epoch, len(a.m.Ring))
	case retireAct:
		return fmt.Sprintf("retire %v", a.ring)
	case abortAct:
		return fmt.Sprintf("abort %d %s", a.call, errorKinds(a.err))
	case tombstoneAct:
		return fmt.Sprintf("tombstone seq=%d", a.seq)
	case measureAct:
		return fmt.Sprintf("measure round=%d to=%d", a.r.Round, a.r.Target.ID)
	case dieAct:
		return "die " + errorKinds(a.err)
	case redialAct:
		return fmt.Sprintf("redial Resume%+v", *a.resume)
	case adoptAct:
		if a.resumed {
			return fmt.Sprintf("adopt connection %d: session resumed, resend from frame %d, the master's from %d", a.conn, a.masterRecv+1, a.masterNext)
		}
		return fmt.Sprintf("adopt connection %d as the new master connection", a.conn)
	case dropConnAct:
		return fmt.Sprintf("drop dialled connection %d", a.conn)
	case noticeAct:
		return "notice: " + a.text
	}
	return fmt.Sprintf("%T", a)
}

// checkMachine asserts what must hold after every step, whatever the script does.
func checkMachine(t *testing.T, m *machine, file string, line int) {
	t.Helper()
	calls := map[uint64]string{}
	claim := func(c uint64, what string) {
		if c == 0 {
			return
		}
		if prev, ok := calls[c]; ok {
			t.Fatalf("%s:%d: call %d waits for both %s and %s", file, line, c, prev, what)
		}
		calls[c] = what
	}
	claim(m.topo.call, "topology")
	claim(m.pend.call, "pending")
	claim(m.opt.call, "optimize")
	claim(m.sync.call, "sync")
	claim(m.joinCall, "connect")
	for tag, o := range m.ops {
		claim(o.call, fmt.Sprintf("tag %d", tag))
		if o.phase != opVoted && o.seq == 0 && o.phase != opWithdrawn {
			t.Fatalf("%s:%d: tag %d past its vote without a seq", file, line, tag)
		}
	}
	if m.fatal != nil && (len(m.ops) > 0 || len(calls) > 0) {
		t.Fatalf("%s:%d: dead machine still holds calls %v", file, line, calls)
	}
}

// checkConns asserts that the step that took in adopted or dropped the connection in names, once,
// and touched no other: the runtime holds it only until then.
func checkConns(t *testing.T, in input, acts []action, file string, line int) {
	t.Helper()
	var want connID
	if r, ok := in.(redialedIn); ok {
		want = r.conn
	}
	var named []connID
	for _, a := range acts {
		switch a := a.(type) {
		case adoptAct:
			named = append(named, a.conn)
		case dropConnAct:
			named = append(named, a.conn)
		}
	}
	switch {
	case want == 0 && len(named) > 0:
		t.Fatalf("%s:%d: connections %v adopted or dropped, none was dialled", file, line, named)
	case want != 0 && (len(named) != 1 || named[0] != want):
		t.Fatalf("%s:%d: connection %d dialled, %v adopted or dropped", file, line, want, named)
	}
}

// FuzzPeerMachine drives the machine with arbitrary interleavings of calls, cancellations, master
// messages, link events and time, and checks what must always hold: no panic, at most one start and
// exactly one final reply per call that waits (start before final), every waiting call answered when
// the machine dies, nothing but error replies (and the drop of a connection dialled meanwhile) after
// death, and every dialled connection adopted or dropped by the step that takes it.
func FuzzPeerMachine(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{4, 1, 9, 1, 7, 1, 12, 0, 3, 2, 9, 2, 8, 1, 14, 200})
	f.Add([]byte{1, 0, 5, 0, 10, 0, 11, 0, 13, 0, 2, 0, 16, 0, 17, 0})
	f.Fuzz(func(t *testing.T, script []byte) {
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		m := newMachine(2, 250*time.Millisecond, 2*time.Second, now)
		type callState struct {
			op, cancelled, started, final bool
		}
		calls := map[uint64]*callState{}
		var ids []uint64
		next := uint64(0)
		newCall := func(op bool) uint64 {
			next++
			calls[next] = &callState{op: op}
			ids = append(ids, next)
			return next
		}
		pick := func(b byte) uint64 {
			if len(ids) == 0 {
				return 1
			}
			return ids[int(b)%len(ids)]
		}
		dead := false
		var conns connID
		for i := 0; i+1 < len(script); i += 2 {
			op, arg := script[i]%19, script[i+1]
			tag, seq, epoch := uint64(arg%3+1), uint64(arg%5+1), uint64(arg/5%3+1)
			var in input
			switch op {
			case 0:
				in = connectCall{newCall(false)}
			case 1:
				in = topologyCall{call: newCall(false), rewire: arg%2 == 0}
			case 2:
				in = pendingCall{call: newCall(false), leave: arg%5 == 0}
			case 3:
				in = optimizeCall{newCall(false)}
			case 4:
				in = initiateCall{call: newCall(true), tag: tag, desc: wire.Desc{Count: 4, DType: 3, Op: 1}}
			case 5:
				// Only a caller that took its start reports (the runtime guarantees it).
				o := m.ops[tag]
				if o == nil || o.phase != opRunning || !calls[o.call].started {
					continue
				}
				in = reportCall{call: o.call, tag: tag, done: &wire.Done{Code: wire.Code(arg % 3)}}
			case 6:
				in = syncCall{call: newCall(false), vote: &wire.VoteSync{}}
			case 7:
				in = syncDoneCall{call: newCall(false), prev: pick(arg), done: &wire.SyncDone{OK: arg%2 == 0}}
			case 8:
				c := pick(arg)
				if cs := calls[c]; cs != nil {
					cs.cancelled = true
				}
				in = cancelCall{call: c, reason: context.Canceled}
			case 9:
				in = masterIn{&wire.Commence{Tag: tag, Seq: seq, Epoch: epoch}}
			case 10:
				in = masterIn{&wire.Outcome{Tag: tag, Seq: seq, Code: wire.Code(arg % 5)}}
			case 11:
				ring := []uint64{1, 2, 3}[:arg%3+1]
				if arg%7 == 0 {
					ring = []uint64{1, 3}
				}
				in = masterIn{&wire.Topology{Epoch: epoch, Ring: ring}}
			case 12:
				in = masterIn{&wire.Pending{Answer: arg%2 == 0}}
			case 13:
				in = masterIn{&wire.MeasureRound{Round: uint32(arg), Target: wire.PeerInfo{ID: 3}}}
			case 14:
				now = now.Add(time.Duration(arg) * 20 * time.Millisecond)
				in = tickIn{}
			case 15:
				if arg%2 == 0 {
					in = masterIn{&wire.SyncPlan{Code: wire.Code(arg % 4 / 2)}}
				} else {
					in = masterIn{&wire.SyncComplete{}}
				}
			case 16:
				switch arg % 4 {
				case 0:
					in = masterIn{&wire.Kick{}}
				case 1:
					in = masterLost{errors.New("EOF")}
				case 2:
					in = writeFailed{errors.New("EPIPE")}
				default:
					in = closeCall{}
				}
			case 17:
				switch arg % 5 {
				case 0:
					conns++
					in = redialedIn{conn: conns, welcome: &wire.Welcome{Incarnation: uint64(arg)}}
				case 1:
					in = redialedIn{err: errors.New("refused")}
				case 2:
					conns++
					in = redialedIn{conn: conns, resumed: true, masterRecv: uint64(arg % 7), masterNext: uint64(arg % 5)}
				default:
					in = masterIn{&wire.HeartbeatAck{}}
				}
			case 18:
				in = wiredIn{epoch: epoch}
			}
			acts := m.step(now, in)
			checkConns(t, in, acts, "fuzz", i/2)
			for _, a := range acts {
				if dead {
					_, drop := a.(dropConnAct)
					if r, ok := a.(replyAct); !drop && (!ok || r.r.err == nil) {
						t.Fatalf("step %d: %s after death", i/2, formatPeerAction(a))
					}
				}
				switch a := a.(type) {
				case replyAct:
					cs := calls[a.r.call]
					if cs == nil {
						t.Fatalf("step %d: reply to unknown call %d", i/2, a.r.call)
					}
					switch {
					case cs.final:
						t.Fatalf("step %d: second final reply to call %d", i/2, a.r.call)
					case a.r.start != nil && (cs.started || !cs.op):
						t.Fatalf("step %d: unexpected start for call %d", i/2, a.r.call)
					case a.r.start != nil:
						cs.started = true
					default:
						cs.final = true
					}
				case dieAct:
					dead = true
				}
			}
			checkMachine(t, m, "fuzz", i/2)
			if dead {
				for id, cs := range calls {
					if !cs.final && (cs.op || !cs.cancelled) {
						t.Fatalf("step %d: call %d never answered before death", i/2, id)
					}
				}
				// Later calls get answers too; keep going with a dead machine.
			}
		}
	})
}
