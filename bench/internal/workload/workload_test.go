package workload

import "testing"

func TestCheckAcceptsExactSums(t *testing.T) {
	const n, world = 10007, 5
	got := make([]float32, n)
	part := make([]float32, n)
	for r := range world {
		Fill(part, r)
		for i := range got {
			got[i] += part[i]
		}
	}
	for i := range got {
		var want float32
		for r := range world {
			want += Value(r, i)
		}
		if got[i] != want {
			t.Fatalf("element %d: %v != %v", i, got[i], want)
		}
	}
	if m := Check(got, world); m != nil {
		t.Fatal(m)
	}
	got[77]++
	got[5000]--
	if m := Check(got, world); m == nil || m.Count != 2 || m.Index != 77 {
		t.Fatalf("Check of a corrupted result = %v", m)
	}
}

func TestPatternIsNotPeriodic(t *testing.T) {
	// A chunk moved by any block size the partitioner could use must show up.
	buf := make([]float32, 1<<16)
	Fill(buf, 0)
	for _, shift := range []int{1, 2, 64, 256, 1024, 4096, 1 << 14} {
		same := 0
		for i := 0; i+shift < len(buf); i++ {
			if buf[i] == buf[i+shift] {
				same++
			}
		}
		if same > len(buf)/16 {
			t.Errorf("shift %d: %d equal elements", shift, same)
		}
	}
}

func TestCheckUniform(t *testing.T) {
	buf := make([]float32, 4096)
	FillUniform(buf)
	for i := range buf {
		buf[i] *= 3
	}
	if m := CheckUniform(buf, 3); m != nil {
		t.Fatal(m)
	}
	if m := CheckUniform(buf, 4); m == nil {
		t.Fatal("world 4 accepted a world-3 result")
	}
	a := []byte{1, 2, 3}
	if Hash(a) == Hash([]byte{1, 2, 4}) {
		t.Fatal("hash collision on a one-byte change")
	}
}
