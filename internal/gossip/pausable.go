package gossip

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// errPaused is returned to dials while a member is paused.
var errPaused = errors.New("gossip: member paused")

// pausable wraps memberlist's network transport so that a member can play a hung process: while
// paused it drops every packet in and out and refuses every stream. Two forwarder goroutines (started
// here, ended by Shutdown) move packets and streams from the inner transport.
type pausable struct {
	memberlist.Transport
	paused  atomic.Bool
	packets chan *memberlist.Packet
	streams chan net.Conn
	stop    chan struct{}
	once    sync.Once
}

func newPausable(inner memberlist.Transport) *pausable {
	p := &pausable{Transport: inner, packets: make(chan *memberlist.Packet), streams: make(chan net.Conn),
		stop: make(chan struct{})}
	go p.forwardPackets()
	go p.forwardStreams()
	return p
}

func (p *pausable) forwardPackets() {
	in := p.Transport.PacketCh()
	for {
		select {
		case pk := <-in:
			if p.paused.Load() {
				continue
			}
			select {
			case p.packets <- pk:
			case <-p.stop:
				return
			}
		case <-p.stop:
			return
		}
	}
}

func (p *pausable) forwardStreams() {
	in := p.Transport.StreamCh()
	for {
		select {
		case c := <-in:
			if p.paused.Load() {
				c.Close()
				continue
			}
			select {
			case p.streams <- c:
			case <-p.stop:
				c.Close()
				return
			}
		case <-p.stop:
			return
		}
	}
}

// PacketCh returns the packets received while not paused.
func (p *pausable) PacketCh() <-chan *memberlist.Packet { return p.packets }

// StreamCh returns the streams accepted while not paused.
func (p *pausable) StreamCh() <-chan net.Conn { return p.streams }

// WriteTo sends b, or silently drops it while paused.
func (p *pausable) WriteTo(b []byte, addr string) (time.Time, error) {
	if p.paused.Load() {
		return time.Now(), nil
	}
	return p.Transport.WriteTo(b, addr)
}

// DialTimeout opens a stream, or fails while paused.
func (p *pausable) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if p.paused.Load() {
		return nil, errPaused
	}
	return p.Transport.DialTimeout(addr, timeout)
}

// Shutdown stops the forwarders and the inner transport.
func (p *pausable) Shutdown() error {
	var err error
	p.once.Do(func() {
		close(p.stop)
		// The inner transport's listeners may be blocked handing over a packet or a stream that no
		// forwarder takes any more, and its Shutdown waits for them: drain until it returns.
		shut := make(chan struct{})
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			in, streams := p.Transport.PacketCh(), p.Transport.StreamCh()
			for {
				select {
				case <-in:
				case c := <-streams:
					if c != nil {
						c.Close()
					}
				case <-shut:
					return
				}
			}
		}()
		err = p.Transport.Shutdown()
		close(shut)
		<-drained
	})
	return err
}
