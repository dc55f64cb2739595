/*
 * concord_test: Concord's own additions to the C API (the concord* functions), checked through pccl.h.
 *
 *   concord_test gossip   the master keeps a silent peer for 60 s (the default "pccl" timing) but runs
 *                         a gossip detector (concordMasterSetGossip) that three peers join
 *                         (concordSetGossip). The driver stops one with SIGSTOP: the others go on in a
 *                         ring of two within seconds. Continued, the stopped peer finds it was kicked
 *                         (concordRejoinable), rejoins by itself (concordRejoin), fetches the state and
 *                         the three finish together.
 *   concord_test refused  concordRejoin gives up at once, in one line, on a wrong run secret, and after
 *                         its timeout on a master that does not answer.
 *   concord_test guard    a master with a contribution guard (concordMasterSetGuard), three peers
 *                         reporting their contributions (concordSetContributionStats): the one whose
 *                         contribution has a thousand times the norm of the others' is kicked with the
 *                         reason, and the other two reduce on.
 *   concord_test quant    both-phase quantization (concordQuantMinMaxBothPhases): results within the
 *                         encoding's error and bit-identical across peers, the bytes on the wire, and
 *                         the descriptors it refuses.
 *   concord_test group    four peers in two peer groups on one master: each group reduces over its own
 *                         two peers.
 *
 * Each scenario runs its master in the driver process, which starts the peers by executing itself
 * with the role "peer" and reads their standard output through pipes. "PASS" ends a good run.
 */
#define _POSIX_C_SOURCE 200809L
#include <pccl.h>

#include "testutil.h"

#include <math.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#define COUNT 1031

/* What every peer adds to element i (the same on every peer: a sum is the world size times it). */
static float base(size_t i) { return (float)(i % 5) + 1.0f; }

/* ---- gossip: a stopped peer is kicked by the gossip verdict, and comes back by itself ---- */

/* One step of the gossip scenario's loop: an all-reduce of COUNT elements and a flag, checked. It
 * returns pcclSuccess with the world it ran over and whether every peer wants to stop, or the failed
 * call's result. */
static pcclResult_t step_checked(pcclComm_t *comm, int want_stop, int *world, int *all_stop) {
    static float buf[COUNT + 1];
    for (size_t i = 0; i < COUNT; i++) buf[i] = base(i);
    buf[COUNT] = want_stop ? 1.0f : 0.0f;
    pcclReduceDescriptor_t d = desc_f32(1, COUNT + 1);
    pcclReduceInfo_t info;
    pcclResult_t rc = pcclAllReduce(buf, buf, &d, comm, &info);
    if (rc != pcclSuccess) return rc;
    *world = (int)info.local_world_size;
    for (size_t i = 0; i < COUNT; i++)
        if (buf[i] != (float)*world * base(i)) die("element %zu = %g in a world of %d", i, buf[i], *world);
    *all_stop = buf[COUNT] == (float)*world;
    return pcclSuccess;
}

static void peer_gossip(uint16_t port, const char *gossip) {
    pcclComm_t *comm = create(port, 0);
    CHECK(concordSetGossip(comm, gossip, NULL));
    CHECK(pcclConnect(comm));
    grow(comm, 3);
    uint64_t step = 0;
    pcclTensorInfo_t infos[1] = {{"step", &step, 1, pcclUint64, pcclDeviceCpu, false}};
    pcclSharedState_t st = {0, 1, infos};
    int fresh = 0, need_sync = 1, saw_two = 0, back = 0, rejoined = 0, kicks = 0;
    for (;;) {
        pcclResult_t rc = pcclSuccess;
        if (!fresh && !need_sync) {
            bool pending = false;
            rc = pcclArePeersPending(comm, &pending);
            if (rc == pcclSuccess && pending) {
                rc = pcclUpdateTopology(comm);
                need_sync = 1;
            }
        }
        if (rc == pcclSuccess && need_sync) {
            st.revision++;
            rc = pcclSynchronizeSharedState(comm, &st, fresh ? PCCL_SHARED_STATE_SYNC_STRATEGY_RECEIVE_ONLY
                                                                : PCCL_SHARED_STATE_SYNC_STRATEGY_ENFORCE_POPULAR,
                                            NULL);
            if (rc != pcclSuccess) st.revision--;
            else need_sync = fresh = 0;
        }
        int world = 0, all_stop = 0;
        if (rc == pcclSuccess) {
            int done = me == 2 ? rejoined : back;
            rc = step_checked(comm, done && step >= 20, &world, &all_stop);
        }
        if (rc == pcclRankConnectionLost) continue; /* a peer left: the library re-wired; retry */
        if (rc != pcclSuccess) {
            if (!concordRejoinable()) die("a call failed with %d, and a rejoin cannot fix it", (int)rc);
            char why[512] = "";
            concordGetLastError(why, sizeof why);
            printf("kicked: %s\n", why);
            if (++kicks > 3) die("kicked %d times", kicks);
            CHECK(concordRejoin(comm, 60000));
            printf("rejoined\n");
            rejoined = fresh = need_sync = 1;
            continue;
        }
        step++;
        if (step == 5 && me == 2) printf("ready\n");
        if (world == 2 && !saw_two) {
            saw_two = 1;
            printf("world 2\n");
        }
        if (world == 3 && saw_two) back = 1;
        if (all_stop) break;
        nap_ms(10);
    }
    if (me == 2 && !rejoined) die("the stopped peer was never kicked");
    CHECK(pcclDestroyCommunicator(comm));
    printf("done at step %llu\n", (unsigned long long)step);
}

/* ---- guard: the peer whose contribution is out of line is kicked ---- */

static void peer_guard(uint16_t port) {
    pcclComm_t *comm = create(port, 0);
    CHECK(concordSetContributionStats(comm, true));
    CHECK(pcclConnect(comm));
    grow(comm, 3);
    static float buf[COUNT];
    pcclReduceDescriptor_t d = desc_f32(1, COUNT);
    int lost = 0;
    for (int step = 0; step < 10;) {
        for (size_t i = 0; i < COUNT; i++) buf[i] = base(i) * (me == 2 && step == 3 ? 1000.0f : 1.0f);
        pcclReduceInfo_t info;
        pcclResult_t rc = pcclAllReduce(buf, buf, &d, comm, &info);
        if (me == 2 && step == 3) {
            char why[512] = "";
            concordGetLastError(why, sizeof why);
            if (rc != pcclMasterConnectionFailed || concordGetLastErrorKind() != CONCORD_ERR_KICKED ||
                strstr(why, "contribution guard") == NULL)
                die("the out-of-line contribution: result %d, kind %d", (int)rc, (int)concordGetLastErrorKind());
            printf("guarded: %s\n", why);
            CHECK(pcclDestroyCommunicator(comm));
            return;
        }
        if (rc == pcclRankConnectionLost) {
            if (++lost > 10) die("the all-reduce kept failing");
            continue;
        }
        if (rc != pcclSuccess) die("pcclAllReduce returned %d at step %d", (int)rc, step);
        for (size_t i = 0; i < COUNT; i++)
            if (buf[i] != (float)info.local_world_size * base(i)) die("element %zu = %g at step %d", i, buf[i], step);
        if (step > 3 && info.local_world_size != 2) die("world %u after the guard", info.local_world_size);
        step++;
    }
    if (!lost) die("the all-reduce the offender took part in did not fail");
    CHECK(pcclDestroyCommunicator(comm));
    printf("done\n");
}

/* ---- quant: both-phase quantization ---- */

static void peer_quant(uint16_t port) {
    pcclComm_t *comm = create(port, 0);
    CHECK(pcclConnect(comm));
    grow(comm, 2);
    static float x[1024];
    pcclReduceDescriptor_t d = desc_f32(7, 1024);
    d.quantization_options.algorithm = concordQuantMinMaxBothPhases;
    d.quantization_options.quantized_datatype = pcclUint8;
    for (int i = 0; i < 1024; i++) x[i] = (float)i + (float)me * 0.25f;
    pcclReduceInfo_t ri;
    CHECK(pcclAllReduce(x, x, &d, comm, &ri));
    /* Two peers, one part per phase: the reduce-scatter sends half of the buffer as 512 one-byte codes
     * and an 8-byte header (minimum and step as floats), and so does the all-gather. */
    if (ri.tx_bytes != 1040 || ri.rx_bytes != 1040)
        die("both phases, uint8: tx %llu rx %llu, want 1040", (unsigned long long)ri.tx_bytes,
            (unsigned long long)ri.rx_bytes);
    /* Each element went through two encodings whose steps are at most the range over the levels. */
    double bound = 2 * (2 * 1024.0) / 255 / 2 + 1e-3;
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < 1024; i++) {
        double exact = 2.0 * i + 0.25;
        if (fabs(x[i] - exact) > bound) die("element %d = %g, want %g within %g", i, x[i], exact, bound);
        uint32_t bits;
        memcpy(&bits, &x[i], 4);
        h = (h ^ bits) * 1099511628211ull;
    }
    printf("result %016llx\n", (unsigned long long)h);
    d.tag = 8;
    d.quantization_options.quantized_datatype = pcclUint16;
    CHECK(pcclAllReduce(x, x, &d, comm, &ri));
    if (ri.tx_bytes != 2 * (8 + 512 * 2)) die("both phases, uint16: tx %llu", (unsigned long long)ri.tx_bytes);
    d.tag = 9;
    d.op = pcclProd;
    EXPECT(pcclAllReduce(x, x, &d, comm, &ri), pcclInvalidArgument);
    d.op = pcclSum;
    static int32_t ints[16];
    d.src_descriptor.datatype = pcclInt32;
    d.count = 16;
    EXPECT(pcclAllReduce(ints, ints, &d, comm, &ri), pcclInvalidArgument);
    CHECK(pcclDestroyCommunicator(comm));
    printf("done\n");
}

/* ---- group: two peer groups on one master ---- */

static void peer_group(uint16_t port) {
    uint32_t group = me < 2 ? 1 : 2;
    pcclComm_t *comm = create(port, group);
    CHECK(pcclConnect(comm));
    uint32_t got = 0;
    CHECK(concordGetPeerGroup(comm, &got));
    if (got != group) die("peer group %u, want %u", got, group);
    grow(comm, 2);
    static float buf[COUNT];
    int first = me < 2 ? 0 : 2; /* the group's members are peers first and first+1 */
    pcclReduceDescriptor_t d = desc_f32(1, COUNT);
    for (int step = 0; step < 10; step++) {
        for (size_t i = 0; i < COUNT; i++) buf[i] = base(i) + (float)me;
        pcclReduceInfo_t info;
        CHECK(pcclAllReduce(buf, buf, &d, comm, &info));
        if (info.local_world_size != 2) die("world %u, want the group's 2", info.local_world_size);
        for (size_t i = 0; i < COUNT; i++)
            if (buf[i] != 2 * base(i) + (float)(first + first + 1)) die("element %zu = %g", i, buf[i]);
    }
    CHECK(pcclDestroyCommunicator(comm));
    printf("done\n");
}

/* ---- the driver ---- */

static void with_gossip(pcclMasterInstance_t *m) { CHECK(concordMasterSetGossip(m, "127.0.0.1:0")); }

static int drive_gossip(const char *self) {
    uint16_t port;
    pcclMasterInstance_t *m = start_master(&port, with_gossip);
    char gossip[128];
    CHECK(concordMasterGetGossipAddress(m, gossip, sizeof gossip));
    char tiny[4];
    EXPECT(concordMasterGetGossipAddress(m, tiny, sizeof tiny), pcclInvalidArgument);
    child c[3];
    for (int i = 0; i < 3; i++) c[i] = spawn(self, "gossip", port, i, gossip);
    await_line(c[2], "ready", NULL, 0);
    kill(c[2].pid, SIGSTOP);
    double stopped = now_s();
    /* The master keeps a silent peer for a minute, and a collective waits 30 s on a silent link:
     * only the gossip verdict can let the others go on this soon. */
    await_line(c[0], "world 2", NULL, 0);
    double took = now_s() - stopped;
    fprintf(stderr, "[driver] the others went on in a ring of two %.2f s after the SIGSTOP\n", took);
    if (took > 20) die("the others went on only %.1f s after the SIGSTOP", took);
    kill(c[2].pid, SIGCONT);
    char line[512];
    await_line(c[2], "kicked:", line, sizeof line);
    if (strstr(line, "gossip") == NULL) die("the stopped peer was kicked for another reason: %s", line);
    await_line(c[2], "rejoined", NULL, 0);
    int ok = 1;
    char done[3][64];
    for (int i = 0; i < 3; i++) {
        await_line(c[i], "done at step", done[i], sizeof done[i]);
        ok &= reap(c[i], 0);
    }
    if (strcmp(done[0], done[1]) != 0 || strcmp(done[0], done[2]) != 0)
        die("the peers ended at different steps: %s %s %s", done[0], done[1], done[2]);
    EXPECT(concordMasterSetGossip(m, "127.0.0.1:0"), pcclInvalidUsage); /* it runs already */
    stop_master(m);
    return ok;
}

static void with_secret(pcclMasterInstance_t *m) { CHECK(concordMasterSetSecret(m, "the run secret, long enough")); }

static int drive_refused(void) {
    uint16_t port;
    pcclMasterInstance_t *m = start_master(&port, with_secret);
    pcclComm_t *comm = create(port, 0);
    CHECK(concordSetSecret(comm, "another secret, long enough"));
    double t0 = now_s();
    EXPECT(concordRejoin(comm, 20000), pcclMasterConnectionFailed);
    char why[512] = "";
    concordGetLastError(why, sizeof why);
    if (concordGetLastErrorKind() != CONCORD_ERR_REFUSED || concordRejoinable() || strstr(why, "token") == NULL ||
        strchr(why, '\n') != NULL)
        die("a wrong secret: kind %d, rejoinable %d: %s", (int)concordGetLastErrorKind(), (int)concordRejoinable(), why);
    if (now_s() - t0 > 10) die("concordRejoin took %.1f s to give up on a wrong secret", now_s() - t0);
    fprintf(stderr, "[driver] %s\n", why);
    CHECK(pcclDestroyCommunicator(comm));
    stop_master(m);

    /* Nobody answers on the stopped master's port: retried until the timeout. */
    comm = create(port, 0);
    t0 = now_s();
    EXPECT(concordRejoin(comm, 1500), pcclMasterConnectionFailed);
    concordGetLastError(why, sizeof why);
    double took = now_s() - t0;
    if (took < 0.5 || took > 10 || strstr(why, "gave up") == NULL) die("no master: gave up after %.1f s: %s", took, why);
    CHECK(pcclDestroyCommunicator(comm));
    return 1;
}

static void with_guard(pcclMasterInstance_t *m) {
    EXPECT(concordMasterSetGuard(m, true, 0.5, true), pcclInvalidArgument); /* a factor must exceed 1 */
    CHECK(concordMasterSetGuard(m, true, 4.0, true));
}

static int drive_guard(const char *self) {
    uint16_t port;
    pcclMasterInstance_t *m = start_master(&port, with_guard);
    child c[3];
    for (int i = 0; i < 3; i++) c[i] = spawn(self, "guard", port, i, "");
    char line[512];
    await_line(c[2], "guarded:", line, sizeof line);
    if (strstr(line, "median") == NULL) die("the guard's reason names no median: %s", line);
    int ok = 1;
    for (int i = 0; i < 3; i++) ok &= reap(c[i], 0);
    stop_master(m);
    return ok;
}

static int drive_quant(const char *self) {
    uint16_t port;
    pcclMasterInstance_t *m = start_master(&port, NULL);
    child c[2];
    char res[2][64];
    for (int i = 0; i < 2; i++) c[i] = spawn(self, "quant", port, i, "");
    for (int i = 0; i < 2; i++) await_line(c[i], "result", res[i], sizeof res[i]);
    if (strcmp(res[0], res[1]) != 0) die("the peers' results differ: %s / %s", res[0], res[1]);
    int ok = reap(c[0], 0) & reap(c[1], 0);
    stop_master(m);
    return ok;
}

static int drive_group(const char *self) {
    uint16_t port;
    pcclMasterInstance_t *m = start_master(&port, NULL);
    child c[4];
    for (int i = 0; i < 4; i++) c[i] = spawn(self, "group", port, i, "");
    int ok = 1;
    for (int i = 0; i < 4; i++) ok &= reap(c[i], 0);
    stop_master(m);
    return ok;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc == 6 && strcmp(argv[1], "peer") == 0) {
        me = atoi(argv[4]);
        alarm(150);
        uint16_t port = (uint16_t)atoi(argv[3]);
        if (strcmp(argv[2], "gossip") == 0) peer_gossip(port, argv[5]);
        else if (strcmp(argv[2], "guard") == 0) peer_guard(port);
        else if (strcmp(argv[2], "quant") == 0) peer_quant(port);
        else if (strcmp(argv[2], "group") == 0) peer_group(port);
        else die("unknown scenario %s", argv[2]);
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: %s gossip|refused|guard|quant|group\n", argv[0]);
        return 2;
    }
    alarm(170);
    signal(SIGPIPE, SIG_IGN);
    int ok = 0;
    if (strcmp(argv[1], "gossip") == 0) ok = drive_gossip(argv[0]);
    else if (strcmp(argv[1], "refused") == 0) ok = drive_refused();
    else if (strcmp(argv[1], "guard") == 0) ok = drive_guard(argv[0]);
    else if (strcmp(argv[1], "quant") == 0) ok = drive_quant(argv[0]);
    else if (strcmp(argv[1], "group") == 0) ok = drive_group(argv[0]);
    else die("unknown scenario %s", argv[1]);
    if (!ok) return 1;
    printf("PASS\n");
    return 0;
}
