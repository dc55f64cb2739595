"""The concord package over torch CPU tensors, and each array library used without the other."""

from __future__ import annotations

import pathlib
import threading

import pytest

torch = pytest.importorskip("torch")

import concord  # noqa: E402

WORKERS = pathlib.Path(__file__).resolve().parent / "workers"

TORCH_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                torch.float32, torch.float64]


def linear(seed):
    """A Linear layer whose parameters come from seed (threads must not share torch's global RNG)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.nn.Linear(8, 4)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return m


def test_torch_tensors_in_place():
    # Torch imports parts of itself lazily on first use; threads doing that at once can deadlock on the
    # import lock, so every operation the peer threads use runs here once first.
    for dt in TORCH_DTYPES:
        sum([((torch.arange(4) % 7) + 1).to(torch.float64)]).to(dt).data_ptr()
    linear(0)
    n, count = 3, 513
    errors = []

    def contribution(dt, rank):
        return ((torch.arange(count) % 7) + rank + 1).to(dt)

    def peer(i, master):
        try:
            with concord.Communicator(master.address) as comm:
                first = True
                while True:
                    if not first:
                        comm.update_topology()
                    first = False
                    if comm.world_size == n:
                        break
                handles = []
                tensors = []
                for k, dt in enumerate(TORCH_DTYPES):
                    t = contribution(dt, i)
                    ptr = t.data_ptr()
                    tensors.append((t, ptr, dt))
                    handles.append(comm.all_reduce_async(t, tag=k))
                for h in handles:
                    assert h.wait().world_size == n
                for t, ptr, dt in tensors:
                    assert t.data_ptr() == ptr  # in place
                    want = sum(contribution(torch.float64, r) for r in range(n)).to(dt)
                    assert torch.equal(t, want), dt
                # a model's parameters as shared state
                model = linear(1 if i < 2 else 2)
                st = concord.SharedState({name: p.data for name, p in model.named_parameters()}, revision=5)
                comm.sync_shared_state(st)
                for (_, p), (_, q) in zip(model.named_parameters(), linear(1).named_parameters()):
                    assert torch.equal(p, q)
                with pytest.raises(concord.InvalidError):
                    comm.all_reduce(torch.zeros(4, 4)[:, 0])
        except BaseException as e:
            errors.append(e)

    with concord.Master() as master:
        ts = [threading.Thread(target=peer, args=(i, master)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
            assert not t.is_alive()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_one_array_library_only(children, lib):
    p = children.python(WORKERS / "only_one.py", lib)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out
    assert f"OK {lib}" in out
