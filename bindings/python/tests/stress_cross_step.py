"""Cross-step churn stress of libpccl.so through the concord package, modelled on PCCL's cross-step
test: 4 to 8 peer processes keep several all-reduces in flight across step boundaries while peers are
killed (SIGKILL) and started every few seconds; newcomers wait in connect and are admitted only at a
topology update. It fails on a deadlock (no joined peer makes progress for --stall seconds), on any
wrong element of any all-reduce, on a peer that dies by itself, and unless every peer that is in the
run at the end reports the same state.

    CONCORD_LIB=/path/to/libpccl.so /usr/bin/python3 bindings/python/tests/stress_cross_step.py --seconds 120

prints one JSON summary line. Without CONCORD_LIB the package builds the library from this checkout.
test_stress.py runs it under pytest (CONCORD_STRESS_SECONDS). Bounded: --seconds of churn, then at
most --stall seconds for the peers to agree to stop and report.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
PKG_ROOT = HERE.parent
sys.path.insert(0, str(PKG_ROOT))

import concord  # noqa: E402


class Peer:
    """A peer process and what its output said."""

    def __init__(self, label: str, argv: list[str], env: dict):
        self.label = label
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.joined = False
        self.final: dict | None = None
        self.killed = False
        self.last_step = time.monotonic()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("joined"):
                self.joined = True
            elif line.startswith("step"):
                self.last_step = time.monotonic()
            elif line.startswith("final "):
                self.final = json.loads(line[len("final "):])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self):
        if self.alive():
            self.killed = True
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def tail(self, n: int = 30) -> str:
        return "".join(self.lines[-n:])


def run(seconds: float, min_peers: int, max_peers: int, seed: int, elements: int, reduces: int,
        stall: float, log=print) -> dict:
    rng = random.Random(seed)
    stop_dir = tempfile.mkdtemp(prefix="concord-stress-")
    stop_file = os.path.join(stop_dir, "stop")
    env = dict(os.environ)
    env["CONCORD_LIB"] = concord.library_path()
    env["PYTHONPATH"] = str(PKG_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    worker = str(HERE / "workers" / "stress_peer.py")
    peers: list[Peer] = []
    summary = {"seed": seed, "seconds": seconds, "started": 0, "killed": 0}

    def fail(why: str):
        for p in peers:
            if p.alive():
                os.kill(p.proc.pid, signal.SIGUSR1)  # Python stacks of every live peer
        time.sleep(1)
        details = "\n".join(f"--- {p.label} (exit {p.proc.poll()}, killed {p.killed}):\n{p.tail()}" for p in peers)
        raise AssertionError(f"stress (seed {seed}): {why}\n{details}")

    with concord.Master() as master:
        def start():
            label = f"p{summary['started']}"
            summary["started"] += 1
            peers.append(Peer(label, [sys.executable, "-u", worker, master.address, str(elements), str(reduces),
                                      stop_file], env))

        try:
            for _ in range(min_peers + 1):
                start()
            begin = time.monotonic()
            next_event = begin + rng.uniform(2, 5)
            while time.monotonic() - begin < seconds:
                time.sleep(0.2)
                now = time.monotonic()
                for p in peers:
                    if not p.alive() and not p.killed:
                        fail(f"{p.label} exited by itself with status {p.proc.returncode}")
                live = [p for p in peers if p.alive()]
                joined = [p for p in live if p.joined]
                if joined and now - max(p.last_step for p in joined) > stall:
                    fail(f"no joined peer made progress for {stall:.0f} s: deadlock")
                if now < next_event:
                    continue
                next_event = now + rng.uniform(2, 5)
                # Kill a joined peer (at least two stay, so the state survives) or start one.
                if len(joined) >= 3 and (len(live) >= max_peers or len(live) > min_peers and rng.random() < 0.5):
                    victim = rng.choice(joined)
                    victim.kill()
                    summary["killed"] += 1
                    log(f"{now - begin:6.1f}s killed {victim.label}; {len(live) - 1} live")
                elif len(live) < max_peers:
                    start()
                    log(f"{now - begin:6.1f}s started {peers[-1].label}; {len(live) + 1} live")

            # Stop. Peers still waiting in connect are killed first: admitted after the others left,
            # they would find nobody holding the state. The others agree on stopping through a flag
            # all-reduce, drain, sync and report.
            for p in peers:
                if p.alive() and not p.joined:
                    p.kill()
            pathlib.Path(stop_file).touch()
            deadline = time.monotonic() + stall
            while time.monotonic() < deadline and any(p.alive() for p in peers):
                time.sleep(0.2)
            for p in peers:
                if p.alive():
                    fail(f"{p.label} did not stop within {stall:.0f} s")
                if not p.killed and p.proc.returncode != 0:
                    fail(f"{p.label} exited with status {p.proc.returncode}")
            finals = [p for p in peers if not p.killed]
            if not finals:
                fail("no peer reported at the end")
            if any(p.final is None for p in finals):
                fail("a peer ended without its report")
            if len({(p.final["hash"], p.final["step"]) for p in finals}) != 1:
                fail(f"the peers ended with different states: {[p.final for p in finals]}")
            summary["survivors"] = len(finals)
            summary["steps"] = finals[0].final["step"]
            for k in ("checked", "retried", "syncs", "dropped"):
                summary[f"{k}_by_survivors"] = sum(p.final[k] for p in finals)
            return summary
        finally:
            for p in peers:
                p.kill()
            try:
                os.remove(stop_file)
            except FileNotFoundError:
                pass
            os.rmdir(stop_dir)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120, help="how long peers are killed and started")
    ap.add_argument("--min-peers", type=int, default=4, help="peers kept running (plus one at the start)")
    ap.add_argument("--max-peers", type=int, default=8, help="most peers running at once")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000, help="the churn's random seed")
    ap.add_argument("--elements", type=int, default=20000, help="float32 elements per all-reduce")
    ap.add_argument("--reduces", type=int, default=4, help="sum all-reduces per step")
    ap.add_argument("--stall", type=float, default=60, help="seconds without progress that count as a deadlock")
    a = ap.parse_args()
    s = run(a.seconds, a.min_peers, a.max_peers, a.seed, a.elements, a.reduces, a.stall,
            log=lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(s))


if __name__ == "__main__":
    main()
