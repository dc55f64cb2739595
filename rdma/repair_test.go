package rdma_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/golden"
	"github.com/concord-ccl/concord/rdma"
)

// TestRepairScenarios runs every testdata/*.txt script through one node's Repair machine and compares
// what it did with the golden file next to it. The first line creates the machine; every other line is
// one input (time does not move unless a line says so):
//
//	node ID ring=1,2,3,4 nics=N            the machine of node ID (NICs 0..N-1, two per distance level)
//	open PATH op=O chunks=C [primary=P]    Open (PATH is SRC->DST/chK; primary defaults to K)
//	posted PATH seq=S pair=L-R             Posted
//	acked PATH seq=S pair=L-R              Acked
//	recv PATH seq=S pair=L-R               Received (pair as the receiver sees it: its NIC first)
//	linkfail peer=P pair=L-R               LinkFailed
//	port nic=N up|down                     PortState
//	probe id=N ok|fail|local [rtt=D]       ProbeResult
//	msg from=F KIND ...                    ControlIn; KIND is notice|failreq|failack (PATH epoch=E op=O
//	                                       [pair=L-R] [seq=S]), ask (id=N a=NODE.NIC b=NODE.NIC),
//	                                       report (id=N a=ok|fail b=ok|fail), verdict (origin=O id=N nic|link
//	                                       a=NODE.NIC [b=NODE.NIC] down|healthy)
//	advance DURATION                       move the clock, then Tick
//
// Run `go test ./rdma -run RepairScenarios -update` to accept new output.
func TestRepairScenarios(t *testing.T) {
	golden.Run(t, "testdata/*.txt", runRepairScript)
}

func formatAction(a rdma.Action) string {
	switch a := a.(type) {
	case rdma.Resume:
		return fmt.Sprintf("resume %v pair=%d-%d epoch=%d from=%d", a.Path, a.Local, a.Remote, a.Epoch, a.From)
	case rdma.Pause:
		return fmt.Sprintf("pause %v", a.Path)
	case rdma.Accept:
		return fmt.Sprintf("accept %v seq=%d", a.Path, a.Seq)
	case rdma.Reject:
		return fmt.Sprintf("reject %v seq=%d", a.Path, a.Seq)
	case rdma.SendMsg:
		avoid := "any"
		if a.Avoid != rdma.NoNIC {
			avoid = strconv.Itoa(int(a.Avoid))
		}
		return fmt.Sprintf("send %d avoid=%s %v", a.To, avoid, a.Msg)
	case rdma.ProbeNIC:
		return fmt.Sprintf("probe id=%d %d.nic%d from nic%d", a.ID, a.Peer, a.Remote, a.Local)
	case rdma.Reconnect:
		return fmt.Sprintf("reconnect peer=%d pair=%d-%d index=%d", a.Peer, a.Local, a.Remote, a.Index)
	case rdma.PathFailed:
		return fmt.Sprintf("failed %v: %v (no-path=%v)", a.Path, a.Err, errors.Is(a.Err, rdma.ErrNoPath))
	case rdma.Note:
		if a.Path == (rdma.PathID{}) {
			return fmt.Sprintf("note %s: %s", a.Kind, a.Text)
		}
		return fmt.Sprintf("note %s %v: %s", a.Kind, a.Path, a.Text)
	}
	return fmt.Sprintf("%#v", a)
}

func runRepairScript(t *testing.T, file string) string {
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var m *rdma.Repair
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var out strings.Builder
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			continue
		}
		fields := strings.Fields(line)
		args := map[string]string{}
		flags := map[string]bool{}
		for _, f := range fields[1:] {
			if k, v, ok := strings.Cut(f, "="); ok {
				args[k] = v
			} else {
				flags[f] = true
			}
		}
		fail := func(format string, a ...any) {
			t.Helper()
			t.Fatalf("%s:%d: %s", file, n, fmt.Sprintf(format, a...))
		}
		num := func(k string) uint64 {
			v, err := strconv.ParseUint(args[k], 10, 64)
			if err != nil {
				fail("%s: %v", k, err)
			}
			return v
		}
		pathOf := func(s string) rdma.PathID {
			var p rdma.PathID
			if _, err := fmt.Sscanf(strings.NewReplacer("->", " ", "/ch", " ").Replace(s), "%d %d %d", &p.Src, &p.Dst, &p.Channel); err != nil {
				fail("path %q: %v", s, err)
			}
			return p
		}
		pair := func() (rdma.NICID, rdma.NICID) {
			var l, r rdma.NICID
			if _, err := fmt.Sscanf(args["pair"], "%d-%d", &l, &r); err != nil {
				fail("pair %q: %v", args["pair"], err)
			}
			return l, r
		}
		ref := func(s string) rdma.NICRef {
			var r rdma.NICRef
			if _, err := fmt.Sscanf(s, "%d.%d", &r.Node, &r.NIC); err != nil {
				fail("nic %q: %v", s, err)
			}
			return r
		}
		var in rdma.Input
		switch fields[0] {
		case "node":
			var ring []rdma.NodeID
			for _, s := range strings.Split(args["ring"], ",") {
				v, _ := strconv.ParseUint(s, 10, 32)
				ring = append(ring, rdma.NodeID(v))
			}
			id, _ := strconv.ParseUint(fields[1], 10, 32)
			nics := make([]rdma.NIC, num("nics"))
			for i := range nics {
				nics[i] = rdma.NIC{ID: rdma.NICID(i), Bandwidth: 12.5e9, Distance: i / 2}
			}
			m = rdma.NewRepair(rdma.NodeID(id), ring, nics, rdma.RepairConfig{})
			out.WriteString("> " + line + "\n")
			continue
		case "open":
			p := pathOf(fields[1])
			prim := rdma.NICID(p.Channel)
			if _, ok := args["primary"]; ok {
				prim = rdma.NICID(num("primary"))
			}
			in = rdma.Open{Path: p, Op: num("op"), Primary: prim, Chunks: num("chunks")}
		case "posted":
			l, r := pair()
			in = rdma.Posted{Path: pathOf(fields[1]), Seq: num("seq"), Local: l, Remote: r}
		case "acked":
			l, r := pair()
			in = rdma.Acked{Path: pathOf(fields[1]), Seq: num("seq"), Local: l, Remote: r}
		case "recv":
			l, r := pair()
			in = rdma.Received{Path: pathOf(fields[1]), Seq: num("seq"), Local: l, Remote: r}
		case "linkfail":
			l, r := pair()
			in = rdma.LinkFailed{Peer: rdma.NodeID(num("peer")), Local: l, Remote: r, Err: errors.New("connection reset")}
		case "port":
			h := rdma.Healthy
			if flags["down"] {
				h = rdma.Down
			}
			in = rdma.PortState{NIC: rdma.NICID(num("nic")), Health: h}
		case "probe":
			var rtt time.Duration
			if s, ok := args["rtt"]; ok {
				rtt, _ = time.ParseDuration(s)
			}
			in = rdma.ProbeResult{ID: num("id"), OK: flags["ok"], Local: flags["local"], RTT: rtt}
		case "msg":
			msg := rdma.Message{}
			kind := fields[2]
			switch kind {
			case "notice", "failreq", "failack":
				msg.Kind = map[string]rdma.MsgKind{"notice": rdma.MsgNotice, "failreq": rdma.MsgFailReq, "failack": rdma.MsgFailAck}[kind]
				msg.Path = pathOf(fields[3])
				msg.Epoch, msg.ID = uint32(num("epoch")), num("op")
				if _, ok := args["pair"]; ok {
					msg.Local, msg.Remote = pair()
				}
				if _, ok := args["seq"]; ok {
					msg.Seq = num("seq")
				}
			case "ask":
				msg = rdma.Message{Kind: rdma.MsgProbeAsk, ID: num("id"), A: ref(args["a"]), B: ref(args["b"])}
			case "report":
				msg = rdma.Message{Kind: rdma.MsgProbeReport, ID: num("id"), OKA: args["a"] == "ok", OKB: args["b"] == "ok"}
			case "verdict":
				msg = rdma.Message{Kind: rdma.MsgVerdict, Origin: rdma.NodeID(num("origin")), ID: num("id"), A: ref(args["a"]),
					Fault: rdma.FaultNIC, Health: rdma.Down}
				if flags["link"] {
					msg.Fault, msg.B = rdma.FaultLink, ref(args["b"])
				}
				if flags["healthy"] {
					msg.Health = rdma.Healthy
				}
			default:
				fail("unknown message kind %q", kind)
			}
			// Every message goes through the wire encoding, as it would between nodes.
			dec, err := rdma.DecodeMessage(rdma.AppendMessage(nil, msg))
			if err != nil {
				fail("%v", err)
			}
			in = rdma.ControlIn{From: rdma.NodeID(num("from")), Msg: dec}
		case "advance":
			d, err := time.ParseDuration(fields[1])
			if err != nil {
				fail("%v", err)
			}
			now = now.Add(d)
			in = rdma.Tick{}
		default:
			fail("unknown input %q", fields[0])
		}
		if m == nil {
			fail("the first input must be a node line")
		}
		out.WriteString("> " + line + "\n")
		for _, a := range m.Step(now, in) {
			out.WriteString("  " + formatAction(a) + "\n")
		}
	}
	return out.String()
}
