"""The torch example's demo: async DiLoCo on Fashion-MNIST across peer processes, one killed, one
joining, and one stopped until the master removes it, which rejoins by itself; every peer that
finishes, the rejoined one included, holds bit-identical shared state."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess

import pytest

pytest.importorskip("torch")

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "diloco_fashion_mnist.py"


def test_async_diloco_with_a_kill_a_join_and_a_rejoin(children):
    demo = children.python(EXAMPLE, "--demo", "--rounds", "30", "--inner-steps", "5", "--batch", "32",
                           "--timeout", "60")
    try:
        out, _ = demo.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.kill(demo.pid, signal.SIGTERM)  # the demo ends the peers it started
        out, _ = demo.communicate(timeout=30)
        pytest.fail("the demo did not end in time:\n" + out)
    assert demo.returncode == 0, out

    def said(peer: int) -> list[str]:
        return [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith(f"peer {peer}: ")]

    assert not [line for line in said(2) if line.startswith("done")], "the killed peer finished:\n" + out
    # Peer 1 was stopped: it finds it was kicked, rejoins, and takes the group's state.
    p1 = said(1)
    kicked = [i for i, line in enumerate(p1) if re.match(r"kicked at round \d+: (KickedError|MasterLostError)", line)]
    assert len(kicked) == 1, out
    rejoined = p1.index("rejoined as a newcomer (rejoin 1)")
    assert rejoined > kicked[0], out
    assert re.match(r"synced at round \d+, world 3, received [1-9]", p1[rejoined + 1]), out
    # The joiner took the state too.
    assert [line for line in said(3) if re.match(r"synced at round \d+, world 3, received [1-9]", line)], out
    hashes = {}
    for peer in (0, 1, 3):
        done = [m for m in map(re.compile(r"done rounds 30 world (\d) accuracy ([\d.]+) final-sync-rx (\d+) "
                                          r"hash (\w+)").match, said(peer)) if m]
        assert len(done) == 1, f"peer {peer}:\n{out}"
        world, accuracy, rx, digest = done[0].groups()
        assert world == "3", f"peer {peer} ended in a world of {world}:\n{out}"
        assert rx == "0", f"peer {peer} differed before the final sync:\n{out}"
        assert float(accuracy) > 0.5, f"peer {peer} did not learn:\n{out}"
        hashes[peer] = digest
    assert len(set(hashes.values())) == 1, hashes
