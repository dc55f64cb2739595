package main

import (
	"crypto/rand"
	"testing"
	"time"

	"github.com/concord-ccl/concord/internal/wanemu"
)

// TestCeiling measures the stream ceiling of every transport on a small test bed of three sites and
// checks that its bytes crossed the emulator: every ring link carried at least the link's share of
// both transfers.
func TestCeiling(t *testing.T) {
	if err := wanemu.Available(); err != nil {
		t.Skipf("skipping: the test bed needs namespaces and TUN devices: %v", err)
	}
	o := options{peers: 3, size: 3 << 20, mtu: 9000, offload: true, timeout: time.Minute, reps: 2}
	tb, err := wanemu.New(wanemu.Config{Sites: o.peers, MTU: o.mtu, Offload: o.offload,
		Link: wanemu.Link{Delay: 2 * time.Millisecond, CapacityMbit: 400, FlowMbit: 200}})
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Start(); err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	b := &bench{o: o, tb: tb}
	secret := make([]byte, 32)
	rand.Read(secret)
	perLink := uint64(2 * (o.peers - 1) * o.size / o.peers)
	port := 7100
	for _, name := range []string{"tcp", "tls", "quic"} {
		before := make([][]wanemu.LinkStats, o.peers)
		for i := range o.peers {
			before[i] = make([]wanemu.LinkStats, o.peers)
			for j := range o.peers {
				before[i][j] = tb.Stats(i, j)
			}
		}
		port += 2
		mbits, err := b.ceiling(name, secret, port, 3)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(mbits) != o.reps {
			t.Fatalf("%s: %d rates, want one per rep (%d)", name, len(mbits), o.reps)
		}
		for _, mbit := range mbits {
			if !(mbit > 0) {
				t.Fatalf("%s: ceilings %v Mbit/s", name, mbits)
			}
		}
		// The warm-up and every timed transfer move the link's bytes.
		for i := range o.peers {
			next := (i + 1) % o.peers
			if got, want := tb.Stats(i, next).Bytes-before[i][next].Bytes, uint64(1+o.reps)*perLink; got < want {
				t.Errorf("%s: link %d->%d carried %d bytes, want at least %d", name, i, next, got, want)
			}
		}
		t.Logf("%s: stream ceilings %v Mbit/s", name, mbits)
	}
}
