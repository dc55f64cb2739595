"""The concord package over numpy arrays, with a master and three communicators in this process."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import concord

DTYPES = [np.uint8, np.int8, np.int16, np.uint16, np.uint32, np.int32, np.uint64, np.int64, np.float16,
          np.float32, np.float64]


def contribution(dtype, rank, n):
    return ((np.arange(n) % 7) + rank + 1).astype(dtype)


def run_peers(n, master, body, **options):
    """Runs body(rank_hint, comm) on n communicators in threads after growing the ring to n; options
    go to every Communicator."""
    errors, results = [], [None] * n

    def peer(i):
        try:
            with concord.Communicator(master.address, pool_size=2, **options) as comm:
                first = True
                while True:
                    if not first:
                        comm.update_topology()
                    first = False
                    if comm.world_size == n:
                        break
                results[i] = body(i, comm)
        except BaseException as e:  # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=peer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a peer hung"
    if errors:
        raise errors[0]
    return results


def test_all_reduce_every_dtype_sync_and_async():
    n, count = 3, 1001

    def body(i, comm):
        for k, dt in enumerate(DTYPES):
            a = contribution(dt, i, count)
            info = comm.all_reduce(a, tag=k)
            assert info.world_size == n
            want = sum(contribution(np.float64, r, count) for r in range(n)).astype(dt)
            np.testing.assert_array_equal(a, want)
        # async, out of place, two in flight
        x, y = contribution(np.float32, i, count), contribution(np.int64, i, count)
        ox, oy = np.empty_like(x), np.empty_like(y)
        hx = comm.all_reduce_async(x, ox, op=concord.ReduceOp.MAX, tag=100)
        hy = comm.all_reduce_async(y, oy, op=concord.ReduceOp.MIN, tag=101)
        assert hy.wait().world_size == n and hx.wait().world_size == n
        np.testing.assert_array_equal(ox, contribution(np.float32, n - 1, count))
        np.testing.assert_array_equal(oy, contribution(np.int64, 0, count))
        np.testing.assert_array_equal(x, contribution(np.float32, i, count))  # send untouched
        many = [contribution(np.float64, i, 10 + j) for j in range(5)]
        comm.all_reduce_many(many, op=concord.ReduceOp.AVG, first_tag=200, max_in_flight=2)
        for j, m in enumerate(many):
            np.testing.assert_array_equal(m, contribution(np.float64, 1, 10 + j))
        q = contribution(np.float32, i, count)
        comm.all_reduce(q, tag=300, quant=concord.Quant.MINMAX_U8)
        exact = sum(contribution(np.float64, r, count) for r in range(n))
        assert np.all(np.abs(q - exact) <= 0.5)
        with pytest.raises(concord.InvalidError):
            comm.all_reduce(contribution(np.int32, i, count), tag=301, quant=concord.Quant.MINMAX_U8)
        return True

    with concord.Master() as master:
        assert run_peers(n, master, body) == [True] * n


def test_shared_state_outlier_receives_majority_in_place():
    n = 3

    def body(i, comm):
        w = np.arange(5000, dtype=np.float32) * (1 if i != 2 else -1)
        step = np.array([7 if i != 2 else 0], dtype=np.int64)
        st = concord.SharedState({"w": w, "step": step}, revision=1)
        info = comm.sync_shared_state(st)
        np.testing.assert_array_equal(w, np.arange(5000, dtype=np.float32))
        assert step[0] == 7 and st.revision == 1 and info.revision == 1
        return info.rx_bytes

    with concord.Master() as master:
        rx = sorted(run_peers(n, master, body))
    assert rx[0] == 0 and rx[1] == 0 and rx[2] == 5000 * 4 + 8


def test_errors_mirror_go_sentinels():
    with concord.Master() as master:
        comm = concord.Communicator(master.address)
        with pytest.raises(concord.NotConnectedError):
            comm.all_reduce(np.zeros(4, np.float32))
        with comm:
            with pytest.raises(concord.TooFewPeersError) as e:
                comm.all_reduce(np.zeros(4, np.float32))
            assert e.value.retryable
            with pytest.raises(concord.InvalidError):
                comm.all_reduce(np.zeros(4, np.complex64))
            with pytest.raises(concord.InvalidError):
                comm.all_reduce(np.zeros((4, 4), np.float32)[:, 1])
            with pytest.raises(concord.ConcordError):  # alone: nothing to optimize
                comm.optimize_topology()
            assert comm.are_peers_pending() is False
            assert comm.group == 0 and comm.rank == 0 and comm.world_size == 1
    with pytest.raises(concord.MasterLostError):
        with concord.Communicator("127.0.0.1:1", master_timeout=0.5):
            pass


SECRET = "the numpy test's run secret, 32+ bytes"


def test_tls_transport_with_a_run_secret():
    n, count = 3, 257

    def body(i, comm):
        a = contribution(np.float32, i, count)
        comm.all_reduce(a, tag=1)
        np.testing.assert_array_equal(a, sum(contribution(np.float32, r, count) for r in range(n)))
        return True

    with concord.Master(transport="tls", secret=SECRET) as master:
        assert run_peers(n, master, body, transport="tls", secret=SECRET, nics=["127.0.0.1"]) == [True] * n
        # A peer with another secret does not get in.
        with pytest.raises(concord.ConcordError):
            with concord.Communicator(master.address, transport="tls", secret="another secret, also long enough",
                                      master_timeout=5):
                pass
    with pytest.raises(concord.InvalidError):
        concord.Master(transport="carrier-pigeon")
