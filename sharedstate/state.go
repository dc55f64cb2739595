package sharedstate

import (
	"errors"
	"fmt"
	"sort"

	"github.com/concord-ccl/concord/rings"
)

// MaxNameLen is the longest entry name, in bytes, that the registry and the digest encoding accept.
const MaxNameLen = 1024

var (
	// ErrDuplicateEntry is returned by State.Add for a name that is already registered.
	ErrDuplicateEntry = errors.New("sharedstate: duplicate entry name")
	// ErrInvalidEntry is returned by State.Add for an entry with an empty or too long name, an
	// invalid dtype, or Data whose length is not a multiple of the dtype size.
	ErrInvalidEntry = errors.New("sharedstate: invalid entry")
)

// Entry is one named tensor of the shared state.
//
// Data is the application's memory: Concord hashes it and, when the peer is an outlier, overwrites it
// in place. The application must not touch it while a sync runs. len(Data) is Count()*DType.Size().
type Entry struct {
	// Name identifies the entry across peers; it is the only key entries are matched by.
	Name string
	// DType is the element type.
	DType rings.DType
	// Data is the tensor's bytes, owned by the application.
	Data []byte
	// MayDiffer excludes the entry from the vote; a peer that is behind still receives it.
	MayDiffer bool
	// Version, when non-zero, lets Concord skip re-hashing: the application promises to change Version
	// whenever it changes Data, and Concord reuses the hash it computed for the same Version. Zero (the
	// default) re-hashes Data at every sync, which is always safe.
	Version uint64

	hashedVersion uint64 // Version the cached hash belongs to; 0 = no cached hash
	hashedLen     int
	hash          uint64
	leaves        []uint64 // leaf hashes of Data when it was last hashed or verified; nil if unknown
}

// Leaves returns the leaf hashes of Data recorded when it was last hashed (by State.Digest) or
// installed by a sync, or nil. They are only valid while Data is unchanged.
func (e *Entry) Leaves() []uint64 { return e.leaves }

// RememberLeaves records that Data hashes to h with the given leaves.
func (e *Entry) RememberLeaves(leaves []uint64, h uint64) {
	e.leaves = leaves
	e.Remember(h)
}

// cached returns the remembered hash of Data if Version allows it.
func (e *Entry) cached() (uint64, bool) {
	if e.Version == 0 || e.hashedVersion != e.Version || e.hashedLen != len(e.Data) {
		return 0, false
	}
	return e.hash, true
}

// Remember records that Data currently hashes to h (Concord calls it after hashing or after writing
// verified content). It only takes effect for a non-zero Version.
func (e *Entry) Remember(h uint64) {
	e.hashedVersion, e.hashedLen, e.hash = e.Version, len(e.Data), h
}

// Count returns the number of elements in e.Data, or 0 when the dtype is invalid.
func (e *Entry) Count() uint64 {
	sz := e.DType.Size()
	if sz <= 0 {
		return 0
	}
	return uint64(len(e.Data) / sz)
}

// validate reports why e cannot be registered, or nil.
func (e *Entry) validate() error {
	switch {
	case e.Name == "":
		return fmt.Errorf("%w: empty name", ErrInvalidEntry)
	case len(e.Name) > MaxNameLen:
		return fmt.Errorf("%w: name of %d bytes exceeds %d", ErrInvalidEntry, len(e.Name), MaxNameLen)
	case !e.DType.Valid():
		return fmt.Errorf("%w: entry %q: invalid dtype %d", ErrInvalidEntry, e.Name, e.DType)
	case len(e.Data)%e.DType.Size() != 0:
		return fmt.Errorf("%w: entry %q: %d bytes is not a multiple of the %s size %d",
			ErrInvalidEntry, e.Name, len(e.Data), e.DType, e.DType.Size())
	}
	return nil
}

// State is a peer's shared state: a revision and the entries, kept sorted by name.
//
// A State is not safe for concurrent use; its owner (the application's training loop) serializes Add,
// Remove and syncs. Entries may be read directly but should only be changed through Add and Remove,
// which keep the slice sorted by name.
type State struct {
	// Revision counts the syncs this state has gone through; the application advances it by one
	// before each sync.
	Revision uint64
	// Entries are the registered entries sorted by name.
	Entries []*Entry
}

// NewState returns an empty State at revision 0.
func NewState() *State { return &State{} }

// Add registers e. It fails with ErrInvalidEntry for an empty or too long name, an invalid dtype or a
// length that is not a whole number of elements, and with ErrDuplicateEntry for a name already present.
// The State keeps the pointer; the caller keeps owning e.Data.
func (s *State) Add(e *Entry) error {
	if e == nil {
		return fmt.Errorf("%w: nil entry", ErrInvalidEntry)
	}
	if err := e.validate(); err != nil {
		return err
	}
	i := s.search(e.Name)
	if i < len(s.Entries) && s.Entries[i].Name == e.Name {
		return fmt.Errorf("%w: %q", ErrDuplicateEntry, e.Name)
	}
	s.Entries = append(s.Entries, nil)
	copy(s.Entries[i+1:], s.Entries[i:])
	s.Entries[i] = e
	return nil
}

// Remove unregisters the entry called name and reports whether it was present.
func (s *State) Remove(name string) bool {
	i := s.search(name)
	if i >= len(s.Entries) || s.Entries[i].Name != name {
		return false
	}
	s.Entries = append(s.Entries[:i], s.Entries[i+1:]...)
	return true
}

// Lookup returns the entry called name, or nil.
func (s *State) Lookup(name string) *Entry {
	i := s.search(name)
	if i < len(s.Entries) && s.Entries[i].Name == name {
		return s.Entries[i]
	}
	return nil
}

// Sorted returns a new slice of the entries sorted by name. It is correct even if Entries was
// reordered by hand.
func (s *State) Sorted() []*Entry {
	out := append([]*Entry(nil), s.Entries...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// search returns the index of the first entry whose name is not below name.
func (s *State) search(name string) int {
	return sort.Search(len(s.Entries), func(i int) bool { return s.Entries[i].Name >= name })
}
