"""libpccl.so driven through cffi with declarations of PCCL's C API (as PCCL's own Python package
loads it): a master in this process and a data-parallel loop in three processes, one of them killed."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import sys

import pytest

pytest.importorskip("cffi")
pytest.importorskip("numpy")

WORKERS = pathlib.Path(__file__).resolve().parent / "workers"
sys.path.insert(0, str(WORKERS))

from pccl_cdecls import load, loopback  # noqa: E402


def test_ddp_loop_with_a_kill(children):
    ffi, lib = load(os.environ["CONCORD_LIB"])
    build = ffi.new("pcclBuildInfo_t *")
    assert lib.pcclGetBuildInfo(build) == lib.pcclSuccess and not build.has_cuda_support
    mp = ffi.new("pcclMasterInstance_t **")
    assert lib.pcclCreateMaster(loopback(ffi, 0)[0], mp) == lib.pcclSuccess
    master = mp[0]
    assert lib.pcclRunMaster(master) == lib.pcclSuccess
    try:
        # The master API of PCCL has no way to read the port back; Concord's extension does.
        ffi.cdef("pcclResult_t concordMasterGetPort(const pcclMasterInstance_t *m, uint16_t *port_out);")
        port = ffi.new("uint16_t *")
        assert lib.concordMasterGetPort(master, port) == lib.pcclSuccess
        steps = 40
        peers = [children.python(WORKERS / "cffi_ddp_peer.py", os.environ["CONCORD_LIB"], str(port[0]), str(i),
                                 str(steps), env={"PYTHONPATH": str(WORKERS)}) for i in range(3)]
        victim = peers[2]
        said = []
        for line in victim.stdout:
            said.append(line)
            if "step 10 " in line:
                os.kill(victim.pid, signal.SIGKILL)
                break
        victim.wait(timeout=30)
        assert victim.returncode == -signal.SIGKILL, "".join(said)
        hashes, outs = [], []
        for p in peers[:2]:
            out, _ = p.communicate(timeout=120)
            outs.append(out)
            assert p.returncode == 0, out
            m = re.search(r"done hash (\w+)", out)
            assert m, out
            hashes.append(m.group(1))
        assert hashes[0] == hashes[1]
        assert all("world 2" in out for out in outs), outs
    finally:
        assert lib.pcclInterruptMaster(master) == lib.pcclSuccess
        assert lib.pcclMasterAwaitTermination(master) == lib.pcclSuccess
        assert lib.pcclDestroyMaster(master) == lib.pcclSuccess
