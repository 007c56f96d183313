"""The launcher runs the deadline rule its plan was priced with (kplan/planner/deadline.py via
kplan/launcher/recovery.py): a lost node's replacement goes on demand, and stays there, once
the slack no longer covers another preemption; with room, spot as before."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any

import pytest

from kplan.app import planning
from kplan.planner.plan import Plan
from kplan.planner.search import SearchOptions
from tests.test_launcher_recovery_rules import (  # noqa: F401  (env: the fixture)
    JOB,
    _events,
    _placed,
    _run,
    _sim,
    _spec,
    env,
)

WORK_S = 6600.0  # the plan's training: the simulated job ends 2 h after its start


@cache
def _plan() -> Plan:
    opts = SearchOptions(
        markets=("spot",),
        instance_types=("g4dn.xlarge",),
        clouds=("aws",),
        min_nodes=2,
        max_nodes=2,
        mixed=False,
        spot_runs=200,
        deadline_hours=5.0,
    )
    plan = planning.estimate(planning.load_example("cifar10-resnet18"), opts).plan
    return replace(plan, chosen=replace(plan.chosen, steps=1, step_time_s=WORK_S))


@pytest.mark.parametrize(("deadline_h", "market"), [(2.5, "on-demand"), (4.0, "spot")])
def test_a_replacement_follows_the_deadline_rule(
    env: dict[str, Any],  # noqa: F811
    deadline_h: float,
    market: str,
) -> None:
    """Lost at 600 s with the plan's 6600 s (and an interval) left: a replacement up a restart
    later leaves 9000 - 630 - 300 - 8408 s of slack by a 2.5 h deadline, under the 2162 s
    reserve: on demand; by 4 h, spot."""
    plan = _plan()
    assert plan.chosen.spot.recovery is not None and plan.chosen.spot.recovery.deadline_s
    sim = _sim(env, {f"{JOB}-n1-r0": 600.0})
    spec = _spec(env, allow_on_demand=True, deadline_h=deadline_h, plan=plan)
    out = _run(env, spec, sim)
    assert out.status == "succeeded", out.reason
    assert _placed(sim)[2] == (1, "us-east-1a", market)
    assert not _events(env, "spot-return")  # on demand stays on demand
