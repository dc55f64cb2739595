package measure

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/internal/transport"
)

// RoleRing is the role of one process of the loopback ring. A program that calls LoopbackRing must
// register it: cluster.Main(map[string]func() int{measure.RoleRing: measure.RingMain, ...}).
const RoleRing = "measure-ring"

// Environment of the ring role.
const (
	envRingBytes  = "CONCORD_MEASURE_RING_BYTES"
	envRingChunk  = "CONCORD_MEASURE_RING_CHUNK"
	envRingLocal  = "CONCORD_MEASURE_RING_LOCAL"
	envRingListen = "CONCORD_MEASURE_RING_LISTEN"
)

// RingChunk is the number of bytes per send and receive call in the ring, like the baseline tool.
const RingChunk = 1 << 20

// ringStartDelay is how far in the future the parent schedules the common start of a repetition, so
// that every process has received the start time before it comes.
const ringStartDelay = 50 * time.Millisecond

// Ring is the result of LoopbackRing.
type Ring struct {
	N     int       // processes in the ring
	Bytes int       // bytes each process sent (and received) per repetition
	Times []float64 // seconds per timed repetition: from the common start until the last process finished
	// Seconds is the median of Times.
	Seconds float64
	// Aggregate is L = N·Bytes/Seconds, bytes per second through loopback in all.
	Aggregate float64
	// PerRank is R = Bytes/Seconds = L/N, the bytes per second each process sent.
	PerRank float64
	// Local is whether the ring ran over the TCP transport's local path (a unix socket) instead of
	// loopback TCP.
	Local bool
}

// Placement puts process i of a ring on a host: it listens on listen (host:port, port 0 for any;
// empty means 127.0.0.1:0) and is started by start (nil: on this host, see cluster.Spec.Start).
type Placement func(i int) (listen string, start func(*exec.Cmd) error)

// ringMsg is what the parent sends a ring process.
type ringMsg struct {
	Next    string `json:"next,omitempty"`     // address of the next process, sent once
	Rep     int    `json:"rep"`                // repetition number
	StartNs int64  `json:"start_ns,omitempty"` // wall-clock start of the repetition, Unix nanoseconds
	Stop    bool   `json:"stop,omitempty"`     // leave
}

// ringEvent is what a ring process prints.
type ringEvent struct {
	Event string `json:"event"` // "listening", "ready", "done"
	Addr  string `json:"addr,omitempty"`
	Rep   int    `json:"rep"`
	EndNs int64  `json:"end_ns,omitempty"` // wall-clock end of the repetition, Unix nanoseconds
}

// LoopbackRing starts n processes of RoleRing in c, connects them in a ring with Concord's TCP
// transport on 127.0.0.1 (over its local path, a unix socket, when local is true) and runs
// warmup+reps repetitions in which every process sends bytes bytes to the next while receiving as
// many from the previous; the repetitions after the warm-ups are timed. All processes of a repetition
// start at one wall-clock instant (they share the machine's clock), and the repetition's time ends
// when the last one has finished. The processes have exited when it returns without error.
func LoopbackRing(ctx context.Context, c *cluster.Cluster, n, bytes, warmup, reps int, local bool) (Ring, error) {
	return RingOn(ctx, c, n, bytes, warmup, reps, local, nil)
}

// RingOn is LoopbackRing with the processes placed by place (nil: all on 127.0.0.1 of this host), on
// the hosts of a test bed, say: then the bytes cross the links between the hosts, over TCP (the
// local path's unix sockets belong to one network namespace, so they never reach another host).
func RingOn(ctx context.Context, c *cluster.Cluster, n, bytes, warmup, reps int, local bool, place Placement) (Ring, error) {
	if n < 2 || bytes <= 0 || reps <= 0 || warmup < 0 {
		return Ring{}, fmt.Errorf("measure: ring of %d processes, %d bytes, %d reps: invalid", n, bytes, reps)
	}
	procs := make([]*cluster.Proc, n)
	defer func() {
		for _, p := range procs {
			if p != nil {
				p.Kill() // no-op error for those that already left
			}
		}
	}()
	env := []string{envRingBytes + "=" + strconv.Itoa(bytes), envRingChunk + "=" + strconv.Itoa(RingChunk),
		envRingLocal + "=" + strconv.FormatBool(local)}
	addrs := make([]string, n)
	for i := range procs {
		spec := cluster.Spec{Role: RoleRing, Name: fmt.Sprintf("ring-%d", i), Env: env}
		if place != nil {
			var listen string
			listen, spec.Start = place(i)
			spec.Env = append(slices.Clip(env), envRingListen+"="+listen)
		}
		p, err := c.Spawn(spec)
		if err != nil {
			return Ring{}, err
		}
		procs[i] = p
	}
	for i, p := range procs {
		var ev ringEvent
		if err := await(ctx, p, "listening", &ev); err != nil {
			return Ring{}, err
		}
		addrs[i] = ev.Addr
	}
	for i, p := range procs {
		if err := p.Send(ringMsg{Next: addrs[(i+1)%n]}); err != nil {
			return Ring{}, err
		}
	}
	for _, p := range procs {
		if err := await(ctx, p, "ready", nil); err != nil {
			return Ring{}, err
		}
	}
	r := Ring{N: n, Bytes: bytes, Local: local}
	for rep := range warmup + reps {
		start := time.Now().Add(ringStartDelay).UnixNano()
		for _, p := range procs {
			if err := p.Send(ringMsg{Rep: rep, StartNs: start}); err != nil {
				return Ring{}, err
			}
		}
		var end int64
		for _, p := range procs {
			var ev ringEvent
			if err := await(ctx, p, "done", &ev); err != nil {
				return Ring{}, err
			}
			end = max(end, ev.EndNs)
		}
		if rep >= warmup {
			r.Times = append(r.Times, float64(end-start)/1e9)
		}
	}
	for _, p := range procs {
		if err := p.Send(ringMsg{Stop: true}); err != nil {
			return Ring{}, err
		}
	}
	for _, p := range procs {
		if code, err := p.Wait(ctx); err != nil {
			return Ring{}, err
		} else if code != 0 {
			return Ring{}, fmt.Errorf("measure: %s exited with status %d", p.Name(), code)
		}
	}
	r.Seconds = Median(r.Times)
	r.PerRank = float64(bytes) / r.Seconds
	r.Aggregate = float64(n) * r.PerRank
	return r, nil
}

// await reads p's lines until the event, decoding it into v when v is not nil. A line with event
// "error" fails it.
func await(ctx context.Context, p *cluster.Proc, event string, v any) error {
	for {
		l, err := p.Next(ctx)
		if err != nil {
			return fmt.Errorf("measure: waiting for %q: %w", event, err)
		}
		if l.Event == "error" {
			return fmt.Errorf("measure: %s", l)
		}
		if l.Event == event {
			if v == nil {
				return nil
			}
			return l.Decode(v)
		}
	}
}

// RingMain is the ring role (RoleRing). It listens, connects to the next process once the parent
// names it, accepts the previous one, and then runs the repetitions the parent schedules.
func RingMain() int {
	if err := ringMain(); err != nil {
		cluster.Emit(map[string]string{"event": "error", "error": err.Error()})
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func ringMain() error {
	bytes, err := strconv.Atoi(os.Getenv(envRingBytes))
	if err != nil || bytes <= 0 {
		return fmt.Errorf("ring: %s=%q", envRingBytes, os.Getenv(envRingBytes))
	}
	chunk, err := strconv.Atoi(os.Getenv(envRingChunk))
	if err != nil || chunk <= 0 {
		chunk = RingChunk
	}
	local, _ := strconv.ParseBool(os.Getenv(envRingLocal))
	tr := transport.NewTCP(transport.TCPConfig{DisableLocal: !local})
	listen := os.Getenv(envRingListen)
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	ln, err := tr.Listen(listen)
	if err != nil {
		return fmt.Errorf("ring: %w", err)
	}
	defer ln.Close()
	if err := cluster.Emit(ringEvent{Event: "listening", Addr: ln.Addr().String()}); err != nil {
		return err
	}
	next, err := recvMsg()
	if err != nil {
		return err
	}
	accepted := make(chan net.Conn, 1)
	acceptErr := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			acceptErr <- err
			return
		}
		accepted <- c
	}()
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	out, err := tr.Dial(dctx, next.Next)
	cancel()
	if err != nil {
		return fmt.Errorf("ring: dial %s: %w", next.Next, err)
	}
	defer out.Close()
	var in net.Conn
	select {
	case in = <-accepted:
	case err := <-acceptErr:
		return fmt.Errorf("ring: accept: %w", err)
	case <-time.After(10 * time.Second):
		return errors.New("ring: the previous process did not connect within 10s")
	}
	defer in.Close()

	sbuf, rbuf := make([]byte, bytes), make([]byte, bytes)
	for i := range sbuf {
		sbuf[i] = byte(i)
	}
	clear(rbuf) // fault the pages in before the first repetition
	if err := cluster.Emit(ringEvent{Event: "ready"}); err != nil {
		return err
	}
	for {
		m, err := recvMsg()
		if err != nil {
			return err
		}
		if m.Stop {
			return nil
		}
		time.Sleep(time.Until(time.Unix(0, m.StartNs)))
		if err := ringRep(out, in, sbuf, rbuf, chunk); err != nil {
			return fmt.Errorf("ring: rep %d: %w", m.Rep, err)
		}
		if err := cluster.Emit(ringEvent{Event: "done", Rep: m.Rep, EndNs: time.Now().UnixNano()}); err != nil {
			return err
		}
	}
}

// ringRep sends sbuf on out while receiving len(rbuf) bytes from in, chunk bytes per call.
func ringRep(out, in net.Conn, sbuf, rbuf []byte, chunk int) error {
	deadline := time.Now().Add(time.Minute)
	out.SetWriteDeadline(deadline)
	in.SetReadDeadline(deadline)
	var wg sync.WaitGroup
	var sendErr error
	wg.Go(func() {
		for off := 0; off < len(sbuf); off += chunk {
			if _, err := out.Write(sbuf[off:min(off+chunk, len(sbuf))]); err != nil {
				sendErr = err
				return
			}
		}
	})
	var recvErr error
	for off := 0; off < len(rbuf); {
		k, err := in.Read(rbuf[off:min(off+chunk, len(rbuf))])
		off += k
		if err != nil {
			if err == io.EOF && off == len(rbuf) {
				break
			}
			recvErr = err
			break
		}
	}
	if recvErr != nil {
		out.Close() // unblocks the sender
	}
	wg.Wait()
	return errors.Join(recvErr, sendErr)
}

// recvMsg returns the next message from the parent, waiting at most a few minutes.
func recvMsg() (ringMsg, error) {
	select {
	case raw := <-cluster.Inbox():
		var m ringMsg
		if err := json.Unmarshal(raw, &m); err != nil {
			return ringMsg{}, fmt.Errorf("ring: message %q: %w", raw, err)
		}
		return m, nil
	case <-time.After(5 * time.Minute):
		return ringMsg{}, errors.New("ring: no message from the parent for 5 minutes")
	}
}
