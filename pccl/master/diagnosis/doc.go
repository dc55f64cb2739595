// Package diagnosis finds slow links and slow peers of a group from the timing summaries its members
// send after every collective, after the delay-matrix syndromes of C4.
//
// It is pure: a Detector takes one Op at a time (the ring and every member's Report) and returns the
// Events it raised or cleared. It owns no clock, goroutine or randomness; the master feeds it from
// its state machine.
//
// # What a peer reports
//
// For every link an operation used, a peer reports the bytes carried, the offsets of the first and
// last byte from the moment it began the operation, and the time it was stalled on that link and on
// nothing else: on its link out, because the send had not completed; on its link in, because the
// bytes had not arrived. Its span (the latest end) minus its stalls is the time it was busy on its
// own: reducing, copying, or late to start. On its links in it also reports the transit: the time
// the frames spent arriving, summed per frame from its first payload byte to its last.
//
// # The delay matrix
//
// Per directed link the Detector keeps the recent samples of four figures: the transfer time per
// byte (last byte minus first byte, at the sender), the stall per byte (how long the link held its
// sender back), the wait (how long the receiver starved on it) and the transit per byte (at the
// receiver). Per peer it keeps its busy time
// per byte, its wait fraction, its late start and how far its vote trailed the operation's median
// vote. Estimates are the median of the last Recent samples, so one noisy operation moves nothing.
//
// # Syndromes
//
// A ring runs at the pace of its slowest part, so every peer downstream of a slow spot waits; what
// tells the spots apart is who is held back and who is busy:
//
//   - a slow link (a cell): one link holds its sender back, far beyond the group's median stall, or
//     its frames take far longer to cross than the group median transit of the links of its kind
//     (within a site, or between sites: Op.Sites). A link paced by a slow upstream peer never fills
//     its in-flight window and holds nobody back, as on the site rings of a hierarchical collective;
//     its frames still cross at the link's rate, so the transit alone finds the slow one there;
//   - a slow sender (a row): most of a peer's recently observed links out are hot cells;
//   - a slow receiver (a column): most of a peer's recently observed links in are hot cells;
//   - a peer slow outside communication: walking the waiting chain back from the peers that wait,
//     against the ring's direction, ends at a peer that does not wait, whose own busy time is far
//     beyond the median while its link out is not slow. The link into it may look slow then (its
//     predecessor could not hand it data while it was busy); that is explained and not reported.
//     A peer late before it even votes holds everyone at the vote instead, and the ring runs clean:
//     it is found as the member whose vote trails the median one, in each recent operation, by
//     far more than the votes' usual spread.
//
// A single ring shows one link out and one link in per peer, so a slow sender or receiver looks
// like a slow link until a second link of its row or column is observed: in an operation that
// reports several links per peer (a bidirectional ring), in the ring after the next re-wiring, or in
// bandwidth tests (ObserveProbe): those of OptimizeTopology, which measure every link, or those the
// owner of the Detector asks for around the links Suspects returns (a cell that stood out in the
// latest operation with nothing else known of its row or column), which are in before the Recent
// operations a syndrome needs. A hot ring cell whose sender's tested links out (receiver's links in)
// are mostly slow is that sender (receiver).
// A slow link whose row and column hold no other recent cell or test is reported with a lower
// confidence and says so in its evidence.
//
// # Hysteresis
//
// A culprit's figure counts only when it stood out in each of the last Recent operations, against
// the group median of the recent medians: a cell is hot when its least stall of the last Recent
// operations exceeds Raise times the group median and its excess is at least Floor times the median
// span per byte, so one or two noisy operations, and noise on near-zero stalls, raise nothing. A
// syndrome is raised once it held in Confirm consecutive operations (with Recent = 3 and Confirm =
// 1, at the third operation of a clean fault) and cleared once it was absent in Release consecutive
// ones, or at once when its links are no longer observed (the ring moved away from them) or a
// broader syndrome explains it (a slow link turning out to be a slow sender).
package diagnosis
