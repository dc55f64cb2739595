"""A peer of test_drop_in.py's scenarios, written against the concord package.

argv: scenario (admit | pause), master address, peer index.

admit: peers 0, 1 and 2 (A, B, C) run only all-reduces until peer 3 (D) waits in connect; C dies in
the middle of a large all-reduce; A and B retry it and keep reducing between the two of them, D
still waiting, until they call update_topology, which admits D.

pause: three peers reduce eight times under the library's default timing; peer 2 says "stop me"
before its fourth step and the test stops the process for 10 s. Nobody may fail.

Every element of every result is checked. Lines on stdout tell the test where a peer is.
"""

import faulthandler

faulthandler.dump_traceback_later(110, exit=True)  # a hang shows where it is

import os
import signal
import sys
import time

import numpy as np

import concord

scenario, address, me = sys.argv[1], sys.argv[2], int(sys.argv[3])
COUNT = 2053


def contribution(who, n=COUNT):
    return (np.arange(n) % 5 + who + 1).astype(np.float32)


def reduce_checked(comm, who, tag=1):
    """One all-reduce among the peers `who`, retried while a peer leaves; returns the failures."""
    lost = 0
    while True:
        x = contribution(me)
        try:
            info = comm.all_reduce(x, tag=tag)
        except concord.ConcordError as e:
            if not e.retryable or lost > 10:
                raise
            np.testing.assert_array_equal(x, contribution(me))  # a failed all-reduce leaves x alone
            lost += 1
            continue
        assert info.world_size == len(who), (info.world_size, who)
        np.testing.assert_array_equal(x, sum(contribution(w) for w in who))
        return lost


def grow(comm, n):
    first = True
    while True:
        if not first:
            comm.update_topology()
        first = False
        if comm.world_size == n:
            return
        time.sleep(0.02)


def admit(comm):
    if me == 3:
        print("connected", flush=True)
        assert comm.world_size == 3, comm.world_size
        reduce_checked(comm, [0, 1, 3])
        return
    grow(comm, 3)
    print("ring of 3", flush=True)
    for step in range(2000):
        reduce_checked(comm, [0, 1, 2])
        if comm.are_peers_pending():
            break
        time.sleep(0.005)
    else:
        raise SystemExit("D never registered")
    big = contribution(me, 1 << 22)
    if me == 2:
        h = comm.all_reduce_async(big, tag=2)
        time.sleep(0.002)
        os.kill(os.getpid(), signal.SIGKILL)
    lost = 0
    while True:
        try:
            comm.all_reduce(big, tag=2)
            break
        except concord.ConcordError as e:
            if not e.retryable or lost > 10:
                raise
            lost += 1
    assert lost > 0, "the all-reduce C died in succeeded"
    np.testing.assert_array_equal(big, contribution(0, 1 << 22) + contribution(1, 1 << 22))
    for step in range(20):
        assert reduce_checked(comm, [0, 1]) == 0
        assert comm.world_size == 2, f"world size {comm.world_size} at step {step} after C left"
    assert comm.are_peers_pending(), "D is no longer pending after the retries"
    print("updating topology", flush=True)
    comm.update_topology()
    assert comm.world_size == 3, comm.world_size
    reduce_checked(comm, [0, 1, 3])


def pause(comm):
    grow(comm, 3)
    for step in range(8):
        if me == 2 and step == 3:
            print("stop me", flush=True)
            time.sleep(0.1)
        assert reduce_checked(comm, [0, 1, 2]) == 0, f"an all-reduce failed at step {step}"
    assert comm.world_size == 3, comm.world_size


with concord.Communicator(address) as comm:
    {"admit": admit, "pause": pause}[scenario](comm)
print("done", flush=True)
