package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/concord-ccl/concord/diloco"
	"github.com/concord-ccl/concord/internal/cluster"
	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/sharedstate"
)

// Environment of the peer role.
const (
	rolePeer  = "peer"
	envMaster = "CONCORD_BENCH_MASTER"
	envParams = "CONCORD_BENCH_PARAMS"
)

// params is what every peer is told, as JSON in envParams.
type params struct {
	Kind      string        `json:"kind"`
	H         int           `json:"h"`
	Batch     int           `json:"batch"`
	Steps     int           `json:"steps"` // outer steps of the run
	Seed      uint64        `json:"seed"`
	Full      bool          `json:"full"`
	OutDir    string        `json:"out_dir"` // where a finished peer writes its final parameters
	Lifetime  time.Duration `json:"lifetime"`
	InnerLR   float32       `json:"inner_lr"`
	OuterLR   float32       `json:"outer_lr"`
	OuterMom  float32       `json:"outer_momentum"`
	MinWorld  int           `json:"min_world"`
	RetryWait time.Duration `json:"retry_wait"`
}

// peerEvent is every line a peer prints.
type peerEvent struct {
	Event     string  `json:"event"` // "connected", "step", "done", "error"
	Step      uint64  `json:"step,omitempty"`
	Loss      float32 `json:"loss,omitempty"`
	World     int     `json:"world,omitempty"`
	Revision  uint64  `json:"revision,omitempty"`
	State     string  `json:"state,omitempty"` // hash of the shared-state digest after the step
	Reduced   int64   `json:"bytes_reduced"`
	Fetched   int64   `json:"bytes_fetched"`
	Samples   int64   `json:"samples,omitempty"`
	Aborts    int     `json:"aborts,omitempty"`
	Joins     int     `json:"joins,omitempty"`
	Dropped   int     `json:"dropped,omitempty"`
	LocalStep int     `json:"local_steps,omitempty"`
	Params    string  `json:"params,omitempty"` // done: file with the final parameters
	Detail    string  `json:"detail,omitempty"`
}

// stateHash folds a digest into one value: the revision and every entry's
// hash, in name order.
func stateHash(d sharedstate.Digest) string {
	h := d.Revision
	for _, e := range d.Entries {
		h = (h ^ e.Hash) * 0x100000001b3
	}
	return fmt.Sprintf("%016x", h)
}

// peerMain is the peer role: connect, train, write the final parameters.
func peerMain() int {
	if err := peer(); err != nil {
		cluster.Emit(peerEvent{Event: "error", Detail: err.Error()})
		fmt.Fprintln(os.Stderr, "peer:", err)
		return 1
	}
	return 0
}

func peer() error {
	var p params
	if err := json.Unmarshal([]byte(os.Getenv(envParams)), &p); err != nil {
		return fmt.Errorf("%s: %w", envParams, err)
	}
	kind, err := diloco.ParseKind(p.Kind)
	if err != nil {
		return err
	}
	train, _, err := loadData(p.Full)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.Lifetime)
	defer cancel()
	log := cluster.Logger()
	comm, err := pccl.Connect(ctx, pccl.Config{Master: os.Getenv(envMaster), Logger: log})
	if err != nil {
		return err
	}
	defer comm.Close()
	cluster.Emit(peerEvent{Event: "connected", World: comm.WorldSize()})
	cfg := diloco.TrainerConfig{
		Kind: kind, H: p.H, BatchSize: p.Batch, Seed: p.Seed, Steps: p.Steps,
		Inner:     diloco.AdamWConfig{LR: p.InnerLR},
		Outer:     diloco.NesterovConfig{LR: p.OuterLR, Momentum: p.OuterMom},
		MinWorld:  p.MinWorld,
		RetryWait: p.RetryWait,
		Logger:    log,
		Progress: func(pr diloco.Progress) {
			cluster.Emit(peerEvent{
				Event: "step", Step: pr.Step, Loss: pr.Loss, World: pr.World, Revision: pr.Revision,
				State: stateHash(pr.Digest), Reduced: pr.BytesReduced, Fetched: pr.BytesFetched,
				Aborts: pr.Aborts, Joins: pr.Joins,
			})
		},
	}
	sum, err := diloco.Run(ctx, comm, cfg, train, nil)
	if err != nil {
		return err
	}
	path := filepath.Join(p.OutDir, cluster.Name()+".params")
	if err := os.WriteFile(path, encodeParams(sum.Params), 0o644); err != nil {
		return err
	}
	return cluster.Emit(peerEvent{
		Event: "done", Step: sum.Steps, State: stateHash(sum.Digest), Reduced: sum.BytesReduced, Fetched: sum.BytesFetched,
		Samples: sum.Samples, Aborts: sum.Aborts, Joins: sum.Joins, Dropped: sum.Dropped, LocalStep: sum.LocalSteps, Params: path,
	})
}

// loadData returns the full data set (an error if it is not installed) or the
// embedded subset.
func loadData(full bool) (train, test *diloco.Dataset, err error) {
	if !full {
		return diloco.LoadEmbedded()
	}
	dir := diloco.DefaultDir()
	if _, err := os.Stat(dir); err != nil {
		return nil, nil, fmt.Errorf("--full: the Fashion-MNIST data set is not installed in %s (apt-get install dataset-fashion-mnist): %w", dir, err)
	}
	train, test, err = diloco.LoadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("--full: %w", err)
	}
	return train, test, nil
}

// encodeParams writes v as little-endian float32s.
func encodeParams(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

// decodeParams reads what encodeParams wrote.
func decodeParams(b []byte) ([]float32, error) {
	if len(b) != 4*diloco.NumParams {
		return nil, fmt.Errorf("parameter file of %d bytes, want %d", len(b), 4*diloco.NumParams)
	}
	v := make([]float32, diloco.NumParams)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v, nil
}
