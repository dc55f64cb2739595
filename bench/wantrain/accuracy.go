package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/concord-ccl/concord/diloco"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// The accuracy runs. The WAN runs move the bytes of a 256 MiB model whose inner steps are sleeps,
// which says nothing of what the algorithms do to a model's quality; so every configuration is also
// trained for real: the Fashion-MNIST MLP of package diloco, on the full data set, by the same number
// of peers with the same trainer settings (H, fragments, delay, mixing, compression), for a fixed
// budget of inner steps, on the in-memory network (which moves the same bytes, only without delay),
// and its test accuracy taken.

// accRun trains cfg with peers peers on train for real and returns the test accuracy of the final
// parameters, after checking that every peer ends with the same ones.
func accRun(ctx context.Context, cfg diloco.TrainerConfig, peers int, train, test *diloco.Dataset) (float64, error) {
	net := pccl.NewNetwork()
	ln, err := net.Host("master").Listen("master:7000")
	if err != nil {
		return 0, err
	}
	srv := master.NewServer(master.ServerConfig{Config: master.Config{HeartbeatInterval: 200 * time.Millisecond, HeartbeatTimeout: 10 * time.Second}})
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(sctx, ln) }()
	defer func() { stop(); <-served }()

	cfg.MinWorld = peers
	sums := make([]diloco.Summary, peers)
	errs := make([]error, peers)
	var wg sync.WaitGroup
	for i := range peers {
		host := fmt.Sprintf("peer%d", i)
		wg.Go(func() {
			comm, err := pccl.Connect(ctx, pccl.Config{Master: "master:7000", ListenAddr: host + ":9000",
				Transport: net.Host(host), MasterTimeout: time.Minute, ProgressTimeout: time.Minute})
			if err != nil {
				errs[i] = err
				return
			}
			defer comm.Close()
			sums[i], errs[i] = diloco.Run(ctx, comm, cfg, train, test)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	for i := range sums[1:] {
		if !slices.Equal(sums[i+1].Params, sums[0].Params) {
			return 0, fmt.Errorf("peers 0 and %d end with different parameters", i+1)
		}
	}
	return sums[0].TestAccuracy, nil
}

// accuracies runs accRun for every configuration and reports progress on stderr.
func accuracies(ctx context.Context, o *options, cfgs map[string]diloco.TrainerConfig) (map[string]float64, error) {
	train, test, err := diloco.LoadDir(o.dataDir)
	if err != nil {
		return nil, fmt.Errorf("the full Fashion-MNIST set (install Debian's dataset-fashion-mnist, or name its directory with --data-dir): %w", err)
	}
	out := map[string]float64{}
	for _, name := range o.configs {
		cfg := cfgs[name]
		// The same budget of inner steps for every kind: DDP takes one per outer step.
		cfg.Steps = o.accOuter
		if cfg.Kind == diloco.KindDDP {
			cfg.Steps = o.accOuter * o.h
		}
		t0 := time.Now()
		acc, err := accRun(ctx, cfg, o.accPeers, train, test)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		fmt.Fprintf(os.Stderr, "wantrain: %s on Fashion-MNIST: test accuracy %.4f (%v)\n", name, acc, time.Since(t0).Round(time.Second))
		out[name] = acc
	}
	return out, nil
}
