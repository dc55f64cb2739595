package pccl

import "github.com/concord-ccl/concord/rdma/plan"

// SitePlanForTest returns the strategy of the last call c's intra-site tier ran by the planner ("" if
// none yet) and how many of its calls were planned.
func SitePlanForTest(c *Communicator) (string, uint64) {
	t := c.site
	if t == nil {
		return "", 0
	}
	last := ""
	if s := t.plans.last.Load(); s > 0 {
		last = plan.Strategy(s - 1).String()
	}
	return last, t.plans.planned.Load()
}
