// Package transport opens the byte-stream connections and sessions that Concord's peers and master
// talk over.
//
// Every implementation satisfies one interface, [Transport]. It listens on a "host:port" address and
// dials one; the connections it yields are plain [net.Conn] values. It also opens sessions ([Session]):
// a session carries any number of streams, opened from either end, and, where the implementation has
// them, unreliable datagrams. Three implementations exist or are planned:
//
//   - TCP ([NewTCP]): real sockets with configurable Nagle, buffer and keep-alive settings. A session is
//     one TCP connection per stream plus a control connection; it has no datagrams ([ErrNoDatagrams]).
//     Between processes of one network namespace the connection is a unix socket that its listener
//     opens beside the TCP one (the local path, local.go), unless [TCPConfig.DisableLocal] is set.
//   - The in-memory [Network] ([NewNetwork]): many named hosts in one process, with latency, bandwidth,
//     loss, black holes, partitions and crashes injected per directed host pair through its methods,
//     and write hooks ([Network.OnWrite], [FailAt]) that fail a link at a chosen byte, frame or write.
//     Its sessions are built as TCP's, over its own connections, and add datagrams that cross the same
//     links with the same faults (loss drops a datagram instead of delaying it). It is built only on
//     channels and the standard timers, so protocol tests can run it inside a testing/synctest bubble
//     with fake time and get deterministic timings.
//   - TLS ([NewTLS]): TLS 1.3 over TCP, every connection authenticated by the run secret (package
//     auth: a proof of the secret bound to the TLS session, so it cannot be replayed or relayed).
//     Sessions are built as TCP's, each stream a TLS connection of its own.
//   - QUIC ([NewQUIC]): quic-go, always encrypted and authenticated as TLS is. Its connections are
//     sessions natively: streams are QUIC streams and datagrams QUIC datagrams. Every dialled
//     connection has a UDP socket and a congestion controller of its own, so striping one transfer
//     over K connections opens K QUIC connections (see quic.go for the tuning and the close protocol).
//
// Errors that callers branch on are the standard ones, so code written against one implementation
// works against the others: [net.ErrClosed] for an operation on a locally closed connection, session
// or listener, [os.ErrDeadlineExceeded] for an expired deadline, [io.EOF] once the peer has closed a
// stream and all of its data has been read, [ErrSessionClosed] once the peer has closed a session, the
// syscall errors aliased here as [ErrRefused], [ErrReset], [ErrBrokenPipe] and [ErrAddrInUse], and
// [ErrNoDatagrams] and [ErrDatagramTooLarge] for datagrams.
//
// Bulk data goes through ReadFull and WriteBuffers (rawio.go): on Linux they move the bytes of the
// net package's TCP and unix sockets by raw system calls, so that a copy of a few MiB in the kernel
// does not make the Go scheduler hand the goroutine's P to another thread; any other connection goes
// through its own Read and Write.
//
// # Sessions over byte streams
//
// TCP and the in-memory network share one session implementation. DialSession opens the control
// connection and writes a fixed-size, versioned preamble on it: a magic, a version, the body's length,
// a random 128-bit session id and the stream index 0. The session listener reads the preamble of every
// new connection within a time limit, answers a new id with an accept (or refuse) frame, and from then
// on routes every connection that carries the same id to that session. Every stream is a connection
// of its own, dialled by the end that dialled the session (so sessions work through NAT): the dialling
// end opens a stream by dialling one with an even index; the accepting end opens one by sending an
// open frame with an odd index over the control connection, which the dialling end answers by
// dialling that stream. Closing the control connection closes the session; the peer then reports
// ErrSessionClosed, or ErrReset when the connection was torn down. A listener bounds what a peer can make it
// hold: connections in their handshake (the rest wait in the backlog), the time a preamble may take,
// sessions waiting for Accept and streams waiting for AcceptStream (more are refused). A bad preamble
// closes that connection and nothing else. The session id only tells sessions apart; it is no secret
// from whoever sees the traffic, so authenticating streams is left to a secure channel beneath.
//
// TCP sessions have no datagram path: a framed fallback over the control connection would be reliable
// and ordered, and so would hide exactly the loss that a datagram user must handle. Callers that want
// datagrams where available fall back to a stream on ErrNoDatagrams.
//
// # Goroutines
//
// A Network starts no goroutine of its own: connections compute delivery times when bytes are written,
// and readers wait with timers. The session machinery runs these, on both TCP and the Network:
//
//   - per session listener, one accept goroutine, which owns the underlying listener's Accept, and one
//     handshake goroutine per connection whose preamble is being read (at most 64), which owns that
//     connection until it is handed to a session or closed;
//   - per session, one control goroutine, which owns reading the control connection (writes to it take
//     turns through a one-token channel), and on the dialling end one short-lived goroutine per stream
//     the accepting end asked for, which dials it.
//
// Everything else is done by the caller's goroutine. Session.Close and SessionListener.Close wait for
// the goroutines they own. Streams handed to the application belong to it (closing their session closes
// them too). Every goroutine blocks only
// on channels, timers and the connections' reads, so inside a synctest bubble all of them block
// durably.
package transport
