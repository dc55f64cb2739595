package pccl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"
)

// The run goroutine and the ways into it: it owns the machine, feeds it every input in order and
// carries out its actions.

// request is one input for the run goroutine. reply, when set, is registered for the input's call
// before the machine sees it; abort, for a collective, stops its data path. An input read from a
// master connection carries the connection's generation (fromMaster, gen): run drops it once that
// connection has been replaced. conn is the connection a redialedIn names, which run keeps in its
// table under the input's connID until the machine adopts or drops it.
type request struct {
	in         input
	reply      chan reply
	abort      func(error)
	fromMaster bool
	gen        uint64
	conn       net.Conn
}

type callEntry struct {
	ch    chan reply // capacity 2: a collective gets a start and a final reply
	abort func(error)
}

// newCall returns a fresh call id and the channel its replies arrive on.
func (c *Communicator) newCall() (uint64, chan reply) {
	return c.nextCall.Add(1), make(chan reply, 2)
}

// submit hands r to the run goroutine, or returns why the communicator is dead.
func (c *Communicator) submit(r request) error {
	select {
	case c.reqs <- r:
		return nil
	case <-c.done:
		return c.fatal
	}
}

// post hands an input without a reply to the run goroutine; it is dropped once the communicator is
// closed.
func (c *Communicator) post(in input) {
	select {
	case c.reqs <- request{in: in}:
	case <-c.stop:
	}
}

// postFrom posts an input read from master connection generation gen.
func (c *Communicator) postFrom(gen uint64, in input) {
	select {
	case c.reqs <- request{in: in, fromMaster: true, gen: gen}:
	case <-c.stop:
	}
}

// await waits for the final reply to call. If ctx ends first the call is cancelled and ctx's error
// returned; if the communicator dies, its fatal error.
func (c *Communicator) await(ctx context.Context, call uint64, ch chan reply) (reply, error) {
	for {
		select {
		case r := <-ch:
			if r.start != nil {
				continue
			}
			return r, nil
		case <-c.done:
			select {
			case r := <-ch:
				if r.start == nil {
					return r, nil
				}
			default:
			}
			return reply{}, c.fatal
		case <-ctx.Done():
			c.post(cancelCall{call: call, reason: ctx.Err()})
			return reply{}, ctx.Err()
		}
	}
}

// ask submits in, registered for call, and waits for its final reply; the reply's error if any.
func (c *Communicator) ask(ctx context.Context, what string, call uint64, ch chan reply, in input) (reply, error) {
	if err := c.submit(request{in: in, reply: ch}); err != nil {
		return reply{}, err
	}
	r, err := c.await(ctx, call, ch)
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return r, fmt.Errorf("pccl: %s: %w", what, err)
		}
		return r, err
	}
	return r, r.err
}

// run owns the machine: it feeds it every input in order and carries out its actions.
func (c *Communicator) run(m *machine) {
	defer c.wg.Done()
	every := max(m.hbEvery/4, time.Millisecond)
	if every > 50*time.Millisecond {
		every = 50 * time.Millisecond
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		var in input
		select {
		case r := <-c.reqs:
			if r.reply != nil {
				if call := callOf(r.in); call != 0 {
					c.calls[call] = &callEntry{ch: r.reply, abort: r.abort}
				}
			}
			if r.fromMaster {
				if r.gen != c.gen {
					continue // from a master connection that was replaced
				}
				if _, ok := r.in.(masterIn); ok && !c.ctl.received() {
					continue // arrived on the connection before, then again on this one
				}
			}
			if rd, ok := r.in.(redialedIn); ok && r.conn != nil {
				c.conns[rd.conn] = r.conn
			}
			in = r.in
		case <-tick.C:
			in = tickIn{}
		case <-c.stop:
			for id, conn := range c.conns {
				conn.Close() // the machine never answered for it: it died first
				delete(c.conns, id)
			}
			return
		}
		now := time.Now()
		acts := m.step(now, in)
		c.publish(m) // before the replies: a call that returns sees the ring it brought about
		c.apply(m, now, acts)
		if cc, ok := in.(cancelCall); ok && !m.hasOp(cc.call) {
			delete(c.calls, cc.call) // nobody waits for its answer any more
		}
		c.publish(m)
	}
}

// publish stores the view accessors read when the machine's ring, epoch or stats changed.
func (c *Communicator) publish(m *machine) {
	if v := c.view.Load(); v.epoch != m.epoch || !slices.Equal(v.ring, m.ring) || v.run != m.run || v.optimize != m.opt.stats {
		c.view.Store(&view{epoch: m.epoch, ring: slices.Clone(m.ring), run: m.run, optimize: m.opt.stats})
	}
}

// apply carries out the machine's actions in order.
func (c *Communicator) apply(m *machine, now time.Time, acts []action) {
	for len(acts) > 0 {
		a := acts[0]
		acts = acts[1:]
		switch a := a.(type) {
		case sendAct:
			if err := c.write(now, a.msg); err != nil {
				acts = append(acts, m.step(now, writeFailed{err})...)
			}
		case replyAct:
			e := c.calls[a.r.call]
			if e == nil {
				continue
			}
			select {
			case e.ch <- a.r:
			default:
				c.log.Error("reply dropped: the call's channel is full", "call", a.r.call)
			}
			if a.r.start == nil {
				delete(c.calls, a.r.call)
			}
		case wireAct:
			replace(c.connects, a.m)
		case retireAct:
			c.links.Retire(a.ring)
		case abortAct:
			if e := c.calls[a.call]; e != nil && e.abort != nil {
				e.abort(a.err)
			}
		case tombstoneAct:
			c.links.Tombstone(a.seq)
		case measureAct:
			c.wg.Add(1)
			go func() {
				defer c.wg.Done()
				rate, lat := c.measure(c.life, a.r)
				c.post(measuredIn{round: a.r.Round, to: a.r.Target.ID, rate: rate, latency: lat})
			}()
		case dieAct:
			if a.err != ErrClosed {
				c.log.Warn("communicator failed", "err", a.err)
			}
			c.fatal = a.err
			close(c.done)
			c.endLife()
			c.masterConn().Close()
		case redialAct:
			c.wg.Add(1)
			go c.redial(a.resume)
		case adoptAct:
			conn := c.takeConn(a.conn)
			var err error
			if a.resumed {
				err = c.ctl.resume(conn, a.masterRecv, a.masterNext)
				c.log.Info("resumed the session with the master on a new connection")
			} else {
				c.ctl.start(a.session)
				c.log.Warn("the master restarted; reconnected with this peer's state")
			}
			c.masterMu.Lock()
			old := c.master
			c.master = conn
			c.masterMu.Unlock()
			old.Close()
			c.gen++
			if err != nil {
				acts = append(acts, m.step(now, writeFailed{err})...)
			}
			c.wg.Add(1)
			go c.readMaster(conn, c.gen)
		case callAct:
			c.wg.Add(1)
			go c.answer(a.call)
		case noticeAct:
			c.log.Warn("the master says: " + a.text)
		case dropConnAct:
			if conn := c.takeConn(a.conn); conn != nil {
				conn.Close()
			}
		}
	}
}

// takeConn removes connection id from run's table and returns it, nil if it is not there.
func (c *Communicator) takeConn(id connID) net.Conn {
	conn := c.conns[id]
	delete(c.conns, id)
	return conn
}

// replace puts v in a one-slot channel, dropping a stale value.
func replace[T any](ch chan T, v T) {
	for {
		select {
		case ch <- v:
			return
		default:
			select {
			case <-ch:
			default:
			}
		}
	}
}

// wiring answers the master's Connect requests: open the links of the new ring, then report.
func (c *Communicator) wiring() {
	defer c.wg.Done()
	for {
		select {
		case <-c.stop:
			return
		case m := <-c.connects:
			failed, err := c.links.Wire(m)
			if err != nil {
				c.log.Warn("wiring failed", "epoch", m.Epoch, "err", err)
			}
			c.post(wiredIn{epoch: m.Epoch, failed: failed, err: err})
		}
	}
}
