package main

/*
#include "impl.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime/cgo"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/pccl/master"
)

// masterInst is the Go side of a pcclMasterInstance_t: a master.Server served in the background.
type masterInst struct {
	addr      string
	cfg       master.Config
	transport string // "tcp", "tls" or "quic"; empty means tcp
	secret    []byte // authenticates tls and quic
	preset    string // the timing preset in force, which also picks the gossip preset
	gossip    string // where the gossip member binds; "" is off

	mu      sync.Mutex
	ln      net.Listener
	stop    context.CancelFunc
	done    chan struct{} // closed when Serve returned
	running bool
	srv     *master.Server
}

// masterOf returns the master behind a C handle.
func masterOf(p *C.pcclMasterInstance_t) (*masterInst, error) {
	if p == nil {
		return nil, errNull("master instance")
	}
	h := cgo.Handle(p.handle)
	if h == 0 {
		return nil, errUnknownHandle
	}
	m, ok := h.Value().(*masterInst)
	if !ok {
		return nil, errUnknownHandle
	}
	return m, nil
}

//export pcclCreateMaster
func pcclCreateMaster(addr C.ccoip_socket_address_t, out **C.pcclMasterInstance_t) C.pcclResult_t {
	if out == nil {
		return fail(C.pcclInvalidArgument, errNull("p_master_handle_out"))
	}
	s, err := addrString(&addr)
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	m := &masterInst{addr: s, preset: "pccl"}
	m.cfg.HeartbeatInterval, m.cfg.HeartbeatTimeout, _ = masterPreset("pccl")
	p := (*C.pcclMasterInstance_t)(C.calloc(1, C.sizeof_struct_pcclMasterInstanceState_t))
	p.handle = C.uintptr_t(cgo.NewHandle(m))
	*out = p
	return C.pcclSuccess
}

//export pcclRunMaster
func pcclRunMaster(p *C.pcclMasterInstance_t) C.pcclResult_t {
	m, err := masterOf(p)
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// As in PCCL, every failure to launch is pcclInvalidUsage: a second run, or a port that
	// cannot be bound.
	if m.done != nil {
		return fail(C.pcclInvalidUsage, errors.New("pccl: the master already ran"))
	}
	if err := m.cfg.Validate(); err != nil {
		return fail(C.pcclInvalidUsage, err)
	}
	tr, err := selectTransport(m.transport, m.secret)
	if err != nil {
		return fail(C.pcclInvalidUsage, err)
	}
	ln, err := tr.Listen(m.addr)
	if err != nil {
		return fail(C.pcclInvalidUsage, fmt.Errorf("pccl: master: listen on %s: %w", m.addr, err))
	}
	ctx, stop := context.WithCancel(context.Background())
	sc := master.ServerConfig{Config: m.cfg}
	if m.gossip != "" {
		g := master.GossipLAN()
		if m.preset == "wan" {
			g = master.GossipWAN()
		}
		g.BindAddr = m.gossip
		sc.Gossip = &g
	}
	srv := master.NewServer(sc)
	m.ln, m.stop, m.done, m.running, m.srv = ln, stop, make(chan struct{}), true, srv
	go func(done chan struct{}) {
		defer close(done)
		srv.Serve(ctx, ln)
	}(m.done)
	return C.pcclSuccess
}

// pcclInterruptMaster stops a master that runs; interrupting it again does nothing, as in PCCL.
//
//export pcclInterruptMaster
func pcclInterruptMaster(p *C.pcclMasterInstance_t) C.pcclResult_t {
	m, err := masterOf(p)
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stop == nil {
		return fail(C.pcclInvalidUsage, errors.New("pccl: the master is not running"))
	}
	m.stop()
	return C.pcclSuccess
}

//export pcclMasterAwaitTermination
func pcclMasterAwaitTermination(p *C.pcclMasterInstance_t) C.pcclResult_t {
	m, err := masterOf(p)
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	m.mu.Lock()
	done := m.done
	m.mu.Unlock()
	if done == nil {
		return fail(C.pcclInvalidUsage, errors.New("pccl: the master never ran"))
	}
	<-done
	m.mu.Lock()
	m.running = false
	m.mu.Unlock()
	return C.pcclSuccess
}

//export pcclDestroyMaster
func pcclDestroyMaster(p *C.pcclMasterInstance_t) C.pcclResult_t {
	m, err := masterOf(p)
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	m.mu.Lock()
	running := m.running
	m.mu.Unlock()
	if running {
		return fail(C.pcclInvalidUsage, errors.New("pccl: destroy a master only after pcclMasterAwaitTermination"))
	}
	cgo.Handle(p.handle).Delete()
	p.handle = 0
	C.free(unsafe.Pointer(p))
	return C.pcclSuccess
}

// configureMaster applies f to a master that has not run yet.
func configureMaster(p *C.pcclMasterInstance_t, f func(m *masterInst) error) C.pcclResult_t {
	m, err := masterOf(p)
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done != nil {
		return fail(C.pcclInvalidUsage, errors.New("pccl: the master already runs"))
	}
	if err := f(m); err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	return C.pcclSuccess
}

//export concordMasterSetPreset
func concordMasterSetPreset(p *C.pcclMasterInstance_t, preset *C.char) C.pcclResult_t {
	return configureMaster(p, func(m *masterInst) error {
		interval, timeout, err := masterPreset(goString(preset))
		if err != nil {
			return err
		}
		m.cfg.HeartbeatInterval, m.cfg.HeartbeatTimeout = interval, timeout
		m.preset = goString(preset)
		return nil
	})
}

//export concordMasterSetSecret
func concordMasterSetSecret(p *C.pcclMasterInstance_t, secret *C.char) C.pcclResult_t {
	return configureMaster(p, func(m *masterInst) error {
		m.cfg.Token, m.secret = goString(secret), []byte(goString(secret))
		return nil
	})
}

//export concordMasterGetPort
func concordMasterGetPort(p *C.pcclMasterInstance_t, out *C.uint16_t) C.pcclResult_t {
	m, err := masterOf(p)
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	if out == nil {
		return fail(C.pcclInvalidArgument, errNull("port_out"))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ln == nil {
		return fail(C.pcclInvalidUsage, errors.New("pccl: the master is not running"))
	}
	_, port, _ := net.SplitHostPort(m.ln.Addr().String())
	n, _ := strconv.Atoi(port)
	*out = C.uint16_t(n)
	return C.pcclSuccess
}

//export concordMasterSetGossip
func concordMasterSetGossip(p *C.pcclMasterInstance_t, bind *C.char) C.pcclResult_t {
	return configureMaster(p, func(m *masterInst) error {
		addr := goString(bind)
		if addr != "" {
			if _, _, err := net.SplitHostPort(addr); err != nil {
				return fmt.Errorf("%w: gossip address %q: %v", pccl.ErrInvalid, addr, err)
			}
		}
		m.gossip = addr
		return nil
	})
}

//export concordMasterGetGossipAddress
func concordMasterGetGossipAddress(p *C.pcclMasterInstance_t, buf *C.char, n C.size_t) C.pcclResult_t {
	m, err := masterOf(p)
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	if buf == nil {
		return fail(C.pcclInvalidArgument, errNull("buf"))
	}
	m.mu.Lock()
	srv := m.srv
	m.mu.Unlock()
	if srv == nil {
		return fail(C.pcclInvalidUsage, errors.New("pccl: the master is not running"))
	}
	// Serve starts the gossip member before it accepts anyone; a few seconds is plenty.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr, err := srv.GossipAddr(ctx)
	if err != nil || addr == "" {
		return fail(C.pcclInvalidUsage, errors.New("pccl: the master runs no gossip detector (concordMasterSetGossip)"))
	}
	if int(n) < len(addr)+1 {
		return fail(C.pcclInvalidArgument, fmt.Errorf("%w: the gossip address needs %d bytes, buf has %d", pccl.ErrInvalid, len(addr)+1, n))
	}
	out := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	out[copy(out, addr)] = 0
	return C.pcclSuccess
}

//export concordMasterSetGuard
func concordMasterSetGuard(p *C.pcclMasterInstance_t, nonFinite C.bool, normFactor C.double, exclude C.bool) C.pcclResult_t {
	return configureMaster(p, func(m *masterInst) error {
		g := master.GuardPolicy{RejectNonFinite: bool(nonFinite), NormFactor: float64(normFactor), Exclude: bool(exclude)}
		c := m.cfg
		c.Guard = g
		if err := c.Validate(); err != nil {
			return fmt.Errorf("%w: %w", pccl.ErrInvalid, err)
		}
		m.cfg.Guard = g
		return nil
	})
}
