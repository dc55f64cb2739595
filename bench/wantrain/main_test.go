package main

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/diloco"
	"github.com/concord-ccl/concord/internal/wanemu"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestAccuracyRun trains streaming DiLoCo with compression for real on the embedded subset: every peer
// ends with the same parameters, and they learn.
func TestAccuracyRun(t *testing.T) {
	train, test, err := diloco.LoadEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	cfg := diloco.TrainerConfig{Kind: diloco.KindStreamingDiLoCo, H: 12, Fragments: 4, SyncDelay: 2, Mix: 0.5,
		BatchSize: 16, Steps: 5, Compression: diloco.Compression{Values: diloco.Int4, TopK: 0.05}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acc, err := accRun(ctx, cfg, 2, train, test)
	if err != nil {
		t.Fatal(err)
	}
	if acc < 0.5 {
		t.Fatalf("test accuracy %v after training", acc)
	}
}

// TestBenchSmall runs the WAN runs on a small model with short steps: every configuration's peers
// hold identical state after every outer step, the compressed syncs move fewer bytes than the
// others, and the churn run's survivors retry and its newcomer joins.
func TestBenchSmall(t *testing.T) {
	if err := wanemu.Available(); err != nil {
		t.Skipf("skipping: the WAN runs need namespaces and TUN devices: %v", err)
	}
	o := &options{model: 4 << 20, stepMs: 10, h: 8, fragments: 2, syncDelay: 4, mix: 0.5, values: diloco.Int4, topk: 0.05,
		ddpSteps: 3, outer: 3, linkMbit: 1000, rtts: [3]time.Duration{4 * time.Millisecond, 6 * time.Millisecond, 8 * time.Millisecond},
		configs: names, churn: true, churnModel: 1 << 20, accOuter: 1, accPeers: 2, batch: 8, wan: true, timeout: 3 * time.Minute}
	res, err := run(o)
	if err != nil {
		t.Fatal(err)
	}
	if !res.BitIdentical || res.Churn == nil || !res.Churn.BitIdentical {
		t.Fatalf("bit-identical %v, churn %+v", res.BitIdentical, res.Churn)
	}
	by := map[string]*config{}
	for _, c := range res.Configs {
		by[c.Name] = c
		if c.ComputeUtilization <= 0 || c.ComputeUtilization > 1 || c.WANBytesPerInner <= 0 {
			t.Fatalf("%s: utilization %v, %v WAN bytes per inner step", c.Name, c.ComputeUtilization, c.WANBytesPerInner)
		}
	}
	if len(by) != len(names) {
		t.Fatalf("configurations %v", res.Configs)
	}
	if sc, s := by["streaming-compressed"], by["streaming"]; sc.WANBytesPerInner >= s.WANBytesPerInner/4 || *sc.WANBytesVsDDP >= 1 {
		t.Fatalf("compressed syncs moved %v bytes per inner step, uncompressed %v", sc.WANBytesPerInner, s.WANBytesPerInner)
	}
	for _, a := range res.Churn.SurvivorAbort {
		if a == 0 {
			t.Fatalf("a survivor saw no failed fragment: %+v", res.Churn)
		}
	}
}
