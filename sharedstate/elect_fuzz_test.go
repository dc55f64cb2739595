package sharedstate

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// FuzzElect runs the shared-state election on arbitrary candidates and priors and checks what every
// plan must satisfy: no panic; entries sorted by name; every fetch of a peer that is a candidate, not
// rejected, for an elected entry with the elected hash, from donors that hold that hash at the elected
// revision and are not the fetcher; a state elected whole from one voter (unless resumed); and a Prior
// that repeats the plan. Each candidate takes three
// bytes: strategy, revision, and the hashes of entries a, b and c (two bits each; 3 = absent).
func FuzzElect(f *testing.F) {
	f.Add([]byte{0, 1, 0x00, 0, 1, 0x00, 0, 1, 0x15}, uint64(0), false)
	f.Add([]byte{0, 2, 0x00, 1, 2, 0x05, 2, 1, 0x00, 0, 3, 0x2a}, uint64(1), true)
	f.Add([]byte{2, 0, 0x3f, 2, 0, 0x3f}, uint64(5), true)
	f.Fuzz(func(t *testing.T, data []byte, priorRev uint64, hasPrior bool) {
		var cands []Candidate
		for i := 0; i+2 < len(data) && len(cands) < 16; i += 3 {
			d := Digest{Revision: uint64(data[i+1] % 4)}
			for k, name := range []string{"a", "b", "c"} {
				h := uint64(data[i+2] >> (2 * k) & 3)
				if h == 3 {
					continue
				}
				d.Entries = append(d.Entries, EntryDigest{Name: name, DType: 10, Count: 4, Hash: h + 1, MayDiffer: name == "c" && data[i]&4 != 0})
			}
			cands = append(cands, Candidate{Peer: fmt.Sprintf("p%d", i/3), Strategy: Strategy(data[i] % 3), Digest: d})
		}
		var prior *Prior
		if hasPrior {
			prior = &Prior{Revision: priorRev % 8, Entries: []EntryDigest{{Name: "a", DType: 10, Count: 4, Hash: 1}}}
		}
		plan, err := Elect(cands, prior)
		if err != nil {
			return
		}
		if !slices.IsSortedFunc(plan.Entries, func(x, y EntryDigest) int { return strings.Compare(x.Name, y.Name) }) {
			t.Fatalf("entries not sorted: %+v", plan.Entries)
		}
		rejected := map[string]bool{}
		for _, r := range plan.Rejected {
			rejected[r.Peer] = true
		}
		byPeer := map[string]Candidate{}
		for _, c := range cands {
			byPeer[c.Peer] = c
		}
		for peer, fetches := range plan.Fetch {
			if _, ok := byPeer[peer]; !ok || rejected[peer] {
				t.Fatalf("fetch for %q, which is no candidate or rejected", peer)
			}
			for _, fe := range fetches {
				i := slices.IndexFunc(plan.Entries, func(e EntryDigest) bool { return e.Name == fe.Name })
				if i < 0 {
					t.Fatalf("%s fetches %q, which is not elected", peer, fe.Name)
				}
				if e := plan.Entries[i]; !e.MayDiffer && e.Hash != fe.Hash {
					t.Fatalf("%s fetches %q with hash %d, elected %d", peer, fe.Name, fe.Hash, e.Hash)
				}
				if len(fe.Donors) == 0 {
					t.Fatalf("%s fetches %q from nobody", peer, fe.Name)
				}
				for _, d := range fe.Donors {
					if d == peer {
						t.Fatalf("%s fetches %q from itself", peer, fe.Name)
					}
				}
			}
		}
		if !plan.Resumed && !slices.ContainsFunc(cands, func(c Candidate) bool {
			if rejected[c.Peer] || c.Strategy == ReceiveOnly || c.Digest.Revision != plan.Revision {
				return false
			}
			for _, e := range plan.Entries {
				i := slices.IndexFunc(c.Digest.Entries, func(x EntryDigest) bool { return x.Name == e.Name })
				if !e.MayDiffer && (i < 0 || c.Digest.Entries[i].Hash != e.Hash) {
					return false
				}
			}
			return true
		}) {
			t.Fatalf("no voter holds the elected state %+v", plan.Entries)
		}
		if p := plan.Prior(); p.Revision != plan.Revision || !slices.Equal(p.Entries, plan.Entries) {
			t.Fatalf("prior %+v does not repeat the plan", p)
		}
	})
}
