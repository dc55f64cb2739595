package sharedstate

import (
	"errors"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/concord-ccl/concord/rings"
)

// The test state has two voted entries and one MayDiffer entry.
var testShape = []EntryDigest{
	{Name: "a", DType: rings.F32, Count: 4},
	{Name: "b", DType: rings.BF16, Count: 2048},
	{Name: "m", DType: rings.U8, Count: 8, MayDiffer: true},
}

// cand returns a candidate holding the given hashes for a, b and m.
func cand(peer string, s Strategy, rev uint64, ha, hb, hm uint64) Candidate {
	es := append([]EntryDigest(nil), testShape...)
	es[0].Hash, es[1].Hash, es[2].Hash = ha, hb, hm
	return Candidate{Peer: peer, Strategy: s, Digest: Digest{Revision: rev, Entries: es}}
}

// elected returns the plan entries for the given a and b hashes.
func elected(ha, hb uint64) []EntryDigest {
	es := append([]EntryDigest(nil), testShape...)
	es[0].Hash, es[1].Hash = ha, hb
	return es
}

func fa(h uint64, donors ...string) Fetch {
	return Fetch{Name: "a", Hash: h, Bytes: 16, Donors: donors}
}
func fb(h uint64, donors ...string) Fetch {
	return Fetch{Name: "b", Hash: h, Bytes: 4096, Donors: donors}
}
func fm(h uint64, donor string) Fetch {
	return Fetch{Name: "m", Hash: h, Bytes: 8, Donors: []string{donor}}
}

// rejected returns the rejected peers of p and the sentinel each one's error wraps.
func rejectedPeers(p Plan) map[string]error {
	out := make(map[string]error)
	for _, r := range p.Rejected {
		switch {
		case errors.Is(r.Err, ErrSendOnlyLost):
			out[r.Peer] = ErrSendOnlyLost
		case errors.Is(r.Err, ErrRevision):
			out[r.Peer] = ErrRevision
		default:
			out[r.Peer] = r.Err
		}
	}
	return out
}

// wantPlan is the part of a Plan a table case spells out.
type wantPlan struct {
	rev      uint64
	resumed  bool
	ha, hb   uint64
	fetch    map[string][]Fetch
	rejected map[string]error
}

func checkWant(t *testing.T, name string, got Plan, w wantPlan) {
	t.Helper()
	if got.Revision != w.rev || got.Resumed != w.resumed {
		t.Errorf("%s: revision %d resumed %v, want %d %v", name, got.Revision, got.Resumed, w.rev, w.resumed)
	}
	if !reflect.DeepEqual(got.Entries, elected(w.ha, w.hb)) {
		t.Errorf("%s: entries %+v, want a=%d b=%d", name, got.Entries, w.ha, w.hb)
	}
	if w.fetch == nil {
		w.fetch = map[string][]Fetch{}
	}
	if !reflect.DeepEqual(got.Fetch, w.fetch) {
		t.Errorf("%s: fetch\n got %+v\nwant %+v", name, got.Fetch, w.fetch)
	}
	if w.rejected == nil {
		w.rejected = map[string]error{}
	}
	if r := rejectedPeers(got); !reflect.DeepEqual(r, w.rejected) {
		t.Errorf("%s: rejected %v, want %v", name, r, w.rejected)
	}
}

func TestElect(t *testing.T) {
	prior5 := &Prior{Revision: 5, Entries: elected(1, 2)}
	cases := []struct {
		name  string
		cands []Candidate
		prior *Prior
		want  wantPlan
	}{
		{
			name: "unanimous",
			cands: []Candidate{
				cand("p1", EnforcePopular, 3, 1, 2, 30),
				cand("p2", EnforcePopular, 3, 1, 2, 31),
			},
			want: wantPlan{rev: 3, ha: 1, hb: 2},
		},
		{
			name: "an outlier fetches only the entries that differ",
			cands: []Candidate{
				cand("p1", EnforcePopular, 3, 1, 2, 30),
				cand("p2", EnforcePopular, 3, 1, 2, 30),
				cand("p3", EnforcePopular, 3, 9, 2, 30),
			},
			want: wantPlan{rev: 3, ha: 1, hb: 2, fetch: map[string][]Fetch{"p3": {fa(1, "p1", "p2")}}},
		},
		{
			name: "a tie goes to the state with the smallest hashes",
			cands: []Candidate{
				cand("p1", EnforcePopular, 3, 9, 2, 0),
				cand("p2", EnforcePopular, 3, 5, 2, 0),
			},
			want: wantPlan{rev: 3, ha: 5, hb: 2, fetch: map[string][]Fetch{"p1": {fa(5, "p2")}}},
		},
		{
			// Voted entry by entry, a would go to 5 and b to 4: a state nobody holds.
			name: "a two-two tie elects one whole state, never a mix",
			cands: []Candidate{
				cand("p1", EnforcePopular, 3, 9, 4, 0),
				cand("p2", EnforcePopular, 3, 9, 4, 0),
				cand("p3", EnforcePopular, 3, 5, 8, 0),
				cand("p4", EnforcePopular, 3, 5, 8, 0),
			},
			want: wantPlan{rev: 3, ha: 5, hb: 8, fetch: map[string][]Fetch{
				"p1": {fa(5, "p3", "p4"), fb(8, "p4", "p3")},
				"p2": {fa(5, "p3", "p4"), fb(8, "p3", "p4")},
			}},
		},
		{
			name: "two peers with crossed entries end with one of the two states",
			cands: []Candidate{
				cand("p0", EnforcePopular, 1, 201, 251, 0),
				cand("p1", EnforcePopular, 1, 202, 252, 0),
			},
			want: wantPlan{rev: 1, ha: 201, hb: 251, fetch: map[string][]Fetch{"p1": {fa(201, "p0"), fb(251, "p0")}}},
		},
		{
			// Entry by entry, a would go to 1 (p1, p2) and b to 9 (p3, p4): a state nobody holds.
			name: "majorities of single entries do not make a state",
			cands: []Candidate{
				cand("p1", EnforcePopular, 3, 1, 7, 0),
				cand("p2", EnforcePopular, 3, 1, 8, 0),
				cand("p3", EnforcePopular, 3, 2, 9, 0),
				cand("p4", EnforcePopular, 3, 3, 9, 0),
			},
			want: wantPlan{rev: 3, ha: 1, hb: 7, fetch: map[string][]Fetch{
				"p2": {fb(7, "p1")},
				"p3": {fa(1, "p2", "p1"), fb(7, "p1")},
				"p4": {fa(1, "p2", "p1"), fb(7, "p1")},
			}},
		},
		{
			name: "the most popular whole state wins over a more popular single entry",
			cands: []Candidate{
				cand("p1", EnforcePopular, 3, 4, 5, 0),
				cand("p2", EnforcePopular, 3, 4, 5, 0),
				cand("p3", EnforcePopular, 3, 1, 6, 0),
				cand("p4", EnforcePopular, 3, 1, 7, 0),
				cand("p5", EnforcePopular, 3, 1, 8, 0),
			},
			want: wantPlan{rev: 3, ha: 4, hb: 5, fetch: map[string][]Fetch{
				"p3": {fa(4, "p1", "p2"), fb(5, "p2", "p1")},
				"p4": {fa(4, "p1", "p2"), fb(5, "p1", "p2")},
				"p5": {fa(4, "p2", "p1"), fb(5, "p2", "p1")},
			}},
		},
		{
			name: "fresh run revision tie goes to the higher revision",
			cands: []Candidate{
				cand("p1", EnforcePopular, 3, 1, 2, 7),
				cand("p2", EnforcePopular, 4, 1, 2, 8),
			},
			want: wantPlan{rev: 4, ha: 1, hb: 2, fetch: map[string][]Fetch{"p1": {fm(8, "p2")}}},
		},
		{
			name: "fresh run most popular revision",
			cands: []Candidate{
				cand("p1", EnforcePopular, 3, 1, 2, 7),
				cand("p2", EnforcePopular, 3, 1, 2, 7),
				cand("p3", EnforcePopular, 9, 6, 6, 6),
			},
			want: wantPlan{rev: 3, ha: 1, hb: 2, fetch: map[string][]Fetch{"p3": {fa(1, "p1", "p2"), fb(2, "p2", "p1"), fm(7, "p1")}}},
		},
		{
			name: "send-only that wins is a donor",
			cands: []Candidate{
				cand("s", SendOnly, 3, 1, 2, 0),
				cand("p", EnforcePopular, 3, 1, 2, 0),
				cand("q", EnforcePopular, 3, 4, 2, 0),
			},
			want: wantPlan{rev: 3, ha: 1, hb: 2, fetch: map[string][]Fetch{"q": {fa(1, "p", "s")}}},
		},
		{
			name: "send-only that loses an entry is rejected",
			cands: []Candidate{
				cand("s", SendOnly, 3, 1, 7, 0),
				cand("p", EnforcePopular, 3, 1, 2, 0),
				cand("q", EnforcePopular, 3, 1, 2, 0),
			},
			want: wantPlan{rev: 3, ha: 1, hb: 2, rejected: map[string]error{"s": ErrSendOnlyLost}},
		},
		{
			name: "send-only at a losing revision is rejected",
			cands: []Candidate{
				cand("s", SendOnly, 2, 1, 2, 0),
				cand("p", EnforcePopular, 3, 1, 2, 0),
				cand("q", EnforcePopular, 3, 1, 2, 0),
			},
			want: wantPlan{rev: 3, ha: 1, hb: 2, rejected: map[string]error{"s": ErrSendOnlyLost}},
		},
		{
			// s1 and s2 make revision 4 win (a tie with 3 goes to the higher one) and s1's state
			// wins at 4; s2 is withdrawn, the vote is rerun, revision 3 wins and s1 is withdrawn too.
			name: "withdrawn send-only votes are recounted",
			cands: []Candidate{
				cand("s1", SendOnly, 4, 1, 8, 0),
				cand("s2", SendOnly, 4, 1, 9, 0),
				cand("y", EnforcePopular, 3, 2, 4, 0),
				cand("z", EnforcePopular, 3, 3, 4, 0),
			},
			want: wantPlan{rev: 3, ha: 2, hb: 4,
				fetch:    map[string][]Fetch{"z": {fa(2, "y")}},
				rejected: map[string]error{"s1": ErrSendOnlyLost, "s2": ErrSendOnlyLost}},
		},
		{
			name: "of two send-only peers that disagree one wins",
			cands: []Candidate{
				cand("s1", SendOnly, 6, 2, 1, 0),
				cand("s2", SendOnly, 6, 1, 2, 0),
			},
			prior: &Prior{Revision: 5, Entries: elected(1, 2)},
			want:  wantPlan{rev: 6, ha: 1, hb: 2, rejected: map[string]error{"s1": ErrSendOnlyLost}},
		},
		{
			name: "receive-only never votes and receives the rest",
			cands: []Candidate{
				cand("r1", ReceiveOnly, 3, 7, 7, 7),
				cand("r2", ReceiveOnly, 3, 7, 2, 7),
				cand("p", EnforcePopular, 3, 1, 2, 5),
			},
			want: wantPlan{rev: 3, ha: 1, hb: 2, fetch: map[string][]Fetch{
				"r1": {fa(1, "p"), fb(2, "p"), fm(5, "p")},
				"r2": {fa(1, "p"), fm(5, "p")},
			}},
		},
		{
			name: "send-only and receive-only mix",
			cands: []Candidate{
				cand("s", SendOnly, 4, 1, 2, 5),
				cand("r", ReceiveOnly, 0, 0, 0, 0),
			},
			want: wantPlan{rev: 4, ha: 1, hb: 2, fetch: map[string][]Fetch{"r": {fa(1, "s"), fb(2, "s"), fm(5, "s")}}},
		},
		{
			name: "newcomer fetches may-differ entries, others keep theirs",
			cands: []Candidate{
				cand("p1", EnforcePopular, 6, 1, 2, 11),
				cand("p2", EnforcePopular, 6, 1, 2, 12),
				cand("new", EnforcePopular, 0, 0, 0, 0),
			},
			prior: prior5,
			want:  wantPlan{rev: 6, ha: 1, hb: 2, fetch: map[string][]Fetch{"new": {fa(1, "p1", "p2"), fb(2, "p2", "p1"), fm(11, "p1")}}},
		},
		{
			name: "newcomer whose may-differ entry matches a holder keeps it",
			cands: []Candidate{
				cand("p1", EnforcePopular, 6, 1, 2, 11),
				cand("p2", EnforcePopular, 6, 1, 2, 12),
				cand("new", EnforcePopular, 0, 1, 0, 12),
			},
			prior: prior5,
			want:  wantPlan{rev: 6, ha: 1, hb: 2, fetch: map[string][]Fetch{"new": {fb(2, "p1", "p2")}}},
		},
		{
			name: "revision advances by one; a peer two ahead is rejected",
			cands: []Candidate{
				cand("p1", EnforcePopular, 6, 1, 2, 0),
				cand("p2", EnforcePopular, 6, 1, 2, 0),
				cand("p3", EnforcePopular, 7, 1, 2, 0),
			},
			prior: prior5,
			want:  wantPlan{rev: 6, ha: 1, hb: 2, rejected: map[string]error{"p3": ErrRevision}},
		},
		{
			name: "the next revision beats a more popular current one",
			cands: []Candidate{
				cand("p1", EnforcePopular, 5, 1, 2, 0),
				cand("p2", EnforcePopular, 5, 1, 2, 0),
				cand("p3", EnforcePopular, 6, 3, 4, 9),
			},
			prior: prior5,
			want: wantPlan{rev: 6, ha: 3, hb: 4, fetch: map[string][]Fetch{
				"p1": {fa(3, "p3"), fb(4, "p3"), fm(9, "p3")},
				"p2": {fa(3, "p3"), fb(4, "p3"), fm(9, "p3")},
			}},
		},
		{
			name: "resume from the remembered state",
			cands: []Candidate{
				cand("p1", EnforcePopular, 5, 1, 2, 3),
				cand("p2", EnforcePopular, 5, 1, 2, 4),
			},
			prior: prior5,
			want:  wantPlan{rev: 5, resumed: true, ha: 1, hb: 2},
		},
		{
			name: "resume takes the remembered content over a more popular one",
			cands: []Candidate{
				cand("p1", EnforcePopular, 5, 8, 2, 3),
				cand("p2", EnforcePopular, 5, 8, 2, 3),
				cand("p3", EnforcePopular, 5, 1, 2, 3),
			},
			prior: prior5,
			want:  wantPlan{rev: 5, resumed: true, ha: 1, hb: 2, fetch: map[string][]Fetch{"p1": {fa(1, "p3")}, "p2": {fa(1, "p3")}}},
		},
	}
	for _, c := range cases {
		got, err := Elect(c.cands, c.prior)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		checkWant(t, c.name, got, c.want)
		checkPlan(t, c.name, c.cands, got)
	}
}

func TestElectErrors(t *testing.T) {
	prior5 := &Prior{Revision: 5, Entries: elected(1, 2)}
	badDigest := cand("x", EnforcePopular, 1, 1, 1, 1)
	badDigest.Digest.Entries = append(badDigest.Digest.Entries, badDigest.Digest.Entries[0])
	badDType := cand("x", EnforcePopular, 1, 1, 1, 1)
	badDType.Digest.Entries[1].DType = 0
	cases := []struct {
		name  string
		cands []Candidate
		prior *Prior
		want  []error
	}{
		{"no candidates", nil, nil, []error{ErrNoCandidates}},
		{"empty peer id", []Candidate{cand("", EnforcePopular, 1, 1, 1, 1)}, nil, []error{ErrInvalidCandidate}},
		{"duplicate peer", []Candidate{cand("x", EnforcePopular, 1, 1, 1, 1), cand("x", EnforcePopular, 1, 1, 1, 1)}, nil, []error{ErrInvalidCandidate}},
		{"unknown strategy", []Candidate{cand("x", Strategy(3), 1, 1, 1, 1)}, nil, []error{ErrInvalidCandidate}},
		{"duplicate entry", []Candidate{badDigest}, nil, []error{ErrInvalidCandidate}},
		{"invalid dtype", []Candidate{badDType}, nil, []error{ErrInvalidCandidate}},
		{"all receive-only", []Candidate{cand("r1", ReceiveOnly, 1, 1, 1, 1), cand("r2", ReceiveOnly, 1, 1, 1, 1)}, nil, []error{ErrNoDonor}},
		{"every voter too far ahead", []Candidate{cand("p1", EnforcePopular, 8, 1, 2, 0), cand("r", ReceiveOnly, 5, 1, 2, 0)}, prior5, []error{ErrNoDonor, ErrRevision}},
		{"resume from an older revision", []Candidate{cand("p1", EnforcePopular, 3, 1, 2, 0)}, prior5, []error{ErrResumeMismatch}},
		{"resume with other content", []Candidate{cand("p1", EnforcePopular, 5, 1, 7, 0), cand("p2", EnforcePopular, 5, 1, 7, 0)}, prior5, []error{ErrResumeMismatch}},
		{"resume with another entry set", []Candidate{cand("p1", EnforcePopular, 5, 1, 2, 0)}, &Prior{Revision: 5, Entries: elected(1, 2)[:2]}, []error{ErrResumeMismatch}},
		{"resume with another dtype", []Candidate{cand("p1", EnforcePopular, 5, 1, 2, 0)}, &Prior{Revision: 5, Entries: []EntryDigest{
			{Name: "a", DType: rings.F32, Count: 4, Hash: 1},
			{Name: "b", DType: rings.F16, Count: 2048, Hash: 2},
			{Name: "m", DType: rings.U8, Count: 8, MayDiffer: true},
		}}, []error{ErrResumeMismatch}},
	}
	for _, c := range cases {
		p, err := Elect(c.cands, c.prior)
		for _, w := range c.want {
			if !errors.Is(err, w) {
				t.Errorf("%s: Elect = %+v, %v; want an error wrapping %v", c.name, p, err, w)
			}
		}
	}
}

func TestElectEntrySetMismatch(t *testing.T) {
	c := cand("c", EnforcePopular, 1, 1, 2, 3)
	c.Digest.Entries = c.Digest.Entries[:1] // lacks b and m
	d := cand("d", EnforcePopular, 1, 1, 2, 3)
	d.Digest.Entries[0].DType = rings.F16
	d.Digest.Entries[0].Count = 8
	e := cand("e", EnforcePopular, 1, 1, 2, 3)
	e.Digest.Entries = append(e.Digest.Entries, EntryDigest{Name: "extra", DType: rings.I8, Count: 1})
	cands := []Candidate{e, d, cand("a", EnforcePopular, 1, 1, 2, 3), c, cand("b", ReceiveOnly, 1, 1, 2, 3)}
	_, err := Elect(cands, nil)
	var me *MismatchError
	if !errors.As(err, &me) || !errors.Is(err, ErrEntrySetMismatch) {
		t.Fatalf("Elect = %v, want a *MismatchError", err)
	}
	want := []EntryMismatch{
		{Name: "a", Variants: []Variant{
			{Present: true, DType: rings.F32, Count: 4, Peers: []string{"a", "b", "c", "e"}},
			{Present: true, DType: rings.F16, Count: 8, Peers: []string{"d"}},
		}},
		{Name: "b", Variants: []Variant{
			{Present: true, DType: rings.BF16, Count: 2048, Peers: []string{"a", "b", "d", "e"}},
			{Present: false, Peers: []string{"c"}},
		}},
		{Name: "extra", Variants: []Variant{
			{Present: false, Peers: []string{"a", "b", "c", "d"}},
			{Present: true, DType: rings.I8, Count: 1, Peers: []string{"e"}},
		}},
		{Name: "m", Variants: []Variant{
			{Present: true, DType: rings.U8, Count: 8, MayDiffer: true, Peers: []string{"a", "b", "d", "e"}},
			{Present: false, Peers: []string{"c"}},
		}},
	}
	if !reflect.DeepEqual(me.Entries, want) {
		t.Errorf("mismatch\n got %+v\nwant %+v", me.Entries, want)
	}
	msg := err.Error()
	for _, s := range []string{`"a": f32[4] on [a b c e], f16[8] on [d]`, `"b":`, `absent on [c]`, `"extra":`, `"m": u8[8] may-differ on`} {
		if !strings.Contains(msg, s) {
			t.Errorf("message %q lacks %q", msg, s)
		}
	}
	// A different MayDiffer flag is a mismatch too.
	f := cand("f", EnforcePopular, 1, 1, 2, 3)
	f.Digest.Entries[2].MayDiffer = false
	if _, err := Elect([]Candidate{cand("a", EnforcePopular, 1, 1, 2, 3), f}, nil); !errors.As(err, &me) || len(me.Entries) != 1 || me.Entries[0].Name != "m" {
		t.Errorf("MayDiffer flag mismatch: %v", err)
	}
}

func TestElectDonorSpreading(t *testing.T) {
	shape := []EntryDigest{
		{Name: "x", DType: rings.F32, Count: 25},
		{Name: "y", DType: rings.F32, Count: 25},
		{Name: "z", DType: rings.F32, Count: 25},
	}
	mk := func(peer string, h uint64) Candidate {
		es := append([]EntryDigest(nil), shape...)
		for i := range es {
			es[i].Hash = h
		}
		return Candidate{Peer: peer, Digest: Digest{Revision: 1, Entries: es}}
	}
	cands := []Candidate{mk("d1", 1), mk("d2", 1), mk("d3", 1), mk("d4", 1), mk("o1", 2), mk("o2", 3), mk("o3", 4)}
	p, err := Elect(cands, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := func(name string, donors ...string) Fetch {
		return Fetch{Name: name, Hash: 1, Bytes: 100, Donors: donors}
	}
	want := map[string][]Fetch{
		"o1": {f("x", "d1", "d2", "d3", "d4"), f("y", "d2", "d3", "d4", "d1"), f("z", "d3", "d4", "d1", "d2")},
		"o2": {f("x", "d4", "d1", "d2", "d3"), f("y", "d1", "d2", "d3", "d4"), f("z", "d2", "d3", "d4", "d1")},
		"o3": {f("x", "d3", "d4", "d1", "d2"), f("y", "d4", "d1", "d2", "d3"), f("z", "d1", "d2", "d3", "d4")},
	}
	if !reflect.DeepEqual(p.Fetch, want) {
		t.Errorf("fetch\n got %+v\nwant %+v", p.Fetch, want)
	}
	first := map[string]int{}
	for _, fs := range p.Fetch {
		for _, f := range fs {
			first[f.Donors[0]]++
		}
	}
	if !reflect.DeepEqual(first, map[string]int{"d1": 3, "d2": 2, "d3": 2, "d4": 2}) {
		t.Errorf("first-donor counts %v", first)
	}
}

func TestPlanPrior(t *testing.T) {
	p, err := Elect([]Candidate{cand("p", EnforcePopular, 6, 1, 2, 3)}, &Prior{Revision: 5})
	if err != nil {
		t.Fatal(err)
	}
	pr := p.Prior()
	if pr.Revision != 6 || !reflect.DeepEqual(pr.Entries, elected(1, 2)) {
		t.Fatalf("Prior = %+v", pr)
	}
	// The next sync resumes from it or advances it.
	if q, err := Elect([]Candidate{cand("p", EnforcePopular, 6, 1, 2, 9)}, pr); err != nil || !q.Resumed {
		t.Errorf("resume: %+v, %v", q, err)
	}
	if q, err := Elect([]Candidate{cand("p", EnforcePopular, 7, 4, 4, 9)}, pr); err != nil || q.Revision != 7 {
		t.Errorf("advance: %+v, %v", q, err)
	}
}

// checkPlan asserts the invariants every plan must satisfy: fetches come from eligible donors that
// hold exactly the promised bytes; once applied every kept peer holds the elected content; the
// elected content is the whole state of some voter (unless the plan resumes the remembered one);
// and a peer that is behind ends with the whole state, MayDiffer entries included, of one voter that
// holds the elected content.
func checkPlan(t *testing.T, name string, cands []Candidate, p Plan) {
	t.Helper()
	checkWholeState(t, name, cands, p)
	byPeer := make(map[string]Candidate)
	for _, c := range cands {
		byPeer[c.Peer] = c
	}
	rej := rejectedPeers(p)
	hashOf := func(c Candidate, entry string) uint64 {
		for _, e := range c.Digest.Entries {
			if e.Name == entry {
				return e.Hash
			}
		}
		t.Fatalf("%s: peer %s lacks %q", name, c.Peer, entry)
		return 0
	}
	for peer, fs := range p.Fetch {
		if _, ok := rej[peer]; ok {
			t.Errorf("%s: rejected peer %s fetches", name, peer)
		}
		for _, f := range fs {
			if len(f.Donors) == 0 {
				t.Errorf("%s: %s fetches %s without a donor", name, peer, f.Name)
			}
			for _, d := range f.Donors {
				dc := byPeer[d]
				if _, ok := rej[d]; ok || dc.Strategy == ReceiveOnly || dc.Digest.Revision != p.Revision || d == peer {
					t.Errorf("%s: %s is not an eligible donor of %s to %s", name, d, f.Name, peer)
				}
				if hashOf(dc, f.Name) != f.Hash {
					t.Errorf("%s: donor %s does not hold %#x for %s", name, d, f.Hash, f.Name)
				}
			}
			if hashOf(byPeer[peer], f.Name) == f.Hash {
				t.Errorf("%s: %s fetches %s it already holds", name, peer, f.Name)
			}
		}
	}
	for _, c := range cands {
		if _, ok := rej[c.Peer]; ok {
			continue
		}
		got := make(map[string]uint64)
		for _, e := range c.Digest.Entries {
			got[e.Name] = e.Hash
		}
		for _, f := range p.Fetch[c.Peer] {
			got[f.Name] = f.Hash
		}
		for _, e := range p.Entries {
			if !e.MayDiffer && got[e.Name] != e.Hash {
				t.Errorf("%s: after the plan %s holds %#x for %s, elected %#x", name, c.Peer, got[e.Name], e.Name, e.Hash)
			}
		}
		if c.Strategy == SendOnly && len(p.Fetch[c.Peer]) > 0 && c.Digest.Revision == p.Revision {
			for _, f := range p.Fetch[c.Peer] {
				if !byPeerEntry(c, f.Name).MayDiffer {
					t.Errorf("%s: send-only %s receives %s", name, c.Peer, f.Name)
				}
			}
		}
	}
}

func byPeerEntry(c Candidate, name string) EntryDigest {
	for _, e := range c.Digest.Entries {
		if e.Name == name {
			return e
		}
	}
	return EntryDigest{}
}

// TestElectDeterministic elects random groups in many candidate orders and checks that the plan (or
// the error) never changes and always satisfies checkPlan.
func TestElectDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 300 {
		n := 1 + rng.IntN(8)
		var prior *Prior
		if rng.IntN(2) == 0 {
			prior = &Prior{Revision: 10, Entries: elected(uint64(rng.IntN(3)), uint64(rng.IntN(3)))}
		}
		cands := make([]Candidate, n)
		for i := range cands {
			cands[i] = cand(string(rune('a'+i)), Strategy(rng.IntN(3)), uint64(9+rng.IntN(3)),
				uint64(rng.IntN(3)), uint64(rng.IntN(3)), uint64(rng.IntN(3)))
		}
		ref, refErr := Elect(cands, prior)
		if refErr == nil {
			checkPlan(t, "random", cands, ref)
		}
		for range 5 {
			shuffled := append([]Candidate(nil), cands...)
			rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			for i := range shuffled {
				es := append([]EntryDigest(nil), shuffled[i].Digest.Entries...)
				rng.Shuffle(len(es), func(i, j int) { es[i], es[j] = es[j], es[i] })
				shuffled[i].Digest.Entries = es
			}
			got, err := Elect(shuffled, prior)
			if !reflect.DeepEqual(got, ref) || !reflect.DeepEqual(err, refErr) {
				t.Fatalf("round %d: order changed the outcome:\n%+v %v\n%+v %v", round, ref, refErr, got, err)
			}
		}
	}
}

// checkWholeState asserts that the plan elects a state some voter holds whole and that every peer
// that is behind ends with exactly the state of one holder.
func checkWholeState(t *testing.T, name string, cands []Candidate, p Plan) {
	t.Helper()
	rej := rejectedPeers(p)
	full := func(c Candidate) map[string]uint64 {
		m := make(map[string]uint64)
		for _, e := range c.Digest.Entries {
			m[e.Name] = e.Hash
		}
		return m
	}
	holdsElected := func(m map[string]uint64) bool {
		for _, e := range p.Entries {
			if !e.MayDiffer && m[e.Name] != e.Hash {
				return false
			}
		}
		return true
	}
	var holders []map[string]uint64
	for _, c := range cands {
		if _, ok := rej[c.Peer]; ok || c.Strategy == ReceiveOnly || c.Digest.Revision != p.Revision {
			continue
		}
		if m := full(c); holdsElected(m) {
			holders = append(holders, m)
		}
	}
	if len(holders) == 0 {
		if !p.Resumed {
			t.Errorf("%s: no voter holds the elected state %+v", name, p.Entries)
		}
		return
	}
	for _, c := range cands {
		if _, ok := rej[c.Peer]; ok || (c.Strategy != ReceiveOnly && c.Digest.Revision == p.Revision) {
			continue
		}
		after := full(c)
		for _, f := range p.Fetch[c.Peer] {
			after[f.Name] = f.Hash
		}
		if !slices.ContainsFunc(holders, func(h map[string]uint64) bool { return maps.Equal(h, after) }) {
			t.Errorf("%s: %s ends with %v, the whole state of no holder", name, c.Peer, after)
		}
	}
}

// TestElectMayDifferFromOneHolder: a peer that is behind takes all its MayDiffer entries from one
// holder of the elected state, the one it has most in common with, never a mix of several holders'.
func TestElectMayDifferFromOneHolder(t *testing.T) {
	shape := []EntryDigest{
		{Name: "w", DType: rings.F32, Count: 4},
		{Name: "x", DType: rings.F32, Count: 4, MayDiffer: true},
		{Name: "y", DType: rings.F32, Count: 4, MayDiffer: true},
	}
	mk := func(peer string, rev, w, x, y uint64) Candidate {
		es := append([]EntryDigest(nil), shape...)
		es[0].Hash, es[1].Hash, es[2].Hash = w, x, y
		return Candidate{Peer: peer, Digest: Digest{Revision: rev, Entries: es}}
	}
	cands := []Candidate{mk("h1", 4, 1, 10, 20), mk("h2", 4, 1, 11, 21), mk("new", 0, 0, 11, 20)}
	p, err := Elect(cands, &Prior{Revision: 3})
	if err != nil {
		t.Fatal(err)
	}
	// new shares x with h2 and y with h1: per entry it would keep both and end with a mix. It takes
	// h1's state (equal cost, then peer id): y is kept, x fetched.
	want := map[string][]Fetch{"new": {
		{Name: "w", Hash: 1, Bytes: 16, Donors: []string{"h1", "h2"}},
		{Name: "x", Hash: 10, Bytes: 16, Donors: []string{"h1"}},
	}}
	if !reflect.DeepEqual(p.Fetch, want) {
		t.Errorf("fetch\n got %+v\nwant %+v", p.Fetch, want)
	}
	checkPlan(t, "may-differ", cands, p)
}
