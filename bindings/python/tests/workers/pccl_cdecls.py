"""Declarations of PCCL v1.0's C API for cffi (ABI mode), written from pccl.h and ccoip_inet.h the way
PCCL's own Python package declares them: a program that only knows PCCL's API, loading libpccl.so."""

CDEFS = """
typedef enum ccoip_inet_protocol_t { inetIPv4, inetIPv6 } ccoip_inet_protocol_t;
typedef struct ccoip_ipv4_address_t { uint8_t data[4]; } ccoip_ipv4_address_t;
typedef struct ccoip_ipv6_address_t { uint8_t data[16]; } ccoip_ipv6_address_t;
typedef struct ccoip_inet_address_t {
    ccoip_inet_protocol_t protocol;
    ccoip_ipv4_address_t ipv4;
    ccoip_ipv6_address_t ipv6;
} ccoip_inet_address_t;
typedef struct ccoip_socket_address_t { ccoip_inet_address_t inet; uint16_t port; } ccoip_socket_address_t;

typedef enum pcclResult_t {
    pcclSuccess = 0, pcclNotInitialized = 1, pcclInternalError = 2, pcclInvalidArgument = 3,
    pcclInvalidUsage = 4, pcclTooFewPeers = 5, pcclMasterConnectionFailed = 6, pcclRankConnectionFailed = 7,
    pcclRankConnectionLost = 8, pcclNoSharedStateAvailable = 9, pcclPendingAsyncOps = 10,
    pcclUpdateTopologyFailed = 11, pcclTopologyOptimizationFailed = 12
} pcclResult_t;
typedef enum pcclDataType_t {
    pcclUint8 = 0, pcclInt8 = 1, pcclInt16 = 2, pcclUint16 = 3, pcclUint32 = 4, pcclInt32 = 5,
    pcclUint64 = 6, pcclInt64 = 7, pcclFloat16 = 8, pcclBFloat16 = 9, pcclFloat = 10, pcclDouble = 11
} pcclDataType_t;
typedef enum pcclDeviceType_t { pcclDeviceCpu = 0, pcclDeviceCuda = 1 } pcclDeviceType_t;
typedef enum pcclRedOp_t { pcclSum, pcclAvg, pcclProd, pcclMax, pcclMin } pcclRedOp_t;
typedef enum pcclAttribute_t {
    PCCL_ATTRIBUTE_GLOBAL_WORLD_SIZE = 1, PCCL_ATTRIBUTE_PEER_GROUP_WORLD_SIZE = 2,
    PCCL_ATTRIBUTE_NUM_DISTINCT_PEER_GROUPS = 3, PCCL_ATTRIBUTE_LARGEST_PEER_GROUP_WORLD_SIZE = 4
} pcclAttribute_t;
typedef enum pcclSharedStateSyncStrategy_t {
    PCCL_SHARED_STATE_SYNC_STRATEGY_ENFORCE_POPULAR = 0, PCCL_SHARED_STATE_SYNC_STRATEGY_RECEIVE_ONLY = 1,
    PCCL_SHARED_STATE_SYNC_STRATEGY_SEND_ONLY = 2
} pcclSharedStateSyncStrategy_t;
typedef struct pcclCommCreateParams_t {
    ccoip_socket_address_t master_address; uint32_t peer_group; uint32_t p2p_connection_pool_size;
} pcclCommCreateParams_t;
typedef struct pcclComm_t pcclComm_t;
typedef struct pcclReduceInfo_t { uint32_t local_world_size; uint64_t tx_bytes; uint64_t rx_bytes; } pcclReduceInfo_t;
typedef enum pcclDistributionHint_t {
    pcclDistributionNone = 0, pcclDistributionNormal = 1, pcclDistributionUniform = 2
} pcclDistributionHint_t;
typedef struct pcclReduceOperandDescriptor_t {
    pcclDataType_t datatype; pcclDistributionHint_t distribution_hint;
} pcclReduceOperandDescriptor_t;
typedef enum pcclQuantizationAlgorithm_t {
    pcclQuantNone = 0, pcclQuantMinMax = 1, pcclQuantZeroPointScale = 2
} pcclQuantizationAlgorithm_t;
typedef struct pcclQuantizationOptions_t {
    pcclDataType_t quantized_datatype; pcclQuantizationAlgorithm_t algorithm;
} pcclQuantizationOptions_t;
typedef struct pcclReduceDescriptor_t {
    size_t count; pcclRedOp_t op; uint64_t tag; pcclReduceOperandDescriptor_t src_descriptor;
    pcclQuantizationOptions_t quantization_options;
} pcclReduceDescriptor_t;
typedef struct pcclReduceSingleDescriptor_t {
    void *sendbuf; void *recvbuf; pcclReduceDescriptor_t descriptor;
} pcclReduceOpDescriptor_t;
typedef struct pcclAsyncReduceOp_t { pcclComm_t *comm; uint64_t tag; } pcclAsyncReduceOp_t;
typedef struct pcclTensorInfo_t {
    const char *name; void *data; size_t count; pcclDataType_t datatype; pcclDeviceType_t device_type;
    bool allow_content_inequality;
} pcclTensorInfo_t;
typedef struct pcclSharedState_t { uint64_t revision; size_t count; pcclTensorInfo_t *infos; } pcclSharedState_t;
typedef struct pcclSharedStateSyncInfo_t { uint64_t tx_bytes; uint64_t rx_bytes; } pcclSharedStateSyncInfo_t;
typedef struct pcclMasterInstanceState_t pcclMasterInstance_t;
typedef struct pcclBuildInfo_t { bool has_cuda_support; } pcclBuildInfo_t;

pcclResult_t pcclInit(void);
pcclResult_t pcclCreateCommunicator(const pcclCommCreateParams_t *params, pcclComm_t **comm_out);
pcclResult_t pcclGetAttribute(const pcclComm_t *communicator, pcclAttribute_t attribute, int *p_attribute_out);
pcclResult_t pcclDestroyCommunicator(pcclComm_t *communicator);
pcclResult_t pcclConnect(pcclComm_t *communicator);
pcclResult_t pcclUpdateTopology(pcclComm_t *communicator);
pcclResult_t pcclArePeersPending(const pcclComm_t *communicator, bool *pending_out);
pcclResult_t pcclOptimizeTopology(const pcclComm_t *communicator);
pcclResult_t pcclAllReduce(const void *sendbuff, void *recvbuff, const pcclReduceDescriptor_t *descriptor,
                           const pcclComm_t *communicator, pcclReduceInfo_t *reduce_info_out);
pcclResult_t pcclAllReduceAsync(const void *sendbuff, void *recvbuff, const pcclReduceDescriptor_t *descriptor,
                                const pcclComm_t *communicator, pcclAsyncReduceOp_t *reduce_handle_out);
pcclResult_t pcclAllReduceMultipleWithRetry(const pcclReduceOpDescriptor_t *descriptors, size_t count,
                                            const pcclComm_t *communicator, pcclReduceInfo_t *reduce_info_out,
                                            int max_in_flight);
pcclResult_t pcclAwaitAsyncReduce(const pcclAsyncReduceOp_t *reduce_handle, pcclReduceInfo_t *reduce_info_out);
pcclResult_t pcclSynchronizeSharedState(const pcclComm_t *communicator, pcclSharedState_t *shared_state,
                                        pcclSharedStateSyncStrategy_t strategy,
                                        pcclSharedStateSyncInfo_t *sync_info_out);
pcclResult_t pcclCreateMaster(ccoip_socket_address_t listen_address, pcclMasterInstance_t **p_master_handle_out);
pcclResult_t pcclRunMaster(pcclMasterInstance_t *master_instance);
pcclResult_t pcclInterruptMaster(pcclMasterInstance_t *master_instance);
pcclResult_t pcclMasterAwaitTermination(pcclMasterInstance_t *master_instance);
pcclResult_t pcclDestroyMaster(pcclMasterInstance_t *master_instance);
pcclResult_t pcclGetBuildInfo(pcclBuildInfo_t *info);
"""


def load(path: str):
    """Returns (ffi, lib) for libpccl.so at path, initialized."""
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(CDEFS)
    lib = ffi.dlopen(path)
    assert lib.pcclInit() == lib.pcclSuccess
    return ffi, lib


def loopback(ffi, port: int):
    a = ffi.new("ccoip_socket_address_t *")
    a.inet.protocol = 0  # inetIPv4
    a.inet.ipv4.data = [127, 0, 0, 1]
    a.port = port
    return a
