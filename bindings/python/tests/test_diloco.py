"""The torch example: async DiLoCo on Fashion-MNIST across three peer processes, one killed and one
joining; every peer that finishes holds bit-identical shared state."""

from __future__ import annotations

import os
import pathlib
import re
import signal

import pytest

pytest.importorskip("torch")

import concord  # noqa: E402

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "diloco_fashion_mnist.py"


def test_async_diloco_with_a_kill_and_a_join(children, tmp_path):
    go = tmp_path / "join"
    with concord.Master() as master:
        common = ["--master", master.address, "--rounds", "30", "--inner-steps", "5", "--batch", "32"]
        peers = [children.python(EXAMPLE, *common, "--index", str(i), "--grow-to", "3") for i in range(3)]
        joiner = children.python(EXAMPLE, *common, "--index", "3", "--wait-for", str(go))
        victim = peers[2]
        for line in victim.stdout:
            if re.search(r"round 5 ", line):
                os.kill(victim.pid, signal.SIGKILL)
                break
        victim.wait(timeout=30)
        assert victim.returncode == -signal.SIGKILL
        seen = []
        for line in peers[0].stdout:  # the survivors go on without the victim, then the joiner is let in
            seen.append(line)
            if "world 2" in line:
                go.touch()
                break
        else:
            pytest.fail("".join(seen))
        outs = {}
        for name, p in (("0", peers[0]), ("1", peers[1]), ("joiner", joiner)):
            out, _ = p.communicate(timeout=180)
            outs[name] = ("".join(seen) if name == "0" else "") + out
            assert p.returncode == 0, f"peer {name}:\n{outs[name]}"
    hashes = {}
    for name, out in outs.items():
        m = re.search(r"done rounds 30 world (\d) accuracy ([\d.]+) final-sync-rx (\d+) hash (\w+)", out)
        assert m, f"peer {name}:\n{out}"
        assert m.group(1) == "3", f"peer {name} ended in a world of {m.group(1)}:\n{out}"
        assert m.group(3) == "0", f"peer {name} differed before the final sync:\n{out}"
        assert float(m.group(2)) > 0.5, f"peer {name} did not learn:\n{out}"
        hashes[name] = m.group(4)
    assert len(set(hashes.values())) == 1, hashes
    assert re.search(r"synced at round \d+, world 3, received [1-9]", outs["joiner"]), outs["joiner"]
