package rdma

import (
	"slices"

	"github.com/concord-ccl/concord/internal/hugemem"
)

// scratchBuffer lends the node's working buffer, grown to size bytes, to the operation about to start.
// The operation gives it back in finish (see operation.scratch).
func (n *Node) scratchBuffer(size int) []byte {
	if !n.scratchFree || cap(n.scratch) < size {
		n.scratch = hugemem.Make(size, size)
	}
	n.scratchFree = false
	return n.scratch[:size]
}

// maxSpareBytes bounds the capacity the node keeps in spare chunk copies.
const maxSpareBytes = 64 << 20

// hold returns a copy of a chunk that must wait, in a recycled buffer when one is large enough.
func (n *Node) hold(data []byte) []byte {
	for i := len(n.spare) - 1; i >= 0; i-- {
		if b := n.spare[i]; cap(b) >= len(data) {
			n.spare = slices.Delete(n.spare, i, i+1)
			n.spareBytes -= cap(b)
			return append(b[:0], data...)
		}
	}
	return slices.Clone(data)
}

// release takes back a copy made by hold once nothing reads it.
func (n *Node) release(b []byte) {
	if n.spareBytes+cap(b) > maxSpareBytes {
		return
	}
	n.spare = append(n.spare, b)
	n.spareBytes += cap(b)
}
