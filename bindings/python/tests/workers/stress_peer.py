"""A peer of the cross-step stress run (stress_cross_step.py), written against the concord package.

argv: master address, elements per all-reduce, all-reduces per step, stop file.

Each step launches K sum all-reduces and one max all-reduce of a stop flag, and waits for the
previous step's, which stay in flight across the step boundary. When one fails it waits for all in
flight and relaunches the failed ones (PCCL's retry), until all succeed or this peer is alone. At
the start of every 16th step, when peers are pending, it drains everything, admits them (update_topology)
and syncs the shared state (the step counter and the weights), which is how a newcomer learns
where the run is. A newcomer syncs right after connect returns. Every element of every result is
checked against what the peers contributed (all contribute the same, so a sum is world size times
the contribution). Once the stop flag comes back set, every peer drains, syncs a last time (nothing
may move: the states are identical) and prints its state's hash.

Lines on stdout: "joined", "step S world W ...", and "final" with a JSON report;
CONCORD_STRESS_TRACE=1 adds one per launch and wait of an all-reduce.
"""

import faulthandler
import signal
import sys

faulthandler.enable()
faulthandler.register(signal.SIGUSR1)  # the driver asks for the stacks of a stalled run

import hashlib
import json
import os
import time

import numpy as np

import concord

address, N, K, stop_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
MEMBERSHIP_EVERY = 16
stats = {"checked": 0, "retried": 0, "syncs": 0, "dropped": 0}
TRACE = os.environ.get("CONCORD_STRESS_TRACE") == "1"


def trace(*a):
    if TRACE:
        print("trace", *a, flush=True)


def data(step, j):
    return ((np.arange(N, dtype=np.int64) + step * K + j) % 97 + 1).astype(np.float32)


class Op:
    """One all-reduce of a step: j < K are sums of data(step, j), j == K the max of the stop flag."""

    def __init__(self, comm, step, j):
        self.comm, self.step, self.j = comm, step, j
        self.tag = (step % 2) * (K + 1) + j  # two consecutive steps never share a tag
        if j < K:
            self.orig, self.op = data(step, j), concord.ReduceOp.SUM
        else:
            self.orig = np.array([1.0 if os.path.exists(stop_file) else 0.0], dtype=np.float32)
            self.op = concord.ReduceOp.MAX
        self.handle, self.result, self.world = None, None, 0

    def launch(self):
        self.buf = self.orig.copy()
        trace("launch", self.step, self.j, self.tag)
        try:
            self.handle = self.comm.all_reduce_async(self.buf, tag=self.tag, op=self.op)
        except concord.ConcordError as e:
            if not e.retryable:
                raise
            self.handle = None  # counts as failed: relaunched with the others

    def wait(self):
        """Waits for the op and checks its result; False if it failed and must be relaunched."""
        if self.result is not None:
            return True  # done before a later op of its batch failed
        if self.handle is None:
            return False
        h, self.handle = self.handle, None
        trace("wait", self.step, self.j)
        try:
            info = h.wait()
        except concord.ConcordError as e:
            trace("failed", self.step, self.j, e)
            if not e.retryable:
                raise
            assert np.array_equal(self.buf, self.orig), "a failed all-reduce changed its buffer"
            return False
        w = info.world_size
        if self.j < K:
            want = self.orig * np.float32(w)
            bad = np.flatnonzero(self.buf != want)
            assert bad.size == 0, (f"step {self.step} reduce {self.j} world {w}: element {bad[0]} is "
                                   f"{self.buf[bad[0]]}, want {want[bad[0]]}")
        else:
            assert self.buf[0] in (0.0, 1.0) and self.buf[0] >= self.orig[0], f"stop flag {self.buf[0]}"
        stats["checked"] += 1
        self.result, self.world = self.buf, w
        return True


def run_ops(comm, ops):
    """Waits for ops (everything in flight) and relaunches the failed ones, until all succeeded (True)
    or fewer than two peers are left (False: the ops are dropped)."""
    todo = ops
    for _ in range(100):
        failed = [op for op in todo if not op.wait()]
        if not failed:
            return True
        stats["retried"] += len(failed)
        # Nothing is in flight now, so the library has re-wired the ring without the peers that left.
        if comm.world_size < 2:
            stats["dropped"] += len(failed)
            return False
        for op in failed:
            op.launch()
        todo = failed
    raise SystemExit("the all-reduces kept failing")


class Trainer:
    def __init__(self, comm):
        self.comm = comm
        self.state = concord.SharedState({"step": np.zeros(1, dtype=np.int64), "w": np.zeros(N, dtype=np.float32)})
        self.synced = False
        self.inflight = []  # ops launched and not yet waited for, oldest step first
        self.stop = False

    def apply(self, ops):
        """Applies completed steps in order: the weights move by the first sum's average."""
        for op in ops:
            if op.j == 0:
                w = self.state["w"]
                w *= np.float32(0.5)
                w += op.result / np.float32(op.world)
            if op.j == K and op.result[0] == 1.0:
                self.stop = True

    def drain(self):
        ops, self.inflight = self.inflight, []
        if run_ops(self.comm, ops):
            self.apply(ops)

    def update_topology(self):
        for attempt in range(20):
            try:
                self.comm.update_topology()
                return
            except concord.ConcordError as e:
                print(f"update topology failed: {e}", flush=True)
                if not e.retryable and e.code != 11:  # pcclUpdateTopologyFailed: try again
                    raise
                time.sleep(0.05)
        raise SystemExit("update topology kept failing")

    def sync(self):
        if self.synced:
            self.state.revision += 1
        for attempt in range(20):
            try:
                info = self.comm.sync_shared_state(self.state)
                self.synced = True
                stats["syncs"] += 1
                return info
            except (concord.SyncError, concord.PeerLeftError, concord.AbortedError, concord.NotConnectedError) as e:
                # A donor or a voter left: re-wire (admitting whoever waits, as every peer does here)
                # and vote again.
                print(f"sync failed: {e}", flush=True)
                self.update_topology()
        raise SystemExit("the shared-state sync kept failing")

    def membership(self):
        trace("membership")
        self.drain()
        trace("update")
        self.update_topology()
        self.sync()

    def step(self):
        s = int(self.state["step"][0])
        # Like a training loop that updates its topology every few steps, newcomers are only looked
        # for every MEMBERSHIP_EVERY steps (every step while alone): they wait in connect meanwhile,
        # and peers die around them.
        if (s % MEMBERSHIP_EVERY == 0 or self.comm.world_size < 2) and self.comm.are_peers_pending():
            # A newcomer comes out of connect, syncs and starts its first step with this vote: so
            # does everyone, or the votes and the all-reduces of peers would pair up differently.
            self.membership()
            return
        if self.comm.world_size < 2:
            self.drain()
            self.stop = self.stop or os.path.exists(stop_file)  # alone: nobody to agree with
            time.sleep(0.05)
            return
        ops = [Op(self.comm, s, j) for j in range(K + 1)]
        for op in ops:
            op.launch()
        self.state["step"][0] = s + 1
        prev, self.inflight = self.inflight, self.inflight + ops
        if prev:
            # The previous step's all-reduces were in flight across the step boundary.
            if all([op.wait() for op in prev]):
                self.apply(prev)
                self.inflight = ops
            else:
                self.drain()  # this step's too, then the failures of both steps again
        if s % 25 == 0:
            print(f"step {s} world {self.comm.world_size} {stats}", flush=True)

    def finish(self):
        self.drain()
        info = self.sync()
        assert (info.tx_bytes, info.rx_bytes) == (0, 0), f"the states differed at the end: {info}"
        h = hashlib.sha256(self.state["w"].tobytes()).hexdigest()[:16]
        report = {"step": int(self.state["step"][0]), "revision": self.state.revision, "hash": h, **stats}
        print("final " + json.dumps(report), flush=True)


with concord.Communicator(address, pool_size=1) as comm:
    print("joined", flush=True)
    t = Trainer(comm)
    t.sync()  # a newcomer learns the step and the weights; the first peer syncs alone
    print(f"step {int(t.state['step'][0])} world {comm.world_size} synced", flush=True)
    while not t.stop:
        t.step()
    t.finish()
