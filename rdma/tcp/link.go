package tcp

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/concord-ccl/concord/rdma"
)

// linkHealth maps an interface's flags to a NIC's health: up with a carrier is Healthy.
func linkHealth(l netlink.Link) rdma.Health {
	a := l.Attrs()
	if a.Flags&net.FlagUp != 0 && a.RawFlags&unix.IFF_LOWER_UP != 0 {
		return rdma.Healthy
	}
	return rdma.Down
}

// watchLinks reads every NIC's link state, then subscribes to link updates in the endpoint's namespace
// (the analogue of an RDMA port event) and starts the goroutine that applies them.
func (e *Endpoint) watchLinks() error {
	h, err := netlink.NewHandleAt(e.ns)
	if err != nil {
		return fmt.Errorf("tcp: netlink: %w", err)
	}
	defer h.Close()
	for i, n := range e.cfg.NICs {
		l, err := h.LinkByName(n.Interface)
		if err != nil {
			return fmt.Errorf("tcp: nic%d (%s): %w", i, n.Interface, err)
		}
		e.health[i] = linkHealth(l)
	}
	updates := make(chan netlink.LinkUpdate, 64)
	failed := make(chan error, 1)
	ns := e.ns
	err = netlink.LinkSubscribeWithOptions(updates, e.done, netlink.LinkSubscribeOptions{
		Namespace:    &ns,
		ListExisting: true,
		ErrorCallback: func(err error) {
			select {
			case failed <- err:
			default:
			}
		},
	})
	if err != nil {
		return fmt.Errorf("tcp: link subscription: %w", err)
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		failed := failed // the callback keeps sending on the outer one; this one is set to nil
		for {
			select {
			case u, ok := <-updates:
				if !ok {
					return
				}
				health := linkHealth(u.Link)
				if u.Header.Type == unix.RTM_DELLINK {
					health = rdma.Down
				}
				e.setHealth(u.Link.Attrs().Name, health)
			case <-failed:
				// The subscription reported an error (it may have ended): from then on socket errors
				// alone tell about failures. Nothing is marked down on a guess.
				failed = nil
			case <-e.done:
				for range updates { // the library closes updates once done is closed
				}
				return
			}
		}
	}()
	return nil
}

// setHealth applies a link-state change of interface name: every NIC on it changes health, and on
// Down every data and control connection of that NIC fails at once with rdma.ErrNICDown, as RDMA
// queue pairs do on a port error. Probe connections stay: a Probe on them reports ErrNICDown.
func (e *Endpoint) setHealth(name string, h rdma.Health) {
	var changed []rdma.NICID
	var victims []*conn
	e.mu.Lock()
	for i, n := range e.cfg.NICs {
		if n.Interface != name || e.health[i] == h {
			continue
		}
		e.health[i] = h
		changed = append(changed, rdma.NICID(i))
		if h == rdma.Down {
			for c := range e.conns {
				if c.spec.Local == rdma.NICID(i) && c.spec.Class != rdma.ProbeClass {
					victims = append(victims, c)
				}
			}
		}
	}
	e.mu.Unlock()
	for _, nic := range changed {
		e.loop.emit(rdma.PortChanged{NIC: nic, Health: h})
	}
	for _, c := range victims {
		c.fail(fmt.Errorf("tcp: %v: interface %s: %w", c.spec, name, rdma.ErrNICDown))
	}
}
