package plan

import (
	"reflect"
	"testing"
)

func TestRerankBridgesARailMismatch(t *testing.T) {
	tp := Uniform(6, 8, 2, 0, 25e9)
	tp.Nodes[0].NICs[1].Down = true // node 0 lost rail 1
	tp.Nodes[1].NICs[2].Down = true // its neighbour lost rail 2: they share only 6 rails
	got := Rerank(tp.order(), tp.railSets())
	if want := []int{0, 2, 1, 3, 4, 5}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Rerank = %v, want %v (node 2 bridges 0 and 1)", got, want)
	}
	for i, u := range got {
		if o := overlap(tp.Rails(u), tp.Rails(got[(i+1)%len(got)])); o < 7 {
			t.Errorf("edge %d-%d shares %d rails after re-ranking, want 7", u, got[(i+1)%len(got)], o)
		}
	}
	const d = 1 << 32
	plain := mustCost(t, tp, Balance, d, Model{NoRerank: true})
	rr := mustCost(t, tp, Balance, d, Model{})
	if !rr.Reranked || !reflect.DeepEqual(rr.Rings[0], got) {
		t.Errorf("Balance did not use the re-ranked ring: %+v", rr)
	}
	if want := plain.Seconds * 6 / 7; rr.Seconds > want*(1+1e-12) {
		t.Errorf("re-ranked Balance %.6g s, want %.6g (7 rails instead of 6)", rr.Seconds, want)
	}
	// A ring without mismatches is left alone.
	healthy := Uniform(6, 8, 2, 0, 25e9)
	if got := Rerank(healthy.order(), healthy.railSets()); !reflect.DeepEqual(got, healthy.order()) {
		t.Errorf("healthy ring re-ranked to %v", got)
	}
}
