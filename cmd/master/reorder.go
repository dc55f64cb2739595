package main

import (
	"github.com/urfave/cli/v2"

	"github.com/concord-ccl/concord/pccl/master"
)

// reorderFlags switch and pace the master's policy of re-ordering a ring around a slow link on its
// own (master.ReorderPolicy).
func reorderFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "reorder", Value: true, EnvVars: []string{"CONCORD_REORDER"},
			Usage: "re-order a group's ring around a clearly slow link on its own, with no OptimizeTopology call; false: a slow link only costs more at the next OptimizeTopology"},
		&cli.DurationFlag{Name: "reorder-interval", EnvVars: []string{"CONCORD_REORDER_INTERVAL"},
			Usage: "least time between two re-orderings of one group", DefaultText: "1m"},
	}
}

// applyReorder sets the re-ordering policy of cfg from the flags of reorderFlags.
func applyReorder(cc *cli.Context, cfg *master.Config) {
	cfg.Diagnosis.Reorder.Off = !cc.Bool("reorder")
	cfg.Diagnosis.Reorder.Interval = cc.Duration("reorder-interval")
}
