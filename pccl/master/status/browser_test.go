package status

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl/master"
)

// browser returns the path of a headless-capable Chromium, or skips the test. CI installs Debian's
// chromium package for it.
func browser(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no chromium on PATH: install Debian's chromium package (apt-get install -y chromium) to run the browser test")
	return ""
}

// fakePeer is one peer's control connection, driven step by step by the test.
type fakePeer struct {
	t    *testing.T
	id   uint64
	conn net.Conn
}

func dialPeer(t *testing.T, addr string, id uint64) *fakePeer {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := wire.Exchange(c, wire.KindControl); err != nil {
		t.Fatal(err)
	}
	p := &fakePeer{t: t, id: id, conn: c}
	p.send(&wire.Hello{Addr: fmt.Sprintf("127.0.0.1:%d", 7000+id), Site: []string{"eu-west", "us-east"}[id%2], Peer: id})
	if w, ok := p.expect(wire.TypeWelcome).(*wire.Welcome); !ok || w.Peer != id {
		t.Fatalf("peer %d: welcome %+v", id, w)
	}
	return p
}

func (p *fakePeer) send(m wire.Message) {
	p.t.Helper()
	if _, err := p.conn.Write(wire.AppendFrame(nil, m)); err != nil {
		p.t.Fatalf("peer %d: %v", p.id, err)
	}
}

// expect reads messages until one of type typ.
func (p *fakePeer) expect(typ wire.Type) wire.Message {
	p.t.Helper()
	for {
		m, _, err := wire.ReadFrame(p.conn, 0, nil)
		if err != nil {
			p.t.Fatalf("peer %d waiting for type %d: %v", p.id, typ, err)
		}
		if k, ok := m.(*wire.Kick); ok {
			p.t.Fatalf("peer %d kicked: %s", p.id, k.Reason)
		}
		if m.Type() == typ {
			return m
		}
	}
}

// wire answers the Connect of a wiring round and waits for its Topology.
func (p *fakePeer) wire() {
	p.t.Helper()
	c := p.expect(wire.TypeConnect).(*wire.Connect)
	p.send(&wire.LinksReady{Epoch: c.Epoch, OK: true})
}

// TestStatusPageInBrowser runs a master on loopback, feeds it four peers and collectives whose link
// timings show a slow link, and loads the status page in headless Chromium: after the page's script
// ran (it refreshes the body in place), the DOM must show the peers, the ring, both heat maps and the
// slow link's event.
func TestStatusPageInBrowser(t *testing.T) {
	chromium := browser(t)
	defer goleak.VerifyNone(t)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Long heartbeats: the browser may take seconds to start on a loaded machine. The slow link must
	// stay on the page as an active syndrome, so the master does not re-order the ring around it
	// (the fake peers here answer no Connect round).
	srv := master.NewServer(master.ServerConfig{Config: master.Config{MinPeers: 2, HeartbeatInterval: time.Minute,
		HeartbeatTimeout: 10 * time.Minute, Diagnosis: master.DiagnosisConfig{Reorder: master.ReorderPolicy{Off: true}}}})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	web := httptest.NewServer(Handler(srv.Snapshot, prometheus.NewRegistry()))
	defer web.Close()

	const n = 4
	var peers []*fakePeer
	for id := uint64(1); id <= n; id++ {
		p := dialPeer(t, ln.Addr().String(), id)
		defer p.conn.Close()
		peers = append(peers, p)
		if id == 1 {
			p.wire()
			p.expect(wire.TypeTopology)
		}
	}
	peers[0].send(&wire.VoteTopology{})
	var ring []uint64
	for _, p := range peers {
		p.wire()
	}
	for _, p := range peers {
		ring = p.expect(wire.TypeTopology).(*wire.Topology).Ring
	}
	if len(ring) != n {
		t.Fatalf("ring %v", ring)
	}
	byID := map[uint64]*fakePeer{}
	for _, p := range peers {
		byID[p.id] = p
	}

	slow := [2]uint64{ring[1], ring[2]}
	for op := range 8 {
		tag := uint64(op + 1)
		for _, p := range peers {
			p.send(&wire.Initiate{Tag: tag, Desc: wire.Desc{Count: 1 << 20, DType: 3, Op: 1}})
		}
		var seq uint64
		for _, p := range peers {
			seq = p.expect(wire.TypeCommence).(*wire.Commence).Seq
		}
		for i, id := range ring {
			succ, pred := ring[(i+1)%n], ring[(i+n-1)%n]
			d0 := uint64(20 * time.Millisecond)
			extra := uint64(0)
			if op >= 4 {
				extra = 3 * d0
			}
			span := d0 + extra
			stall, wait := d0*15/100, span-d0*80/100
			if [2]uint64{id, succ} == slow {
				stall += extra
				wait -= extra
			}
			byID[id].send(&wire.Done{Tag: tag, Seq: seq, Code: wire.CodeOK, LinkBytes: 16 << 20, LinkNanos: d0 + uint64(i)*d0/4,
				Links: []wire.LinkTiming{
					{Peer: succ, Dir: wire.LinkOut, Bytes: 16 << 20, Start: d0 / 100, End: span, Wait: stall},
					{Peer: pred, Dir: wire.LinkIn, Bytes: 16 << 20, Start: d0 / 200, End: span, Wait: wait},
				}})
		}
		for _, p := range peers {
			if o := p.expect(wire.TypeOutcome).(*wire.Outcome); o.Code != wire.CodeOK {
				t.Fatalf("outcome %+v", o)
			}
		}
	}
	for _, p := range peers {
		p.send(&wire.StepReport{Step: 1000 + p.id})
		// The master handles a connection's messages in order: once the heartbeat is answered, the
		// step report is in.
		p.send(&wire.Heartbeat{Seq: p.id})
		p.expect(wire.TypeHeartbeatAck)
	}
	s := srv.Snapshot()
	if len(s.Peers) != n || !s.Peers[n-1].HasStep || len(s.Groups) != 1 || len(s.Groups[0].Syndromes) != 1 {
		t.Fatalf("snapshot lacks the steps or the syndrome: %+v", s)
	}

	bctx, bcancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer bcancel()
	cmd := exec.CommandContext(bctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+t.TempDir(), "--virtual-time-budget=5000", "--dump-dom", web.URL+"/")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	dom := string(out)

	if !regexp.MustCompile(`<html[^>]* data-refreshed="[1-9]`).MatchString(dom) {
		t.Errorf("the page's script never refreshed the body (no data-refreshed on <html>): %.300s", dom)
	}
	if got := strings.Count(dom, `<tr class="peer">`); got != n {
		t.Errorf("%d peer rows, want %d", got, n)
	}
	for _, p := range peers {
		if !strings.Contains(dom, fmt.Sprintf(`<td class="num step">%d</td>`, 1000+p.id)) {
			t.Errorf("peer %d's step is missing", p.id)
		}
	}
	if got := strings.Count(dom, `<circle class="node"`); got != n {
		t.Errorf("%d ring nodes, want %d", got, n)
	}
	if got := strings.Count(dom, `class="edge"`); got != n {
		t.Errorf("%d ring arrows, want %d", got, n)
	}
	for _, id := range []string{"bandwidth", "delay"} {
		i := strings.Index(dom, `<h2 id="`+id+`">`)
		if i < 0 {
			t.Errorf("no %s heat map", id)
			continue
		}
		sec := dom[i:]
		sec = sec[:strings.Index(sec, "</section>")]
		cells := regexp.MustCompile(`<td class="cell"[^>]*>([^<]*)</td>`).FindAllStringSubmatch(sec, -1)
		known := 0
		for _, c := range cells {
			if c[1] != "·" {
				known++
			}
		}
		if len(cells) != n*n || known != n {
			t.Errorf("%s heat map: %d cells, %d known; want %d and %d (one per ring link)", id, len(cells), known, n*n, n)
		}
	}
	want := fmt.Sprintf("slow-link %d→%d", slow[0], slow[1])
	if !strings.Contains(dom, `<td>slow-link</td>`) || !strings.Contains(dom, want) {
		t.Errorf("the slow link %s is not on the page", want)
	}
}
