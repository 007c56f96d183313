"""Spot replay helpers shared by the replay tests (tests/test_spotsim.py,
tests/test_spot_deadline.py): a hand-written trace, one replay of it from time 0, and replays of
a 4-node, 12-hour job from given starts."""

from __future__ import annotations

import numpy as np

from kplan.planner import spotsim
from kplan.planner.spot import RecoveryPolicy
from kplan.planner.spottrace import ADD, REMOVE, SpotTrace

# restart 300 s, boot 240 s, a 10 s checkpoint every 1800 s of progress: a cycle is 1810 s
POL = RecoveryPolicy(
    restart_s=300.0,
    provisioning_s=240.0,
    checkpoint_interval_s=1800.0,
    checkpoint_s=10.0,
    max_replacements=20,
    capacity_wait_s=900.0,
)
WORK = 3600.0  # two intervals: undisturbed, 240 + 3600 + 2 * 10 = 3860 s


def trace(rows: list[tuple[float, str, str]], end_s: float = 1e6) -> SpotTrace:
    return SpotTrace(
        name="hand",
        source="test",
        times_s=np.array([r[0] for r in rows], dtype=float),
        kinds=np.array([ADD if r[1] == "add" else REMOVE for r in rows], dtype=np.int8),
        nodes=tuple(r[2] for r in rows),
        end_s=end_s,
    )


def play(
    rows: list[tuple[float, str, str]], nodes: int = 2, policy: RecoveryPolicy = POL
) -> spotsim.ReplayOutcome:
    return spotsim.replay(
        trace(rows),
        start_s=0.0,
        nodes=nodes,
        work_s=WORK,
        policy=policy,
        usd_per_hour=1.0,
        usd_per_hour_on_demand=4.0,
    )


BOTH = [(0.0, "add", "a"), (0.0, "add", "b")]


def replays(tr: SpotTrace, starts: list[float], pol: RecoveryPolicy) -> list[spotsim.ReplayOutcome]:
    return spotsim.replay_many(
        tr,
        starts,
        nodes=4,
        work_s=12 * 3600.0,
        policy=pol,
        usd_per_hour=1.0,
        usd_per_hour_on_demand=4.0,
    )
