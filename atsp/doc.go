// Package atsp solves the asymmetric travelling salesman problem that orders
// a ring of peers.
//
// A ring AllReduce runs at the pace of its slowest link, so the master
// measures every directed link and asks this package for a Hamiltonian cycle
// through all peers. The default objective, Bottleneck, minimises the most
// expensive edge of the cycle first and the sum of the edge costs second; the
// Total objective minimises the sum only and is the one the TSPLIB instances
// are scored by.
//
// Small instances (up to Options.ExactMax nodes) are solved exactly with a
// Held-Karp dynamic programme; for Bottleneck a binary search over the
// distinct edge costs finds the smallest threshold that still admits a
// Hamiltonian cycle, and Held-Karp then minimises the total among the cycles
// inside that threshold. Larger instances are solved by an iterated local
// search: nearest-neighbour and greedy-edge construction, then Or-opt, node
// swap and reversal-free 3-opt segment insertion with incremental costs,
// perturbed by reversal-free segment kicks. For Bottleneck the heuristic
// searches over thresholds by pricing edges above the threshold out of the
// tour.
//
// Everything except Improve is pure: no goroutines, no global randomness, and
// time only through Options.Now. Improve runs one goroutine per call that ends
// when its context ends or its search is exhausted.
package atsp
