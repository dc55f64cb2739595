package rings

import "testing"

func TestPartition(t *testing.T) {
	for count := 0; count <= 40; count++ {
		for parts := 1; parts <= 9; parts++ {
			spans := Partition(count, parts)
			if len(spans) != parts {
				t.Fatalf("Partition(%d,%d): %d spans", count, parts, len(spans))
			}
			off := 0
			for i, s := range spans {
				want := count / parts
				if i < count%parts {
					want++
				}
				if s.Off != off || s.Len != want {
					t.Fatalf("Partition(%d,%d)[%d] = %+v, want {%d %d}", count, parts, i, s, off, want)
				}
				off += s.Len
			}
			if off != count {
				t.Fatalf("Partition(%d,%d) covers %d", count, parts, off)
			}
		}
	}
	got := Partition(10, 4)
	want := []Span{{0, 3}, {3, 3}, {6, 2}, {8, 2}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Partition(10,4) = %v, want %v", got, want)
		}
	}
}

func TestPartitionPanicsOnBadInput(t *testing.T) {
	for _, c := range [][2]int{{-1, 2}, {5, 0}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Partition(%d,%d) did not panic", c[0], c[1])
				}
			}()
			Partition(c[0], c[1])
		}()
	}
}
