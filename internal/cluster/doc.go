// Package cluster supervises the processes of a local Concord cluster for tests, benchmarks, demos and
// the stress soak: a master and any number of peers, all on loopback, all children of the calling
// process.
//
// # Roles
//
// Children are the calling program itself, re-executed (os.Executable) with the environment variable
// [EnvRole] naming the role to run. A program registers its roles by calling [Main] first thing in
// main; in the parent Main returns at once, in a child it runs the role and exits with its status:
//
//	func main() {
//		cluster.Main(map[string]func() int{"peer": peerMain})
//		// parent code: c := cluster.New(cluster.Config{}); c.Spawn(...)
//	}
//
// So `go run ./bench/x` works without building anything else. The role [RoleMaster] is built in: it
// runs a master server on 127.0.0.1 and reports its address ([Cluster.StartMaster]).
//
// # Talking to children
//
// A child reports events by printing one JSON object per line on stdout ([Emit]); the parent reads
// them as [Line] values from the child's channel ([Proc.Lines]) and from the cluster's merged channel
// ([Cluster.Lines]). The parent can send JSON lines to a child's stdin ([Proc.Send]); the child reads
// them from [Inbox]. Stderr of every child is copied, line by line and prefixed with its name, to
// [Config.Stderr]. When the parent goes away, the child's stdin reaches end of file and the child
// exits, so no child outlives its supervisor.
//
// # Faults and cleanup
//
// Every child runs in a process group of its own. [Proc.Kill] sends SIGKILL to that group, [Proc.Stop]
// and [Proc.Continue] send SIGSTOP and SIGCONT. [Cluster.Close] kills every group the cluster created
// whose leader is still running and reaps every child; it never signals a process it did not start.
// Every wait in this package is bounded by a context or a timeout.
package cluster
