"""Async DiLoCo on Fashion-MNIST with the concord package, across processes, with churn.

Every peer trains its own copy of a small MLP on its shard of the data for a few inner AdamW steps,
then all-reduces (averages) its pseudo-gradient, the difference between the outer parameters and its
inner ones. The all-reduce runs in the background while the next inner steps run; its result is
applied one round later by an outer Nesterov SGD step (the one-step-delayed, "async" DiLoCo). The
outer parameters, the outer momentum and the round counter are the shared state: a peer that joins
receives them, and a final sync shows that every peer holds bit-identical state.

A peer that dies makes the survivors' pending all-reduce fail with PeerLeftError; the ring is already
re-wired without it, so they start the same all-reduce again. Peers that wait to join are admitted
between rounds (are_peers_pending / update_topology) and take the state with a sync.

Run the whole demo (a master, three peers, one killed, one joining) with

    python3 bindings/python/examples/diloco_fashion_mnist.py --demo

or one peer of a run with --master HOST:PORT --index I. --device cuda keeps the model on the GPU and
stages the pseudo-gradients through host memory for the all-reduce.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import pathlib
import signal
import struct
import subprocess
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import concord  # noqa: E402

DATA_DIRS = [
    pathlib.Path(__file__).resolve().parents[3] / "diloco" / "data",  # the subset the Go diloco package embeds
    pathlib.Path("/usr/share/fashion-mnist"),
]


def read_idx(path: pathlib.Path) -> torch.Tensor:
    """Reads a (gzipped) IDX file of unsigned bytes."""
    raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    zero, kind, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or kind != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(raw[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def load(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns the images (N x 784 floats in [0, 1]) and labels of a split ("train" or "t10k")."""
    for d in DATA_DIRS:
        for ext in (".gz", ""):
            img, lab = d / f"{split}-images-idx3-ubyte{ext}", d / f"{split}-labels-idx1-ubyte{ext}"
            if img.exists() and lab.exists():
                x = read_idx(img).reshape(-1, 784).float() / 255
                return x, read_idx(lab).long()
    raise FileNotFoundError(f"Fashion-MNIST {split} files not found in {DATA_DIRS}")


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def state_hash(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def peer(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    device = torch.device(args.device)
    x, y = load("train")
    shard = torch.arange(len(y))[args.index % args.shards::args.shards]
    xt, yt = load("t10k")
    model = make_model().to(device)
    params = list(model.parameters())
    # Shared state, on the host: outer parameters, outer momentum, rounds started.
    outer = [p.detach().cpu().clone() for p in params]
    momentum = [torch.zeros_like(p) for p in outer]
    rounds = torch.zeros(1, dtype=torch.int64)
    state = concord.SharedState({f"outer.{i}": t for i, t in enumerate(outer)})
    state.entries.update({f"momentum.{i}": t for i, t in enumerate(momentum)})
    state["rounds"] = rounds
    delta = [torch.zeros_like(p) for p in outer]  # the pseudo-gradient being averaged
    inner_opt = torch.optim.AdamW(params, lr=args.inner_lr)
    gen = torch.Generator().manual_seed(1000 + args.index)

    if args.wait_for:
        while not os.path.exists(args.wait_for):
            time.sleep(0.01)
    comm = concord.Communicator(args.master, pool_size=2).connect()
    print(f"peer {args.index}: connected", flush=True)
    if args.grow_to:  # the first peers of a run wait for each other
        first = True
        while True:
            if not first:
                comm.update_topology()
            first = False
            if comm.world_size >= args.grow_to:
                break
            time.sleep(0.01)

    handle = None
    need_sync, fresh = True, True

    def finish_reduce() -> None:
        """Waits for the pending all-reduce (retrying it after a peer left) and applies the outer step."""
        nonlocal handle
        if handle is None:
            return
        while True:
            try:
                info = handle.wait()
                world = info.world_size
                break
            except concord.TooFewPeersError:
                world = 1  # alone: the own pseudo-gradient is the average
                break
            except concord.ConcordError as e:
                if not e.retryable:
                    raise
                print(f"peer {args.index}: round {int(rounds)}: {type(e).__name__}, retrying", flush=True)
                handle = start_reduce()
        handle = None
        with torch.no_grad():
            for o, m, d in zip(outer, momentum, delta):
                m.mul_(args.momentum).add_(d)
                o.sub_(d.add(m, alpha=args.momentum), alpha=args.outer_lr)
        return world

    def start_reduce():
        return _Many(comm, delta)

    while int(rounds) < args.rounds:
        if not fresh and comm.are_peers_pending():
            finish_reduce()
            comm.update_topology()
            need_sync = True
        fresh = False
        if need_sync:
            state.revision += 1
            info = comm.sync_shared_state(state)
            with torch.no_grad():
                for p, o in zip(params, outer):
                    p.copy_(o)
            print(f"peer {args.index}: synced at round {int(rounds)}, world {comm.world_size}, "
                  f"received {info.rx_bytes} bytes", flush=True)
            need_sync = False
        print(f"peer {args.index}: round {int(rounds)} world {comm.world_size}", flush=True)
        model.train()
        for _ in range(args.inner_steps):
            idx = shard[torch.randint(len(shard), (args.batch,), generator=gen)]
            loss = torch.nn.functional.cross_entropy(model(x[idx].to(device)), y[idx].to(device))
            inner_opt.zero_grad()
            loss.backward()
            inner_opt.step()
        finish_reduce()
        with torch.no_grad():
            for d, o, p in zip(delta, outer, params):
                d.copy_(o - p.detach().cpu())  # staged to host for the all-reduce
            for p, o in zip(params, outer):
                p.copy_(o)
        rounds += 1
        handle = start_reduce()
    finish_reduce()
    state.revision += 1
    info = comm.sync_shared_state(state)
    with torch.no_grad():
        for p, o in zip(params, outer):
            p.copy_(o)
        acc = (model(xt.to(device)).argmax(1).cpu() == yt).float().mean().item()
    digest = state_hash(outer + momentum + [rounds])
    print(f"peer {args.index}: done rounds {int(rounds)} world {comm.world_size} accuracy {acc:.3f} "
          f"final-sync-rx {info.rx_bytes} hash {digest}", flush=True)
    comm.close()


class _Many:
    """An all_reduce_many (average, retried by the library) run in a thread, with an AsyncReduce-like wait()."""

    def __init__(self, comm: concord.Communicator, tensors: list[torch.Tensor]):
        import threading

        self._result = None
        self._thread = threading.Thread(target=self._run, args=(comm, tensors))
        self._thread.start()

    def _run(self, comm, tensors):
        try:
            self._result = comm.all_reduce_many(tensors, op=concord.ReduceOp.AVG, first_tag=1, max_in_flight=4)
        except BaseException as e:
            self._result = e

    def wait(self) -> concord.ReduceInfo:
        self._thread.join()
        if isinstance(self._result, BaseException):
            raise self._result
        return self._result


def demo(args: argparse.Namespace) -> None:
    """A master in this process, three peers, one killed at round 5, one joining after that."""
    me = pathlib.Path(__file__).resolve()
    with concord.Master() as master:
        common = ["--master", master.address, "--rounds", str(args.rounds), "--device", args.device]
        procs = [subprocess.Popen([sys.executable, "-u", str(me), *common, "--index", str(i), "--grow-to", "3"],
                                  stdout=subprocess.PIPE, text=True) for i in range(3)]
        go = pathlib.Path(f"/tmp/concord-diloco-join-{os.getpid()}")
        joiner = subprocess.Popen([sys.executable, "-u", str(me), *common, "--index", "3", "--wait-for", str(go)],
                                  stdout=subprocess.PIPE, text=True)
        try:
            for line in procs[2].stdout:
                print(line, end="")
                if "round 5 " in line:
                    os.kill(procs[2].pid, signal.SIGKILL)
                    break
            for line in procs[0].stdout:
                print(line, end="")
                if "retrying" in line or "world 2" in line:
                    go.touch()
                    break
            for p in (procs[0], procs[1], joiner):
                for line in p.stdout:
                    print(line, end="")
                p.wait()
        finally:
            for p in procs + [joiner]:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait()
            go.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo", action="store_true", help="run a master and four peers with churn")
    ap.add_argument("--master", help="the master's host:port")
    ap.add_argument("--index", type=int, default=0, help="this peer's number (picks its data shard and seed)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--grow-to", type=int, default=0, help="wait until this many peers are in before training")
    ap.add_argument("--wait-for", help="connect only once this file exists")
    ap.add_argument("--rounds", type=int, default=40, help="outer rounds")
    ap.add_argument("--inner-steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--inner-lr", type=float, default=1e-3)
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    if args.demo:
        demo(args)
    elif args.master:
        peer(args)
    else:
        ap.error("give --demo or --master")


if __name__ == "__main__":
    main()
