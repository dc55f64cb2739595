"""PCCL behaviours that programs written for PCCL rely on, through the concord package and through PCCL's
own C API (cffi declarations, as PCCL's Python package loads libpccl.so):

* a retry after a failed all-reduce never admits a peer waiting in connect; update_topology does;
* two peers with crossed shared-state entries end with one of the two states, never a mix;
* a peer stopped for 10 s is kept under the default timing, while a killed one leaves at once;
* PCCL's headers (ccoip.h beside pccl.h) build a cffi extension with bindings/c as the only include
  directory;
* the master's result codes on misuse;
* real byte counts: a sync's bytes sent and received, an all-reduce's bytes quantized as on the wire.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import sys
import threading
import time

import pytest

np = pytest.importorskip("numpy")

import concord  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
WORKERS = HERE / "workers"
CABI = HERE.parents[1] / "c"
sys.path.insert(0, str(WORKERS))


def read_until(proc, text, said):
    """Reads proc's output until a line starts with text; every line goes to said."""
    for line in proc.stdout:
        said.append(line)
        if line.startswith(text):
            return
    proc.wait()
    raise AssertionError(f"peer ended (status {proc.returncode}) without saying {text!r}:\n" + "".join(said))


def finish(proc, said, timeout=90):
    out, _ = proc.communicate(timeout=timeout)
    said.append(out)
    assert proc.returncode == 0, "".join(said)
    assert "done" in "".join(said), "".join(said)


def test_a_retry_never_admits_a_waiting_peer(children):
    with concord.Master() as master:
        peers = [children.python(WORKERS / "drop_in_peer.py", "admit", master.address, str(i)) for i in range(3)]
        said = [[] for _ in range(4)]
        read_until(peers[0], "ring of 3", said[0])
        peers.append(children.python(WORKERS / "drop_in_peer.py", "admit", master.address, "3"))
        # A and B get through C's death and 20 more all-reduces with D still waiting (they assert
        # the world size of every one), then admit D themselves.
        read_until(peers[0], "updating topology", said[0])
        read_until(peers[3], "connected", said[3])
        peers[2].wait(timeout=60)
        assert peers[2].returncode == -signal.SIGKILL
        for i in (0, 1, 3):
            finish(peers[i], said[i])


def test_a_stopped_peer_is_kept(children):
    with concord.Master() as master:  # the default timing, as PCCL's
        peers = [children.python(WORKERS / "drop_in_peer.py", "pause", master.address, str(i)) for i in range(3)]
        said = [[] for _ in range(3)]
        read_until(peers[2], "stop me", said[2])
        os.kill(peers[2].pid, signal.SIGSTOP)
        try:
            time.sleep(10)
        finally:
            os.kill(peers[2].pid, signal.SIGCONT)
        for i in range(3):
            finish(peers[i], said[i])


def in_threads(n, master, body):
    """Runs body(i, comm) for n communicators in threads once the ring holds all n."""
    errors, results = [], [None] * n

    def peer(i):
        try:
            with concord.Communicator(master.address) as comm:
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


def test_crossed_states_end_as_one_of_them_with_bytes_counted():
    n = 1000
    orig = [{"a": np.arange(n, dtype=np.float32) + 201, "b": np.arange(n, dtype=np.float32) + 251},
            {"a": np.arange(n, dtype=np.float32) + 202, "b": np.arange(n, dtype=np.float32) + 252}]

    def body(i, comm):
        st = concord.SharedState({k: v.copy() for k, v in orig[i].items()}, revision=1)
        info = comm.sync_shared_state(st)
        which = [k for k in (0, 1) if all(np.array_equal(st[e], orig[k][e]) for e in ("a", "b"))]
        assert len(which) == 1, f"peer {i} ends with a mix: a[0]={st['a'][0]} b[0]={st['b'][0]}"
        st.revision += 1
        again = comm.sync_shared_state(st)
        assert (again.tx_bytes, again.rx_bytes) == (0, 0)
        # 1024 floats over two peers: half of the buffer each way in each phase, 4096 bytes; with
        # uint8 min-max quantization the all-gather half goes as 512 codes and an 8-byte header.
        x = np.arange(1024, dtype=np.float32)
        plain = comm.all_reduce(x, tag=5)
        quant = comm.all_reduce(x, tag=6, quant=concord.Quant.MINMAX_U8)
        return which[0], info, plain, quant

    with concord.Master() as master:
        results = in_threads(2, master, body)
    (w0, i0, p0, q0), (w1, i1, p1, q1) = results
    assert w0 == w1, "the peers ended with different states"
    both = 2 * n * 4
    donor, fetcher = (i0, i1) if w0 == 0 else (i1, i0)
    assert (donor.tx_bytes, donor.rx_bytes) == (both, 0)
    assert (fetcher.tx_bytes, fetcher.rx_bytes) == (0, both)
    for p, q in ((p0, q0), (p1, q1)):
        assert (p.world_size, p.tx_bytes, p.rx_bytes) == (2, 4096, 4096)
        assert (q.tx_bytes, q.rx_bytes) == (2048 + 512 + 8, 2048 + 512 + 8)


def test_master_result_codes_as_pccl():
    cffi = pytest.importorskip("cffi")  # noqa: F841
    from pccl_cdecls import load, loopback

    ffi, lib = load(os.environ["CONCORD_LIB"])
    ffi.cdef("pcclResult_t concordMasterGetPort(const pcclMasterInstance_t *m, uint16_t *port_out);")
    mp = ffi.new("pcclMasterInstance_t **")
    assert lib.pcclCreateMaster(loopback(ffi, 0)[0], mp) == lib.pcclSuccess
    m = mp[0]
    assert lib.pcclInterruptMaster(m) == lib.pcclInvalidUsage  # not running
    assert lib.pcclMasterAwaitTermination(m) == lib.pcclInvalidUsage  # never ran
    assert lib.pcclRunMaster(m) == lib.pcclSuccess
    assert lib.pcclRunMaster(m) == lib.pcclInvalidUsage  # twice
    port = ffi.new("uint16_t *")
    assert lib.concordMasterGetPort(m, port) == lib.pcclSuccess
    tp = ffi.new("pcclMasterInstance_t **")
    assert lib.pcclCreateMaster(loopback(ffi, port[0])[0], tp) == lib.pcclSuccess
    assert lib.pcclRunMaster(tp[0]) == lib.pcclInvalidUsage  # the port is taken
    assert lib.pcclDestroyMaster(tp[0]) == lib.pcclSuccess
    assert lib.pcclInterruptMaster(m) == lib.pcclSuccess
    assert lib.pcclInterruptMaster(m) == lib.pcclSuccess  # again: nothing more to do
    assert lib.pcclMasterAwaitTermination(m) == lib.pcclSuccess
    assert lib.pcclDestroyMaster(m) == lib.pcclSuccess

    # The concord package raises for the same misuse.
    master = concord.Master().run()
    try:
        with pytest.raises(concord.ConcordError) as e:
            concord.Master(port=master.port).run()
        assert e.value.code == lib.pcclInvalidUsage
    finally:
        master.close()


def test_pccl_headers_build_a_cffi_extension(tmp_path):
    cffi = pytest.importorskip("cffi")
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler (cc) on PATH")
    lib_dir = str(pathlib.Path(os.environ["CONCORD_LIB"]).parent)
    if pathlib.Path(os.environ["CONCORD_LIB"]).name != "libpccl.so":
        pytest.skip("CONCORD_LIB is not named libpccl.so; -lpccl cannot find it")
    ffi = cffi.FFI()
    ffi.cdef("""
        #define CCOIP_PROTOCOL_PORT_MASTER ...
        typedef struct { bool has_cuda_support; ...; } pcclBuildInfo_t;
        typedef enum { pcclSuccess = 0, ... } pcclResult_t;
        pcclResult_t pcclGetBuildInfo(pcclBuildInfo_t *info);
    """)
    # Only -I bindings/c: the headers a PCCL program includes must be there and self-contained.
    ffi.set_source("_pccl_headers", "#include <ccoip.h>\n#include <pccl.h>\n", include_dirs=[str(CABI)],
                   libraries=["pccl"], library_dirs=[lib_dir], runtime_library_dirs=[lib_dir])
    built = ffi.compile(tmpdir=str(tmp_path), verbose=False)
    sys.path.insert(0, str(pathlib.Path(built).parent))
    try:
        import _pccl_headers
    finally:
        sys.path.pop(0)
    assert _pccl_headers.lib.CCOIP_PROTOCOL_PORT_MASTER == 48148
    info = _pccl_headers.ffi.new("pcclBuildInfo_t *")
    assert _pccl_headers.lib.pcclGetBuildInfo(info) == _pccl_headers.lib.pcclSuccess
    assert not info.has_cuda_support
