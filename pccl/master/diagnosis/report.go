package diagnosis

import "time"

// Timing is what one link did during one operation, seen from the reporting peer (see the package
// documentation). Start and End are offsets from the moment the peer began the operation.
type Timing struct {
	Peer  uint64 // the other end of the link
	Out   bool   // true: bytes went from the reporting peer to Peer; false: from Peer to it
	Bytes uint64
	Start time.Duration
	End   time.Duration
	Wait  time.Duration // stalled on this link and on nothing else
	// Transit (links in only) is the time the link's frames spent arriving at the reporting peer,
	// summed per frame from its first payload byte to its last; 0: not timed.
	Transit time.Duration
}

// Report is one peer's timing summary of one operation.
type Report struct {
	Peer  uint64
	Links []Timing
	// Vote is how long after the first member's vote this peer's vote for the operation reached the
	// master (0 for the first): the others waited that long for it before the operation could start.
	Vote time.Duration
}

// Op is one completed collective of a group: its ring in order and the members' reports (a member
// that sent none is simply absent).
type Op struct {
	Ring    []uint64
	Reports []Report
	// Sites names the site of each member (absent or "": no site). The transit of a link between two
	// sites is judged against the group's other links between sites, that of a link within a site
	// against the links within sites, so that WAN links slower by design than site links raise nothing.
	Sites map[uint64]string
}
