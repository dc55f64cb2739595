package sharedstate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/concord-ccl/concord/rings"
)

// Strategy is how a peer takes part in a sync.
type Strategy uint8

const (
	// EnforcePopular is the default: the peer votes, and it sends or receives as the vote decides.
	EnforcePopular Strategy = iota
	// SendOnly asserts that the peer's state is right: it votes, and if it loses it is rejected with
	// ErrSendOnlyLost instead of being overwritten.
	SendOnly
	// ReceiveOnly withdraws the peer's state: it never votes and never donates, and it receives every
	// entry that differs from the elected state.
	ReceiveOnly
)

// String returns the strategy's name.
func (s Strategy) String() string {
	switch s {
	case EnforcePopular:
		return "enforce-popular"
	case SendOnly:
		return "send-only"
	case ReceiveOnly:
		return "receive-only"
	}
	return fmt.Sprintf("strategy(%d)", uint8(s))
}

// Valid reports whether s is one of the defined strategies.
func (s Strategy) Valid() bool { return s <= ReceiveOnly }

// votes reports whether a peer with strategy s takes part in the vote.
func (s Strategy) votes() bool { return s != ReceiveOnly }

var (
	// ErrNoCandidates is returned by Elect when it is given no candidate.
	ErrNoCandidates = errors.New("sharedstate: no candidates")
	// ErrInvalidCandidate is returned by Elect for an empty or duplicate peer id, an unknown strategy,
	// or a digest with an empty, duplicate or invalid entry.
	ErrInvalidCandidate = errors.New("sharedstate: invalid candidate")
	// ErrEntrySetMismatch is wrapped by *MismatchError: peers disagree on the set of entries.
	ErrEntrySetMismatch = errors.New("sharedstate: entry set mismatch")
	// ErrRevision rejects a peer whose revision is more than one ahead of the last accepted one.
	ErrRevision = errors.New("sharedstate: revision must advance by exactly one per sync")
	// ErrResumeMismatch fails a sync that neither advances the last accepted revision nor offers
	// exactly the remembered state at that revision.
	ErrResumeMismatch = errors.New("sharedstate: state does not match the remembered revision and hashes")
	// ErrSendOnlyLost rejects a SendOnly peer whose revision or content lost the vote.
	ErrSendOnlyLost = errors.New("sharedstate: send-only peer lost the vote")
	// ErrNoDonor fails a sync in which no peer is left to provide the state.
	ErrNoDonor = errors.New("sharedstate: no donor")
)

// MismatchError reports entries that the peers do not register identically. It wraps
// ErrEntrySetMismatch.
type MismatchError struct {
	// Entries lists each differing entry, sorted by name.
	Entries []EntryMismatch
}

// EntryMismatch is one entry that not all peers register the same way.
type EntryMismatch struct {
	// Name is the entry's name.
	Name string
	// Variants are the distinct ways the peers register it, in order of their first peer id.
	Variants []Variant
}

// Variant is one way some peers register an entry.
type Variant struct {
	// Present is false for the peers that lack the entry; the other fields are then zero.
	Present bool
	// DType is the element type these peers use.
	DType rings.DType
	// Count is the element count these peers use.
	Count uint64
	// MayDiffer is the flag these peers use.
	MayDiffer bool
	// Peers are the peers that register the entry this way, sorted.
	Peers []string
}

// String describes the variant, for example "f32[10] on [a b]" or "absent on [c]".
func (v Variant) String() string {
	if !v.Present {
		return fmt.Sprintf("absent on %v", v.Peers)
	}
	md := ""
	if v.MayDiffer {
		md = " may-differ"
	}
	return fmt.Sprintf("%s[%d]%s on %v", v.DType, v.Count, md, v.Peers)
}

// Error lists every differing entry with its variants.
func (e *MismatchError) Error() string {
	var b strings.Builder
	b.WriteString(ErrEntrySetMismatch.Error())
	for i, m := range e.Entries {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%q:", m.Name)
		for j, v := range m.Variants {
			if j > 0 {
				b.WriteString(",")
			}
			b.WriteString(" ")
			b.WriteString(v.String())
		}
	}
	return b.String()
}

// Unwrap returns ErrEntrySetMismatch.
func (e *MismatchError) Unwrap() error { return ErrEntrySetMismatch }

// Candidate is one peer's vote.
type Candidate struct {
	// Peer is the peer's id; ids order peers wherever an order is needed.
	Peer string
	// Strategy is how the peer takes part.
	Strategy Strategy
	// Digest is the peer's state.
	Digest Digest
}

// Prior is what the last successful sync accepted; the master keeps it across syncs and across the
// departure of every peer. Plan.Prior returns the next one.
type Prior struct {
	// Revision is the last accepted revision.
	Revision uint64
	// Entries are the accepted entries sorted by name; MayDiffer entries have hash 0.
	Entries []EntryDigest
}

// Fetch is one entry an outlier must fetch.
type Fetch struct {
	// Name is the entry's name.
	Name string
	// Hash is the hash the received bytes must have; a mismatch fails the transfer.
	Hash uint64
	// Bytes is the entry's size in bytes.
	Bytes int64
	// Donors hold exactly these bytes, the preferred one first. A MayDiffer entry has one donor.
	Donors []string
}

// Rejection is a peer removed from the sync, with the reason.
type Rejection struct {
	// Peer is the rejected peer.
	Peer string
	// Err wraps ErrRevision or ErrSendOnlyLost.
	Err error
}

// Plan is the outcome of an election.
type Plan struct {
	// Revision is the elected revision; every peer that is not rejected holds it after the sync.
	Revision uint64
	// Resumed is true when the revision did not advance: the peers offered exactly the remembered
	// state (a no-op sync, or a group that came back after all peers left).
	Resumed bool
	// Entries are the elected entries sorted by name. A MayDiffer entry has hash 0: it has no single
	// elected content.
	Entries []EntryDigest
	// Holders are the voters at the elected revision that hold the whole elected state, sorted; empty
	// only for a resumption that no voter offers whole.
	Holders []string
	// Fetch maps each outlier peer to the entries it must fetch, sorted by name. Peers with nothing to
	// fetch are absent.
	Fetch map[string][]Fetch
	// Rejected lists the peers removed from the sync, sorted by peer id. They neither send nor receive.
	Rejected []Rejection
}

// Prior returns what the master must remember after this plan completed.
func (p *Plan) Prior() *Prior {
	return &Prior{Revision: p.Revision, Entries: append([]EntryDigest(nil), p.Entries...)}
}

// Elect runs the election over cands given the prior accepted state (nil on a fresh run) and returns
// the plan. The rules are in the package documentation. Elect is a pure function: it does not modify
// its arguments, and the order of cands does not matter.
func Elect(cands []Candidate, prev *Prior) (Plan, error) {
	if len(cands) == 0 {
		return Plan{}, ErrNoCandidates
	}
	cs, err := normalize(cands)
	if err != nil {
		return Plan{}, err
	}
	shape, err := entrySet(cs)
	if err != nil {
		return Plan{}, err
	}

	rejected := make(map[string]error)
	var active []*Candidate
	voters := 0
	for i := range cs {
		c := &cs[i]
		if !c.Strategy.votes() {
			continue
		}
		voters++
		if prev != nil && c.Digest.Revision > prev.Revision && c.Digest.Revision-prev.Revision > 1 {
			rejected[c.Peer] = fmt.Errorf("peer %s: revision %d after %d: %w",
				c.Peer, c.Digest.Revision, prev.Revision, ErrRevision)
			continue
		}
		active = append(active, c)
	}

	var (
		rev     uint64
		resumed bool
		hashes  []uint64
	)
	for {
		if len(active) == 0 {
			return Plan{}, noVoters(voters, rejected)
		}
		rev, resumed, err = electRevision(active, prev)
		if err != nil {
			return Plan{}, err
		}
		hashes, err = electContent(active, rev, resumed, shape, prev)
		if err != nil {
			return Plan{}, err
		}
		kept := active[:0:0]
		for _, c := range active {
			if c.Strategy == SendOnly {
				if err := sendOnlyCheck(c, rev, shape, hashes); err != nil {
					rejected[c.Peer] = err
					continue
				}
			}
			kept = append(kept, c)
		}
		if len(kept) == len(active) {
			break
		}
		active = kept
	}

	plan := Plan{Revision: rev, Resumed: resumed, Entries: make([]EntryDigest, len(shape))}
	for k, e := range shape {
		e.Hash = hashes[k]
		plan.Entries[k] = e
	}
	var current []*Candidate
	for _, c := range active {
		if c.Digest.Revision == rev {
			current = append(current, c)
		}
	}
	plan.Fetch, plan.Holders = assignFetches(cs, rejected, current, rev, plan.Entries)
	for i := range cs {
		if err, ok := rejected[cs[i].Peer]; ok {
			plan.Rejected = append(plan.Rejected, Rejection{Peer: cs[i].Peer, Err: err})
		}
	}
	return plan, nil
}

// normalize validates cands and returns a copy sorted by peer id, each digest sorted by name.
func normalize(cands []Candidate) ([]Candidate, error) {
	cs := make([]Candidate, len(cands))
	for i, c := range cands {
		if c.Peer == "" {
			return nil, fmt.Errorf("%w: candidate %d has an empty peer id", ErrInvalidCandidate, i)
		}
		if !c.Strategy.Valid() {
			return nil, fmt.Errorf("%w: peer %s: unknown %v", ErrInvalidCandidate, c.Peer, c.Strategy)
		}
		c.Digest.Entries = sortedEntries(c.Digest.Entries)
		for k, e := range c.Digest.Entries {
			switch {
			case e.Name == "":
				return nil, fmt.Errorf("%w: peer %s: entry with an empty name", ErrInvalidCandidate, c.Peer)
			case k > 0 && c.Digest.Entries[k-1].Name == e.Name:
				return nil, fmt.Errorf("%w: peer %s: entry %q listed twice", ErrInvalidCandidate, c.Peer, e.Name)
			case !e.DType.Valid():
				return nil, fmt.Errorf("%w: peer %s: entry %q: invalid dtype %d", ErrInvalidCandidate, c.Peer, e.Name, e.DType)
			}
		}
		cs[i] = c
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].Peer < cs[j].Peer })
	for i := 1; i < len(cs); i++ {
		if cs[i].Peer == cs[i-1].Peer {
			return nil, fmt.Errorf("%w: peer id %s appears twice", ErrInvalidCandidate, cs[i].Peer)
		}
	}
	return cs, nil
}

// entrySet checks that every candidate registers the same entries and returns them with zero hashes.
// cs is sorted by peer id.
func entrySet(cs []Candidate) ([]EntryDigest, error) {
	names := make(map[string]bool)
	for _, c := range cs {
		for _, e := range c.Digest.Entries {
			names[e.Name] = true
		}
	}
	all := make([]string, 0, len(names))
	for n := range names {
		all = append(all, n)
	}
	sort.Strings(all)

	// pos[i] walks candidate i's sorted entries in step with all.
	pos := make([]int, len(cs))
	shape := make([]EntryDigest, 0, len(all))
	var mism []EntryMismatch
	for _, name := range all {
		var vs []Variant
		for i := range cs {
			var v Variant
			es := cs[i].Digest.Entries
			if pos[i] < len(es) && es[pos[i]].Name == name {
				e := es[pos[i]]
				v = Variant{Present: true, DType: e.DType, Count: e.Count, MayDiffer: e.MayDiffer}
				pos[i]++
			}
			found := false
			for j := range vs {
				if vs[j].Present == v.Present && vs[j].DType == v.DType && vs[j].Count == v.Count && vs[j].MayDiffer == v.MayDiffer {
					vs[j].Peers = append(vs[j].Peers, cs[i].Peer)
					found = true
					break
				}
			}
			if !found {
				v.Peers = []string{cs[i].Peer}
				vs = append(vs, v)
			}
		}
		if len(vs) > 1 {
			mism = append(mism, EntryMismatch{Name: name, Variants: vs})
			continue
		}
		shape = append(shape, EntryDigest{Name: name, DType: vs[0].DType, Count: vs[0].Count, MayDiffer: vs[0].MayDiffer})
	}
	if len(mism) > 0 {
		return nil, &MismatchError{Entries: mism}
	}
	return shape, nil
}

// noVoters explains why no voter is left.
func noVoters(voters int, rejected map[string]error) error {
	if voters == 0 {
		return fmt.Errorf("%w: every peer is %v", ErrNoDonor, ReceiveOnly)
	}
	peers := make([]string, 0, len(rejected))
	for p := range rejected {
		peers = append(peers, p)
	}
	sort.Strings(peers)
	errs := make([]error, len(peers))
	for i, p := range peers {
		errs[i] = rejected[p]
	}
	return fmt.Errorf("%w: all %d voters were rejected: %w", ErrNoDonor, voters, errors.Join(errs...))
}

// electRevision picks the revision among the active voters (see the package documentation).
func electRevision(active []*Candidate, prev *Prior) (rev uint64, resumed bool, err error) {
	counts := make(map[uint64]int)
	for _, c := range active {
		counts[c.Digest.Revision]++
	}
	if prev == nil {
		best := -1
		for r, n := range counts {
			if n > best || (n == best && r > rev) {
				rev, best = r, n
			}
		}
		return rev, false, nil
	}
	p := prev.Revision
	if p+1 > p && counts[p+1] > 0 {
		return p + 1, false, nil
	}
	if counts[p] > 0 {
		return p, true, nil
	}
	held := make([]uint64, 0, len(counts))
	for r := range counts {
		held = append(held, r)
	}
	sort.Slice(held, func(i, j int) bool { return held[i] < held[j] })
	return 0, false, fmt.Errorf("%w: no voter holds revision %d or %d (voters hold %v)", ErrResumeMismatch, p, p+1, held)
}

// electContent returns the elected hash of each entry of shape (0 for MayDiffer entries). Only active
// voters at revision rev count.
func electContent(active []*Candidate, rev uint64, resumed bool, shape []EntryDigest, prev *Prior) ([]uint64, error) {
	hashes := make([]uint64, len(shape))
	if resumed {
		pe := sortedEntries(prev.Entries)
		same := len(pe) == len(shape)
		for k := 0; same && k < len(pe); k++ {
			same = pe[k].sameShape(shape[k])
		}
		if !same {
			return nil, fmt.Errorf("%w: revision %d: the entry set differs from the remembered one", ErrResumeMismatch, rev)
		}
		var missing []string
		for k, e := range shape {
			if e.MayDiffer {
				continue
			}
			hashes[k] = pe[k].Hash
			held := false
			for _, c := range active {
				if c.Digest.Revision == rev && c.Digest.Entries[k].Hash == hashes[k] {
					held = true
					break
				}
			}
			if !held {
				missing = append(missing, e.Name)
			}
		}
		if len(missing) > 0 {
			return nil, fmt.Errorf("%w: revision %d: no peer holds the remembered content of %q", ErrResumeMismatch, rev, missing)
		}
		return hashes, nil
	}
	// The whole state wins, never entry by entry: voters are grouped by the hashes of all their voted
	// entries, the largest group wins, and a tie goes to the smallest hashes compared in name order.
	// Groups are formed in peer-id order and compared by count and hashes only, so the result
	// depends on neither the candidates' order nor map iteration.
	type tally struct {
		hashes []uint64
		n      int
	}
	var tallies []*tally
	index := make(map[string]*tally)
	for _, c := range active {
		if c.Digest.Revision != rev {
			continue
		}
		v := votedHashes(c, shape)
		k := stateKey(v)
		t := index[k]
		if t == nil {
			t = &tally{hashes: v}
			index[k] = t
			tallies = append(tallies, t)
		}
		t.n++
	}
	best := tallies[0]
	for _, t := range tallies[1:] {
		if t.n > best.n || (t.n == best.n && slices.Compare(t.hashes, best.hashes) < 0) {
			best = t
		}
	}
	copy(hashes, best.hashes)
	return hashes, nil
}

// votedHashes returns c's hash of each entry of shape, 0 for MayDiffer entries.
func votedHashes(c *Candidate, shape []EntryDigest) []uint64 {
	v := make([]uint64, len(shape))
	for k, e := range shape {
		if !e.MayDiffer {
			v[k] = c.Digest.Entries[k].Hash
		}
	}
	return v
}

// stateKey encodes voted hashes as a map key.
func stateKey(v []uint64) string {
	b := make([]byte, 0, 8*len(v))
	for _, h := range v {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return string(b)
}

// sendOnlyCheck returns the rejection of a SendOnly peer that lost, or nil.
func sendOnlyCheck(c *Candidate, rev uint64, shape []EntryDigest, hashes []uint64) error {
	if c.Digest.Revision != rev {
		return fmt.Errorf("peer %s: revision %d, elected %d: %w", c.Peer, c.Digest.Revision, rev, ErrSendOnlyLost)
	}
	var lost []string
	for k, e := range shape {
		if !e.MayDiffer && c.Digest.Entries[k].Hash != hashes[k] {
			lost = append(lost, e.Name)
		}
	}
	if len(lost) > 0 {
		return fmt.Errorf("peer %s: entries %q: %w", c.Peer, lost, ErrSendOnlyLost)
	}
	return nil
}

// assignFetches lists what each peer that is not rejected must fetch, and from whom, and the holders
// of the whole elected state. cs is sorted by peer id; current are the remaining voters at the
// elected revision, also sorted.
func assignFetches(cs []Candidate, rejected map[string]error, current []*Candidate, rev uint64, elected []EntryDigest) (map[string][]Fetch, []string) {
	// A peer that is behind takes every MayDiffer entry from one peer that holds the whole elected
	// state (any voter at the elected revision when nobody does, which only a resumption allows), so
	// that it ends with a state that peer held.
	whole := current[:0:0]
	var holders []string
	for _, d := range current {
		if holdsElected(d, elected) {
			whole = append(whole, d)
			holders = append(holders, d.Peer)
		}
	}
	if len(whole) == 0 {
		whole = current
	}
	load := make(map[string]int64)
	out := make(map[string][]Fetch)
	for i := range cs {
		c := &cs[i]
		if _, ok := rejected[c.Peer]; ok {
			continue
		}
		behind := c.Strategy == ReceiveOnly || c.Digest.Revision != rev
		var source *Candidate
		if behind {
			source = mayDifferSource(c, whole, elected, load)
		}
		var fs []Fetch
		for k, e := range elected {
			mine := c.Digest.Entries[k].Hash
			var f Fetch
			switch {
			case !e.MayDiffer:
				if mine == e.Hash {
					continue
				}
				f = Fetch{Name: e.Name, Hash: e.Hash, Bytes: e.Bytes()}
				for _, d := range current {
					if d.Digest.Entries[k].Hash == e.Hash {
						f.Donors = append(f.Donors, d.Peer)
					}
				}
				orderByLoad(f.Donors, load)
			case behind:
				h := source.Digest.Entries[k].Hash
				if mine == h {
					continue // our bytes are already the source's
				}
				f = Fetch{Name: e.Name, Hash: h, Bytes: e.Bytes(), Donors: []string{source.Peer}}
			default:
				continue
			}
			load[f.Donors[0]] += f.Bytes
			fs = append(fs, f)
		}
		if len(fs) > 0 {
			out[c.Peer] = fs
		}
	}
	return out, holders
}

// holdsElected reports whether d holds the elected hash of every voted entry.
func holdsElected(d *Candidate, elected []EntryDigest) bool {
	for k, e := range elected {
		if !e.MayDiffer && d.Digest.Entries[k].Hash != e.Hash {
			return false
		}
	}
	return true
}

// mayDifferSource picks the peer of pool that a behind peer c takes its MayDiffer entries from: the
// one it must fetch the fewest bytes of, then the least loaded, then the smallest peer id. Nil when
// the state has no MayDiffer entry.
func mayDifferSource(c *Candidate, pool []*Candidate, elected []EntryDigest, load map[string]int64) *Candidate {
	var best *Candidate
	var bestCost int64
	for _, d := range pool {
		var cost int64
		any := false
		for k, e := range elected {
			if e.MayDiffer {
				any = true
				if d.Digest.Entries[k].Hash != c.Digest.Entries[k].Hash {
					cost += e.Bytes()
				}
			}
		}
		if !any {
			return nil
		}
		if best == nil || cost < bestCost || (cost == bestCost && (load[d.Peer] < load[best.Peer] ||
			(load[d.Peer] == load[best.Peer] && d.Peer < best.Peer))) {
			best, bestCost = d, cost
		}
	}
	return best
}

// orderByLoad sorts donors by the bytes already assigned to them as first donor, then by peer id.
func orderByLoad(donors []string, load map[string]int64) {
	sort.SliceStable(donors, func(i, j int) bool {
		li, lj := load[donors[i]], load[donors[j]]
		if li != lj {
			return li < lj
		}
		return donors[i] < donors[j]
	})
}
