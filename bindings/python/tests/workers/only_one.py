"""Runs two peers in threads with only one array library importable: argv[1] is "numpy" or "torch";
the other one is blocked before concord is imported."""

import faulthandler

faulthandler.dump_traceback_later(100, exit=True)  # a hang shows where it is

import sys
import threading

lib = sys.argv[1]
sys.modules["torch" if lib == "numpy" else "numpy"] = None  # any import of it now fails

import concord  # noqa: E402

if lib == "numpy":
    import numpy as np

    def make(i):
        return np.full(257, i + 1, dtype=np.float32)

    def values(x):
        return x.tolist()
else:
    import torch

    def make(i):
        return torch.full((257,), i + 1, dtype=torch.bfloat16)

    def values(x):
        return x.float().tolist()

# Torch imports parts of itself lazily on first use; two threads doing that at once can deadlock on
# the import lock, so the first use happens here, before the peer threads start.
values(make(0))
failures = []


def peer(i, master):
    try:
        with concord.Communicator(master.address) as comm:
            first = True
            while True:
                if not first:
                    comm.update_topology()
                first = False
                if comm.world_size == 2:
                    break
            x = make(i)
            comm.all_reduce(x)
            assert values(x) == [3.0] * 257, values(x)[:4]
            st = concord.SharedState({"x": x}, revision=1)
            comm.sync_shared_state(st)
    except BaseException as e:
        failures.append(e)


with concord.Master() as master:
    ts = [threading.Thread(target=peer, args=(i, master)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
assert not failures, failures
other = "torch" if lib == "numpy" else "numpy"
assert sys.modules.get(other) is None
print("OK", lib)
