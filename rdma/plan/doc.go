// Package plan is the planning half of the intra-site tier: a description of a site's topology
// (nodes, NICs with measured α and β, rails, NUMA and PCIe placement, health), an α–β cost model of
// every failure-aware AllReduce schedule, and a [Planner] that picks the cheapest schedule per call
// and re-plans when a NIC fails or heals. It is pure: no I/O, no clocks, no randomness.
//
// # Cost model
//
// Costs follow Thakur, Rabenseifner and Gropp: a ring AllReduce over N ranks takes
// 2(N−1)·α + 2((N−1)/N)·D·β, and on a ring with unequal links β is the slowest link's. Each of the n
// nodes contributes g ranks (GPUs) to a flat ring, as NCCL's rings do, so a node sends and receives
// a = 2(ng−1)/(ng) bytes across the network per byte of message. A node's bandwidth is the sum of
// its healthy NICs'; a ring edge's is the sum, over the rails both ends have healthy, of the smaller
// side's bandwidth (a rail-optimized fabric). Reduction arithmetic and NVLink are taken as free.
//
// # Strategies
//
//   - [Ring]: the standard ring, one channel per NIC; only when no NIC is down.
//   - [HotRepair]: the standard ring with each failed NIC's channel moved to its backup NIC, which
//     then carries double load.
//   - [Balance]: the standard ring with each node's bytes spread over its healthy NICs in proportion
//     to bandwidth ([BalanceRoutes]).
//   - [R2CCL]: R²CCL-AllReduce, costed as in the R²CCL paper's Appendix A ([YStar], [Crossover]).
//   - [Recursive]: recursive R²CCL-AllReduce over the levels of node bandwidth.
//   - [OptCC]: a schedule that attains OptCC's O(1/p) overhead bound in this model; its derivation
//     is this package's own (see [OptCCSplit]).
//   - [Weighted]: the standard ring with reduce-scatter blocks sized by a linear program, alone or
//     beside a second ring (the reverse, or one with a degraded node swapped with a neighbour). On a
//     degraded topology the program also routes each link's bytes over the rails both ends have
//     ([Estimate].LinkRails), bounding every NIC rather than every node.
//
// Rings are re-ranked with the paper's bridge-based Algorithm 1 ([Rerank]) when neighbours' rail sets
// barely overlap. [FaultFree] and [Ideal] give the references every degraded case is compared with.
//
// # Data split
//
// [Build] turns the chosen estimate into a [Plan]: the message's byte ranges per ring ([Part]), each
// ring node's reduce-scatter ownership, each node's channel-to-NIC routes and, for the weighted
// rings, each link's split over rails. All shares are exact
// integers that sum to the message (largest remainder, [Apportion]) and are deterministic.
//
// # Who calls what
//
// Every function of the package is pure and safe for concurrent use on arguments no one modifies
// meanwhile; a result may share slices with its arguments (a plan with its estimate), so treat both
// as read-only. A [Planner] is the one stateful type: it belongs to one goroutine, and the plans and
// estimates it returns share memory with its caches, read-only too. A Planner chooses; the package
// runs nothing: package rdma's Replanner asks a Planner for each call's plan, and its Node executes it.
package plan
