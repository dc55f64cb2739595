"""The cross-step churn stress (stress_cross_step.py) under pytest: 4 to 8 peers with several
all-reduces in flight across steps, peers killed and started every few seconds. It runs only when
CONCORD_STRESS_SECONDS is set (CI sets 120 in a step of its own), so the default run stays short;
CONCORD_STRESS_SEED repeats a run (the seed is in every failure message)."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("numpy")

SECONDS = os.environ.get("CONCORD_STRESS_SECONDS")


@pytest.mark.skipif(not SECONDS, reason="set CONCORD_STRESS_SECONDS (CI: 120) to run the churn stress")
def test_cross_step_churn():
    import stress_cross_step

    seed = int(os.environ.get("CONCORD_STRESS_SEED", str(int(time.time()) % 100000)))
    s = stress_cross_step.run(float(SECONDS), min_peers=4, max_peers=8, seed=seed, elements=20000, reduces=4,
                              stall=60, log=print)
    print(s)
    assert s["killed"] > 0 and s["started"] > 5, s
    assert s["steps"] > 0 and s["checked_by_survivors"] > 0, s
