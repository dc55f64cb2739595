package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/concord-ccl/concord/internal/cluster"
)

// The raw transfer is the reference join_seconds is compared to: the same number of bytes moved
// over one loopback TCP connection between two processes, 1 MiB per write and per read, from a real
// buffer into a real buffer whose pages are already in memory (as the newcomer's state is).
const (
	roleSink   = "raw-sink"
	roleSource = "raw-source"
	envRaw     = "CONCORD_BENCH_RAW" // "bytes reps"
	rawChunk   = 1 << 20
)

// rawEvent is what the two raw roles print.
type rawEvent struct {
	Event   string  `json:"event"` // "listening", "rep", "error"
	Addr    string  `json:"addr,omitempty"`
	Seconds float64 `json:"seconds,omitempty"` // rep: from the first write to the receiver's acknowledgement
	// CPUSeconds is, for a rep, the CPU time (user and kernel) the process used for it.
	CPUSeconds float64 `json:"cpu_seconds,omitempty"`
	Detail     string  `json:"detail,omitempty"`
}

// rawParams reads envRaw.
func rawParams() (bytes, reps int, warm bool, err error) {
	if _, err := fmt.Sscan(os.Getenv(envRaw), &bytes, &reps, &warm); err != nil {
		return 0, 0, false, fmt.Errorf("%s=%q: %w", envRaw, os.Getenv(envRaw), err)
	}
	return bytes, reps, warm, nil
}

func rawFail(err error) int {
	cluster.Emit(rawEvent{Event: "error", Detail: err.Error()})
	return 1
}

// sinkMain is the receiving role: it listens on loopback, accepts one connection and, reps times,
// reads bytes bytes into its buffer and answers one byte.
func sinkMain() int {
	n, reps, warm, err := rawParams()
	if err != nil {
		return rawFail(err)
	}
	buf := make([]byte, n)
	for i := 0; i < n; i += 4096 {
		buf[i] = 1
	}
	if warm {
		if err := kernelWarm(buf); err != nil {
			return rawFail(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return rawFail(err)
	}
	defer ln.Close()
	cluster.Emit(rawEvent{Event: "listening", Addr: ln.Addr().String()})
	conn, err := ln.Accept()
	if err != nil {
		return rawFail(err)
	}
	defer conn.Close()
	u0 := selfUsage()
	for range reps {
		for off := 0; off < n; {
			m, err := conn.Read(buf[off:min(off+rawChunk, n)])
			if err != nil {
				return rawFail(fmt.Errorf("read at %d: %w", off, err))
			}
			off += m
		}
		if _, err := conn.Write([]byte{1}); err != nil {
			return rawFail(err)
		}
		u1 := selfUsage()
		cluster.Emit(rawEvent{Event: "rep", CPUSeconds: u1.cpu() - u0.cpu()})
		u0 = u1
	}
	return 0
}

// sourceMain is the sending role: it fills its buffer, waits for the sink's address on its inbox,
// connects and, reps times, writes bytes bytes 1 MiB at a time and waits for the acknowledgement.
func sourceMain() int {
	n, reps, warm, err := rawParams()
	if err != nil {
		return rawFail(err)
	}
	buf := make([]byte, n)
	fillEntry(buf, 7)
	if warm {
		if err := kernelWarm(buf); err != nil {
			return rawFail(err)
		}
	}
	var addr string
	if err := json.Unmarshal(<-cluster.Inbox(), &addr); err != nil {
		return rawFail(err)
	}
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return rawFail(err)
	}
	defer conn.Close()
	ack := make([]byte, 1)
	for range reps {
		t0, u0 := time.Now(), selfUsage()
		for off := 0; off < n; off += rawChunk {
			if _, err := conn.Write(buf[off:min(off+rawChunk, n)]); err != nil {
				return rawFail(err)
			}
		}
		if _, err := io.ReadFull(conn, ack); err != nil {
			return rawFail(err)
		}
		cluster.Emit(rawEvent{Event: "rep", Seconds: time.Since(t0).Seconds(), CPUSeconds: selfUsage().cpu() - u0.cpu()})
	}
	return 0
}

// rawEnv returns the environment entry of the raw roles.
func rawEnv(bytes, reps int, warm bool) string {
	return envRaw + "=" + strconv.Itoa(bytes) + " " + strconv.Itoa(reps) + " " + strconv.FormatBool(warm)
}
