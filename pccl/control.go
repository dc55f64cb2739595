package pccl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/concord-ccl/concord/internal/wire"
)

// The control connection to the master: the handshake, the Hello and its Welcome, session
// resumption, the writer and the reader, and redials (reconnect.go has the protocol).

// hello runs the handshake on conn and introduces this peer (introduce).
func (c *Communicator) hello(ctx context.Context, conn net.Conn, resume *wire.Resume) (*wire.Welcome, wire.SessionID, error) {
	if err := c.handshake(ctx, conn); err != nil {
		return nil, wire.SessionID{}, err
	}
	return c.introduce(ctx, conn, resume)
}

// handshake runs the connection handshake with the master on conn.
func (c *Communicator) handshake(ctx context.Context, conn net.Conn) error {
	conn.SetDeadline(c.deadline(ctx))
	defer conn.SetDeadline(time.Time{})
	if err := wire.Exchange(conn, wire.KindControl); err != nil {
		if errors.Is(err, wire.ErrVersion) {
			return fmt.Errorf("pccl: master handshake: %w: %w: %w (peer and master come from different releases)", ErrKicked, ErrRefused, err)
		}
		return fmt.Errorf("pccl: master handshake: %w: %w", ErrMasterLost, err)
	}
	return nil
}

// deadline bounds one exchange with the master: MasterTimeout, or ctx's deadline if sooner.
func (c *Communicator) deadline(ctx context.Context) time.Time {
	deadline := time.Now().Add(c.cfg.MasterTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return deadline
}

// introduce sends this peer's Hello on conn, after the handshake, and returns the master's Welcome
// and the session it opens. resume, if set, reports what this peer holds to a master it reconnects to.
func (c *Communicator) introduce(ctx context.Context, conn net.Conn, resume *wire.Resume) (*wire.Welcome, wire.SessionID, error) {
	var sid wire.SessionID
	conn.SetDeadline(c.deadline(ctx))
	defer conn.SetDeadline(time.Time{})
	nics := c.cfg.NICs
	if c.site != nil {
		nics = c.site.addrs
	}
	h := &wire.Hello{Token: c.cfg.Token, Addr: c.adv, Site: c.cfg.Site, Peer: c.cfg.ID, Group: c.cfg.Group, NICs: nics, Resume: resume,
		Published: c.cfg.AdvertiseAddr != ""}
	if _, err := conn.Write(wire.AppendFrame(nil, h)); err != nil {
		return nil, sid, fmt.Errorf("pccl: send hello: %w: %w", ErrMasterLost, err)
	}
	for {
		msg, _, err := wire.ReadFrame(conn, 0, nil)
		if err != nil {
			return nil, sid, fmt.Errorf("pccl: waiting for welcome: %w: %w", ErrMasterLost, err)
		}
		switch m := msg.(type) {
		case *wire.SessionStart:
			sid = m.ID
		case *wire.Welcome:
			return m, sid, nil
		case *wire.Kick:
			return nil, sid, kickError(m)
		default:
			return nil, sid, fmt.Errorf("pccl: master answered hello with %T", msg)
		}
	}
}

// resumeSession asks the master on conn, after the handshake, to move this peer's session to it, and
// returns the master's answer.
func (c *Communicator) resumeSession(ctx context.Context, conn net.Conn, id wire.SessionID) (*wire.SessionResumed, error) {
	conn.SetDeadline(c.deadline(ctx))
	defer conn.SetDeadline(time.Time{})
	req := &wire.SessionResume{Token: c.cfg.Token, Peer: c.id, ID: id, Recv: c.ctl.recv.Load()}
	if _, err := conn.Write(wire.AppendFrame(nil, req)); err != nil {
		return nil, err
	}
	msg, _, err := wire.ReadFrame(conn, 0, nil)
	if err != nil {
		return nil, err
	}
	r, ok := msg.(*wire.SessionResumed)
	if !ok {
		return nil, fmt.Errorf("pccl: master answered a session resumption with %T", msg)
	}
	return r, nil
}

// write sends one message to the master, numbered in the session. A failure is the connection's:
// the session keeps the frame for the next one.
func (c *Communicator) write(now time.Time, msg wire.Message) error {
	b, err := c.ctl.frame(c.wbuf[:0], msg)
	c.wbuf = b
	if err != nil {
		return err
	}
	mc := c.masterConn()
	mc.SetWriteDeadline(now.Add(c.cfg.MasterTimeout))
	_, err = mc.Write(b)
	return err
}

// masterConn returns the master connection in use.
func (c *Communicator) masterConn() net.Conn {
	c.masterMu.Lock()
	defer c.masterMu.Unlock()
	return c.master
}

// readMaster posts the messages of master connection mc (generation gen) to run until it ends.
func (c *Communicator) readMaster(mc net.Conn, gen uint64) {
	defer c.wg.Done()
	var buf []byte
	for {
		msg, b, err := wire.ReadFrame(mc, 0, buf)
		buf = b
		if err != nil {
			c.postFrom(gen, masterLost{err})
			return
		}
		if a, ok := msg.(*wire.SessionAck); ok {
			c.ctl.ack(a.Recv)
			continue
		}
		c.postFrom(gen, masterIn{msg})
	}
}

// heldState is the shared state this peer holds after its last successful sync, for Resume reports.
type heldState struct {
	revision uint64
	digest   []byte // sharedstate.EncodeDigest
}

// redial dials the master once and resumes the session on the new connection; if the master does not
// know the session, it sends a Hello reporting resume and the shared state held. It posts the result
// to run. A connection that run no longer takes is closed.
func (c *Communicator) redial(resume *wire.Resume) {
	defer c.wg.Done()
	if h := c.held.Load(); h != nil {
		resume.Revision, resume.Digest = h.revision, h.digest
	}
	ctx, cancel := context.WithTimeout(c.life, c.cfg.DialTimeout)
	defer cancel()
	var res redialedIn
	conn, err := c.dialMaster(ctx, c.ln)
	if err == nil {
		err = c.handshake(ctx, conn)
	}
	if err == nil {
		if id, ok := c.ctl.ident(); ok {
			// The answer may take longer than a dial: a master that is paused answers when it runs
			// again, and once it has read the request it has moved the session here.
			var r *wire.SessionResumed
			r, err = c.resumeSession(c.life, conn, id)
			if err == nil && r.OK {
				res.resumed, res.masterRecv, res.masterNext = true, r.Recv, r.Next
			}
		}
		if err == nil && !res.resumed {
			res.welcome, res.session, err = c.introduce(ctx, conn, resume)
			if err == nil {
				c.rv.welcomed(res.welcome)
			}
		}
	}
	if err != nil {
		if conn != nil {
			conn.Close()
		}
		conn = nil
	}
	if conn != nil {
		res.conn = connID(c.nextConn.Add(1))
	}
	res.err, res.kicked = err, errors.Is(err, ErrKicked)
	select {
	case c.reqs <- request{in: res, conn: conn}:
	case <-c.stop:
		if conn != nil {
			conn.Close()
		}
	}
}
