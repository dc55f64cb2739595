// Package netlab builds a multi-NIC cluster on one Linux machine out of network namespaces, for
// tests and benchmarks of the intra-site tier.
//
// A [Lab] has a hub namespace and one namespace per node. Every node has K NICs, nic0 .. nic{K-1}:
// veth pairs whose other end sits in the hub, enslaved to the bridge of that rail (rail r joins the
// r-th NIC of every node). Each rail is one /24 subnet of 198.18.0.0/15, the range set aside for
// benchmarks: node n's NIC r has address 198.18.r.(n+1) (see [Addr]). Rails are separate networks: a
// NIC reaches the same rail's NICs only, as in a rail-optimized fabric. With a rate set, HTB on both
// ends of each veth limits what the NIC sends and what it receives, so bandwidth is scarce the way it
// is on a real NIC; small packets (probes, acks, control messages) have a class of their own that HTB
// serves first, as a NIC's separate queues would.
//
// Code reaches a node in three ways. [Node.Do] runs a function on an OS thread that has entered the
// node's namespace; the thread is locked and never unlocked, so the runtime throws it away afterwards
// and no other goroutine ever runs in the wrong namespace. Sockets made inside Do (see [Node.Listen]
// and [Node.Dial]) stay in the node's namespace and may be used from any goroutine. [Node.Start]
// starts a process inside the namespace (the child inherits the namespace of the thread that forks
// it). [Node.Path] names the namespace for libraries that take a path, such as a netlink handle.
//
// [Lab.SetNIC] takes one NIC down or up inside its node; [Lab.SetPort] takes a rail's bridge port
// down or up in the hub, which the node sees as loss of carrier.
//
// Every object lives inside the namespaces the lab creates, so deleting the namespaces removes
// everything: veth pairs die with them, and nothing is added to the root namespace. Namespace names
// start with a prefix ("cnd-" by default) followed by the process id; [Sweep] removes those of
// processes that no longer exist, so a killed run is cleaned up by the next one and parallel test
// binaries never touch each other's namespaces. Building a lab needs root (CAP_NET_ADMIN and
// CAP_SYS_ADMIN); [Available] says whether this process can.
package netlab
