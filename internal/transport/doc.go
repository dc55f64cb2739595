// Package transport opens the byte-stream connections that Concord's peers and master talk over.
//
// Every implementation satisfies one interface, [Transport]: it listens on a "host:port" address and
// dials one, and the connections it yields are plain [net.Conn] values. Three implementations exist or
// are planned:
//
//   - TCP ([NewTCP]): real sockets with configurable Nagle, buffer and keep-alive settings.
//   - The in-memory [Network] ([NewNetwork]): many named hosts in one process, with latency, bandwidth,
//     loss, black holes, partitions and crashes injected per directed host pair through its methods.
//     It is built only on channels and the standard timers, so protocol tests can run it inside a
//     testing/synctest bubble with fake time and get deterministic timings.
//   - QUIC, whose streams are adapted to net.Conn (not in this package yet).
//
// Errors that callers branch on are the standard ones, so code written against one implementation
// works against the others: [net.ErrClosed] for an operation on a locally closed connection or
// listener, [os.ErrDeadlineExceeded] for an expired deadline, [io.EOF] once the peer has closed and all
// of its data has been read, and the syscall errors aliased here as [ErrRefused], [ErrReset],
// [ErrBrokenPipe] and [ErrAddrInUse].
package transport
