// Package rdma is Concord's intra-site tier: collectives over nodes that each have several NICs, kept
// running losslessly when a NIC, cable or port fails mid-operation.
//
// # Fabric
//
// A provider implements [Endpoint] and [Conn] (sub-packages: rdma/sim, a deterministic discrete-event
// simulator, and rdma/tcp, real sockets bound to interfaces). Everything is posted without blocking and
// every outcome comes back as an [Event] in the endpoint's single event context, the way RDMA verbs post
// work requests and poll completions.
package rdma
