/*
 * pccl.h: the PCCL v1.0 C API, implemented by Concord (libpccl.so, built from bindings/c).
 *
 * Programs written against PCCL's pccl.h compile against this header and link against Concord's
 * libpccl.so unchanged: every function, type, enum value and result code of PCCL v1.0 is here with
 * the same numbering and layout. Functions whose names start with "concord" are Concord's own
 * additions (transport, run token, site, presets, error messages); PCCL programs never need them.
 *
 * Memory: buffers and shared-state tensors are the caller's memory and are used in place, never
 * copied on the way in. A buffer passed to an asynchronous all-reduce belongs to the library until
 * pcclAwaitAsyncReduce returns for it. Handles returned by the library are released by the matching
 * destroy function.
 */
#ifndef CONCORD_PCCL_H
#define CONCORD_PCCL_H

#include "ccoip_inet.h"

#ifdef __cplusplus
#include <cstddef>
extern "C" {
#else
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#endif

#if defined(_MSC_VER)
#define PCCL_EXPORT __declspec(dllimport)
#else
#define PCCL_EXPORT __attribute__((visibility("default")))
#endif

/* Marks an out-parameter that may be NULL. */
#define PCCL_NULLABLE

/* The result of every call. */
typedef enum pcclResult_t {
    pcclSuccess = 0,
    pcclNotInitialized = 1,        /* pcclInit was not called */
    pcclInternalError = 2,         /* the library failed; concordGetLastError tells why */
    pcclInvalidArgument = 3,       /* a NULL pointer, an unknown enum value, a tag in use, ... */
    pcclInvalidUsage = 4,          /* a call in the wrong state, or a failed shared-state sync */
    pcclTooFewPeers = 5,           /* fewer than two peers in the peer group */
    pcclMasterConnectionFailed = 6,
    pcclRankConnectionFailed = 7,
    pcclRankConnectionLost = 8,    /* a peer left during a collective; retry it */
    pcclNoSharedStateAvailable = 9,
    pcclPendingAsyncOps = 10,      /* the call needs every async all-reduce awaited first */
    pcclUpdateTopologyFailed = 11,
    pcclTopologyOptimizationFailed = 12,
} pcclResult_t;

/* Element types. */
typedef enum pcclDataType_t {
    pcclUint8 = 0,
    pcclInt8 = 1,
    pcclInt16 = 2,
    pcclUint16 = 3,
    pcclUint32 = 4,
    pcclInt32 = 5,
    pcclUint64 = 6,
    pcclInt64 = 7,
    pcclFloat16 = 8,
    pcclBFloat16 = 9,
    pcclFloat = 10,
    pcclDouble = 11,
} pcclDataType_t;

/* Where a shared-state tensor lives. Concord builds without CUDA support accept only pcclDeviceCpu. */
typedef enum pcclDeviceType_t {
    pcclDeviceCpu = 0,
    pcclDeviceCuda = 1,
} pcclDeviceType_t;

/* Reductions. pcclAvg divides the sum by the number of peers (integer division for integers). */
typedef enum pcclRedOp_t {
    pcclSum,
    pcclAvg,
    pcclProd,
    pcclMax,
    pcclMin
} pcclRedOp_t;

/* Attributes read with pcclGetAttribute. */
typedef enum pcclAttribute_t {
    PCCL_ATTRIBUTE_GLOBAL_WORLD_SIZE = 1,             /* peers in the run */
    PCCL_ATTRIBUTE_PEER_GROUP_WORLD_SIZE = 2,         /* peers in this peer's group */
    PCCL_ATTRIBUTE_NUM_DISTINCT_PEER_GROUPS = 3,      /* groups in the run */
    PCCL_ATTRIBUTE_LARGEST_PEER_GROUP_WORLD_SIZE = 4, /* peers in the largest group */
} pcclAttribute_t;

/* How a peer takes part in a shared-state sync. */
typedef enum pcclSharedStateSyncStrategy_t {
    /* The peer's content competes in the vote; it sends or receives as the vote decides. */
    PCCL_SHARED_STATE_SYNC_STRATEGY_ENFORCE_POPULAR = 0,
    /* The peer's content does not compete: it is overwritten by the elected content. */
    PCCL_SHARED_STATE_SYNC_STRATEGY_RECEIVE_ONLY = 1,
    /* The peer asserts its content is right; it fails if another content is elected. */
    PCCL_SHARED_STATE_SYNC_STRATEGY_SEND_ONLY = 2,
} pcclSharedStateSyncStrategy_t;

/* Parameters of pcclCreateCommunicator. */
typedef struct pcclCommCreateParams_t {
    ccoip_socket_address_t master_address; /* the master's address */
    uint32_t peer_group;                   /* collectives and shared state span one group */
    uint32_t p2p_connection_pool_size;     /* connections to each ring neighbour; 0 means 1 */
} pcclCommCreateParams_t;

/* A communicator: one peer's membership in a run. Opaque. */
typedef struct pcclComm_t pcclComm_t;

/* Declared for compatibility; no function uses it. */
typedef struct pcclRankInfo_t pcclRankInfo_t;

/* What an all-reduce did. */
typedef struct pcclReduceInfo_t {
    uint32_t local_world_size; /* peers that took part */
    uint64_t tx_bytes;         /* payload bytes this peer sent, quantized as on the wire */
    uint64_t rx_bytes;         /* payload bytes this peer received, quantized as on the wire */
} pcclReduceInfo_t;

/* A hint about the values of a buffer; accepted and ignored. */
typedef enum pcclDistributionHint_t {
    pcclDistributionNone = 0,
    pcclDistributionNormal = 1,
    pcclDistributionUniform = 2
} pcclDistributionHint_t;

/* The element type of a collective's buffers. */
typedef struct pcclReduceOperandDescriptor_t {
    pcclDataType_t datatype;
    pcclDistributionHint_t distribution_hint;
} pcclReduceOperandDescriptor_t;

/* Quantization of a collective's wire traffic. */
typedef enum pcclQuantizationAlgorithm_t {
    pcclQuantNone = 0,
    pcclQuantMinMax = 1,         /* Concord: min/step encoding, uint8 or uint16, float/double only */
    pcclQuantZeroPointScale = 2, /* Concord: served by the same affine encoding as pcclQuantMinMax */
    /* Concord's own: the encoding of pcclQuantMinMax on every hop of the reduce-scatter as well as
     * on the all-gather (sum, avg, min and max only), for about a quarter (uint8) or half (uint16)
     * of the float bytes in every frame; results stay bit-identical on every peer. */
    concordQuantMinMaxBothPhases = 16
} pcclQuantizationAlgorithm_t;

typedef struct pcclQuantizationOptions_t {
    pcclDataType_t quantized_datatype; /* pcclUint8 or pcclUint16 when algorithm is not None */
    pcclQuantizationAlgorithm_t algorithm;
} pcclQuantizationOptions_t;

/* One all-reduce. Every peer passes the same count, op, tag, type and quantization for a tag. */
typedef struct pcclReduceDescriptor_t {
    size_t count; /* elements */
    pcclRedOp_t op;
    uint64_t tag; /* all-reduces on different tags may run at once */
    pcclReduceOperandDescriptor_t src_descriptor;
    pcclQuantizationOptions_t quantization_options;
} pcclReduceDescriptor_t;

/* One all-reduce of pcclAllReduceMultipleWithRetry. */
typedef struct pcclReduceSingleDescriptor_t {
    void *sendbuf;
    void *recvbuf;
    pcclReduceDescriptor_t descriptor;
} pcclReduceOpDescriptor_t;

/* The handle of an asynchronous all-reduce: its communicator and tag. */
typedef struct pcclAsyncReduceOp_t {
    pcclComm_t *comm;
    uint64_t tag;
} pcclAsyncReduceOp_t;

/* Declared for compatibility; no function uses it. */
typedef struct pcclRankUuid_t {
    uint8_t data[16];
} pcclRankUuid_t;

/* One named tensor of the shared state, in the caller's memory. */
typedef struct pcclTensorInfo_t {
    const char *name;
    void *data;
    size_t count;                  /* elements */
    pcclDataType_t datatype;
    pcclDeviceType_t device_type;
    bool allow_content_inequality; /* excluded from the vote; still sent to peers that are behind */
} pcclTensorInfo_t;

/* The shared state. revision is in/out: a sync that fetches state overwrites it. */
typedef struct pcclSharedState_t {
    uint64_t revision;
    size_t count;
    pcclTensorInfo_t *infos;
} pcclSharedState_t;

/* What a shared-state sync did. */
typedef struct pcclSharedStateSyncInfo_t {
    uint64_t tx_bytes; /* entry bytes this peer sent to peers that fetched from it */
    uint64_t rx_bytes; /* entry bytes this peer fetched */
} pcclSharedStateSyncInfo_t;

/* A master instance. Opaque. */
typedef struct pcclMasterInstanceState_t pcclMasterInstance_t;

/* Facts about this build. */
typedef struct pcclBuildInfo_t {
    bool has_cuda_support;
} pcclBuildInfo_t;

#ifndef CONCORD_IMPLEMENTATION

/* Initializes the library; every function except the master functions needs it first. */
PCCL_EXPORT pcclResult_t pcclInit(void);

/* Allocates a communicator for params; no I/O happens until pcclConnect. */
PCCL_EXPORT pcclResult_t pcclCreateCommunicator(const pcclCommCreateParams_t *params, pcclComm_t **comm_out);

/* Reads an attribute of a connected communicator into *p_attribute_out. */
PCCL_EXPORT pcclResult_t pcclGetAttribute(const pcclComm_t *communicator, pcclAttribute_t attribute,
                                          int *p_attribute_out);

/* Leaves the run (if connected), waits for the communicator's work to stop and frees it. */
PCCL_EXPORT pcclResult_t pcclDestroyCommunicator(pcclComm_t *communicator);

/*
 * Registers with the master and blocks until the accepted peers admit this peer (at their next
 * pcclUpdateTopology). pcclMasterConnectionFailed when the master cannot be reached or refuses;
 * pcclInvalidUsage on a second call.
 */
PCCL_EXPORT pcclResult_t pcclConnect(pcclComm_t *communicator);

/*
 * The membership step: every accepted peer calls it; together they admit waiting peers and re-wire
 * the ring. It is the only call that admits a peer waiting in pcclConnect. pcclPendingAsyncOps while
 * async all-reduces of this peer are not awaited.
 */
PCCL_EXPORT pcclResult_t pcclUpdateTopology(pcclComm_t *communicator);

/*
 * Asks whether peers wait to be admitted. Every accepted peer calls it; all get the same answer. It
 * may be called while async all-reduces run.
 */
PCCL_EXPORT pcclResult_t pcclArePeersPending(const pcclComm_t *communicator, bool *pending_out);

/*
 * Measures the links and re-orders the ring for bandwidth. Every accepted peer calls it.
 * pcclInvalidUsage with one peer; pcclTopologyOptimizationFailed on failure.
 */
PCCL_EXPORT pcclResult_t pcclOptimizeTopology(const pcclComm_t *communicator);

/* pcclAllReduceAsync followed by pcclAwaitAsyncReduce. */
PCCL_EXPORT pcclResult_t pcclAllReduce(const void *sendbuff, void *recvbuff, const pcclReduceDescriptor_t *descriptor,
                                       const pcclComm_t *communicator, pcclReduceInfo_t *PCCL_NULLABLE reduce_info_out);

/*
 * Starts an all-reduce of descriptor->count elements from sendbuff into recvbuff (which may be the
 * same buffer) and fills *reduce_handle_out. pcclTooFewPeers with fewer than two peers in the group;
 * pcclInvalidArgument for bad arguments or a tag already running.
 */
PCCL_EXPORT pcclResult_t pcclAllReduceAsync(const void *sendbuff, void *recvbuff,
                                            const pcclReduceDescriptor_t *descriptor, const pcclComm_t *communicator,
                                            pcclAsyncReduceOp_t *reduce_handle_out);

/*
 * Runs count all-reduces, at most max_in_flight at a time. When some fail because a peer left, it
 * waits for the others, re-wires the ring (admitting nobody) and retries the failed ones, until all
 * succeed or fewer than two peers remain (pcclTooFewPeers). The byte counts are summed.
 */
PCCL_EXPORT pcclResult_t pcclAllReduceMultipleWithRetry(const pcclReduceOpDescriptor_t *descriptors, size_t count,
                                                        const pcclComm_t *communicator,
                                                        pcclReduceInfo_t *PCCL_NULLABLE reduce_info_out,
                                                        int max_in_flight);

/*
 * Waits for an async all-reduce. pcclRankConnectionLost when a peer left during it: the buffers hold
 * what they held before the call, the ring is re-wired without the peer once this peer has no other
 * all-reduce in flight, and the caller may simply start the all-reduce again. The re-wiring admits
 * nobody: peers waiting in pcclConnect keep waiting for a pcclUpdateTopology.
 */
PCCL_EXPORT pcclResult_t pcclAwaitAsyncReduce(const pcclAsyncReduceOp_t *reduce_handle,
                                              pcclReduceInfo_t *PCCL_NULLABLE reduce_info_out);

/*
 * Makes the shared state identical on every accepted peer of the group: the most popular whole state
 * (the list of hashes of every entry not marked allow_content_inequality) wins, ties broken the same
 * way every time, and peers that differ fetch the entries that differ into their tensors in place. shared_state->revision must grow
 * by one per sync (any value on a fresh run). pcclPendingAsyncOps while async all-reduces run;
 * pcclInvalidUsage when the sync fails.
 */
PCCL_EXPORT pcclResult_t pcclSynchronizeSharedState(const pcclComm_t *communicator, pcclSharedState_t *shared_state,
                                                    pcclSharedStateSyncStrategy_t strategy,
                                                    pcclSharedStateSyncInfo_t *PCCL_NULLABLE sync_info_out);

/* Creates a master that will listen on listen_address (port 0 picks a free port). */
PCCL_EXPORT pcclResult_t pcclCreateMaster(ccoip_socket_address_t listen_address, pcclMasterInstance_t **p_master_handle_out);

/*
 * Starts the master in the background and returns; pcclInvalidUsage if it ran before or cannot listen
 * on its address.
 */
PCCL_EXPORT pcclResult_t pcclRunMaster(pcclMasterInstance_t *master_instance);

/* Asks a running master to stop (again: nothing more); pcclInvalidUsage if it never ran. */
PCCL_EXPORT pcclResult_t pcclInterruptMaster(pcclMasterInstance_t *master_instance);

/* Blocks until an interrupted master has stopped; pcclInvalidUsage if it never ran. */
PCCL_EXPORT pcclResult_t pcclMasterAwaitTermination(pcclMasterInstance_t *master_instance);

/* Frees a master (after pcclMasterAwaitTermination, or one that never ran). */
PCCL_EXPORT pcclResult_t pcclDestroyMaster(pcclMasterInstance_t *master_instance);

/* Reports facts about this build. */
PCCL_EXPORT pcclResult_t pcclGetBuildInfo(pcclBuildInfo_t *info);

#endif /* CONCORD_IMPLEMENTATION */

/* ---------------------------------------------------------------------------------------------
 * Concord's additions. They configure a communicator before pcclConnect (pcclInvalidUsage after)
 * or report errors; PCCL programs never need them.
 * ------------------------------------------------------------------------------------------- */

/* The kind of the last error, mirroring Concord's Go sentinel errors. */
typedef enum concordErrorKind_t {
    CONCORD_OK = 0,
    CONCORD_ERR_OTHER = 1,
    CONCORD_ERR_PEER_LEFT = 2,
    CONCORD_ERR_ABORTED = 3,
    CONCORD_ERR_TOO_FEW_PEERS = 4,
    CONCORD_ERR_LOCAL_FAILURE = 5,
    CONCORD_ERR_NON_FINITE = 6,
    CONCORD_ERR_KICKED = 7,
    CONCORD_ERR_CLOSED = 8,
    CONCORD_ERR_DESCRIPTOR_MISMATCH = 9,
    CONCORD_ERR_MASTER_LOST = 10,
    CONCORD_ERR_BUSY = 11,
    CONCORD_ERR_INVALID = 12,
    CONCORD_ERR_SYNC = 13,
    CONCORD_ERR_TIMEOUT = 14,
    CONCORD_ERR_REFUSED = 15, /* refused for good (wrong run token or secret, another release): also kicked */
} concordErrorKind_t;

#ifndef CONCORD_IMPLEMENTATION

/*
 * Copies the message of the calling thread's most recent failed call (NUL-terminated, truncated to
 * len bytes) into buf and returns the message's full length; 0 when no call of this thread has failed
 * yet. Like errno, it is per thread: threads sharing the library never read each other's errors.
 * Calls that succeed leave it alone, so read it right after the call that failed.
 */
PCCL_EXPORT size_t concordGetLastError(char *buf, size_t len);

/* Returns the kind of the calling thread's most recent failed call's error (CONCORD_OK when none
 * failed yet). */
PCCL_EXPORT concordErrorKind_t concordGetLastErrorKind(void);

/* Selects the transport, before pcclConnect: "tcp" (the default), "tls" (TLS 1.3 over TCP) or "quic".
 * tls and quic authenticate every connection with the run secret (concordSetSecret), which they
 * require; the master must use the same transport (concordMasterSetTransport). */
PCCL_EXPORT pcclResult_t concordSetTransport(pcclComm_t *communicator, const char *name);

/* Sets the run secret: the master refuses peers whose secret differs from its own, and tls and quic
 * authenticate with it (at least 16 bytes there). */
PCCL_EXPORT pcclResult_t concordSetSecret(pcclComm_t *communicator, const char *secret);

/* Lists the local network interfaces (names or addresses, comma-separated, distinct) this peer may
 * use for traffic inside its site, before pcclConnect; they are announced to the master, which lists
 * them with the peer (the intra-site phases do not use them yet). NULL or "" means none. */
PCCL_EXPORT pcclResult_t concordSetNICs(pcclComm_t *communicator, const char *nics);

/* Names the datacenter or region of this peer, for topology and the master's status page. */
PCCL_EXPORT pcclResult_t concordSetSite(pcclComm_t *communicator, const char *site);

/*
 * Sets where this peer accepts links from its ring neighbour (host:port; default 127.0.0.1:0 when the
 * master is on loopback, 0.0.0.0:0 otherwise) and the address neighbours dial (NULL or "": derived).
 */
PCCL_EXPORT pcclResult_t concordSetListenAddress(pcclComm_t *communicator, const char *listen,
                                                 const char *advertise);

/*
 * Applies a timing preset (pool size, part size, dial, master and link timeouts). "pccl", the
 * default, is as patient as PCCL, which leaves failure detection to TCP keepalive: the master may stay
 * silent for 60 s and a collective's link for 30 s, while a closed connection fails at once. "lan" and
 * "wan" are Concord's presets, which give up on silence within seconds. An explicit
 * p2p_connection_pool_size still wins.
 */
PCCL_EXPORT pcclResult_t concordSetPreset(pcclComm_t *communicator, const char *preset);

/* Sets how long the master may stay silent before calls fail (milliseconds; 0 keeps the default). */
PCCL_EXPORT pcclResult_t concordSetMasterTimeout(pcclComm_t *communicator, uint64_t millis);

/* Returns the peer group the communicator was created for. */
PCCL_EXPORT pcclResult_t concordGetPeerGroup(const pcclComm_t *communicator, uint32_t *group_out);

/* Returns this peer's position in the ring in force. */
PCCL_EXPORT pcclResult_t concordGetRank(const pcclComm_t *communicator, int *rank_out);

/*
 * Applies a master timing preset before pcclRunMaster. "pccl", the default, keeps a silent peer for
 * 60 s, as PCCL's keepalive does (a closed connection still removes it at once); "lan" removes it
 * after 1.5 s and "wan" after 6 s.
 */
PCCL_EXPORT pcclResult_t concordMasterSetPreset(pcclMasterInstance_t *master_instance, const char *preset);

/* Sets the master's run secret before pcclRunMaster (see concordSetSecret). */
PCCL_EXPORT pcclResult_t concordMasterSetSecret(pcclMasterInstance_t *master_instance, const char *secret);

/* Selects the transport the master listens on, before pcclRunMaster: "tcp" (the default), "tls" or
 * "quic"; tls and quic need concordMasterSetSecret. */
PCCL_EXPORT pcclResult_t concordMasterSetTransport(pcclMasterInstance_t *master_instance, const char *name);

/* Returns the port a running master listens on (useful after asking for port 0). */
PCCL_EXPORT pcclResult_t concordMasterGetPort(const pcclMasterInstance_t *master_instance, uint16_t *port_out);

/*
 * Runs a gossip failure detector (SWIM over UDP and TCP) on bind_address (host:port; port 0 picks
 * one, see concordMasterGetGossipAddress), before pcclRunMaster; peers join it with concordSetGossip.
 * A peer the gossip group declares dead is removed at once, even while its connection stays open (a
 * hung process keeps its sockets): with the "pccl" preset, which keeps a silent peer for 60 s, a
 * stopped peer is then removed within seconds. Its timing follows the master's preset (wan: the WAN
 * gossip preset, else LAN). NULL or "" turns it off (the default).
 */
PCCL_EXPORT pcclResult_t concordMasterSetGossip(pcclMasterInstance_t *master_instance, const char *bind_address);

/*
 * Copies the address peers join the running master's gossip detector at (host:port, NUL-terminated)
 * into buf; pcclInvalidUsage when the master does not run or runs without gossip, pcclInvalidArgument
 * when len is too small.
 */
PCCL_EXPORT pcclResult_t concordMasterGetGossipAddress(const pcclMasterInstance_t *master_instance, char *buf,
                                                       size_t len);

/*
 * The contribution guard, before pcclRunMaster: before an all-reduce of float or double data starts,
 * the master checks the contributions its peers report (concordSetContributionStats). It refuses one
 * holding NaN or infinity (reject_non_finite) or whose norm exceeds norm_factor times the median norm
 * of the others' (norm_factor above 1; 0 turns that check off). exclude kicks the offending peer (the
 * others get pcclRankConnectionLost and retry without it); otherwise the all-reduce fails for everyone
 * with an error naming the offender. All off by default.
 */
PCCL_EXPORT pcclResult_t concordMasterSetGuard(pcclMasterInstance_t *master_instance, bool reject_non_finite,
                                               double norm_factor, bool exclude);

/*
 * Joins the master's gossip failure detector at join_address (concordMasterGetGossipAddress), before
 * pcclConnect; this peer's gossip member binds bind_address (host:port; NULL or "": the host of the
 * listen address, or of the route to the master, any port). NULL or "" for join_address: no gossip.
 */
PCCL_EXPORT pcclResult_t concordSetGossip(pcclComm_t *communicator, const char *join_address,
                                          const char *bind_address);

/*
 * Makes every all-reduce of float or double data report the norm and finiteness of this peer's
 * contribution to the master (one pass over the send buffer), for its contribution guard; before
 * pcclConnect. Off by default.
 */
PCCL_EXPORT pcclResult_t concordSetContributionStats(pcclComm_t *communicator, bool enabled);

/*
 * Whether the most recent failed call's error is one a rejoin can fix: the master removed this peer
 * (CONCORD_ERR_KICKED: it was silent, cut off or misbehaved) or was unreachable for too long
 * (CONCORD_ERR_MASTER_LOST), and not for a reason connecting again cannot fix (CONCORD_ERR_REFUSED).
 */
PCCL_EXPORT bool concordRejoinable(void);

/*
 * Brings a communicator the master removed back into the run as a newcomer: it drops the old
 * membership and connects again with the same settings, retrying with a jittered exponential backoff
 * (100 ms doubling up to 5 s) while the master cannot be reached, until it is admitted (as
 * pcclConnect: at the accepted peers' next pcclUpdateTopology). A newcomer holds stale state: its
 * first call must be the shared-state sync the accepted peers make after admitting it, with
 * PCCL_SHARED_STATE_SYNC_STRATEGY_RECEIVE_ONLY. It gives up at once on what a retry cannot fix, with
 * pcclMasterConnectionFailed and one line in concordGetLastError naming it: a wrong run token or
 * secret, or a master of another release (CONCORD_ERR_REFUSED); and after timeout_ms (0: no limit)
 * with the last connection error. Every asynchronous all-reduce must be awaited first
 * (pcclPendingAsyncOps).
 */
PCCL_EXPORT pcclResult_t concordRejoin(pcclComm_t *communicator, uint64_t timeout_ms);

#endif /* CONCORD_IMPLEMENTATION */

#ifdef __cplusplus
}
#endif

#endif /* CONCORD_PCCL_H */
