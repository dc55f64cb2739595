package diagnosis

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Link is a directed link between two peers.
type Link struct{ From, To uint64 }

// String returns "from→to".
func (l Link) String() string { return fmt.Sprintf("%d→%d", l.From, l.To) }

// Kind is a syndrome.
type Kind uint8

// Syndromes.
const (
	SlowLink     Kind = iota + 1 // one link (a cell of the matrix)
	SlowSender                   // a peer's links out (a row)
	SlowReceiver                 // a peer's links in (a column)
	SlowCompute                  // a peer slow outside communication (the origin of a waiting chain)
)

var kindNames = [...]string{"", "slow-link", "slow-sender", "slow-receiver", "slow-compute"}

// Kinds lists every syndrome, in order.
var Kinds = []Kind{SlowLink, SlowSender, SlowReceiver, SlowCompute}

// String returns the syndrome's name, as Event.Key and the metrics use it ("slow-link", ...).
func (k Kind) String() string {
	if int(k) < len(kindNames) && k != 0 {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Event is a syndrome raised or cleared.
type Event struct {
	Kind Kind
	// Peer is the slow peer: the row's sender, the column's receiver, the waiting chain's origin, or
	// the sender of a slow link.
	Peer uint64
	// Link is the slow link of a SlowLink; zero otherwise.
	Link Link
	// Cells are the hot cells that make the evidence (SlowLink, SlowSender, SlowReceiver).
	Cells []Link
	// Chain is the waiting chain: the peers that waited on Peer, nearest first (SlowCompute, and any
	// syndrome whose culprit is the chain's origin).
	Chain []uint64
	// Ratio is the culprit's figure over the group median: the stall per byte of the hot cells (or
	// their transit per byte, for cells hot by their transit alone), or the busy time per byte of a
	// SlowCompute peer.
	Ratio float64
	// Confidence in [0, 1) grows with Ratio, and shrinks where the matrix cannot tell this syndrome
	// from another one.
	Confidence float64
	// Cleared is true when the syndrome ended; Evidence then says why.
	Cleared bool
	// Ops is how many operations the syndrome has held: Confirm when raised, its whole life when
	// cleared or listed by Active.
	Ops int
	// Evidence says, in words, what was seen.
	Evidence string
}

// Key identifies the syndrome an event is about.
func (e Event) Key() string {
	if e.Kind == SlowLink {
		return e.Kind.String() + " " + e.Link.String()
	}
	return fmt.Sprintf("%s %d", e.Kind, e.Peer)
}

func sortedLinks(m map[Link]bool) []Link {
	ls := make([]Link, 0, len(m))
	for l := range m {
		ls = append(ls, l)
	}
	sortLinks(ls)
	return ls
}

// chainText writes a waiting chain, its first peers only when it is long.
func chainText(chain []uint64) string {
	const show = 8
	if len(chain) <= show {
		return fmt.Sprint(chain)
	}
	return strings.TrimSuffix(fmt.Sprint(chain[:show]), "]") + " …]"
}

func compareLinks(a, b Link) int {
	if c := cmp.Compare(a.From, b.From); c != 0 {
		return c
	}
	return cmp.Compare(a.To, b.To)
}

func sortLinks(ls []Link) { slices.SortFunc(ls, compareLinks) }

func joinLinks(ls []Link) string {
	s := make([]string, len(ls))
	for i, l := range ls {
		s[i] = l.String()
	}
	return strings.Join(s, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
