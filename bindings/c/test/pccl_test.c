/*
 * pccl_test: exercises libpccl.so through PCCL's C API only (pccl.h).
 *
 * Run without arguments it is the driver: it runs a master in this process (pcclCreateMaster,
 * pcclRunMaster), starts three peers by executing itself with the role "peer", and checks that peers
 * 0 and 1 exit 0 while peer 2 dies by SIGKILL in the middle of an all-reduce. Each peer connects,
 * grows the ring with pcclUpdateTopology until all three are in, synchronizes shared state (peer 2
 * starts with different content and must receive the majority's), all-reduces every data type (sync,
 * async and multiple-with-retry; every element checked), and then peer 2 kills itself mid-operation
 * while the survivors retry until the all-reduce succeeds over the two of them.
 *
 * With CONCORD_TEST_TRANSPORT set (tls or quic), the master and the peers use that transport through
 * Concord's additions (concordMasterSetTransport, concordSetTransport), authenticated with the run
 * secret in CONCORD_TEST_SECRET, and the peers announce their NIC (concordSetNICs).
 */
#define _POSIX_C_SOURCE 200809L
#include <pccl.h>

#include "testutil.h"

#define NPEERS 3
#define COUNT 4099 /* not a multiple of the world size */

/* ---- element conversions for small integers ---- */

static uint16_t f16_of(float f) { /* exact for the small integers used here */
    if (f == 0) return 0;
    uint32_t b;
    memcpy(&b, &f, 4);
    uint32_t sign = (b >> 16) & 0x8000, exp = (b >> 23) & 0xff, mant = b & 0x7fffff;
    return (uint16_t)(sign | ((exp - 127 + 15) << 10) | (mant >> 13));
}

static float f16_to(uint16_t h) {
    if ((h & 0x7fff) == 0) return 0;
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    uint32_t b = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static uint16_t bf16_of(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    return (uint16_t)(b >> 16);
}

static float bf16_to(uint16_t h) {
    uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static size_t size_of(pcclDataType_t t) {
    switch (t) {
    case pcclUint8: case pcclInt8: return 1;
    case pcclInt16: case pcclUint16: case pcclFloat16: case pcclBFloat16: return 2;
    case pcclUint32: case pcclInt32: case pcclFloat: return 4;
    default: return 8;
    }
}

static void put(pcclDataType_t t, void *buf, size_t i, double v) {
    switch (t) {
    case pcclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case pcclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case pcclInt16: ((int16_t *)buf)[i] = (int16_t)v; break;
    case pcclUint16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
    case pcclUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case pcclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case pcclUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case pcclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case pcclFloat16: ((uint16_t *)buf)[i] = f16_of((float)v); break;
    case pcclBFloat16: ((uint16_t *)buf)[i] = bf16_of((float)v); break;
    case pcclFloat: ((float *)buf)[i] = (float)v; break;
    case pcclDouble: ((double *)buf)[i] = v; break;
    }
}

static double get(pcclDataType_t t, const void *buf, size_t i) {
    switch (t) {
    case pcclUint8: return ((const uint8_t *)buf)[i];
    case pcclInt8: return ((const int8_t *)buf)[i];
    case pcclInt16: return ((const int16_t *)buf)[i];
    case pcclUint16: return ((const uint16_t *)buf)[i];
    case pcclUint32: return ((const uint32_t *)buf)[i];
    case pcclInt32: return ((const int32_t *)buf)[i];
    case pcclUint64: return (double)((const uint64_t *)buf)[i];
    case pcclInt64: return (double)((const int64_t *)buf)[i];
    case pcclFloat16: return f16_to(((const uint16_t *)buf)[i]);
    case pcclBFloat16: return bf16_to(((const uint16_t *)buf)[i]);
    case pcclFloat: return ((const float *)buf)[i];
    case pcclDouble: return ((const double *)buf)[i];
    }
    return -1;
}

/* contribution of peer `rank` to element i: small, signed for signed types, exact in every type */
static double contribution(pcclDataType_t t, int rank, size_t i) {
    double v = (double)(i % 7) + rank + 1;
    if ((t == pcclInt8 || t == pcclInt16 || t == pcclInt32 || t == pcclInt64) && i % 2) v = -v;
    return v;
}

/* ---- the peer ---- */

static void check_reduced(pcclDataType_t t, pcclRedOp_t op, const void *buf, size_t count, int world) {
    for (size_t i = 0; i < count; i++) {
        double want = 0;
        for (int r = 0; r < world; r++) {
            double c = contribution(t, r, i);
            if (op == pcclSum) want += c;
            else if (op == pcclMax) want = r == 0 || c > want ? c : want;
            else if (op == pcclMin) want = r == 0 || c < want ? c : want;
        }
        double got = get(t, buf, i);
        if (got != want) die("dtype %d op %d element %zu: got %g, want %g", (int)t, (int)op, i, got, want);
    }
}

static void sync_state(pcclComm_t *comm, uint64_t revision, int diverge) {
    float weights[1000];
    int64_t step = 42;
    for (int i = 0; i < 1000; i++) weights[i] = diverge ? -1.0f : (float)i * 0.5f;
    pcclTensorInfo_t infos[2] = {
        {"weights", weights, 1000, pcclFloat, pcclDeviceCpu, false},
        {"step", &step, 1, pcclInt64, pcclDeviceCpu, false},
    };
    pcclSharedState_t st = {revision, 2, infos};
    pcclSharedStateSyncInfo_t info;
    CHECK(pcclSynchronizeSharedState(comm, &st, PCCL_SHARED_STATE_SYNC_STRATEGY_ENFORCE_POPULAR, &info));
    for (int i = 0; i < 1000; i++)
        if (weights[i] != (float)i * 0.5f) die("shared state weights[%d] = %g after sync", i, weights[i]);
    if (step != 42) die("shared state step = %lld after sync", (long long)step);
    if (st.revision != revision) die("revision %llu after sync, want %llu", (unsigned long long)st.revision,
                                     (unsigned long long)revision);
    if (diverge && info.rx_bytes != sizeof weights) die("outlier received %llu bytes", (unsigned long long)info.rx_bytes);
    if (!diverge && info.rx_bytes != 0) die("majority peer received %llu bytes", (unsigned long long)info.rx_bytes);
}

static const pcclDataType_t all_types[] = {pcclUint8, pcclInt8, pcclInt16, pcclUint16, pcclUint32, pcclInt32,
                                           pcclUint64, pcclInt64, pcclFloat16, pcclBFloat16, pcclFloat, pcclDouble};
#define NTYPES (sizeof all_types / sizeof all_types[0])

static void reduce_every_type(pcclComm_t *comm) {
    void *bufs[NTYPES];
    /* Sum: even types with pcclAllReduce in place, odd types async with separate buffers. */
    pcclAsyncReduceOp_t handles[NTYPES];
    void *outs[NTYPES];
    for (size_t k = 0; k < NTYPES; k++) {
        pcclDataType_t t = all_types[k];
        bufs[k] = malloc(COUNT * size_of(t));
        outs[k] = malloc(COUNT * size_of(t));
        for (size_t i = 0; i < COUNT; i++) put(t, bufs[k], i, contribution(t, me, i));
        pcclReduceDescriptor_t d = desc_of(t, pcclSum, 100 + k, COUNT);
        if (k % 2 == 0) {
            pcclReduceInfo_t info;
            CHECK(pcclAllReduce(bufs[k], bufs[k], &d, comm, &info));
            if (info.local_world_size != NPEERS) die("local world size %u", info.local_world_size);
            check_reduced(t, pcclSum, bufs[k], COUNT, NPEERS);
        } else {
            CHECK(pcclAllReduceAsync(bufs[k], outs[k], &d, comm, &handles[k]));
        }
    }
    for (size_t k = 1; k < NTYPES; k += 2) {
        pcclReduceInfo_t info;
        CHECK(pcclAwaitAsyncReduce(&handles[k], &info));
        check_reduced(all_types[k], pcclSum, outs[k], COUNT, NPEERS);
        for (size_t i = 0; i < COUNT; i++) /* the send buffer is left alone */
            if (get(all_types[k], bufs[k], i) != contribution(all_types[k], me, i)) die("send buffer changed");
    }
    /* Max and Min of every type in one pcclAllReduceMultipleWithRetry call, two in flight. */
    pcclReduceOpDescriptor_t many[2 * NTYPES];
    for (size_t k = 0; k < NTYPES; k++) {
        for (int j = 0; j < 2; j++) {
            pcclDataType_t t = all_types[k];
            void *b = j ? outs[k] : bufs[k];
            for (size_t i = 0; i < COUNT; i++) put(t, b, i, contribution(t, me, i));
            many[2 * k + j].sendbuf = b;
            many[2 * k + j].recvbuf = b;
            many[2 * k + j].descriptor = desc_of(t, j ? pcclMin : pcclMax, 200 + 2 * k + j, COUNT);
        }
    }
    pcclReduceInfo_t info;
    CHECK(pcclAllReduceMultipleWithRetry(many, 2 * NTYPES, comm, &info, 2));
    for (size_t k = 0; k < NTYPES; k++) {
        check_reduced(all_types[k], pcclMax, bufs[k], COUNT, NPEERS);
        check_reduced(all_types[k], pcclMin, outs[k], COUNT, NPEERS);
        free(bufs[k]);
        free(outs[k]);
    }
}

/* Quantized all-reduces: the result is close to the exact sum (both algorithms, uint8 and uint16). */
static void reduce_quantized(pcclComm_t *comm) {
    const pcclQuantizationAlgorithm_t algs[2] = {pcclQuantMinMax, pcclQuantZeroPointScale};
    const pcclDataType_t qtypes[2] = {pcclUint8, pcclUint16};
    float *x = malloc(COUNT * sizeof(float));
    for (int a = 0; a < 2; a++) {
        for (int q = 0; q < 2; q++) {
            for (size_t i = 0; i < COUNT; i++) x[i] = (float)contribution(pcclFloat, me, i);
            pcclReduceDescriptor_t d = desc_of(pcclFloat, pcclSum, 400 + 2 * a + q, COUNT);
            d.quantization_options.algorithm = algs[a];
            d.quantization_options.quantized_datatype = qtypes[q];
            CHECK(pcclAllReduce(x, x, &d, comm, NULL));
            for (size_t i = 0; i < COUNT; i++) {
                double want = 0;
                for (int r = 0; r < NPEERS; r++) want += contribution(pcclFloat, r, i);
                if (x[i] < want - 0.5 || x[i] > want + 0.5) die("quantized sum[%zu] = %g, want about %g", i, x[i], want);
            }
        }
    }
    pcclReduceDescriptor_t bad = desc_of(pcclInt32, pcclSum, 410, COUNT);
    bad.quantization_options.algorithm = pcclQuantMinMax;
    bad.quantization_options.quantized_datatype = pcclUint8;
    if (pcclAllReduce(x, x, &bad, comm, NULL) != pcclInvalidArgument) die("quantized int32 accepted");
    free(x);
}

/* While an async all-reduce is not awaited, membership changes and syncs are refused. */
static void pending_ops_block_membership(pcclComm_t *comm) {
    double x[3] = {1, 2, 3};
    pcclReduceDescriptor_t d = desc_of(pcclDouble, pcclSum, 300, 3);
    pcclAsyncReduceOp_t h;
    CHECK(pcclAllReduceAsync(x, x, &d, comm, &h));
    pcclAsyncReduceOp_t again;
    if (pcclAllReduceAsync(x, x, &d, comm, &again) != pcclInvalidArgument) die("a tag in flight was reused");
    if (pcclUpdateTopology(comm) != pcclPendingAsyncOps) die("update topology with an all-reduce in flight");
    pcclTensorInfo_t info = {"x", x, 3, pcclDouble, pcclDeviceCpu, false};
    pcclSharedState_t st = {9, 1, &info};
    if (pcclSynchronizeSharedState(comm, &st, PCCL_SHARED_STATE_SYNC_STRATEGY_ENFORCE_POPULAR, NULL) != pcclPendingAsyncOps)
        die("shared-state sync with an all-reduce in flight");
    CHECK(pcclAwaitAsyncReduce(&h, NULL));
    for (int i = 0; i < 3; i++)
        if (x[i] != 3.0 * (i + 1)) die("x[%d] = %g", i, x[i]);
    if (pcclAwaitAsyncReduce(&h, NULL) != pcclInvalidArgument) die("an all-reduce was awaited twice");
}

#define BIG (4u << 20) /* floats in the all-reduce that peer 2 dies in */

static void survive_a_kill(pcclComm_t *comm) {
    float *grads = malloc(BIG * sizeof(float));
    for (size_t i = 0; i < BIG; i++) grads[i] = (float)contribution(pcclFloat, me, i);
    pcclReduceDescriptor_t d = desc_of(pcclFloat, pcclSum, 7, BIG);
    if (me == 2) {
        pcclAsyncReduceOp_t h;
        CHECK(pcclAllReduceAsync(grads, grads, &d, comm, &h));
        nap_ms(2);
        kill(getpid(), SIGKILL);
    }
    int lost = 0;
    pcclReduceInfo_t info;
    for (;;) {
        pcclResult_t rc = pcclAllReduce(grads, grads, &d, comm, &info);
        if (rc == pcclSuccess) break;
        if (rc != pcclRankConnectionLost) die("all-reduce during the kill returned %d", (int)rc);
        lost++;
        if (lost > 10) die("all-reduce kept failing");
        for (size_t i = 0; i < BIG; i++) /* a failed all-reduce leaves the buffer as it was */
            if (grads[i] != (float)contribution(pcclFloat, me, i)) die("grads[%zu] changed by a failed all-reduce", i);
    }
    if (!lost) die("the all-reduce peer 2 died in succeeded");
    if (info.local_world_size != 2) die("world size %u after the kill", info.local_world_size);
    check_reduced(pcclFloat, pcclSum, grads, 4096, 2);
    for (size_t i = 4096; i < BIG; i++)
        if (grads[i] != (float)(contribution(pcclFloat, 0, i) + contribution(pcclFloat, 1, i)))
            die("grads[%zu] = %g after the retry", i, grads[i]);
    free(grads);
    if (world_size(comm) != 2) die("world size %d after the kill", world_size(comm));
}

/* The transport and run secret of the environment, or NULL for PCCL's plain TCP. */
static const char *test_transport(void) {
    const char *t = getenv("CONCORD_TEST_TRANSPORT");
    return (t != NULL && *t != '\0') ? t : NULL;
}

static const char *test_secret(void) {
    const char *s = getenv("CONCORD_TEST_SECRET");
    return s != NULL ? s : "";
}

static int peer(uint16_t port) {
    alarm(120);
    CHECK(pcclInit());
    pcclCommCreateParams_t params;
    memset(&params, 0, sizeof params);
    params.master_address = loopback(port);
    params.peer_group = 0;
    params.p2p_connection_pool_size = 2;
    pcclComm_t *comm = NULL;
    CHECK(pcclCreateCommunicator(&params, &comm));
    if (test_transport() != NULL) {
        CHECK(concordSetSecret(comm, test_secret()));
        CHECK(concordSetTransport(comm, test_transport()));
        CHECK(concordSetNICs(comm, "127.0.0.1"));
    }
    CHECK(pcclConnect(comm));
    if (pcclConnect(comm) != pcclInvalidUsage) die("a second pcclConnect did not fail with pcclInvalidUsage");

    grow(comm, NPEERS);
    int v = 0;
    CHECK(pcclGetAttribute(comm, PCCL_ATTRIBUTE_GLOBAL_WORLD_SIZE, &v));
    if (v != NPEERS) die("global world size %d", v);
    CHECK(pcclGetAttribute(comm, PCCL_ATTRIBUTE_NUM_DISTINCT_PEER_GROUPS, &v));
    if (v != 1) die("%d peer groups", v);
    CHECK(pcclGetAttribute(comm, PCCL_ATTRIBUTE_LARGEST_PEER_GROUP_WORLD_SIZE, &v));
    if (v != NPEERS) die("largest peer group of %d", v);

    bool pending = true;
    CHECK(pcclArePeersPending(comm, &pending));
    if (pending) die("peers pending with everyone in");

    sync_state(comm, 1, me == 2);
    reduce_every_type(comm);
    reduce_quantized(comm);
    pending_ops_block_membership(comm);
    CHECK(pcclOptimizeTopology(comm));
    if (world_size(comm) != NPEERS) die("world size %d after optimizing", world_size(comm));

    /* Misuse is reported, not crashed on. */
    pcclReduceDescriptor_t bad = desc_of((pcclDataType_t)99, pcclSum, 1, 4);
    float tiny[4] = {0};
    if (pcclAllReduce(tiny, tiny, &bad, comm, NULL) != pcclInvalidArgument) die("bad data type accepted");
    if (concordGetLastErrorKind() != CONCORD_ERR_INVALID) die("bad data type: error kind %d", (int)concordGetLastErrorKind());

    survive_a_kill(comm);
    sync_state(comm, 2, 0);
    CHECK(pcclDestroyCommunicator(comm));
    printf("[peer %d] ok\n", me);
    return 0;
}

/* ---- the driver ---- */

static int driver(const char *self) {
    alarm(150);
    pcclBuildInfo_t build;
    CHECK(pcclGetBuildInfo(&build));
    pcclMasterInstance_t *master = NULL;
    CHECK(pcclCreateMaster(loopback(0), &master));
    if (test_transport() != NULL) {
        if (concordMasterSetTransport(master, "carrier-pigeon") != pcclInvalidArgument) die("an unknown transport was accepted");
        CHECK(concordMasterSetTransport(master, test_transport()));
        if (pcclRunMaster(master) != pcclInvalidUsage) die("%s without a run secret did not fail", test_transport());
        CHECK(concordMasterSetSecret(master, test_secret()));
    }
    CHECK(pcclRunMaster(master));
    if (pcclRunMaster(master) != pcclInvalidUsage) die("a second pcclRunMaster did not fail");
    uint16_t port = 0;
    CHECK(concordMasterGetPort(master, &port));

    pid_t pids[NPEERS];
    for (int i = 0; i < NPEERS; i++) {
        char ps[16], is[16];
        snprintf(ps, sizeof ps, "%u", port);
        snprintf(is, sizeof is, "%d", i);
        pids[i] = fork();
        if (pids[i] < 0) die("fork: %s", strerror(errno));
        if (pids[i] == 0) {
            execl(self, self, "peer", ps, is, (char *)NULL);
            _exit(127);
        }
    }
    int failed = 0;
    for (int i = 0; i < NPEERS; i++) {
        int status;
        if (waitpid(pids[i], &status, 0) < 0) die("waitpid: %s", strerror(errno));
        if (!ended_as_wanted(status, i == 2)) {
            fprintf(stderr, "[driver] peer %d ended with status 0x%x\n", i, status);
            failed = 1;
        }
    }
    stop_master(master);
    if (failed) return 1;
    printf("PASS\n");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc == 4 && strcmp(argv[1], "peer") == 0) {
        me = atoi(argv[3]);
        return peer((uint16_t)atoi(argv[2]));
    }
    return driver(argv[0]);
}
