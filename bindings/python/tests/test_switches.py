"""Concord's switches through the concord package: both-phase quantization, peer groups, the
contribution guard, the gossip failure detector, and a kicked peer that rejoins by itself
(examples/rejoin_after_kick.py, in processes)."""

from __future__ import annotations

import hashlib
import os
import pathlib
import signal
import sys
import threading
import time

import numpy as np
import pytest

import concord

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
from _peers import Peers  # noqa: E402  (the examples' bounded waits for their peers' lines)


def run_threads(bodies, timeout=90):
    """Runs each body() in a thread of its own; returns their results, or raises the first error."""
    errors, results = [], [None] * len(bodies)

    def run(i):
        try:
            results[i] = bodies[i]()
        except BaseException as e:  # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a peer hung"
    if errors:
        raise errors[0]
    return results


def grow(comm, n):
    """Lets the ring grow to n peers; a newcomer skips its first update."""
    first = True
    while True:
        if not first:
            comm.update_topology()
        first = False
        if comm.world_size == n:
            return
        time.sleep(0.02)


def test_both_phase_quantization():
    with concord.Master() as master:

        def peer(i):
            def body():
                with concord.Communicator(master.address) as comm:
                    grow(comm, 2)
                    x = np.arange(1024, dtype=np.float32) + np.float32(i * 0.25)
                    info = comm.all_reduce(x, tag=7, quant=concord.Quant.MINMAX_U8_BOTH)
                    # Two peers: each phase sends half of the buffer as 512 one-byte codes and an 8-byte
                    # header (the minimum and step as floats).
                    assert (info.tx_bytes, info.rx_bytes) == (1040, 1040)
                    exact = 2 * np.arange(1024, dtype=np.float64) + 0.25
                    assert np.all(np.abs(x - exact) <= 2 * 2048 / 255 / 2 + 1e-3)
                    y = np.arange(1024, dtype=np.float64)
                    info16 = comm.all_reduce(y, tag=8, quant=concord.Quant.MINMAX_U16_BOTH)
                    assert info16.tx_bytes == 2 * (16 + 512 * 2)  # a float64 source: the header holds doubles
                    assert np.all(np.abs(y - 2 * np.arange(1024)) <= 2 * 2048 / 65535 / 2 + 1e-6)
                    with pytest.raises(concord.InvalidError, match="both phases"):
                        comm.all_reduce(x, tag=9, op=concord.ReduceOp.PROD, quant=concord.Quant.MINMAX_U8_BOTH)
                    with pytest.raises(concord.InvalidError):
                        comm.all_reduce(np.ones(16, dtype=np.int32), tag=10, quant=concord.Quant.MINMAX_U8_BOTH)
                    return hashlib.sha256(x.tobytes() + y.tobytes()).hexdigest()
            return body

        a, b = run_threads([peer(0), peer(1)])
        assert a == b, "the peers' quantized results differ"


def test_peer_groups():
    with concord.Master() as master:

        def peer(i):
            group = 1 if i < 2 else 2

            def body():
                with concord.Communicator(master.address, group=group) as comm:
                    assert comm.group == group
                    grow(comm, 2)
                    for step in range(5):
                        x = np.full(257, float(i + step), dtype=np.float32)
                        info = comm.all_reduce(x, tag=step)
                        assert info.world_size == 2
                        first = 0 if i < 2 else 2  # the group's peers are first and first+1
                        np.testing.assert_array_equal(x, np.full(257, 2 * first + 1 + 2 * step, dtype=np.float32))
                    return comm.group
            return body

        assert run_threads([peer(i) for i in range(4)]) == [1, 1, 2, 2]


def test_guard_settings_are_checked():
    with pytest.raises(concord.InvalidError):
        concord.Master(guard={"norm_factor": 0.5})  # a factor must exceed 1
    with pytest.raises(concord.InvalidError, match="unknown"):
        concord.Master(guard={"norm": 4})
    with concord.Master() as master, pytest.raises(concord.ConcordError, match="no gossip"):
        master.gossip_address  # noqa: B018


def test_contribution_guard_kicks_the_offender():
    guard = {"reject_non_finite": True, "norm_factor": 4.0, "exclude": True}
    with concord.Master(guard=guard) as master:

        def peer(i):
            def body():
                with concord.Communicator(master.address, contribution_stats=True) as comm:
                    grow(comm, 3)
                    lost, step = 0, 0
                    while step < 8:
                        x = (np.arange(1031, dtype=np.float32) % 5) + 1
                        if i == 2 and step == 3:
                            x *= 1000
                            with pytest.raises(concord.KickedError, match="contribution guard") as err:
                                comm.all_reduce(x, tag=1)
                            assert "median" in str(err.value)
                            return "kicked"
                        try:
                            info = comm.all_reduce(x, tag=1)
                        except concord.PeerLeftError:
                            lost += 1
                            assert lost < 10
                            continue
                        np.testing.assert_array_equal(x, info.world_size * ((np.arange(1031) % 5) + 1))
                        if step > 3:
                            assert info.world_size == 2
                        step += 1
                    assert lost > 0, "the all-reduce the offender took part in did not fail"
                    return "done"
            return body

        assert run_threads([peer(i) for i in range(3)]) == ["done", "done", "kicked"]


def test_rejoin_refused_for_a_wrong_secret():
    with concord.Master(secret="the run secret, long enough") as master:
        address = master.address
        comm = concord.Communicator(address, secret="another secret, long enough")
        t0 = time.monotonic()
        with pytest.raises(concord.RefusedError, match="token") as err:
            comm.rejoin(timeout=20)
        assert time.monotonic() - t0 < 10
        assert not err.value.rejoinable and "\n" not in str(err.value)
        comm.close()
    # Nobody answers on the stopped master's port: retried until the timeout.
    comm = concord.Communicator(address)
    t0 = time.monotonic()
    with pytest.raises(concord.MasterLostError, match="gave up"):
        comm.rejoin(timeout=1.5)
    assert 0.5 <= time.monotonic() - t0 <= 10
    comm.close()


def test_run_with_rejoin():
    """run_with_rejoin reruns the body after a rejoinable error, counting the rejoins, and raises the
    others, and the kick past max_rejoins."""
    with concord.Master() as master:
        comm = concord.Communicator(master.address).connect()
        calls, seen = [], []

        def kicked_twice(rejoins):
            calls.append(rejoins)
            if rejoins < 2:
                raise concord.KickedError(f"kick {rejoins}", rejoinable=True)
            return comm.world_size  # raises unless connected again

        assert concord.run_with_rejoin(comm, kicked_twice, timeout=20,
                                       on_rejoin=lambda err, n: seen.append((str(err), n))) == 1
        assert calls == [0, 1, 2] and seen == [("kick 0", 1), ("kick 1", 2)]

        def refused(rejoins):
            calls.append(rejoins)
            raise concord.RefusedError("wrong secret")

        calls.clear()
        with pytest.raises(concord.RefusedError):
            concord.run_with_rejoin(comm, refused, timeout=20)
        assert calls == [0]

        def always_kicked(rejoins):
            calls.append(rejoins)
            raise concord.MasterLostError("gone", rejoinable=True)

        calls.clear()
        with pytest.raises(concord.MasterLostError):
            concord.run_with_rejoin(comm, always_kicked, timeout=20, max_rejoins=1)
        assert calls == [0, 1]
        comm.close()


def test_kicked_peer_rejoins_by_itself():
    """The master keeps a silent peer for a minute (the default timing) but runs a gossip detector the
    peers join: a peer stopped with SIGSTOP is removed by the gossip verdict, and once continued it
    finds it was kicked, rejoins, takes the state and finishes with the others, bit-identical. The
    peers' lines go to stdout, which pytest shows when the test fails."""
    peers = Peers()
    with concord.Master(gossip="127.0.0.1:0") as master:
        argv = [sys.executable, "-u", str(EXAMPLES / "rejoin_after_kick.py"), "--master", master.address,
                "--gossip", master.gossip_address, "--steps", "60", "--world", "3", "--pause", "0.1",
                "--timeout", "60"]
        try:
            for i in range(3):
                peers.start(i, argv + ["--index", str(i)])
            peers.expect(2, r"^ready", 60)
            os.kill(peers.procs[2].pid, signal.SIGSTOP)
            peers.expect(0, r" world 2$", 60, after=time.monotonic())
            os.kill(peers.procs[2].pid, signal.SIGCONT)
            kicked = peers.expect(2, r"^kicked:", 60)
            assert "gossip" in kicked, kicked  # the verdict, not the heartbeat timeout
            peers.expect(2, r"^rejoined", 60)
            peers.wait_all(120)
        finally:
            peers.kill_running()
    finals = []
    for i, p in peers.procs.items():
        said = "".join(peers.said[i])
        assert p.returncode == 0, said
        finals.append([line for line in peers.said[i] if line.startswith("done")][-1])
    assert len(set(finals)) == 1, finals
    assert " world 3 " in finals[0], finals


def test_contribution_guard_fails_the_all_reduce_for_everyone():
    """Without ``exclude`` the guard fails the all-reduce a NaN contribution would spoil on every peer,
    naming the offender, and the group reduces on with clean data."""
    with concord.Master(guard={"reject_non_finite": True}) as master:

        def peer(i):
            def body():
                with concord.Communicator(master.address, contribution_stats=True) as comm:
                    grow(comm, 3)
                    ids = []
                    for step in range(3):
                        x = (np.arange(1031, dtype=np.float32) % 5) + 1
                        if step == 1 and i == 2:
                            x[17] = np.nan
                        if step == 1:
                            with pytest.raises(concord.LocalFailureError, match="contribution guard") as err:
                                comm.all_reduce(x, tag=1 + step)
                            assert not err.value.retryable
                            ids.append(str(err.value))
                            continue
                        info = comm.all_reduce(x, tag=1 + step)
                        assert info.world_size == 3
                        np.testing.assert_array_equal(x, 3 * ((np.arange(1031) % 5) + 1))
                    return ids[0]
            return body

        messages = run_threads([peer(i) for i in range(3)])
        # Every peer names the same offender.
        named = {m.split("contribution guard: peer ")[1].split("'")[0] for m in messages}
        assert len(named) == 1 and all("NaN or infinite" in m for m in messages), messages
