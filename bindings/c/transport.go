package main

/*
#include "impl.h"
*/
import "C"

import (
	"fmt"
	"strings"

	"github.com/concord-ccl/concord/internal/transport"
	"github.com/concord-ccl/concord/pccl"
)

// transportName checks a transport name given from C: tcp, tls or quic (any case; empty means tcp).
func transportName(name string) (string, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	switch n {
	case "", "tcp":
		return "tcp", nil
	case "tls", "quic":
		return n, nil
	}
	return "", fmt.Errorf("%w: transport %q (want tcp, tls or quic)", pccl.ErrInvalid, name)
}

// selectTransport builds the transport a communicator or master connects over. tls and quic are
// authenticated with the run secret, which they require; tcp uses the secret only as the run token.
func selectTransport(name string, secret []byte) (transport.Transport, error) {
	if name == "" {
		name = "tcp"
	}
	if name != "tcp" && len(secret) == 0 {
		return nil, fmt.Errorf("%w: transport %s needs the run secret: call concordSetSecret (concordMasterSetSecret for a master) first", pccl.ErrInvalid, name)
	}
	tr, err := transport.Select(name, transport.AuthConfig{Secret: secret})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", pccl.ErrInvalid, err)
	}
	return tr, nil
}

//export concordMasterSetTransport
func concordMasterSetTransport(p *C.pcclMasterInstance_t, name *C.char) C.pcclResult_t {
	return configureMaster(p, func(m *masterInst) error {
		n, err := transportName(goString(name))
		m.transport = n
		return err
	})
}
