package main

import (
	"context"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
	"github.com/concord-ccl/concord/pccl/master"
	"github.com/concord-ccl/concord/rings"
)

// loopResult is the measurement over real sockets on loopback.
type loopResult struct {
	Requested   int        `json:"requested"`
	Reached     int        `json:"reached"`     // the most connections served at once
	FDLimit     uint64     `json:"fd_limit"`    // RLIMIT_NOFILE after raising the soft limit to the hard one
	StoppedWhy  string     `json:"stopped_why"` // why it went no further
	Note        string     `json:"note"`
	Collectives int        `json:"collectives"` // per size
	Sizes       []loopSize `json:"sizes"`
}

// loopSize is one size over loopback, in milliseconds of wall time.
type loopSize struct {
	Peers int `json:"peers"`
	// JoinMs: every peer but the first connects and sends Hello, until every Welcome arrived.
	JoinMs float64 `json:"join_ms"`
	// AdmitMs: the first peer's UpdateTopology until every peer got its Topology after the wiring
	// round (every Connect carries the whole ring, so the round moves O(n²) bytes).
	AdmitMs float64 `json:"admit_ms"`
	// CollectiveMs: mean of a collective in which every peer sends Initiate, answers Commence with
	// Done at once, until every Outcome arrived.
	CollectiveMs float64 `json:"collective_ms"`
	// HeartbeatMs: mean of every peer sending a heartbeat until every ack arrived.
	HeartbeatMs float64 `json:"heartbeat_ms"`
	// EventsPerSec is the master's control messages received per second during the collectives and
	// heartbeats.
	EventsPerSec float64 `json:"events_per_sec"`
}

// waitLimit bounds every wait of the loopback run.
const waitLimit = 60 * time.Second

// raiseFDLimit raises the soft RLIMIT_NOFILE to the hard limit and returns it.
func raiseFDLimit() (uint64, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, err
	}
	if r.Cur < r.Max {
		r.Cur = r.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
			return 0, err
		}
	}
	return r.Cur, nil
}

// runLoopback serves simulated peers over loopback at 100, 1,000 and the most connections allowed,
// up to want.
func runLoopback(ctx context.Context, want int, progress func(string, ...any)) (loopResult, error) {
	res := loopResult{Requested: want, Collectives: 5,
		Note: "admit_ms grows with the square of the peers: every Connect of a wiring round carries the whole ring " +
			"(see rewire_connect_bytes in process), so the round moves n frames of O(n) bytes"}
	limit, err := raiseFDLimit()
	if err != nil {
		return res, fmt.Errorf("file-descriptor limit: %w", err)
	}
	res.FDLimit = limit
	// Both ends of every connection live in this process, plus a margin for the runtime and listeners.
	most := int(limit-64) / 2
	top := want
	res.StoppedWhy = fmt.Sprintf("the requested maximum of %d connections was reached", want)
	if most < want {
		top = most
		res.StoppedWhy = fmt.Sprintf("file descriptors: RLIMIT_NOFILE is %d and both ends of each connection live in this process", limit)
	}
	var sizes []int
	for _, s := range []int{100, 1000} {
		if s < top {
			sizes = append(sizes, s)
		}
	}
	sizes = append(sizes, top)
	for _, n := range sizes {
		s, err := loopbackSize(ctx, n, res.Collectives)
		if err != nil {
			res.StoppedWhy = fmt.Sprintf("at %d connections: %v", n, err)
			progress("loopback n=%d: %v", n, err)
			if len(res.Sizes) == 0 {
				return res, err
			}
			return res, nil
		}
		res.Sizes = append(res.Sizes, s)
		res.Reached = n
		progress("loopback n=%d: join %.0f ms, admit %.0f ms, collective %.1f ms, heartbeat round %.1f ms, %.0f events/s",
			n, s.JoinMs, s.AdmitMs, s.CollectiveMs, s.HeartbeatMs, s.EventsPerSec)
	}
	return res, nil
}

// client is one simulated peer on a real control connection. Its reader answers Connect with
// LinksReady and Commence with Done at once, and reports every message's kind on seen.
type client struct {
	conn net.Conn
	mu   sync.Mutex // serializes writes: the reader answers while the driver sends
	buf  []byte
}

func (c *client) send(msg wire.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = wire.AppendFrame(c.buf[:0], msg)
	c.conn.SetWriteDeadline(time.Now().Add(waitLimit))
	_, err := c.conn.Write(c.buf)
	return err
}

// read handles the master's messages until the connection ends or quit is closed.
func (c *client) read(seen chan<- string, quit <-chan struct{}) {
	var buf []byte
	for {
		msg, b, err := wire.ReadFrame(c.conn, 0, buf)
		buf = b
		if err != nil {
			return
		}
		kind := ""
		switch m := msg.(type) {
		case *wire.Welcome:
			kind = "welcome"
		case *wire.Connect:
			err = c.send(&wire.LinksReady{Epoch: m.Epoch, OK: true})
		case *wire.Topology:
			kind = "topology"
		case *wire.Commence:
			err = c.send(&wire.Done{Tag: m.Tag, Seq: m.Seq, Code: wire.CodeOK, LinkBytes: 4 << 20, LinkNanos: 2_000_000})
		case *wire.Outcome:
			kind = "outcome"
			if m.Code != wire.CodeOK {
				kind = "outcome-failed"
			}
		case *wire.HeartbeatAck:
			kind = "ack"
		case *wire.Kick:
			kind = "kick"
		}
		if err != nil {
			return
		}
		if kind != "" {
			select {
			case seen <- kind:
			case <-quit:
				return
			}
		}
	}
}

// await counts the kinds reported on seen until want of kind arrived; any other kind listed in fatal
// is an error.
func await(ctx context.Context, seen <-chan string, kind string, want int) error {
	deadline := time.NewTimer(waitLimit)
	defer deadline.Stop()
	for got := 0; got < want; {
		select {
		case k := <-seen:
			switch k {
			case kind:
				got++
			case "kick", "outcome-failed":
				return fmt.Errorf("waiting for %d %s messages: a peer got %s", want, kind, k)
			}
		case <-deadline.C:
			return fmt.Errorf("waiting for %d %s messages: %d arrived within %v", want, kind, got, waitLimit)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func dialClient(addr string, i int) (*client, error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(waitLimit))
	if err := wire.Exchange(conn, wire.KindControl); err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	c := &client{conn: conn}
	if err := c.send(&wire.Hello{Addr: fmt.Sprintf("10.1.%d.%d:7000", i/256, i%256)}); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// loopbackSize runs one size: a server, n clients, the admission, collectives and heartbeats.
func loopbackSize(ctx context.Context, n, collectives int) (loopSize, error) {
	out := loopSize{Peers: n}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return out, err
	}
	sctx, stop := context.WithCancel(ctx)
	srv := master.NewServer(master.ServerConfig{Config: master.Config{HeartbeatInterval: time.Second, HeartbeatTimeout: time.Minute},
		SendQueue: 4096})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, ln) }()
	seen := make(chan string, 4*n+64)
	quit := make(chan struct{})
	var clients []*client
	var readers sync.WaitGroup
	defer func() {
		close(quit)
		stop()
		for _, c := range clients {
			c.conn.Close()
		}
		readers.Wait()
		<-served
	}()
	start := func(c *client) {
		clients = append(clients, c)
		readers.Add(1)
		go func() {
			defer readers.Done()
			c.read(seen, quit)
		}()
	}

	// The first peer is wired alone.
	first, err := dialClient(ln.Addr().String(), 0)
	if err != nil {
		return out, err
	}
	start(first)
	if err := await(ctx, seen, "topology", 1); err != nil {
		return out, fmt.Errorf("first peer: %w", err)
	}

	t0 := time.Now()
	for i := 1; i < n; i++ {
		c, err := dialClient(ln.Addr().String(), i)
		if err != nil {
			return out, fmt.Errorf("connection %d: %w", i+1, err)
		}
		start(c)
	}
	// The first peer's Welcome was counted already.
	if err := await(ctx, seen, "welcome", n-1); err != nil {
		return out, err
	}
	out.JoinMs = ms(time.Since(t0))

	t0 = time.Now()
	if err := first.send(&wire.VoteTopology{}); err != nil {
		return out, err
	}
	if err := await(ctx, seen, "topology", n); err != nil {
		return out, fmt.Errorf("admission: %w", err)
	}
	out.AdmitMs = ms(time.Since(t0))

	t0 = time.Now()
	desc := wire.Desc{Count: 1 << 20, DType: uint8(rings.F32)}
	for range collectives {
		for _, c := range clients {
			if err := c.send(&wire.Initiate{Tag: 1, Desc: desc}); err != nil {
				return out, err
			}
		}
		if err := await(ctx, seen, "outcome", n); err != nil {
			return out, fmt.Errorf("collective: %w", err)
		}
	}
	collTime := time.Since(t0)
	out.CollectiveMs = ms(collTime) / float64(collectives)

	t0 = time.Now()
	for range collectives {
		for _, c := range clients {
			if err := c.send(&wire.Heartbeat{Seq: 1}); err != nil {
				return out, err
			}
		}
		if err := await(ctx, seen, "ack", n); err != nil {
			return out, fmt.Errorf("heartbeats: %w", err)
		}
	}
	hbTime := time.Since(t0)
	out.HeartbeatMs = ms(hbTime) / float64(collectives)
	// Each collective is 2n messages to the master (Initiate, Done), each heartbeat round n.
	out.EventsPerSec = float64(3*n*collectives) / (collTime + hbTime).Seconds()
	if s := srv.Snapshot(); len(s.Ring) != n {
		return out, fmt.Errorf("ring of %d peers after the admission, want %d", len(s.Ring), n)
	}
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
