package nodeproc

import "testing"

func TestCheck(t *testing.T) {
	const nodes, n = 3, 3000
	sum := make([]float32, n)
	for node := range nodes {
		in := make([]float32, n)
		Fill(in, node)
		for i, v := range in {
			sum[i] += v
		}
	}
	if !Check(sum, nodes) {
		t.Fatal("the exact sum does not check")
	}
	Poison(sum)
	if Check(sum, nodes) {
		t.Fatal("a poisoned result checks")
	}
	sum = sum[:1000]
	for i := range sum {
		sum[i] = 0
		for node := range nodes {
			sum[i] += Value(node, i)
		}
	}
	sum[999]++
	if Check(sum, nodes) {
		t.Fatal("a result off by one in its last element checks")
	}
}
