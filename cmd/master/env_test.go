package main

import (
	"testing"

	"github.com/concord-ccl/concord/deploy"
)

// TestDeployEnv: every CONCORD_ variable the example manifests set on a master container is one the
// command reads, so the manifests cannot drift from the flags.
func TestDeployEnv(t *testing.T) {
	n, err := deploy.CheckEnv(deploy.Manifests, app())
	if err != nil {
		t.Fatalf("manifests under deploy/:\n%v", err)
	}
	if n == 0 {
		t.Fatal("no manifest in deploy/ runs master")
	}
}
