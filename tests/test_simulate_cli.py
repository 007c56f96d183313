"""kplan simulate: a plan replayed against a trace, through the CLI (issue 11)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kplan.catalogs.spot_traces import write_trace
from kplan.cli.main import app
from kplan.planner.plan import Plan
from kplan.planner.spottrace import synthetic_trace

runner = CliRunner()


def _plan(tmp_path: Path, nodes: int, epochs: int = 40) -> Path:
    out = tmp_path / f"plan{nodes}.json"
    res = runner.invoke(
        app,
        [
            "estimate",
            "--example",
            "cifar10-resnet18",
            "--spot",
            "--instance-type",
            "p3.2xlarge",
            "--region",
            "us-east-1",
            "--nodes",
            str(nodes),
            "--epochs",
            str(epochs),
            "--out",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.parametrize("nodes", [1, 3])
def test_a_trace_drawn_from_the_model_replays_to_the_models_own_prediction(
    tmp_path: Path, nodes: int, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """On a trace generated from the plan's own spot model (a pool of the plan's size),
    `kplan simulate` gives back the model's mean and p90 of time and cost within 3% (issue 11's
    acceptance; tests/test_spotsim.py asserts it for the engine with fresh clusters). The
    replays start at random times of one long trace, on nodes of random ages: the p3 row's
    shape 1.09 is close enough to memoryless for that not to matter at 3% over a job of hours
    (over 20 minutes, a node of random age is ~25% likelier to go than a fresh one)."""
    from kplan.app import simulating
    from kplan.catalogs import loader, spot_model_file

    # synthetic_trace draws one market in one period: the plan and its replays are priced by
    # the shipped model without its spreads between periods and blocks (tests/test_spotsim.py
    # checks those against the engine). A home of its own (the catalog cache) and the
    # process's caches cleared before and after: no other test sees this model.
    shipped = spot_model_file.load_spot_model()
    calm = [
        replace(
            r,
            rate_sigma=0.0,
            outage_sigma=0.0,
            rate_sigma_long=None,
            period_sigma=0.0,
            market_sigma=0.0,
            market_outage_sigma=0.0,
        )
        for r in shipped.risks
    ]
    stationary = replace(shipped, risks=tuple(calm))

    def clear() -> None:
        spot_model_file.shipped_spot_model.cache_clear()
        loader.shipped_catalog.cache_clear()

    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(spot_model_file, "load_spot_model", lambda path=None: stationary)
    clear()
    request.addfinalizer(clear)
    plan = _plan(tmp_path, nodes, epochs=800)  # hours: a random start's node age washes out
    doc = Plan.from_dict(json.loads(plan.read_text()))
    risk = simulating.plan_risk(doc, None)
    trace = synthetic_trace(risk, pool=nodes, hours=3000.0, seed=7)
    path = tmp_path / "synthetic.csv"
    write_trace(trace, path)
    res = runner.invoke(
        app, ["simulate", "--plan", str(plan), "--trace", str(path), "--runs", "3000", "--json"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    rep, model = out["replayed"], out["spot_only"]
    assert out["truncated"] == 0
    # 3%, and for the 3-node median 3.5%: the model's own median of 3000 runs has a standard
    # error of 0.6% (20 seeds: 2.718 +- 0.016 h) and seed 0 draws 2.677 h, 2.6 of it low,
    # 3.0% under the replays' 2.757 h
    for key in ("hours", "hours_p90", "cost_usd", "cost_p90_usd", "hours_mean", "cost_mean_usd"):
        tol = 0.035 if key == "hours" and nodes == 3 else 0.03
        assert rep[key] == pytest.approx(model[key], rel=tol), (key, rep[key], model[key])
    # about 10% of replays above the model's p90: a calibrated p90 on its own data
    assert 0.05 <= rep["above_spot_only_hours_p90"] <= 0.2


def test_simulate_prints_the_distribution_against_the_plan(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 2)
    from scripts.traces import data_root

    trace = data_root() / "spot" / "bamboo-nsdi23-traces" / "traces" / "p3-trace.csv"
    if not trace.exists():  # pragma: no cover - the shared data is on every dev machine
        pytest.skip("shared spot traces not here")
    res = runner.invoke(
        app, ["simulate", "--plan", str(plan), "--trace", str(trace), "--runs", "50"]
    )
    assert res.exit_code == 0, res.output
    assert "replayed p50" in res.output and "spot-only p90" in res.output
    hours_line = next(ln for ln in res.output.splitlines() if ln.startswith("hours"))
    values = [float(v.rstrip("%")) for v in hours_line.split()[1:]]
    assert all(math.isfinite(v) for v in values) and values[0] > 0


def test_the_shipped_traces_replay_a_plan(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 1, epochs=10)
    for name in ("p3", "g4dn"):
        args = ["simulate", "--plan", str(plan), "--example-trace", name, "--runs", "30"]
        res = runner.invoke(app, [*args, "--json"])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        assert out["trace_hours"] > 10 and out["replayed"]["hours"] > 0


def test_replays_of_one_plan_are_seeded(tmp_path: Path) -> None:
    plan = _plan(tmp_path, 1)
    doc = Plan.from_dict(json.loads(plan.read_text()))
    from kplan.app import simulating

    trace = synthetic_trace(simulating.plan_risk(doc, None), pool=16, hours=200.0, seed=1)
    job = simulating.job_from_plan(doc)
    a = simulating.replay_plan(job, trace, runs=40, seed=3, samples=True)
    b = simulating.replay_plan(job, trace, runs=40, seed=3, samples=True)
    c = simulating.replay_plan(job, trace, runs=40, seed=4, samples=True)
    assert a.samples_hours == b.samples_hours and a.samples_cost_usd == b.samples_cost_usd
    assert not np.array_equal(a.samples_hours, c.samples_hours)
