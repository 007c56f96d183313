"""The planner's global-batch schedule (kplan/planner/batchsched.py; issue 13, item 3)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kplan.app import planning
from kplan.catalogs import load_catalog
from kplan.cli.main import app
from kplan.core.errors import DataFileError
from kplan.planner import batchsched, costs, efficiency
from kplan.planner.perfmodel import PerfParams
from kplan.planner.plan import Plan
from kplan.planner.profile import GnsPoint
from kplan.planner.search import SearchOptions

# One node of 8 GPUs: a fixed 20 ms per step, 0.5 ms per sample, a small all-reduce.
PARAMS = PerfParams(
    compute_a=0.02, compute_b=0.0005, gamma=2.5, intra_alpha=0.002, intra_beta=0.004,
    intra_lat=1e-5, inter_alpha=0.0, inter_beta=0.0, inter_lat=0.0, two_node=0.0, log_sigma=0.1,
)  # fmt: skip
GRID = [64, 91, 128, 181, 256, 362, 512, 724, 1024, 1448, 2048]


def _plan(
    gns: list[GnsPoint], objective: str = "time", tie: float = 0.05, step_sigma: float = 0.0
) -> batchsched.SchedulePlan | None:
    return batchsched.plan_schedule(
        gns=gns,
        base_batch=64,
        samples_at_base=5e6,
        grid=GRID,
        params=PARAMS,
        nodes=1,
        workers=8,
        accum_steps=1,
        max_local_batch=256,
        min_local_batch=1,
        price=_price,
        objective=objective,
        tie_tolerance=tie,
        step_log_sigma=step_sigma,
    )


def _price(train_s: float, log_sigma: float) -> batchsched.Priced:
    """0.1 h of set-up, $30 an hour, a log-normal training time (p90 at exp(Z90 sigma))."""
    hours = train_s / 3600 + 0.1
    hours_p90 = train_s / 3600 * float(np.exp(costs.Z90 * log_sigma)) + 0.1
    return hours, hours * 30.0, hours_p90, hours_p90 * 30.0


def _measured(values: list[float]) -> list[GnsPoint]:
    """Points over the whole of training (no forecast involved)."""
    progress = np.linspace(0.0, 1.0, len(values))
    return [GnsPoint(float(p), v) for p, v in zip(progress, values, strict=True)]


def test_a_growing_noise_scale_gives_a_growing_schedule() -> None:
    growing = _measured([float(v) for v in np.geomspace(30, 30_000, 21)])
    plan = _plan(growing)
    assert plan is not None
    batches = [p.global_batch for p in plan.phases]
    assert 2 <= len(batches) <= batchsched.MAX_PHASES
    assert batches == sorted(batches) and batches[0] < batches[-1]
    assert plan.phases[0].start == 0.0 and plan.phases[-1].end == 1.0
    assert all(a.end == b.start for a, b in itertools.pairwise(plan.phases))
    assert plan.saving > 0.05 and plan.hours < plan.single_hours
    assert plan.single_batch in GRID
    # the phases' samples are the integral of (Bn + B)/(Bn + B0): more than at B0, each
    assert all(p.samples >= 5e6 * (p.end - p.start) * (1 - 1e-9) for p in plan.phases)
    assert plan.entries()[0] == {"progress": 0.0, "global_batch": batches[0]}


def test_the_schedules_p90_holds_the_forecasts_spread_and_the_step_times() -> None:
    # measured over the whole of training: no forecast spread, the p90 is the step time's
    growing = _measured([float(v) for v in np.geomspace(30, 30_000, 21)])
    plan = _plan(growing, step_sigma=0.1)
    assert plan is not None and plan.log_sigma == 0.0
    step90 = float(np.exp(costs.Z90 * 0.1))
    assert plan.hours_p90 - 0.1 == pytest.approx((plan.hours - 0.1) * step90)
    assert plan.single_hours_p90 - 0.1 == pytest.approx((plan.single_hours - 0.1) * step90)
    # one early point: the forecast's trajectories spread the samples of every phase
    early = [GnsPoint(0.01, 40.0)]
    plan = _plan(early, objective="cost", tie=0.0)
    assert plan is not None and plan.log_sigma > 0.01
    assert plan.hours_p90 > plan.hours and plan.cost_p90_usd > plan.cost_usd
    # the single batch's spread taken the same way agrees with the one a plan row carries
    single = float(plan.single_hours_p90 - 0.1) / float(plan.single_hours - 0.1)
    row = float(efficiency.log_sigma(early, 64, [plan.single_batch])[0])
    assert np.log(single) / costs.Z90 == pytest.approx(row, rel=0.15, abs=0.01)


@pytest.mark.parametrize("bn", [50.0, 2_000.0, 1e6])
def test_a_constant_noise_scale_gives_a_single_batch(bn: float) -> None:
    assert _plan(_measured([bn] * 11)) is None


def test_a_saving_within_the_tie_tolerance_keeps_the_single_batch() -> None:
    # One profile point at 1%: the forecast grows it as the prior does (x ~20 by 5%), so most
    # of training is at a large noise scale and the schedule saves only ~3% here.
    point = [GnsPoint(0.01, 40.0)]
    plan = _plan(point, objective="cost", tie=0.0)
    assert plan is not None and plan.phases[0].global_batch < plan.phases[-1].global_batch
    assert plan.saving == pytest.approx(1 - plan.cost_usd / plan.single_cost_usd)
    assert 0 < plan.saving < 0.05
    assert _plan(point, objective="cost", tie=0.05) is None


def test_dynamic_programme_matches_brute_force() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        table = rng.uniform(1.0, 10.0, size=(6, 4))
        table[rng.uniform(size=table.shape) < 0.1] = np.inf
        total, path = batchsched.best_schedule(table, max_phases=2)
        best = np.inf
        for combo in itertools.product(range(4), repeat=6):
            runs = len({c for c in combo})
            if list(combo) != sorted(combo) or runs > 2:
                continue
            best = min(best, float(sum(table[j, b] for j, b in enumerate(combo))))
        assert total == pytest.approx(best)
        if path:
            assert path == sorted(path) and len(set(path)) <= 2


def test_describe() -> None:
    entries: list[dict[str, float | int]] = [
        {"progress": 0.0, "global_batch": 256},
        {"progress": 0.2, "global_batch": 512},
        {"progress": 0.6, "global_batch": 1024},
    ]
    text = batchsched.describe(entries, 0.123)
    assert text == "256 until 20%, 512 until 60%, 1,024 after; saves 12%"


def test_search_attaches_a_schedule_to_the_chosen_row() -> None:
    profile = planning.load_example("deepspeech2")
    plan = planning.estimate(profile, SearchOptions(), catalog=load_catalog()).plan
    row = plan.chosen
    sched = row.schedule
    assert sched is not None and plan.plans[0] is row
    batches = [p.global_batch for p in sched.phases]
    assert batches == sorted(batches) and len(set(batches)) == len(batches) >= 2
    assert sched.saving > 0.05 and sched.hours < row.hours
    assert sched.hours_p90 > sched.hours and sched.cost_p90_usd > sched.cost_usd
    assert all(b % row.accum_steps == 0 for b in batches)
    pinned = planning.estimate(profile, SearchOptions(fixed_global_batch=True), catalog=None)
    assert pinned.plan.chosen.schedule is None  # one batch: nothing to schedule


def test_the_plans_schedule_reaches_the_workers_and_the_estimate_output(tmp_path: Path) -> None:
    """kplan launch with a planned schedule: the spec carries it, the workers get it as
    KPLAN_BATCH_SCHEDULE, and the prediction is the schedule's; kplan estimate shows it."""
    from kplan.app.launching import LaunchRequest, build_spec, spec_from_plan
    from kplan.launcher.bootstrap import worker_env
    from kplan.runtime import env

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    req = LaunchRequest(
        script=script,
        budget_usd=0.0,  # no budget: the knee, as kplan estimate's default
        cloud="aws",
        example_profile="deepspeech2",
        storage_uri="s3://bucket/kplan",
    )
    spec = build_spec(req)
    assert spec.plan is not None
    row = spec.plan.chosen
    assert row.schedule is not None and spec.batch.schedule is not None
    workers = worker_env(spec, "/opt/kplan")
    assert env.epochs_by(workers) == "progress"  # the schedule's phases are of this target
    sched = env.batch_schedule(workers)
    assert sched is not None and sched.trigger == "progress"
    assert [p.global_batch for p in sched.phases] == [p.global_batch for p in row.schedule.phases]
    assert spec.predicted.hours == row.schedule.hours < row.hours
    assert spec.predicted.cost_p90_usd == row.schedule.cost_p90_usd
    plain = LaunchRequest(script=script, budget_usd=5000.0, cloud="aws")
    without = replace(spec.plan, chosen=replace(row, schedule=None))
    assert spec_from_plan(plain, without, "aws").batch.schedule is None
    doc = spec.plan.to_dict()
    doc["chosen"]["batch_schedule"]["phases"][-1]["progress"] = 2
    with pytest.raises(DataFileError, match=r"progress 2 is not a finite number in \[0, 1\]"):
        Plan.from_dict(doc)
    result = CliRunner().invoke(app, ["estimate", "--example", "deepspeech2"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("batch schedule:"))
    first = row.schedule.phases[0].global_batch
    assert line.startswith(f"batch schedule: {first} until") and "saves" in result.output
    tail = " ".join(result.output[result.output.index("batch schedule:") :].split())
    assert "; p90 " in tail.split(")")[0]  # the schedule's own p90, before the line ends
