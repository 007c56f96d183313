"""Issue 24, items 3 and 6: the plan file has one typed, versioned schema
(kplan/planner/plan_schema.py) that round-trips, validates every field once for every reader,
migrates the previous schema's files (tests/fixtures/plan_v1_*.json, saved by the release before
it) and checks a plan against the catalog it was made with (a user catalog included)."""

from __future__ import annotations

import functools
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kplan.app import planning
from kplan.app.launching import LaunchRequest, build_spec
from kplan.cli.main import app
from kplan.core.errors import DataFileError, SchemaVersionError
from kplan.planner.plan import PLAN_SCHEMA, BatchSchedule, Plan, SchedulePhase
from kplan.planner.search import SearchOptions

FIXTURES = Path(__file__).parent / "fixtures"
runner = CliRunner()
OPTION_SETS = {
    "aws-spot-fallback": SearchOptions(
        clouds=("aws",), markets=("spot",), allow_on_demand=True, spot_runs=200, top=5
    ),
    "on-demand": SearchOptions(markets=("on-demand",), top=5),
    "gcp-mixed": SearchOptions(clouds=("gcp",), mixed=True, spot_runs=200, top=5),
}


@functools.cache
def _plan(example: str, options: str) -> Plan:
    return planning.estimate(planning.load_example(example), OPTION_SETS[options]).plan


def _through_json(plan: Plan) -> Plan:
    return Plan.from_dict(json.loads(json.dumps(plan.to_dict())), "test")


@pytest.mark.parametrize("example", planning.example_names())
def test_every_examples_plan_round_trips(example: str) -> None:
    plan = _plan(example, "aws-spot-fallback")
    assert Plan.from_dict(plan.to_dict()) == plan
    assert _through_json(plan) == plan
    assert plan.to_dict()["schema"] == PLAN_SCHEMA


_hours = st.floats(1e-3, 1e4, allow_nan=False)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    example=st.sampled_from(planning.example_names()),
    options=st.sampled_from(sorted(OPTION_SETS)),
    hours=_hours,
    spread=st.floats(1.0, 10.0),
    phases=st.lists(st.integers(1, 2**20), min_size=1, max_size=5, unique=True),
    notes=st.lists(st.text(max_size=30), max_size=3),
    profile=st.text(max_size=20),
)
def test_plans_round_trip_as_a_property(
    example: str,
    options: str,
    hours: float,
    spread: float,
    phases: list[int],
    notes: list[str],
    profile: str,
) -> None:
    """Any plan the planner makes for a built-in example (several option sets), with its chosen
    row's predictions, batch schedule and texts redrawn, reads back equal, through JSON too."""
    plan = _plan(example, options)
    assert Plan.from_dict(plan.to_dict()) == plan
    batches = sorted(b for b in phases if b >= plan.chosen.workers) or [plan.chosen.global_batch]
    schedule = BatchSchedule(
        phases=tuple(SchedulePhase(i / len(batches), b) for i, b in enumerate(batches)),
        hours=hours,
        cost_usd=hours * 2,
        hours_p90=hours * spread,
        cost_p90_usd=hours * 2 * spread,
        forecast_log_sigma=0.1,
        saving=0.05,
    )
    chosen = replace(plan.chosen, hours=hours, hours_p90=hours * spread, schedule=schedule)
    drawn = replace(plan, chosen=chosen, notes=tuple(notes), profile=profile)
    assert Plan.from_dict(drawn.to_dict()) == drawn
    assert _through_json(drawn) == drawn


@pytest.mark.slow
@pytest.mark.parametrize("options", sorted(OPTION_SETS))
@pytest.mark.parametrize("example", planning.example_names())
def test_every_example_and_option_set_round_trips(example: str, options: str) -> None:
    plan = _plan(example, options)
    assert _through_json(plan) == plan


# --- the previous schema ------------------------------------------------------------------------


def _fixture(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    assert doc["schema"] == "kplan.plan/1.0"
    return doc


def test_a_spot_plan_of_the_previous_release_is_migrated() -> None:
    doc = _fixture("plan_v1_yolov3_spot.json")
    plan = Plan.from_dict(doc, "old")
    row, old = plan.chosen, doc["chosen"]
    rec = row.spot.recovery
    assert rec is not None and rec.allow_on_demand and row.spot.allow_on_demand
    assert rec.max_replacements == old["max_replacements"]
    assert rec.capacity_wait_s == old["capacity_wait_s"]
    assert (row.spot.basis, row.spot.model) == (old["time_cost_basis"], old["spot_model"])
    assert row.spot.on_demand_cost_usd == old["on_demand_cost_usd"]
    assert (row.hours, row.cost_p90_usd, row.schedule) == (old["hours"], old["cost_p90_usd"], None)
    assert (plan.profile, plan.catalog) == ("yolov3", "shipped-2026.11")
    assert len(plan.plans) == len(doc["plans"]) and len(plan.frontier) == len(doc["frontier"])
    assert _through_json(plan) == plan


def test_a_batch_schedule_of_the_previous_release_becomes_one_object() -> None:
    doc = _fixture("plan_v1_deepspeech2_schedule.json")
    old = doc["chosen"]
    sched = Plan.from_dict(doc).chosen.schedule
    assert sched is not None and old["batch_schedule"]
    assert sched.entries() == old["batch_schedule"]
    assert (sched.hours, sched.cost_p90_usd, sched.saving) == (
        old["batch_schedule_hours"],
        old["batch_schedule_cost_p90_usd"],
        old["batch_schedule_saving"],
    )


def test_a_local_plan_of_the_previous_release_is_migrated() -> None:
    doc = _fixture("plan_v1_local.json")
    plan = Plan.from_dict(doc)
    assert plan.objective == "local" and plan.chosen.cloud == "local"
    assert plan.local is not None and plan.local.work == doc["local"]["work"]
    assert plan.chosen.spot.recovery is None
    assert _through_json(plan) == plan


def test_old_flat_fields_must_agree_with_the_recovery_rules() -> None:
    doc = _fixture("plan_v1_yolov3_spot.json")
    doc["chosen"]["max_replacements"] = 3  # the flat copy says 3, the rules 20
    with pytest.raises(DataFileError, match=r"chosen\.max_replacements 3 disagrees"):
        Plan.from_dict(doc, "old")


@pytest.mark.parametrize(
    ("schema", "error", "needle"),
    [
        ("kplan.plan/3.0", SchemaVersionError, "kplan.plan/3.0 is not supported"),
        ("kplan.profile/1.0", DataFileError, "not a kplan plan"),
        (None, DataFileError, "not a kplan plan"),
    ],
)
def test_other_schemas_are_refused_with_a_hint(
    schema: str | None, error: type[Exception], needle: str
) -> None:
    doc = _fixture("plan_v1_yolov3_spot.json") | {"schema": schema}
    with pytest.raises(error, match=needle) as info:
        Plan.from_dict(doc, "p.json")
    assert getattr(info.value, "hint", "")


def test_old_plan_files_launch_and_simulate(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spot = str(FIXTURES / "plan_v1_yolov3_spot.json")
    res = runner.invoke(
        app, ["launch", str(script), "--plan", spot, "--budget", "10", "--dry-run", "--json"]
    )
    assert res.exit_code == 0, res.output
    spec = build_spec(LaunchRequest(script, 10.0, plan_file=Path(spot)))
    assert spec.allow_on_demand and spec.recovery.max_replacements == 20
    assert (
        spec.recovery.capacity_wait_s
        == _fixture("plan_v1_yolov3_spot.json")["chosen"]["capacity_wait_s"]
    )
    local = str(FIXTURES / "plan_v1_local.json")
    res = runner.invoke(app, ["launch", str(script), "--plan", local, "--budget", "1", "--dry-run"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(
        app, ["simulate", "--plan", spot, "--example-trace", "p3", "--runs", "20", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["runs"] == 20


# --- the catalog the plan was made with ---------------------------------------------------------


def _user_catalog(home: Path) -> None:
    """A user catalog (as kplan catalog update writes one) with a type the shipped one lacks."""
    from importlib import resources

    folder = home / "catalogs" / "2026-11-26"
    with resources.as_file(resources.files("kplan.catalogs").joinpath("data")) as shipped:
        shutil.copytree(shipped, folder)
    (folder / "VERSION.txt").write_text("user-2026-11-26\n")
    with (folder / "instances.csv").open("a") as f:
        f.write("aws,g4dn.custom,T4,1,4,16,5,none,0,test\n")
    with (folder / "prices.csv").open("a") as f:
        f.write("aws,g4dn.custom,us-east-1,use1-az1,on-demand,0.31,test\n")


def test_a_type_of_the_users_catalog_launches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan made with a user catalog launches against that catalog (it was re-priced against
    the shipped one, which refused the type), and is refused with a hint where that catalog is
    gone and the current one lacks the type."""
    home = tmp_path / "home"
    monkeypatch.setenv("KPLAN_HOME", str(home))
    _user_catalog(home)
    plan, script = tmp_path / "plan.json", tmp_path / "train.py"
    script.write_text("print('hi')\n")
    args = ["estimate", "-e", "cifar10-resnet18", "-t", "g4dn.custom", "--on-demand"]
    res = runner.invoke(app, [*args, "--out", str(plan)])
    assert res.exit_code == 0, res.output
    assert json.loads(plan.read_text())["catalog"] == "user-2026-11-26"
    launch = ["launch", str(script), "--plan", str(plan), "--budget", "5", "--dry-run", "--json"]
    res = runner.invoke(app, launch)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["price_notes"] == []  # the user catalog's own price
    shutil.rmtree(home / "catalogs")
    res = runner.invoke(app, launch)
    assert res.exit_code == 2
    assert "'g4dn.custom' is not a type of aws in catalog shipped-" in res.output
    assert "hint: plan again with this catalog" in res.output
