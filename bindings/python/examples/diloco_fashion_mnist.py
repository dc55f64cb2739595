"""Async DiLoCo on Fashion-MNIST with the concord package, across processes, with churn.

Every peer trains its own copy of a small MLP on its shard of the data for a few inner AdamW steps,
then all-reduces (averages) its pseudo-gradient, the difference between the outer parameters and its
inner ones. The all-reduce runs in the background while the next inner steps run; its result is
applied one round later by an outer Nesterov SGD step (the one-step-delayed, "async" DiLoCo). The
outer parameters, the outer momentum and the round counter are the shared state: a peer that joins
receives them, and a final sync shows that every peer holds bit-identical state.

A peer that dies makes the survivors' pending all-reduce fail with PeerLeftError; the ring is already
re-wired without it, and all_reduce_many starts the same all-reduce again. Peers that wait to join are admitted
between rounds (are_peers_pending / update_topology) and take the state with a RECEIVE_ONLY sync. A
peer that the master removed while it lived (stopped, hung, cut off past the heartbeat timeout) gets
KickedError or MasterLostError with ``err.rejoinable``. The rounds run under concord.run_with_rejoin:
the peer lets its background all-reduce end, rejoins as a newcomer, and runs on from the group's
outer parameters, momentum and round counter. An error a rejoin cannot fix, or a fourth kick, ends
the peer with a "giving up" line.

Run the whole demo with

    python3 bindings/python/examples/diloco_fashion_mnist.py --demo

A master with the "wan" timing (a peer silent for 6 s is removed) runs in the demo's process with
three peers: peer 2 is killed at round 5, peer 3 joins once the others run on without it, then peer 1
is stopped with SIGSTOP until the others run on without it and continued: it rejoins and finishes.
The demo checks that peers 0, 1 and 3 end with bit-identical state; every wait has a time limit.
One peer of a run is --master HOST:PORT --index I. --device cuda keeps the model on the GPU and
stages the pseudo-gradients through host memory for the all-reduce.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import pathlib
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import concord  # noqa: E402
from _peers import Peers  # noqa: E402

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


def peer(args: argparse.Namespace) -> int:
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
    name = f"peer {args.index}"

    deadline = time.monotonic() + args.timeout
    if args.wait_for:
        while not os.path.exists(args.wait_for):
            if time.monotonic() > deadline:
                print(f"{name}: giving up: {args.wait_for} did not appear within {args.timeout:g} s", flush=True)
                return 1
            time.sleep(0.01)
    comm = concord.Communicator(args.master, pool_size=2).connect()
    # A peer that did not wait for the first ones and finds a group has joined a running run: its
    # state is stale, so its first sync only receives, as after a rejoin.
    newcomer = not args.grow_to and comm.world_size > 1
    print(f"{name}: connected", flush=True)
    if args.grow_to:  # the first peers of a run wait for each other
        first = True
        while True:
            if not first:
                comm.update_topology()
            first = False
            if comm.world_size >= args.grow_to:
                break
            if time.monotonic() > deadline:
                print(f"{name}: giving up: the group did not grow to {args.grow_to} within {args.timeout:g} s",
                      flush=True)
                comm.close()
                return 1
            time.sleep(0.01)

    reduce = None  # the all-reduce of the last round's pseudo-gradient, running in the background

    def finish_reduce() -> None:
        """Waits for the pending all-reduce and applies the outer step with its result."""
        nonlocal reduce
        if reduce is None:
            return
        pending, reduce = reduce, None
        try:
            pending.wait(args.timeout)
        except concord.TooFewPeersError:
            pass  # alone: the own pseudo-gradient is the average
        with torch.no_grad():
            for o, m, d in zip(outer, momentum, delta):
                m.mul_(args.momentum).add_(d)
                o.sub_(d.add(m, alpha=args.momentum), alpha=args.outer_lr)

    def sync(receive: bool) -> concord.SyncInfo:
        state.revision += 1
        info = comm.sync_shared_state(state, concord.Strategy.RECEIVE_ONLY if receive else
                                      concord.Strategy.ENFORCE_POPULAR)
        with torch.no_grad():
            for p, o in zip(params, outer):
                p.copy_(o)
        return info

    def train(rejoins: int) -> concord.SyncInfo:
        """Runs the rounds left and the final sync. After a rejoin (or as a newcomer) the first sync
        takes the outer parameters, momentum and round counter from the group."""
        nonlocal reduce
        if rejoins:
            print(f"{name}: rejoined as a newcomer (rejoin {rejoins})", flush=True)
        receive, need_sync, fresh = newcomer or rejoins > 0, True, True
        try:
            while int(rounds) < args.rounds:
                if not fresh and comm.are_peers_pending():
                    finish_reduce()
                    comm.update_topology()
                    need_sync = True
                fresh = False
                if need_sync:
                    info = sync(receive)
                    print(f"{name}: synced at round {int(rounds)}, world {comm.world_size}, "
                          f"received {info.rx_bytes} bytes", flush=True)
                    receive = need_sync = False
                print(f"{name}: round {int(rounds)} world {comm.world_size}", flush=True)
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
                rounds.add_(1)
                reduce = _Many(comm, delta)
            finish_reduce()
            return sync(receive)
        except concord.ConcordError:
            if reduce is not None:  # an all-reduce of the old membership: it must end before a rejoin
                pending, reduce = reduce, None
                pending.join(args.timeout)
            raise

    def kicked(err: concord.ConcordError, rejoins: int) -> None:
        print(f"{name}: kicked at round {int(rounds)}: {type(err).__name__}: {err}; rejoining", flush=True)

    try:
        info = concord.run_with_rejoin(comm, train, timeout=args.timeout, max_rejoins=3, on_rejoin=kicked)
    except (concord.ConcordError, TimeoutError) as err:
        print(f"{name}: giving up: {type(err).__name__}: {err}", flush=True)
        comm.close()
        return 1
    with torch.no_grad():
        acc = (model(xt.to(device)).argmax(1).cpu() == yt).float().mean().item()
    digest = state_hash(outer + momentum + [rounds])
    print(f"{name}: done rounds {int(rounds)} world {comm.world_size} accuracy {acc:.3f} "
          f"final-sync-rx {info.rx_bytes} hash {digest}", flush=True)
    comm.close()
    return 0


class _Many:
    """An all_reduce_many (average, retried by the library after a peer left) run in a thread."""

    def __init__(self, comm: concord.Communicator, tensors: list[torch.Tensor]):
        self._result = None
        self._thread = threading.Thread(target=self._run, args=(comm, tensors), daemon=True)
        self._thread.start()

    def _run(self, comm, tensors):
        try:
            self._result = comm.all_reduce_many(tensors, op=concord.ReduceOp.AVG, first_tag=1, max_in_flight=4)
        except BaseException as e:
            self._result = e

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the background all-reduce did not end within {timeout:g} s")

    def wait(self, timeout: float) -> concord.ReduceInfo:
        self.join(timeout)
        if isinstance(self._result, BaseException):
            raise self._result
        return self._result


def demo(args: argparse.Namespace) -> int:
    """A master in this process and three peers: peer 2 is killed at round 5, peer 3 joins once the
    others run on without it, then peer 1 is stopped until the master removes it, and continued."""
    me = pathlib.Path(__file__).resolve()
    go = pathlib.Path(tempfile.gettempdir()) / f"concord-diloco-join-{os.getpid()}"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run the cleanup below when terminated

    def say(what: str) -> None:
        print(f"demo: {what}", flush=True)

    peers = Peers()
    # The "wan" timing: the master removes a peer whose heartbeats stopped 6 s ago.
    with concord.Master(preset="wan") as master:
        common = [sys.executable, "-u", str(me), "--master", master.address, "--rounds", str(args.rounds),
                  "--inner-steps", str(args.inner_steps), "--batch", str(args.batch), "--device", args.device,
                  "--timeout", str(args.timeout)]
        try:
            for i in range(3):
                peers.start(i, common + ["--index", str(i), "--grow-to", "3"])
            peers.start(3, common + ["--index", "3", "--wait-for", str(go)])
            peers.expect(2, r"round 5 ", args.timeout)
            say("killing peer 2 (SIGKILL)")
            os.kill(peers.procs[2].pid, signal.SIGKILL)
            peers.expect(0, r" world 2$", 60)
            say("letting peer 3 join")
            go.touch()
            peers.expect(3, r"synced at round \d+, world 3", 60)
            peers.expect(1, r"round \d+ world 3$", 60)
            say("stopping peer 1 (SIGSTOP) until the others run on without it")
            os.kill(peers.procs[1].pid, signal.SIGSTOP)
            stopped = time.monotonic()
            peers.expect(0, r"round \d+ world 2$", 60, after=stopped)
            say(f"continuing peer 1 (SIGCONT) after {time.monotonic() - stopped:.1f} s")
            os.kill(peers.procs[1].pid, signal.SIGCONT)
            peers.expect(1, r"rejoined", 60)
            peers.expect(1, r"synced at round \d+, world 3", 60)
            peers.wait_all(4 * args.timeout)
        except (TimeoutError, RuntimeError, subprocess.TimeoutExpired) as e:
            say(f"FAILED: {e}")
            return 1
        finally:
            peers.kill_running()
            go.unlink(missing_ok=True)
    done = re.compile(r"done rounds \d+ world 3 .* hash (\w+)")
    hashes = {}
    for i in (0, 1, 3):
        found = [m.group(1) for m in map(done.search, peers.said[i]) if m]
        if peers.procs[i].returncode != 0 or not found:
            say(f"FAILED: peer {i} did not finish in a group of 3 (status {peers.procs[i].returncode})")
            return 1
        hashes[i] = found[-1]
    if len(set(hashes.values())) != 1:
        say(f"FAILED: the final states differ: {hashes}")
        return 1
    say(f"peers 0, 1 (rejoined) and 3 (joined) hold bit-identical state, hash {hashes[0][:16]}")
    return 0


def main() -> int:
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
    ap.add_argument("--timeout", type=float, default=120, help="seconds a peer waits at most for --wait-for, "
                    "for the group to grow, for an all-reduce and for a rejoin")
    args = ap.parse_args()
    if args.demo:
        return demo(args)
    if not args.master:
        ap.error("give --demo or --master")
    return peer(args)


if __name__ == "__main__":
    sys.exit(main())
