package pccl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/concord-ccl/concord/pccl/master"
)

// TestOnePrefix checks that an error the API returns names the package once, whatever the layers of
// context around it, and that errors.Is still sees the sentinel.
func TestOnePrefix(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("pccl: allreduce tag 1: %w", fmt.Errorf("pccl: %w: no heartbeat for 4s", ErrKicked)),
			"pccl: allreduce tag 1: kicked by the master: no heartbeat for 4s"},
		{fmt.Errorf("pccl: allreduce tag 2 seq 5: %w: peer 3: link failed", ErrPeerLeft),
			"pccl: allreduce tag 2 seq 5: a peer left: peer 3: link failed"},
		{errors.Join(fmt.Errorf("pccl: allreduce tag 1: %w", ErrAborted), context.Canceled),
			"pccl: allreduce tag 1: operation aborted\ncontext canceled"},
		{context.DeadlineExceeded, "pccl: context deadline exceeded"},
		{ErrClosed, "pccl: communicator closed"},
	} {
		got := cleanError(c.err)
		if got.Error() != c.want {
			t.Errorf("%q: got %q, want %q", c.err, got, c.want)
		}
		if !errors.Is(got, c.err) {
			t.Errorf("%q: errors.Is lost the original", c.err)
		}
		if cleanError(got) != got {
			t.Errorf("%q: cleaned twice", c.err)
		}
	}
	if cleanError(nil) != nil {
		t.Error("nil became an error")
	}
}

// TestErrorsNameThePackageOnce checks errors users see: no master at the address, and a master that
// refuses the run token.
func TestErrorsNameThePackageOnce(t *testing.T) {
	defer goleak.VerifyNone(t)
	_, err := Connect(context.Background(), Config{Master: "127.0.0.1:1", MasterTimeout: 200 * time.Millisecond})
	if err == nil || strings.Count(err.Error(), "pccl: ") != 1 || !errors.Is(err, ErrMasterLost) {
		t.Errorf("connect to nobody: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := master.NewServer(master.ServerConfig{Config: master.Config{Token: "right"}})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	defer func() {
		cancel()
		<-served
	}()
	_, err = Connect(ctx, Config{Master: ln.Addr().String(), Token: "wrong"})
	if err == nil || strings.Count(err.Error(), "pccl: ") != 1 || !errors.Is(err, ErrKicked) || !strings.Contains(err.Error(), "token") {
		t.Errorf("wrong token: %v", err)
	}
}
