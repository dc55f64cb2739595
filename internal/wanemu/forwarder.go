package wanemu

import (
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// packet is one IPv4 packet on its way from one site to another. It comes from the forwarder's
// pool and goes back there once it is written or dropped.
type packet struct {
	buf  []byte // the whole packet as the device gives it (virtio-net header first, with offload)
	key  flowKey
	from int
	to   int
	at   int64 // when it was read from the source site's TUN device
}

// arrivalQueue is how many packets the readers may hand to the scheduler before they block.
const arrivalQueue = 8192

// writeQueue is how many packets may wait for one site's writer before the scheduler blocks.
const writeQueue = 8192

// forwarder moves packets between the sites' TUN devices through the emulated links.
//
// Goroutines: one reader per site reads its TUN device, classifies each packet and hands it to the
// scheduler; the scheduler owns every path and the event queue, and releases each packet when it
// falls due; one writer per site writes released packets to its TUN device. The readers and writers
// share only the channels and the pool; the counters are atomic.
type forwarder struct {
	mtu   int
	hdr   int // bytes in front of each IP packet: the virtio-net header with offload, else 0
	base  time.Time
	tuns  []*os.File
	index map[[4]byte]int // site of each address
	paths [][]*path       // [from][to]; owned by the scheduler
	stats [][]*linkCounters
	other atomic.Uint64 // packets that were not IPv4 for another site

	pool  sync.Pool    // packets with buffers of small bytes
	large chan *packet // free packets with buffers of the largest packet, with offload: a free list
	// that outlives garbage collections, which empty a sync.Pool and would have the kernel clear
	// fresh pages for new 64 KiB buffers at the packet rate
	small    int
	arrivals chan *packet
	control  chan func()
	writes   []chan *packet
	done     chan struct{}
	wg       sync.WaitGroup
	closed   sync.Once
}

func newForwarder(tuns []*os.File, addrs [][4]byte, links [][]Link, mtu int, offload bool, seed uint64) *forwarder {
	n := len(tuns)
	f := &forwarder{
		mtu:      mtu,
		base:     time.Now(),
		tuns:     tuns,
		index:    make(map[[4]byte]int, n),
		paths:    make([][]*path, n),
		stats:    make([][]*linkCounters, n),
		arrivals: make(chan *packet, arrivalQueue),
		control:  make(chan func()),
		writes:   make([]chan *packet, n),
		done:     make(chan struct{}),
	}
	f.small = mtu
	if offload {
		// Most packets are still small (acknowledgements, single segments): they get buffers of
		// the MTU, and only the large ones a buffer of the largest packet.
		f.hdr, f.small = vnetHdrLen, vnetHdrLen+mtu
		f.large = make(chan *packet, largeFree)
	}
	f.pool.New = func() any { return &packet{buf: make([]byte, f.small)} }
	for i, a := range addrs {
		f.index[a] = i
	}
	for i := range n {
		f.paths[i] = make([]*path, n)
		f.stats[i] = make([]*linkCounters, n)
		for j := range n {
			f.stats[i][j] = &linkCounters{}
			f.paths[i][j] = newPath(links[i][j], mtu, seed, uint64(i*n+j), f.stats[i][j])
		}
		f.writes[i] = make(chan *packet, writeQueue)
	}
	return f
}

// now returns the forwarder's clock: nanoseconds since it was made, on the monotonic clock.
func (f *forwarder) now() int64 { return int64(time.Since(f.base)) }

func (f *forwarder) start() {
	f.wg.Add(2*len(f.tuns) + 1)
	for i := range f.tuns {
		go f.read(i)
		go f.write(i)
	}
	go f.schedule()
}

// close stops every goroutine and closes the TUN devices. It may be called more than once.
func (f *forwarder) close() {
	f.closed.Do(func() {
		close(f.done)
		for _, t := range f.tuns {
			t.Close()
		}
		f.wg.Wait()
	})
}

// configure changes the link from one site to another; it returns once the scheduler applied it.
func (f *forwarder) configure(from, to int, l Link) {
	f.apply(func() { f.paths[from][to].configure(l) })
}

// apply runs fn on the scheduler, which owns the paths, and returns once it ran (or at once if the
// forwarder is closing).
func (f *forwarder) apply(fn func()) {
	applied := make(chan struct{})
	select {
	case f.control <- func() { fn(); close(applied) }:
		<-applied
	case <-f.done:
	}
}

// capFlow caps one flow of the link from one site to another; it returns once the scheduler applied it.
func (f *forwarder) capFlow(from, to int, key flowKey, mbit float64) {
	f.apply(func() { f.paths[from][to].capFlow(key, mbit) })
}

func (f *forwarder) free(p *packet) {
	p.buf = p.buf[:cap(p.buf)]
	if len(p.buf) > f.small {
		select {
		case f.large <- p:
		default: // the list is full: let it go
		}
	} else {
		f.pool.Put(p)
	}
}

// getLarge returns a packet with a buffer of the largest packet.
func (f *forwarder) getLarge() *packet {
	select {
	case p := <-f.large:
		return p
	default:
		return &packet{buf: make([]byte, maxOffloadPacket)}
	}
}

// largeFree bounds the free list of large packets (64 KiB each).
const largeFree = 4096

// size is the bytes of p that the links carry: the IP packet, without the virtio-net header.
func (f *forwarder) size(p *packet) int { return len(p.buf) - f.hdr }

func (f *forwarder) read(site int) {
	defer f.wg.Done()
	var scratch []byte // with offload: every read lands here, and moves to a buffer of its size
	if f.hdr > 0 {
		scratch = make([]byte, maxOffloadPacket)
	}
	for {
		var p *packet
		if scratch == nil {
			p = f.pool.Get().(*packet)
			n, err := f.tuns[site].Read(p.buf)
			if err != nil {
				f.free(p)
				return // closed
			}
			p.buf = p.buf[:n]
		} else {
			n, err := f.tuns[site].Read(scratch)
			if err != nil {
				return // closed
			}
			if n <= f.small {
				p = f.pool.Get().(*packet)
			} else {
				p = f.getLarge()
			}
			p.buf = p.buf[:n]
			copy(p.buf, scratch[:n])
		}
		p.at = f.now()
		var key flowKey
		err := errTruncated
		if len(p.buf) > f.hdr {
			key, err = parsePacket(p.buf[f.hdr:])
		}
		to, ok := f.index[key.dst]
		if err != nil || !ok || to == site {
			f.other.Add(1)
			f.free(p)
			continue
		}
		p.key, p.from, p.to = key, site, to
		select {
		case f.arrivals <- p:
		case <-f.done:
			f.free(p)
			return
		}
	}
}

func (f *forwarder) write(site int) {
	defer f.wg.Done()
	for {
		select {
		case p := <-f.writes[site]:
			// Counted first, so that whoever receives the packet finds it counted. A write fails only
			// when the device is closing or the packet is malformed; either way the packet is gone, as
			// on a real wire.
			f.stats[p.from][p.to].delivered.Add(1)
			f.tuns[site].Write(p.buf)
			f.free(p)
		case <-f.done:
			return
		}
	}
}

// schedule is the scheduler: it admits arriving packets into their paths and releases the events
// of the delay queue as they fall due. It alone touches f.paths and the queue.
func (f *forwarder) schedule() {
	defer f.wg.Done()
	var q eventQueue
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case p := <-f.arrivals:
			f.admit(&q, p)
			// Take whatever else has arrived before looking at the clock again.
			for drained := false; !drained; {
				select {
				case p := <-f.arrivals:
					f.admit(&q, p)
				default:
					drained = true
				}
			}
		case fn := <-f.control:
			fn()
		case <-timer.C:
		case <-f.done:
			return
		}
		now := f.now()
		for q.len() > 0 && q.next() <= now {
			if !f.step(&q, q.pop()) {
				return
			}
		}
		if q.len() > 0 {
			timer.Reset(time.Duration(q.next() - now))
		}
	}
}

func (f *forwarder) admit(q *eventQueue, p *packet) {
	at, v := f.paths[p.from][p.to].arrive(p.at, p.key, f.size(p))
	if v != pass {
		f.free(p)
		return
	}
	q.push(at, joinLink, p)
}

// step carries out one due event; it returns false when the forwarder is closing.
func (f *forwarder) step(q *eventQueue, ev event) bool {
	p := ev.pkt
	switch ev.kind {
	case joinLink:
		at, v := f.paths[p.from][p.to].transmit(ev.at, f.size(p))
		if v != pass {
			f.free(p)
			return true
		}
		q.push(at, deliver, p)
	case deliver:
		select {
		case f.writes[p.to] <- p:
		case <-f.done:
			return false
		}
	}
	return true
}
