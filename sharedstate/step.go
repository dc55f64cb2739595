package sharedstate

// StepTag is what a peer reports about where it was in training when a failure stopped the group.
type StepTag struct {
	// Step is the training step the peer was working on.
	Step uint64
	// InOptimizer is true once the peer passed the gradient-synchronization barrier that starts the
	// optimizer step of Step.
	InOptimizer bool
}

// resumeAt is the step this tag alone implies: a peer still in forward or backward has not changed
// its parameters and redoes Step; a peer in the optimizer step updates them, so the group goes on
// from Step+1 with the updated parameters.
func (t StepTag) resumeAt() uint64 {
	if t.InOptimizer {
		return t.Step + 1
	}
	return t.Step
}

// ResumeStep returns the step every peer resumes at after a failure, given the tags of the surviving
// peers (0 when there is none).
//
// A failure before the optimizer step of step i resumes at i: no parameter has changed. A failure in the
// optimizer step resumes at i+1: every surviving peer completes its update, and a replacement restores
// the updated parameters from them. Reports may be mixed, because peers do not all reach a phase at the
// same instant; they are resolved by taking the largest implied step. This is sound because the optimizer
// step begins with a barrier: if one peer reports (i, in optimizer), every peer has finished the backward
// pass of i, and those still reporting (i, not in optimizer) are about to enter the update as well; a
// peer that already reports (i+1, not in optimizer) finished the update of i. Peers whose state is older
// than the chosen step are brought forward by the shared-state sync.
func ResumeStep(tags []StepTag) uint64 {
	var s uint64
	for _, t := range tags {
		s = max(s, t.resumeAt())
	}
	return s
}
