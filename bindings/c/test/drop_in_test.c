/*
 * drop_in_test: PCCL behaviours that programs written for PCCL rely on, checked through pccl.h only.
 *
 *   drop_in_test admit    peers A, B and C run only all-reduces while D waits in pcclConnect. C dies
 *                         in the middle of an all-reduce; A and B retry (the library re-wires their
 *                         ring) and keep reducing between the two of them, and D is admitted only
 *                         when A and B call pcclUpdateTopology.
 *   drop_in_test crossed  two peers hold crossed shared-state entries (201, 251) and (202, 252): both
 *                         end with one of the two states, never a mix; the sync reports the bytes
 *                         sent and received, and all-reduces report the bytes on the wire, quantized.
 *   drop_in_test pause    three peers reduce under the library's default timing while the driver
 *                         stops one of them (SIGSTOP) for 10 s: it is kept, and every result is right.
 *   drop_in_test codes    the master's result codes on misuse, as PCCL returns them.
 *
 * Each scenario runs a master in the driver process, which starts the peers by executing itself
 * with the role "peer" and reads their standard output through pipes. "PASS" ends a good run.
 */
#define _POSIX_C_SOURCE 200809L
#include <pccl.h>

#include "testutil.h"

/* What peer `who` contributes to element i. */
static float contribution(int who, size_t i) { return (float)(i % 5) + (float)who + 1.0f; }

#define COUNT 2053
#define BIG (1u << 22)

/* One all-reduce of COUNT floats among the peers in `who` (n of them), retried while a peer leaves;
 * every element is checked. Returns how many attempts failed. */
static int reduce_checked(pcclComm_t *comm, uint64_t tag, const int *who, int n) {
    static float buf[COUNT];
    pcclReduceDescriptor_t d = desc_f32(tag, COUNT);
    int lost = 0;
    for (;;) {
        for (size_t i = 0; i < COUNT; i++) buf[i] = contribution(me, i);
        pcclReduceInfo_t info;
        pcclResult_t rc = pcclAllReduce(buf, buf, &d, comm, &info);
        if (rc == pcclRankConnectionLost) {
            if (++lost > 10) die("the all-reduce kept failing");
            continue;
        }
        if (rc != pcclSuccess) die("pcclAllReduce returned %d", (int)rc);
        if ((int)info.local_world_size != n) die("all-reduce over %u peers, want %d", info.local_world_size, n);
        for (size_t i = 0; i < COUNT; i++) {
            float want = 0;
            for (int k = 0; k < n; k++) want += contribution(who[k], i);
            if (buf[i] != want) die("element %zu = %g, want %g", i, buf[i], want);
        }
        return lost;
    }
}

/* ---- admit: a retry never admits a newcomer ---- */

static void peer_admit(uint16_t port) {
    pcclComm_t *comm = join(port);
    if (me == 3) {
        /* D: pcclConnect returns only once A and B admit it with pcclUpdateTopology. */
        printf("connected\n");
        if (world_size(comm) != 3) die("admitted into a ring of %d", world_size(comm));
        const int abd[3] = {0, 1, 3};
        reduce_checked(comm, 1, abd, 3);
        CHECK(pcclDestroyCommunicator(comm));
        printf("done\n");
        return;
    }
    grow(comm, 3);
    printf("ring of 3\n");
    const int abc[3] = {0, 1, 2};
    /* Reduce until D waits (every peer gets the same answer at the same step). */
    for (int step = 0;; step++) {
        if (step > 2000) die("D never registered");
        reduce_checked(comm, 1, abc, 3);
        bool pending = false;
        CHECK(pcclArePeersPending(comm, &pending));
        if (pending) break;
        nap_ms(5);
    }
    /* A large all-reduce that C dies in: A and B retry it over the two of them, then reduce on. */
    static float big[BIG];
    for (size_t i = 0; i < BIG; i++) big[i] = contribution(me, i);
    pcclReduceDescriptor_t d = desc_f32(2, BIG);
    if (me == 2) {
        pcclAsyncReduceOp_t h;
        CHECK(pcclAllReduceAsync(big, big, &d, comm, &h));
        nap_ms(2);
        kill(getpid(), SIGKILL);
    }
    int lost = 0;
    for (;;) {
        pcclResult_t rc = pcclAllReduce(big, big, &d, comm, NULL);
        if (rc == pcclSuccess) break;
        if (rc != pcclRankConnectionLost) die("the all-reduce C died in returned %d", (int)rc);
        if (++lost > 10) die("the all-reduce C died in kept failing");
    }
    if (!lost) die("the all-reduce C died in succeeded");
    for (size_t i = 0; i < BIG; i++)
        if (big[i] != contribution(0, i) + contribution(1, i)) die("big[%zu] = %g after the retry", i, big[i]);
    const int ab[2] = {0, 1};
    for (int step = 0; step < 20; step++) {
        if (reduce_checked(comm, 1, ab, 2) != 0) die("an all-reduce between A and B failed at step %d", step);
        if (world_size(comm) != 2) die("world size %d at step %d after C left", world_size(comm), step);
    }
    bool pending = false;
    CHECK(pcclArePeersPending(comm, &pending));
    if (!pending) die("D is no longer pending after the retries");
    printf("updating topology\n");
    CHECK(pcclUpdateTopology(comm));
    if (world_size(comm) != 3) die("world size %d after admitting D", world_size(comm));
    const int abd[3] = {0, 1, 3};
    reduce_checked(comm, 1, abd, 3);
    CHECK(pcclDestroyCommunicator(comm));
    printf("done\n");
}

/* ---- crossed: the whole state wins; byte counts ---- */

#define ENTRY 1000

static void fill(float *x, float base) {
    for (int i = 0; i < ENTRY; i++) x[i] = base + (float)i;
}

static int holds(const float *x, float base) {
    for (int i = 0; i < ENTRY; i++)
        if (x[i] != base + (float)i) return 0;
    return 1;
}

static void peer_crossed(uint16_t port) {
    pcclComm_t *comm = join(port);
    grow(comm, 2);
    static float a[ENTRY], b[ENTRY];
    fill(a, me == 0 ? 201 : 202);
    fill(b, me == 0 ? 251 : 252);
    pcclTensorInfo_t infos[2] = {
        {"a", a, ENTRY, pcclFloat, pcclDeviceCpu, false},
        {"b", b, ENTRY, pcclFloat, pcclDeviceCpu, false},
    };
    pcclSharedState_t st = {1, 2, infos};
    pcclSharedStateSyncInfo_t info;
    CHECK(pcclSynchronizeSharedState(comm, &st, PCCL_SHARED_STATE_SYNC_STRATEGY_ENFORCE_POPULAR, &info));
    int state = -1;
    if (holds(a, 201) && holds(b, 251)) state = 0;
    if (holds(a, 202) && holds(b, 252)) state = 1;
    if (state < 0) die("after the sync the state is a mix: a[0] = %g, b[0] = %g", a[0], b[0]);
    printf("state %d tx %llu rx %llu\n", state, (unsigned long long)info.tx_bytes, (unsigned long long)info.rx_bytes);
    /* A second sync of the same state moves nothing. */
    st.revision = 2;
    CHECK(pcclSynchronizeSharedState(comm, &st, PCCL_SHARED_STATE_SYNC_STRATEGY_ENFORCE_POPULAR, &info));
    if (info.tx_bytes != 0 || info.rx_bytes != 0) die("a sync of equal states moved %llu/%llu bytes",
                                                      (unsigned long long)info.tx_bytes, (unsigned long long)info.rx_bytes);

    /* Byte counts of 1024 floats over two peers: each sends and receives half of the buffer in the
     * reduce-scatter and half in the all-gather. Unquantized that is 4096 bytes. With uint8 min-max
     * quantization the all-gather half goes as 512 one-byte codes and an 8-byte header (minimum and
     * step as floats): 2048 + 520 = 2568 bytes. */
    static float x[1024];
    for (int i = 0; i < 1024; i++) x[i] = (float)i;
    pcclReduceDescriptor_t d = desc_f32(5, 1024);
    pcclReduceInfo_t ri;
    CHECK(pcclAllReduce(x, x, &d, comm, &ri));
    if (ri.tx_bytes != 4096 || ri.rx_bytes != 4096) die("unquantized: tx %llu rx %llu, want 4096",
                                                        (unsigned long long)ri.tx_bytes, (unsigned long long)ri.rx_bytes);
    d.tag = 6;
    d.quantization_options.algorithm = pcclQuantMinMax;
    d.quantization_options.quantized_datatype = pcclUint8;
    CHECK(pcclAllReduce(x, x, &d, comm, &ri));
    if (ri.tx_bytes != 2568 || ri.rx_bytes != 2568) die("quantized: tx %llu rx %llu, want 2568",
                                                        (unsigned long long)ri.tx_bytes, (unsigned long long)ri.rx_bytes);
    CHECK(pcclDestroyCommunicator(comm));
    printf("done\n");
}

/* ---- pause: a peer stopped for 10 s is kept ---- */

static void peer_pause(uint16_t port) {
    pcclComm_t *comm = join(port);
    grow(comm, 3);
    const int all[3] = {0, 1, 2};
    for (int step = 0; step < 8; step++) {
        if (me == 2 && step == 3) {
            printf("stop me\n"); /* the driver stops this process for 10 s */
            nap_ms(100);
        }
        if (reduce_checked(comm, 1, all, 3) != 0) die("an all-reduce failed at step %d", step);
    }
    if (world_size(comm) != 3) die("world size %d after the pause", world_size(comm));
    CHECK(pcclDestroyCommunicator(comm));
    printf("done\n");
}

/* ---- the driver ---- */

static int drive_admit(const char *self) {
    uint16_t port;
    pcclMasterInstance_t *m = start_master(&port, NULL);
    child c[4];
    for (int i = 0; i < 3; i++) c[i] = spawn(self, "admit", port, i, NULL);
    await_line(c[0], "ring of 3", NULL, 0);
    c[3] = spawn(self, "admit", port, 3, NULL);
    await_line(c[0], "updating topology", NULL, 0);
    await_line(c[3], "connected", NULL, 0);
    int ok = reap(c[2], 1);
    for (int i = 0; i < 4; i++)
        if (i != 2) ok &= reap(c[i], 0);
    stop_master(m);
    return ok;
}

static int drive_crossed(const char *self) {
    uint16_t port;
    pcclMasterInstance_t *m = start_master(&port, NULL);
    child c[2];
    for (int i = 0; i < 2; i++) c[i] = spawn(self, "crossed", port, i, NULL);
    char line[2][256];
    int state[2];
    unsigned long long tx[2], rx[2];
    for (int i = 0; i < 2; i++) {
        await_line(c[i], "state", line[i], sizeof line[i]);
        if (sscanf(line[i], "state %d tx %llu rx %llu", &state[i], &tx[i], &rx[i]) != 3) die("peer %d said %s", i, line[i]);
    }
    if (state[0] != state[1]) die("the peers ended with states %d and %d", state[0], state[1]);
    /* The outlier fetched both entries from the other, which sent them. */
    unsigned long long both = 2 * ENTRY * sizeof(float);
    int donor = state[0]; /* the peer whose state won */
    if (tx[donor] != both || rx[donor] != 0 || tx[1 - donor] != 0 || rx[1 - donor] != both)
        die("sync bytes: peer 0 tx %llu rx %llu, peer 1 tx %llu rx %llu; want %llu from peer %d", tx[0], rx[0], tx[1],
            rx[1], both, donor);
    int ok = reap(c[0], 0) & reap(c[1], 0);
    stop_master(m);
    return ok;
}

static int drive_pause(const char *self) {
    uint16_t port;
    pcclMasterInstance_t *m = start_master(&port, NULL); /* the library's default timing */
    child c[3];
    for (int i = 0; i < 3; i++) c[i] = spawn(self, "pause", port, i, NULL);
    await_line(c[2], "stop me", NULL, 0);
    kill(c[2].pid, SIGSTOP);
    nap_ms(10000);
    kill(c[2].pid, SIGCONT);
    int ok = 1;
    for (int i = 0; i < 3; i++) ok &= reap(c[i], 0);
    stop_master(m);
    return ok;
}

static int drive_codes(void) {
    pcclMasterInstance_t *m = NULL;
    CHECK(pcclCreateMaster(loopback(0), &m));
    EXPECT(pcclInterruptMaster(m), pcclInvalidUsage);
    EXPECT(pcclMasterAwaitTermination(m), pcclInvalidUsage);
    CHECK(pcclRunMaster(m));
    EXPECT(pcclRunMaster(m), pcclInvalidUsage);
    uint16_t port = 0;
    CHECK(concordMasterGetPort(m, &port));

    /* A second master on the same port cannot bind it. */
    pcclMasterInstance_t *twin = NULL;
    CHECK(pcclCreateMaster(loopback(port), &twin));
    EXPECT(pcclRunMaster(twin), pcclInvalidUsage);
    EXPECT(pcclInterruptMaster(twin), pcclInvalidUsage);
    CHECK(pcclDestroyMaster(twin));

    EXPECT(concordMasterSetPreset(m, "lan"), pcclInvalidUsage); /* it runs already */
    CHECK(pcclInterruptMaster(m));
    CHECK(pcclInterruptMaster(m)); /* again: nothing more to do */
    CHECK(pcclMasterAwaitTermination(m));
    CHECK(pcclDestroyMaster(m));

    CHECK(pcclCreateMaster(loopback(0), &m));
    EXPECT(concordMasterSetPreset(m, "lunar"), pcclInvalidArgument);
    CHECK(concordMasterSetPreset(m, "pccl"));
    CHECK(concordMasterSetPreset(m, "wan"));
    CHECK(concordMasterSetPreset(m, "lan"));
    CHECK(pcclDestroyMaster(m));
    return 1;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc == 5 && strcmp(argv[1], "peer") == 0) {
        me = atoi(argv[4]);
        alarm(120);
        uint16_t port = (uint16_t)atoi(argv[3]);
        if (strcmp(argv[2], "admit") == 0) peer_admit(port);
        else if (strcmp(argv[2], "crossed") == 0) peer_crossed(port);
        else if (strcmp(argv[2], "pause") == 0) peer_pause(port);
        else die("unknown scenario %s", argv[2]);
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: %s admit|crossed|pause|codes\n", argv[0]);
        return 2;
    }
    alarm(150);
    signal(SIGPIPE, SIG_IGN);
    int ok = 0;
    if (strcmp(argv[1], "admit") == 0) ok = drive_admit(argv[0]);
    else if (strcmp(argv[1], "crossed") == 0) ok = drive_crossed(argv[0]);
    else if (strcmp(argv[1], "pause") == 0) ok = drive_pause(argv[0]);
    else if (strcmp(argv[1], "codes") == 0) ok = drive_codes();
    else die("unknown scenario %s", argv[1]);
    if (!ok) return 1;
    printf("PASS\n");
    return 0;
}
