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
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/concord-ccl/concord/pccl"
	"github.com/concord-ccl/concord/rings"
)

// comm is the Go side of a pcclComm_t. Any C thread may call into it; mu serializes the calls that
// change membership (update topology, sync, optimize, the re-wire after a failure) with the launch
// and completion of all-reduces, which is the "no collective in flight" rule of those calls.
type comm struct {
	group uint32 // the peer group given at creation, forwarded as pccl.Config.Group
	ctx   context.Context
	stop  context.CancelFunc // cancels ctx: pcclDestroyCommunicator ends blocked calls

	mu       sync.Mutex // guards the fields below
	cfg      pccl.Config
	c        *pccl.Communicator // nil until connected
	ops      map[uint64]*pending
	dirty    bool // a collective failed because a peer left: re-wire before the next one
	explicit struct{ pool bool }
	// transport names the transport the communicator connects over ("tcp", "tls" or "quic"; empty
	// means tcp) and secret is the run secret that authenticates tls and quic.
	transport string
	secret    []byte
	// preset names the timing preset in force ("pccl" until concordSetPreset), which also picks the
	// gossip preset; gossipBind is where the gossip member binds ("" derives it).
	preset     string
	gossipBind string
}

// pending is an async all-reduce launched and not yet awaited, with the ring it was launched on.
type pending struct {
	req         *pccl.Request
	desc        pccl.Desc
	rank, world int
}

// commOf returns the comm behind a C handle.
func commOf(p *C.pcclComm_t) (*comm, error) {
	if p == nil {
		return nil, errNull("communicator")
	}
	h := cgo.Handle(p.handle)
	if h == 0 {
		return nil, errUnknownHandle
	}
	c, ok := h.Value().(*comm)
	if !ok {
		return nil, errUnknownHandle
	}
	return c, nil
}

// connected returns the communicator of a connected comm.
func (c *comm) connected() (*pccl.Communicator, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c == nil {
		return nil, errors.New("pccl: communicator is not connected")
	}
	return c.c, nil
}

// liveComm checks initialization and returns the connected communicator behind p, or a result code.
func liveComm(p *C.pcclComm_t) (*comm, *pccl.Communicator, C.pcclResult_t) {
	if !initialized.Load() {
		return nil, nil, fail(C.pcclNotInitialized, errNotInitialized)
	}
	c, err := commOf(p)
	if err != nil {
		return nil, nil, fail(C.pcclInvalidArgument, err)
	}
	pc, err := c.connected()
	if err != nil {
		return nil, nil, fail(C.pcclInvalidUsage, err)
	}
	return c, pc, C.pcclSuccess
}

//export pcclCreateCommunicator
func pcclCreateCommunicator(params *C.pcclCommCreateParams_t, out **C.pcclComm_t) C.pcclResult_t {
	if !initialized.Load() {
		return fail(C.pcclNotInitialized, errNotInitialized)
	}
	if params == nil || out == nil {
		return fail(C.pcclInvalidArgument, errNull("params or comm_out"))
	}
	addr, err := addrString(&params.master_address)
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	cfg, _ := peerPreset("pccl")
	c := &comm{cfg: cfg, group: uint32(params.peer_group), ops: map[uint64]*pending{}, preset: "pccl"}
	c.cfg.Master = addr
	c.cfg.Group = c.group
	if n := params.p2p_connection_pool_size; n > 0 {
		if n > 64 {
			return fail(C.pcclInvalidArgument, fmt.Errorf("%w: p2p_connection_pool_size %d exceeds 64", pccl.ErrInvalid, n))
		}
		c.cfg.PoolSize = int(n)
		c.explicit.pool = true
	}
	c.ctx, c.stop = context.WithCancel(context.Background())
	p := (*C.pcclComm_t)(C.calloc(1, C.sizeof_struct_pcclComm_t))
	p.handle = C.uintptr_t(cgo.NewHandle(c))
	*out = p
	return C.pcclSuccess
}

//export pcclDestroyCommunicator
func pcclDestroyCommunicator(p *C.pcclComm_t) C.pcclResult_t {
	c, err := commOf(p)
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	c.stop()
	c.mu.Lock()
	pc := c.c
	c.c = nil
	c.mu.Unlock()
	if pc != nil {
		pc.Close()
	}
	cgo.Handle(p.handle).Delete()
	p.handle = 0
	C.free(unsafe.Pointer(p))
	return C.pcclSuccess
}

// listenFor returns the address a peer listens on for a master at addr: loopback for a loopback
// master, else the local address the route to the master leaves from.
func listenFor(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
			return net.JoinHostPort(host, "0")
		}
	}
	u, err := net.Dial("udp", addr)
	if err != nil {
		return "0.0.0.0:0"
	}
	defer u.Close()
	local := u.LocalAddr().(*net.UDPAddr)
	return net.JoinHostPort(local.IP.String(), "0")
}

// connectConfig returns the configuration pcclConnect and concordRejoin connect with: the settings
// made so far, the transport, and the listen and gossip addresses derived where none was given.
// c.mu must be held.
func (c *comm) connectConfig() (pccl.Config, error) {
	cfg := c.cfg
	tr, err := selectTransport(c.transport, c.secret)
	if err != nil {
		return cfg, err
	}
	cfg.Transport = tr
	if cfg.ListenAddr == "" {
		cfg.ListenAddr = listenFor(cfg.Master)
	}
	if cfg.GossipJoin != "" {
		cfg.Gossip = pccl.GossipLAN()
		if c.preset == "wan" {
			cfg.Gossip = pccl.GossipWAN()
		}
		cfg.Gossip.BindAddr = c.gossipBind
		if cfg.Gossip.BindAddr == "" {
			host, _, _ := net.SplitHostPort(cfg.ListenAddr)
			if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
				host, _, _ = net.SplitHostPort(listenFor(cfg.Master))
			}
			cfg.Gossip.BindAddr = net.JoinHostPort(host, "0")
		}
	}
	return cfg, nil
}

//export pcclConnect
func pcclConnect(p *C.pcclComm_t) C.pcclResult_t {
	if !initialized.Load() {
		return fail(C.pcclNotInitialized, errNotInitialized)
	}
	c, err := commOf(p)
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	c.mu.Lock()
	if c.c != nil {
		c.mu.Unlock()
		return fail(C.pcclInvalidUsage, errors.New("pccl: communicator is already connected"))
	}
	cfg, err := c.connectConfig()
	c.mu.Unlock()
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	pc, err := pccl.Connect(c.ctx, cfg)
	if err != nil {
		return fail(C.pcclMasterConnectionFailed, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		pc.Close()
		return fail(C.pcclInvalidUsage, errors.New("pccl: communicator is already connected"))
	}
	c.c = pc
	return C.pcclSuccess
}

//export pcclGetAttribute
func pcclGetAttribute(p *C.pcclComm_t, attr C.pcclAttribute_t, out *C.int) C.pcclResult_t {
	_, pc, code := liveComm(p)
	if code != C.pcclSuccess {
		return code
	}
	if out == nil {
		return fail(C.pcclInvalidArgument, errNull("p_attribute_out"))
	}
	info := pc.GroupInfo()
	switch attr {
	case C.PCCL_ATTRIBUTE_GLOBAL_WORLD_SIZE:
		*out = C.int(info.GlobalWorldSize)
	case C.PCCL_ATTRIBUTE_PEER_GROUP_WORLD_SIZE:
		*out = C.int(info.GroupWorldSize)
	case C.PCCL_ATTRIBUTE_LARGEST_PEER_GROUP_WORLD_SIZE:
		*out = C.int(info.LargestGroup)
	case C.PCCL_ATTRIBUTE_NUM_DISTINCT_PEER_GROUPS:
		*out = C.int(info.Groups)
	default:
		return fail(C.pcclInvalidArgument, fmt.Errorf("%w: attribute %d", pccl.ErrInvalid, attr))
	}
	return C.pcclSuccess
}

//export pcclUpdateTopology
func pcclUpdateTopology(p *C.pcclComm_t) C.pcclResult_t {
	c, pc, code := liveComm(p)
	if code != C.pcclSuccess {
		return code
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.ops); n > 0 {
		return fail(C.pcclPendingAsyncOps, fmt.Errorf("pccl: update topology: %w: %d all-reduces not awaited", pccl.ErrBusy, n))
	}
	if err := pc.UpdateTopology(c.ctx); err != nil {
		if errors.Is(err, pccl.ErrBusy) {
			return fail(C.pcclPendingAsyncOps, err)
		}
		return fail(C.pcclUpdateTopologyFailed, err)
	}
	c.dirty = false
	return C.pcclSuccess
}

//export pcclArePeersPending
func pcclArePeersPending(p *C.pcclComm_t, out *C.bool) C.pcclResult_t {
	c, pc, code := liveComm(p)
	if code != C.pcclSuccess {
		return code
	}
	if out == nil {
		return fail(C.pcclInvalidArgument, errNull("pending_out"))
	}
	pending, err := pc.ArePeersPending(c.ctx)
	if err != nil {
		return fail(resultOf(err), err)
	}
	*out = C.bool(pending)
	return C.pcclSuccess
}

//export pcclOptimizeTopology
func pcclOptimizeTopology(p *C.pcclComm_t) C.pcclResult_t {
	c, pc, code := liveComm(p)
	if code != C.pcclSuccess {
		return code
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if pc.WorldSize() < 2 {
		return fail(C.pcclInvalidUsage, errors.New("pccl: optimize topology needs at least two peers"))
	}
	if n := len(c.ops); n > 0 {
		return fail(C.pcclPendingAsyncOps, fmt.Errorf("pccl: optimize topology: %w: %d all-reduces not awaited", pccl.ErrBusy, n))
	}
	if err := pc.OptimizeTopology(c.ctx); err != nil {
		if errors.Is(err, pccl.ErrBusy) {
			return fail(C.pcclPendingAsyncOps, err)
		}
		return fail(C.pcclTopologyOptimizationFailed, err)
	}
	return C.pcclSuccess
}

// rewire repairs the ring after a peer left, once no collective of this peer is in flight. Like
// PCCL's re-establishment of its links it admits nobody: a peer waiting in pcclConnect joins only at a
// pcclUpdateTopology, never in the middle of a retry. c.mu must be held.
func (c *comm) rewire(pc *pccl.Communicator) {
	if !c.dirty || len(c.ops) > 0 {
		return
	}
	if err := pc.Rewire(c.ctx); err != nil {
		fail(C.pcclUpdateTopologyFailed, err)
		return
	}
	c.dirty = false
}

// start launches one all-reduce over the caller's buffers, used in place.
func (c *comm) start(pc *pccl.Communicator, send, recv unsafe.Pointer, d *C.pcclReduceDescriptor_t) (uint64, C.pcclResult_t) {
	if send == nil || recv == nil || d == nil {
		return 0, fail(C.pcclInvalidArgument, errNull("sendbuff, recvbuff or descriptor"))
	}
	desc, err := descOf(d)
	if err != nil {
		return 0, fail(C.pcclInvalidArgument, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, busy := c.ops[desc.Tag]; busy {
		return 0, fail(C.pcclInvalidArgument, fmt.Errorf("%w: tag %d is already in flight", pccl.ErrInvalid, desc.Tag))
	}
	c.rewire(pc)
	world := pc.WorldSize()
	if world < 2 {
		return 0, fail(C.pcclTooFewPeers, fmt.Errorf("pccl: all-reduce: %w: the group has %d peer", pccl.ErrTooFewPeers, world))
	}
	n := desc.Count * desc.DType.Size()
	sb := unsafe.Slice((*byte)(send), n)
	rb := unsafe.Slice((*byte)(recv), n)
	c.ops[desc.Tag] = &pending{req: pc.AllReduceAsync(c.ctx, sb, rb, desc), desc: desc, rank: max(pc.Rank(), 0), world: world}
	return desc.Tag, C.pcclSuccess
}

// finish waits for the all-reduce on tag and fills info.
func (c *comm) finish(pc *pccl.Communicator, tag uint64, info *C.pcclReduceInfo_t) C.pcclResult_t {
	c.mu.Lock()
	o := c.ops[tag]
	c.mu.Unlock()
	if o == nil {
		return fail(C.pcclInvalidArgument, fmt.Errorf("%w: no all-reduce in flight on tag %d", pccl.ErrInvalid, tag))
	}
	err := o.req.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.ops, tag)
	if err != nil {
		code := resultOf(err)
		if code == C.pcclRankConnectionLost {
			c.dirty = true
		}
		fail(code, err)
		c.rewire(pc)
		return code
	}
	if info != nil {
		tx, rx := c.traffic(o)
		info.local_world_size = C.uint32_t(o.world)
		info.tx_bytes = C.uint64_t(tx)
		info.rx_bytes = C.uint64_t(rx)
	}
	return C.pcclSuccess
}

// traffic returns the payload bytes o sent and received: the ring schedule's frames of this rank and
// of its predecessor, quantized as they went on the wire (quantization headers included).
func (c *comm) traffic(o *pending) (tx, rx uint64) {
	opt := rings.Options{PartBytes: c.cfg.PartBytes, Quant: o.desc.Quant}
	sent := func(rank int) uint64 {
		t, err := rings.SentTraffic(rings.KindAllReduce, o.desc.Count, o.desc.DType, rank, o.world, opt)
		if err != nil {
			return 0 // a descriptor the collective itself accepted; cannot happen
		}
		return uint64(t.Bytes)
	}
	return sent(o.rank), sent((o.rank + o.world - 1) % o.world)
}

//export pcclAllReduceAsync
func pcclAllReduceAsync(send unsafe.Pointer, recv unsafe.Pointer, d *C.pcclReduceDescriptor_t, p *C.pcclComm_t, out *C.pcclAsyncReduceOp_t) C.pcclResult_t {
	c, pc, code := liveComm(p)
	if code != C.pcclSuccess {
		return code
	}
	if out == nil {
		return fail(C.pcclInvalidArgument, errNull("reduce_handle_out"))
	}
	tag, code := c.start(pc, send, recv, d)
	if code != C.pcclSuccess {
		return code
	}
	out.comm = p
	out.tag = C.uint64_t(tag)
	return C.pcclSuccess
}

//export pcclAwaitAsyncReduce
func pcclAwaitAsyncReduce(h *C.pcclAsyncReduceOp_t, info *C.pcclReduceInfo_t) C.pcclResult_t {
	if h == nil {
		return fail(C.pcclInvalidArgument, errNull("reduce_handle"))
	}
	c, pc, code := liveComm(h.comm)
	if code != C.pcclSuccess {
		return code
	}
	return c.finish(pc, uint64(h.tag), info)
}

//export pcclAllReduce
func pcclAllReduce(send unsafe.Pointer, recv unsafe.Pointer, d *C.pcclReduceDescriptor_t, p *C.pcclComm_t, info *C.pcclReduceInfo_t) C.pcclResult_t {
	c, pc, code := liveComm(p)
	if code != C.pcclSuccess {
		return code
	}
	tag, code := c.start(pc, send, recv, d)
	if code != C.pcclSuccess {
		return code
	}
	return c.finish(pc, tag, info)
}

//export pcclAllReduceMultipleWithRetry
func pcclAllReduceMultipleWithRetry(descs *C.pcclReduceOpDescriptor_t, count C.size_t, p *C.pcclComm_t, info *C.pcclReduceInfo_t, maxInFlight C.int) C.pcclResult_t {
	c, pc, code := liveComm(p)
	if code != C.pcclSuccess {
		return code
	}
	if descs == nil || count == 0 || maxInFlight <= 0 {
		return fail(C.pcclInvalidArgument, fmt.Errorf("%w: descriptors %p, count %d, max_in_flight %d", pccl.ErrInvalid, descs, count, maxInFlight))
	}
	all := unsafe.Slice(descs, int(count))
	todo := make([]int, len(all))
	for i := range todo {
		todo[i] = i
	}
	var tx, rx uint64
	for len(todo) > 0 {
		var failed []int
		for lo := 0; lo < len(todo); lo += int(maxInFlight) {
			window := todo[lo:min(lo+int(maxInFlight), len(todo))]
			var started []int
			for _, i := range window {
				d := &all[i]
				if _, code := c.start(pc, d.sendbuf, d.recvbuf, &d.descriptor); code != C.pcclSuccess {
					for _, j := range started {
						c.finish(pc, uint64(all[j].descriptor.tag), nil)
					}
					return code
				}
				started = append(started, i)
			}
			var hard C.pcclResult_t = C.pcclSuccess
			for _, i := range started {
				var one C.pcclReduceInfo_t
				switch code := c.finish(pc, uint64(all[i].descriptor.tag), &one); code {
				case C.pcclSuccess:
					tx += uint64(one.tx_bytes)
					rx += uint64(one.rx_bytes)
				case C.pcclRankConnectionLost:
					failed = append(failed, i)
				default:
					if hard == C.pcclSuccess {
						hard = code
					}
				}
			}
			if hard != C.pcclSuccess {
				return hard
			}
		}
		todo = failed
	}
	if info != nil {
		info.local_world_size = C.uint32_t(pc.WorldSize())
		info.tx_bytes = C.uint64_t(tx)
		info.rx_bytes = C.uint64_t(rx)
	}
	return C.pcclSuccess
}

//export pcclSynchronizeSharedState
func pcclSynchronizeSharedState(p *C.pcclComm_t, st *C.pcclSharedState_t, strategy C.pcclSharedStateSyncStrategy_t, info *C.pcclSharedStateSyncInfo_t) C.pcclResult_t {
	c, pc, code := liveComm(p)
	if code != C.pcclSuccess {
		return code
	}
	if st == nil || (st.count > 0 && st.infos == nil) {
		return fail(C.pcclInvalidArgument, errNull("shared_state or its infos"))
	}
	strat, ok := strategies[strategy]
	if !ok {
		return fail(C.pcclInvalidArgument, fmt.Errorf("%w: sync strategy %d", pccl.ErrInvalid, strategy))
	}
	state := &pccl.State{Revision: uint64(st.revision)}
	for i, t := range unsafe.Slice(st.infos, int(st.count)) {
		if t.name == nil {
			return fail(C.pcclInvalidArgument, errNull(fmt.Sprintf("infos[%d].name", i)))
		}
		name := C.GoString(t.name)
		if t.device_type != C.pcclDeviceCpu {
			return fail(C.pcclInvalidArgument, fmt.Errorf("%w: entry %q: only CPU memory is supported", pccl.ErrInvalid, name))
		}
		dt, err := dtypeOf(t.datatype)
		if err != nil {
			return fail(C.pcclInvalidArgument, fmt.Errorf("entry %q: %w", name, err))
		}
		var data []byte
		if t.count > 0 {
			if t.data == nil {
				return fail(C.pcclInvalidArgument, errNull(fmt.Sprintf("infos[%d].data", i)))
			}
			data = unsafe.Slice((*byte)(t.data), int(t.count)*dt.Size())
		}
		e := &pccl.Entry{Name: name, DType: dt, Data: data, MayDiffer: bool(t.allow_content_inequality)}
		if err := state.Add(e); err != nil {
			return fail(C.pcclInvalidArgument, err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.ops); n > 0 {
		return fail(C.pcclPendingAsyncOps, fmt.Errorf("pccl: sync shared state: %w: %d all-reduces not awaited", pccl.ErrBusy, n))
	}
	res, err := pc.SyncSharedState(c.ctx, state, pccl.SyncOptions{Strategy: strat})
	if err != nil {
		if errors.Is(err, pccl.ErrBusy) {
			return fail(C.pcclPendingAsyncOps, err)
		}
		return fail(C.pcclInvalidUsage, err)
	}
	st.revision = C.uint64_t(state.Revision)
	if info != nil {
		info.tx_bytes = C.uint64_t(res.ServedBytes)
		info.rx_bytes = C.uint64_t(res.FetchedBytes)
	}
	return C.pcclSuccess
}

// configure applies f to the configuration of a communicator that is not connected yet.
func configure(p *C.pcclComm_t, f func(c *comm) error) C.pcclResult_t {
	c, err := commOf(p)
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		return fail(C.pcclInvalidUsage, errors.New("pccl: the communicator is already connected"))
	}
	if err := f(c); err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	return C.pcclSuccess
}

// goString returns the Go copy of a C string, "" for NULL.
func goString(s *C.char) string {
	if s == nil {
		return ""
	}
	return C.GoString(s)
}

//export concordSetTransport
func concordSetTransport(p *C.pcclComm_t, name *C.char) C.pcclResult_t {
	return configure(p, func(c *comm) error {
		n, err := transportName(goString(name))
		c.transport = n
		return err
	})
}

//export concordSetSecret
func concordSetSecret(p *C.pcclComm_t, secret *C.char) C.pcclResult_t {
	return configure(p, func(c *comm) error {
		c.cfg.Token, c.secret = goString(secret), []byte(goString(secret))
		return nil
	})
}

//export concordSetNICs
func concordSetNICs(p *C.pcclComm_t, nics *C.char) C.pcclResult_t {
	return configure(p, func(c *comm) error {
		c.cfg.NICs = nil
		for _, nic := range strings.Split(goString(nics), ",") {
			if nic = strings.TrimSpace(nic); nic != "" {
				c.cfg.NICs = append(c.cfg.NICs, nic)
			}
		}
		return nil
	})
}

//export concordSetSite
func concordSetSite(p *C.pcclComm_t, site *C.char) C.pcclResult_t {
	return configure(p, func(c *comm) error { c.cfg.Site = goString(site); return nil })
}

//export concordSetListenAddress
func concordSetListenAddress(p *C.pcclComm_t, listen, advertise *C.char) C.pcclResult_t {
	return configure(p, func(c *comm) error {
		l := goString(listen)
		if _, _, err := net.SplitHostPort(l); err != nil {
			return fmt.Errorf("%w: listen address %q: %v", pccl.ErrInvalid, l, err)
		}
		c.cfg.ListenAddr, c.cfg.AdvertiseAddr = l, goString(advertise)
		return nil
	})
}

//export concordSetPreset
func concordSetPreset(p *C.pcclComm_t, preset *C.char) C.pcclResult_t {
	return configure(p, func(c *comm) error {
		base, err := peerPreset(goString(preset))
		if err != nil {
			return err
		}
		if !c.explicit.pool {
			c.cfg.PoolSize = base.PoolSize
		}
		c.cfg.DialTimeout, c.cfg.MasterTimeout, c.cfg.PartBytes = base.DialTimeout, base.MasterTimeout, base.PartBytes
		c.cfg.ProgressTimeout = base.ProgressTimeout
		c.preset = goString(preset)
		return nil
	})
}

//export concordSetMasterTimeout
func concordSetMasterTimeout(p *C.pcclComm_t, millis C.uint64_t) C.pcclResult_t {
	return configure(p, func(c *comm) error { c.cfg.MasterTimeout = time.Duration(millis) * time.Millisecond; return nil })
}

//export concordGetPeerGroup
func concordGetPeerGroup(p *C.pcclComm_t, out *C.uint32_t) C.pcclResult_t {
	c, err := commOf(p)
	if err != nil {
		return fail(C.pcclInvalidArgument, err)
	}
	if out == nil {
		return fail(C.pcclInvalidArgument, errNull("group_out"))
	}
	*out = C.uint32_t(c.group)
	return C.pcclSuccess
}

//export concordGetRank
func concordGetRank(p *C.pcclComm_t, out *C.int) C.pcclResult_t {
	_, pc, code := liveComm(p)
	if code != C.pcclSuccess {
		return code
	}
	if out == nil {
		return fail(C.pcclInvalidArgument, errNull("rank_out"))
	}
	*out = C.int(pc.Rank())
	return C.pcclSuccess
}

//export concordSetGossip
func concordSetGossip(p *C.pcclComm_t, join, bind *C.char) C.pcclResult_t {
	return configure(p, func(c *comm) error {
		c.cfg.GossipJoin, c.gossipBind = goString(join), goString(bind)
		if c.gossipBind != "" {
			if _, _, err := net.SplitHostPort(c.gossipBind); err != nil {
				return fmt.Errorf("%w: gossip bind address %q: %v", pccl.ErrInvalid, c.gossipBind, err)
			}
		}
		return nil
	})
}

//export concordSetContributionStats
func concordSetContributionStats(p *C.pcclComm_t, enabled C.bool) C.pcclResult_t {
	return configure(p, func(c *comm) error { c.cfg.ContributionStats = bool(enabled); return nil })
}
