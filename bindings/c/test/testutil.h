/*
 * testutil.h: what the C test programs share. Failing with the peer's index and the library's last
 * error (die, CHECK, EXPECT), a nap, loopback addresses, all-reduce descriptors, creating and growing
 * a communicator, a master in the driver process, and peers run as child processes whose standard
 * output the driver reads through a pipe.
 *
 * It needs pccl.h and POSIX only; of Concord's additions it calls concordGetLastError (die) and
 * concordMasterGetPort (start_master, to learn the port a master asked for port 0 bound). Define
 * _POSIX_C_SOURCE 200809L before any include. The functions are static inline, so a program that
 * uses only some of them still builds with -Wall -Werror.
 */
#ifndef CONCORD_TEST_TESTUTIL_H
#define CONCORD_TEST_TESTUTIL_H

#if !defined(_POSIX_C_SOURCE) || _POSIX_C_SOURCE < 200809L
#error "testutil.h needs _POSIX_C_SOURCE 200809L defined before any include"
#endif

#include <pccl.h>

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int me = -1; /* peer index, -1 in the driver */

static inline void die(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char why[512] = "";
    concordGetLastError(why, sizeof why);
    fprintf(stderr, "[%s %d] FAIL: %s (last error: %s)\n", me < 0 ? "driver" : "peer", me, msg, why);
    exit(1);
}

#define CHECK(call)                                                       \
    do {                                                                  \
        pcclResult_t rc_ = (call);                                        \
        if (rc_ != pcclSuccess) die("%s returned %d", #call, (int)rc_); \
    } while (0)

#define EXPECT(call, want)                                                                          \
    do {                                                                                            \
        pcclResult_t rc_ = (call);                                                                  \
        if (rc_ != (want)) die("%s returned %d, want %s (%d)", #call, (int)rc_, #want, (int)(want)); \
    } while (0)

static inline void nap_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static inline ccoip_socket_address_t loopback(uint16_t port) {
    ccoip_socket_address_t a;
    memset(&a, 0, sizeof a);
    a.inet.protocol = inetIPv4;
    a.inet.ipv4.data[0] = 127;
    a.inet.ipv4.data[3] = 1;
    a.port = port;
    return a;
}

/* An unquantized all-reduce of count elements of type t. */
static inline pcclReduceDescriptor_t desc_of(pcclDataType_t t, pcclRedOp_t op, uint64_t tag, size_t count) {
    pcclReduceDescriptor_t d;
    memset(&d, 0, sizeof d);
    d.count = count;
    d.op = op;
    d.tag = tag;
    d.src_descriptor.datatype = t;
    d.src_descriptor.distribution_hint = pcclDistributionNone;
    d.quantization_options.quantized_datatype = t;
    d.quantization_options.algorithm = pcclQuantNone;
    return d;
}

/* An unquantized sum of count floats. */
static inline pcclReduceDescriptor_t desc_f32(uint64_t tag, size_t count) {
    return desc_of(pcclFloat, pcclSum, tag, count);
}

static inline int world_size(pcclComm_t *comm) {
    int w = 0;
    CHECK(pcclGetAttribute(comm, PCCL_ATTRIBUTE_PEER_GROUP_WORLD_SIZE, &w));
    return w;
}

/* A communicator for the master on the loopback port, in peer group `group`, not yet connected. */
static inline pcclComm_t *create(uint16_t port, uint32_t group) {
    CHECK(pcclInit());
    pcclCommCreateParams_t params;
    memset(&params, 0, sizeof params);
    params.master_address = loopback(port);
    params.peer_group = group;
    pcclComm_t *comm = NULL;
    CHECK(pcclCreateCommunicator(&params, &comm));
    return comm;
}

/* A communicator in peer group 0, connected. */
static inline pcclComm_t *join(uint16_t port) {
    pcclComm_t *comm = create(port, 0);
    CHECK(pcclConnect(comm));
    return comm;
}

/* Grows the ring with pcclUpdateTopology until it holds n peers; a newcomer skips its first update. */
static inline void grow(pcclComm_t *comm, int n) {
    for (int first = 1;; first = 0) {
        if (!first) CHECK(pcclUpdateTopology(comm));
        if (world_size(comm) == n) return;
        nap_ms(20);
    }
}

/* ---- the driver ---- */

/* A master on a free loopback port, set up by setup (if not NULL) before it runs; *port is the port. */
static inline pcclMasterInstance_t *start_master(uint16_t *port, void (*setup)(pcclMasterInstance_t *)) {
    pcclMasterInstance_t *m = NULL;
    CHECK(pcclCreateMaster(loopback(0), &m));
    if (setup != NULL) setup(m);
    CHECK(pcclRunMaster(m));
    CHECK(concordMasterGetPort(m, port));
    return m;
}

static inline void stop_master(pcclMasterInstance_t *m) {
    CHECK(pcclInterruptMaster(m));
    CHECK(pcclMasterAwaitTermination(m));
    CHECK(pcclDestroyMaster(m));
}

typedef struct {
    pid_t pid;
    FILE *out;
} child;

/* Runs self as `self peer scenario port idx [extra]` with its standard output to a pipe that c.out
 * reads; a NULL extra is left out. */
static inline child spawn(const char *self, const char *scenario, uint16_t port, int idx, const char *extra) {
    int fds[2];
    if (pipe(fds) != 0) die("pipe: %s", strerror(errno));
    char ps[16], is[16];
    snprintf(ps, sizeof ps, "%u", port);
    snprintf(is, sizeof is, "%d", idx);
    pid_t pid = fork();
    if (pid < 0) die("fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execl(self, self, "peer", scenario, ps, is, extra, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    child c = {pid, fdopen(fds[0], "r")};
    return c;
}

/* Reads c's output until a line starts with want; the line goes to out (if not NULL). */
static inline void await_line(child c, const char *want, char *out, size_t n) {
    char line[512];
    while (fgets(line, sizeof line, c.out) != NULL) {
        if (strncmp(line, want, strlen(want)) == 0) {
            /* The precision cuts the line to fit, and tells -Wformat-truncation that this is meant. */
            if (out != NULL) snprintf(out, n, "%.*s", (int)(n - 1), line);
            return;
        }
    }
    die("peer %d ended without saying \"%s\"", (int)c.pid, want);
}

/* Whether a child's wait status is the end it should have: killed by SIGKILL if killed, else exit 0. */
static inline int ended_as_wanted(int status, int killed) {
    return killed ? WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL : WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Waits for c and reports whether it ended as wanted (see ended_as_wanted). */
static inline int reap(child c, int killed) {
    int status;
    if (waitpid(c.pid, &status, 0) < 0) die("waitpid: %s", strerror(errno));
    fclose(c.out);
    int ok = ended_as_wanted(status, killed);
    if (!ok) fprintf(stderr, "[driver] peer %d ended with status 0x%x\n", (int)c.pid, status);
    return ok;
}

#endif
