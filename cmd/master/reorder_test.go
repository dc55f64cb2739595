package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/concord-ccl/concord/pccl/master"
)

// reorderConfig runs the command's flag parsing on args and returns the re-ordering policy it sets,
// and the error of the config's Validate.
func reorderConfig(t *testing.T, args ...string) (master.ReorderPolicy, error) {
	t.Helper()
	a := app()
	var cfg master.Config
	a.Action = func(cc *cli.Context) error {
		cfg = master.LAN()
		applyReorder(cc, &cfg)
		return nil
	}
	if err := a.Run(append([]string{"master"}, args...)); err != nil {
		t.Fatalf("master %v: %v", args, err)
	}
	return cfg.Diagnosis.Reorder, cfg.Validate()
}

func TestReorderFlags(t *testing.T) {
	for _, v := range []string{"CONCORD_REORDER", "CONCORD_REORDER_INTERVAL"} {
		t.Setenv(v, "") // restored after the test
		os.Unsetenv(v)
	}
	if p, err := reorderConfig(t); p.Off || p.Interval != 0 || err != nil {
		t.Errorf("default: %+v, %v; want on with the default interval", p, err)
	}
	if p, _ := reorderConfig(t, "--reorder=false"); !p.Off {
		t.Errorf("--reorder=false: %+v, want off", p)
	}
	if p, _ := reorderConfig(t, "--reorder-interval", "5m"); p.Off || p.Interval != 5*time.Minute {
		t.Errorf("--reorder-interval 5m: %+v", p)
	}
	if _, err := reorderConfig(t, "--reorder-interval", "-1s"); err == nil || !strings.Contains(err.Error(), "Reorder.Interval") {
		t.Errorf("--reorder-interval -1s: Validate = %v, want an error naming Reorder.Interval", err)
	}
}

func TestReorderEnv(t *testing.T) {
	t.Setenv("CONCORD_REORDER", "false")
	t.Setenv("CONCORD_REORDER_INTERVAL", "30s")
	if p, _ := reorderConfig(t); !p.Off || p.Interval != 30*time.Second {
		t.Errorf("CONCORD_REORDER=false CONCORD_REORDER_INTERVAL=30s: %+v", p)
	}
	// The flag wins over its environment twin.
	if p, _ := reorderConfig(t, "--reorder=true"); p.Off {
		t.Errorf("--reorder=true over CONCORD_REORDER=false: %+v, want on", p)
	}
}
