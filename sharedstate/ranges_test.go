package sharedstate

import (
	"reflect"
	"testing"
)

func TestSplitRanges(t *testing.T) {
	abc := []string{"a", "b", "c"}
	cases := []struct {
		size    int64
		donors  []string
		minPart int64
		want    []Range
	}{
		{0, abc, 1, nil},
		{-1, abc, 1, nil},
		{10, nil, 1, nil},
		{10, abc, 1, []Range{{"a", 0, 4}, {"b", 4, 3}, {"c", 7, 3}}},
		{9, abc, 0, []Range{{"a", 0, 3}, {"b", 3, 3}, {"c", 6, 3}}},
		{10, abc, 5, []Range{{"a", 0, 5}, {"b", 5, 5}}},
		{10, abc, 4, []Range{{"a", 0, 5}, {"b", 5, 5}}},
		{10, abc, 100, []Range{{"a", 0, 10}}},
		{2, abc, 1, []Range{{"a", 0, 1}, {"b", 1, 1}}},
		{1 << 40, []string{"x", "y"}, 1 << 20, []Range{{"x", 0, 1 << 39}, {"y", 1 << 39, 1 << 39}}},
	}
	for _, c := range cases {
		got := SplitRanges(c.size, c.donors, c.minPart)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("SplitRanges(%d, %v, %d) = %v, want %v", c.size, c.donors, c.minPart, got, c.want)
		}
	}
}

// TestSplitRangesCover checks on many sizes that the ranges tile [0, size) exactly.
func TestSplitRangesCover(t *testing.T) {
	donors := []string{"a", "b", "c", "d", "e"}
	for size := int64(1); size < 200; size += 7 {
		for minPart := int64(0); minPart < 60; minPart += 9 {
			rs := SplitRanges(size, donors, minPart)
			var off int64
			for i, r := range rs {
				if r.Off != off || r.Len <= 0 || r.Donor != donors[i] {
					t.Fatalf("size %d min %d: range %d = %+v", size, minPart, i, r)
				}
				if len(rs) > 1 && r.Len < minPart {
					t.Fatalf("size %d min %d: range %d shorter than minPart", size, minPart, i)
				}
				off += r.Len
			}
			if off != size {
				t.Fatalf("size %d min %d: ranges cover %d bytes", size, minPart, off)
			}
		}
	}
}
