"""A training loop that comes back by itself after the master removed it, with the concord package.

Each step every peer all-reduces (averages) an update into its weights, which with the step counter
are the group's shared state. A peer that was stopped, cut off or hung long enough for the master to
remove it gets KickedError (or MasterLostError) with ``err.rejoinable`` on its next call: the
training loop runs under concord.run_with_rejoin, which calls rejoin() (a new connection as a
newcomer, with backoff until the others admit it) and runs the loop again: it first takes the group's
state with a RECEIVE_ONLY sync, then trains on. An error a rejoin cannot fix (a wrong secret:
RefusedError) ends the peer with the one-line reason. The accepted peers admit waiting peers between
steps (are_peers_pending / update_topology) and sync the state with them.

The peers start once the group holds --world peers (0: at once) and stop together after --steps
steps, in a group of --world peers again, and print
the step and a hash of their weights: bit-identical on every peer.

Run the whole demo (a master with a gossip failure detector, three peers, one stopped with SIGSTOP
and continued: the gossip verdict removes it within seconds, and it comes back; every wait has a
time limit) with

    python3 bindings/python/examples/rejoin_after_kick.py --demo

or one peer of a run with --master HOST:PORT [--gossip HOST:PORT] --index I.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import concord  # noqa: E402
from _peers import Peers  # noqa: E402

COUNT = 1031


def update(index: int, step: int) -> np.ndarray:
    """This peer's update at a step: deterministic, different on every peer and step."""
    return ((np.arange(COUNT, dtype=np.float32) % 13) + np.float32(index) + np.float32(step % 7)) / np.float32(64)


def peer(args: argparse.Namespace) -> int:
    comm = concord.Communicator(args.master, gossip_join=args.gossip)
    comm.connect()
    first, deadline = True, time.monotonic() + args.timeout
    while comm.world_size < args.world:  # the group grows at the accepted peers' update_topology
        if time.monotonic() > deadline:
            print(f"giving up: the group did not grow to {args.world} within {args.timeout:g} s", flush=True)
            comm.close()
            return 1
        if not first:
            comm.update_topology()
        first = False
        time.sleep(0.02)
    step = np.zeros(1, dtype=np.uint64)
    weights = np.zeros(COUNT, dtype=np.float32)
    state = concord.SharedState({"step": step, "weights": weights})

    def train(rejoins: int) -> concord.ReduceInfo:
        """Steps until the group stops together; after a rejoin, first takes the group's state."""
        if rejoins:
            print("rejoined", flush=True)
        fresh, need_sync = rejoins > 0, True
        while True:
            try:
                if not fresh and not need_sync and comm.are_peers_pending():
                    comm.update_topology()
                    need_sync = True
                if need_sync:
                    state.revision += 1
                    try:
                        comm.sync_shared_state(state, concord.Strategy.RECEIVE_ONLY if fresh else
                                               concord.Strategy.ENFORCE_POPULAR)
                    except concord.ConcordError:
                        state.revision -= 1
                        raise
                    fresh = need_sync = False
                u = update(args.index, int(step[0]))
                flag = np.zeros(1, dtype=np.float32)
                u_info = comm.all_reduce(u, op=concord.ReduceOp.AVG, tag=1)
                want_stop = step[0] >= args.steps and (args.world == 0 or u_info.world_size >= args.world)
                flag[0] = 1.0 if want_stop else 0.0
                f_info = comm.all_reduce(flag, tag=2)
            except concord.ConcordError as err:
                if err.retryable:
                    continue  # a peer left: the ring is re-wired without it; run the step again
                raise
            np.add(weights, u, out=weights)
            step[0] += 1
            if step[0] == 5:
                print("ready", flush=True)
            print(f"step {int(step[0])} world {u_info.world_size}", flush=True)
            if flag[0] == f_info.world_size:
                return u_info
            time.sleep(args.pause)

    try:
        u_info = concord.run_with_rejoin(comm, train, timeout=args.timeout, max_rejoins=3,
                                         on_rejoin=lambda err, n: print(f"kicked: {err}", flush=True))
    except concord.ConcordError as err:
        print(f"giving up: {err}", flush=True)
        return 1
    digest = hashlib.sha256(weights.tobytes()).hexdigest()[:16]
    print(f"done step {int(step[0])} world {u_info.world_size} hash {digest}", flush=True)
    comm.close()
    return 0


def demo(args: argparse.Namespace) -> int:
    """A master with a gossip detector and three peers: peer 2 is stopped with SIGSTOP once it runs,
    and continued once the others run on without it. Every wait has a time limit."""

    def say(what: str) -> None:
        print(f"demo: {what}", flush=True)

    peers = Peers(echo=False)
    with concord.Master(gossip="127.0.0.1:0") as master:
        common = [sys.executable, "-u", __file__, "--master", master.address, "--gossip", master.gossip_address,
                  "--steps", str(args.steps), "--world", "3", "--timeout", str(args.timeout)]
        try:
            for i in range(3):
                peers.start(i, common + ["--index", str(i)])
            peers.expect(2, r"^ready", args.timeout)
            say("stopping peer 2 (SIGSTOP)")
            os.kill(peers.procs[2].pid, signal.SIGSTOP)
            stopped = time.monotonic()
            line = peers.expect(0, r" world 2$", args.timeout, after=stopped)
            say(f"peer 0 goes on: {line.strip()}")
            os.kill(peers.procs[2].pid, signal.SIGCONT)
            peers.wait_all(2 * args.timeout)
        except (TimeoutError, RuntimeError, subprocess.TimeoutExpired) as e:
            say(f"FAILED: {e}")
            return 1
        finally:
            peers.kill_running()
    for i in range(3):
        for line in peers.said[i]:
            if line.startswith(("kicked", "rejoined", "done", "giving up")):
                print(f"peer {i}: {line}", end="")
    return 0 if all(p.returncode == 0 for p in peers.procs.values()) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", action="store_true", help="run a master and three peers, stopping one")
    ap.add_argument("--master", help="the master's host:port")
    ap.add_argument("--gossip", help="the master's gossip address (host:port), to join its failure detector")
    ap.add_argument("--index", type=int, default=0, help="this peer's index (picks its updates)")
    ap.add_argument("--steps", type=int, default=40, help="steps before the peers may stop")
    ap.add_argument("--world", type=int, default=0, help="start and stop only in a group of this many peers (0: any)")
    ap.add_argument("--pause", type=float, default=0.02, help="seconds between steps")
    ap.add_argument("--timeout", type=float, default=120,
                    help="seconds a peer waits for the group to form or to be admitted again after a kick")
    args = ap.parse_args()
    if args.demo:
        return demo(args)
    if not args.master:
        ap.error("--master or --demo is needed")
    return peer(args)


if __name__ == "__main__":
    sys.exit(main())
