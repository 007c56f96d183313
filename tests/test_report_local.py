"""Predicted vs actual for local runs, and the HTML report in a real browser (issue 12).

Fast tests: the local plan (``kplan/app/local_plan.py``) of a profile measured on a CPU
(``tests/data/mlp-regression.cpu.profile.json``, written by ``kplan profile --example
mlp-regression``), the launch request it becomes, and the HTML page of reports built here.
Slow tests: the README's local demo end to end, through the ``kplan`` command in subprocesses
(``kplan profile --example mlp-regression``, then ``kplan launch kplan/examples/mlp_regression.py
--nodes 2 --budget 1 --profile p.json``), whose ``kplan report --json`` must have a predicted
time and cost and their actuals, and whose HTML page headless Chromium must show with no
console error and every plot drawn (tests/chromium_cdp.py).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kplan.app import local_plan as local_plan_module
from kplan.app.launching import LaunchRequest, build_spec
from kplan.app.local_plan import local_plan
from kplan.app.planning import load_example, load_profile
from kplan.core.errors import InputError
from kplan.launcher.metrics_read import Metrics, StepStats
from kplan.launcher.report import (
    Comparison,
    InstanceSpend,
    JobReport,
    Preemption,
    plan_info,
)
from kplan.launcher.report_html import money, render_html
from kplan.planner.plan import Plan
from tests import chromium_cdp

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "tests" / "data" / "mlp-regression.cpu.profile.json"
SCRIPT = ROOT / "kplan" / "examples" / "mlp_regression.py"
KPLAN = Path(sys.executable).with_name("kplan")
CPU = {"cpu": "test CPU", "cores": 2, "gpus": []}


@pytest.fixture
def cpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine seen as a CPU-only one (the profile under test was measured on a CPU)."""
    monkeypatch.setattr(local_plan_module, "machine_facts", lambda: dict(CPU))


def test_local_plan_predicts_the_profiled_configuration_with_its_uncertainty() -> None:
    prof = load_profile(PROFILE)
    doc = local_plan(
        prof, nodes=2, workers_per_node=1, usd_per_hour=0.36, epochs=2, dataset_size=6000,
        facts=CPU,
    ).to_dict()  # fmt: skip
    row = doc["chosen"]
    assert (row["cloud"], row["instance_type"], row["nodes"], row["workers"]) == (
        "local", "local", 2, 2,
    )  # fmt: skip
    assert (row["global_batch"], row["local_batch"], row["steps"]) == (256, 128, 47)
    # The profile measured 2 workers at 128 samples each: the prediction is that measurement
    # within the fit's own error (two sigma).
    measured = next(
        m["step_time"]
        for m in json.loads(PROFILE.read_text())["measurements"]
        if (m["workers"], m["local_batch"]) == (2, 128)
    )
    sigma = doc["local"]["log_sigma"]
    assert 0 < sigma < 1
    assert abs(math.log(row["step_time_s"] / measured)) < 2 * sigma
    assert row["step_time_p90_s"] == pytest.approx(row["step_time_s"] * math.exp(1.2815516 * sigma))
    assert row["hours_p90"] > row["hours"] > 0
    train_s = row["steps"] * row["step_time_s"]
    end_s = local_plan_module.end_of(prof).seconds  # the exit, then the launcher's next tick
    assert row["hours"] * 3600 == pytest.approx(
        train_s + local_plan_module.LOCAL_START_S + end_s, rel=0.01
    )
    # billed per second at the machine's price; p90 priced the same way
    for usd, hours in ((row["cost_usd"], row["hours"]), (row["cost_p90_usd"], row["hours_p90"])):
        assert usd == pytest.approx(0.36 * math.ceil(hours * 3600 - 1e-6) / 3600)
    assert [g["usd_per_hour"] for g in row["groups"]] == [0.18]
    assert (
        "6,000 per epoch x 2 epochs; epochs: as given; samples per epoch: as given"
        in (doc["local"]["work"])
    )
    assert "+" in doc["uncertainty"] and "more workers" not in doc["uncertainty"]

    # More workers than the profile measured: the same machine, a wider band, said so.
    wide = local_plan(prof, nodes=4, workers_per_node=2, facts=CPU).to_dict()
    assert wide["local"]["log_sigma"] > sigma
    assert "more workers than the profile measured" in wide["uncertainty"]
    assert wide["chosen"]["cost_usd"] == 0.0 == wide["chosen"]["cost_p90_usd"]
    assert (
        "200,000 per epoch x 20 epochs; epochs: the profile's; the script's own are unknown"
        in (wide["local"]["work"])
    )
    assert any("the script's arguments state no --epochs" in n for n in wide["notes"])


def test_local_plan_refuses_a_profile_of_another_kind_of_device() -> None:
    with pytest.raises(InputError, match="measured on a CPU; a local job trains on this machine"):
        local_plan(load_profile(PROFILE), nodes=1, workers_per_node=1,
                   facts={**CPU, "gpus": ["NVIDIA A100-SXM4-80GB"]})  # fmt: skip
    gpu_profile = load_example("cifar10-resnet18")
    with pytest.raises(InputError, match="which has no GPU"):
        local_plan(gpu_profile, nodes=1, workers_per_node=1, facts=CPU)
    doc = local_plan(gpu_profile, nodes=1, workers_per_node=1, facts={**CPU, "gpus": ["Tesla T4"]})
    assert any("the prediction assumes the profile's device" in n for n in doc.notes) == (
        gpu_profile.gpu.lower() != "t4"
    )
    with pytest.raises(InputError, match="--precision bf16: the profile was measured in fp32"):
        local_plan(load_profile(PROFILE), nodes=1, workers_per_node=1, precision="bf16", facts=CPU)


def test_a_local_launch_with_a_profile_is_predicted_and_priced(
    cpu_machine: None, tmp_path: Path
) -> None:
    req = LaunchRequest(
        script=SCRIPT, budget_usd=1.0, profile=PROFILE, nodes=2, price_usd_per_hour=0.36,
        epochs=2, dataset_size=6000, job_id="kp-local-pred",
    )  # fmt: skip
    spec = build_spec(req)
    row = spec.plan.to_dict()["chosen"] if spec.plan else {}
    assert spec.cloud == "local" and row["cloud"] == "local"
    assert spec.predicted.hours == row["hours"] and spec.predicted.cost_usd == row["cost_usd"]
    assert spec.predicted.cost_p90_usd == row["cost_p90_usd"] > 0
    assert [n.usd_per_hour for n in spec.nodes] == [0.18, 0.18]  # the machine's price, shared
    assert spec.batch.global_batch == 256  # the batch predicted is the batch run
    # Free without --price; the plan file form of the same prediction runs the same job.
    free = build_spec(replace(req, price_usd_per_hour=None))
    assert free.predicted.cost_usd == 0.0 and all(n.usd_per_hour == 0 for n in free.nodes)
    plan = tmp_path / "local.plan.json"
    plan.write_text(json.dumps(spec.plan.to_dict() if spec.plan else None))
    again = build_spec(LaunchRequest(script=SCRIPT, budget_usd=1.0, plan_file=plan))
    assert again.cloud == "local" and len(again.nodes) == 2
    assert again.predicted.hours == spec.predicted.hours
    assert [n.usd_per_hour for n in again.nodes] == [0.0, 0.0]  # no --price given
    with pytest.raises(InputError, match="the local plan was priced at"):
        build_spec(LaunchRequest(script=SCRIPT, budget_usd=1.0, plan_file=plan,
                                 price_usd_per_hour=1.0))  # fmt: skip
    # Without a profile or a plan a local job runs unpredicted, as before.
    bare = build_spec(LaunchRequest(script=SCRIPT, budget_usd=1.0, nodes=2))
    assert bare.plan is None and bare.predicted.hours is None


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"price_usd_per_hour": math.nan}, "--price=nan must be a finite number"),
        ({"price_usd_per_hour": -1.0}, "--price=-1 must be >= 0"),
        ({"price_usd_per_hour": math.inf}, "--price=inf must be a finite number"),
        ({"epochs": 0.0}, "--epochs=0 must be > 0"),
        ({"dataset_size": 0}, "--dataset-size=0 must be >= 1"),
        ({"profile": None, "epochs": 5.0}, "only for a plan made now"),
        ({"profile": None, "example_profile": "mlp-regression"}, "kplan profile --example"),
    ],
)
def test_local_prediction_flags_are_checked(
    cpu_machine: None, change: dict[str, Any], match: str
) -> None:
    req = LaunchRequest(script=SCRIPT, budget_usd=1.0, profile=PROFILE, nodes=2)
    with pytest.raises(InputError, match=match):
        build_spec(replace(req, **change))


def _report(**kw: Any) -> JobReport:
    """A report of a finished two-node job (synthetic metrics: 200 steps, one preemption)."""
    t0 = 1_795_000_000.0
    steps = [(i, 0.05 + 0.01 * (i % 7) / 7) for i in range(200)]
    saved = Plan.from_dict(json.loads((ROOT / "tests/fixtures/plan_v1_local.json").read_text()))
    plan = replace(
        saved, profile="mlp-regression", reason="local: test",
        uncertainty="step time p90 is +31%", notes=(),
    )  # fmt: skip
    spend = [
        InstanceSpend(f"i-{r}", r, "local", "on-demand", "local", 0.18, "terminated", None,
                      t0 + 1, t0 + 60, 59.0, 0.18 * 59 / 3600, True, None)
        for r in (0, 1)
    ]  # fmt: skip
    base = JobReport(
        id="kp-html-unit", status="succeeded", reason="every node finished", cloud="local",
        region="local", script=str(SCRIPT), command=f"python {SCRIPT} --epochs 2", workers=2,
        plan=plan_info(plan), created_at=t0, ended_at=t0 + 61, budget_usd=1.0, deadline_h=None,
        actual_hours=61 / 3600, total_usd=sum(s.usd for s in spend), billed_seconds=118.0,
        predicted_hours=0.015, predicted_hours_p90=0.018, predicted_cost_usd=0.0054,
        predicted_cost_p90_usd=0.0065, predicted_step_s=0.05, predicted_step_p90_s=0.065,
        predicted_steps=200, predicted_train_s=10.0, predicted_train_p90_s=13.0,
        predicted_start_s=10.0, actual_start_s=20.0, actual_train_s=12.0, instances=spend,
        by_instance={s.instance: s.usd for s in spend}, by_market={"on-demand": 0.0059},
        by_zone={"local": 0.0059},
        cost_curve=[(t0 + 1, 0.0), (t0 + 30, 0.003), (t0 + 60, sum(s.usd for s in spend))],
        preemptions=[Preemption(t0 + 35, "preempted", 1, "i-1", "spot interruption", 2.0, 5.0,
                                0.36, 0.0007, "i-2", 4.0, 0.0002)],
        on_demand=Comparison(None, None, "n/a: local instances have no on-demand price"),
        naive=Comparison(None, None, "n/a: a local job has no cloud to plan on"),
        metrics=Metrics(
            note="synthetic", steps=200, step_time=StepStats(200, 0.054, 0.055, 0.059),
            step_times=steps, global_batch=[(i, 256) for i in range(200)],
            local_batch={0: [(0, 128), (50, 140)], 1: [(0, 128), (50, 116)]},
            gns=[(i, 300.0 + i) for i in range(0, 200, 10)],
            loss=[(i, 1.0 / (1 + i / 20)) for i in range(200)],
            throughput=[(i, 256 / t) for i, t in steps],
            step_clock=[(i, t0 + 20 + 0.06 * i) for i in range(200)],
            first_step_time=t0 + 20, last_step_time=t0 + 32, samples=51200.0, epochs=2.0,
            dataset_size=6000,
        ),
    )  # fmt: skip
    return replace(base, **kw)


def test_html_report_page_says_what_ran_where_and_when() -> None:
    pytest.importorskip("matplotlib")
    page = render_html([_report()])
    assert "this machine (local)" in page and "local local" not in page
    assert f"python {SCRIPT} --epochs 2" in page
    assert "started</span>2026-11-18 11:06:40 UTC" in page  # created_at 1_795_000_000
    assert "ended</span>2026-11-18 11:07:41 UTC" in page
    assert "2 x local (on-demand, local, 1 x cpu); global batch 256, 128 per worker" in page
    titles = ["Spend against the budget", "Step time: predicted vs measured", "Throughput",
              "Training loss", "Per-worker batch sizes", "Gradient noise scale"]  # fmt: skip
    for title in titles:
        assert f"<figcaption>{title}</figcaption>" in page
    assert page.count('src="data:image/png;base64,') == len(titles)
    assert "<td>preempted</td>" in page and "spot interruption" in page
    assert "http://" not in page and "https://" not in page and "<script" not in page
    free = render_html([_report(total_usd=0.0, predicted_cost_usd=0.0, predicted_cost_p90_usd=0.0,
                                instances=[], cost_curve=[])])  # fmt: skip
    assert "Spend against the budget: free" in free and "budget</span>$1.00" in free
    unbudgeted = render_html([_report(total_usd=0.0, predicted_cost_usd=0.0, instances=[],
                                      predicted_cost_p90_usd=0.0, budget_usd=0.0)])  # fmt: skip
    assert "budget</span>none" in unbudgeted and ": free</figcaption>" in unbudgeted


def test_money_reads_like_money() -> None:
    assert [money(x) for x in (1.0, 1234.5, 0.0, 0.25, 0.007404, 0.0000123, None)] == [
        "$1.00", "$1,234.50", "$0.00", "$0.250", "$0.00740", "$0.000012", "n/a",
    ]  # fmt: skip


needs_chromium = pytest.mark.skipif(
    chromium_cdp.chromium() is None,
    reason=f"no chromium binary on PATH (install it: {chromium_cdp.INSTALL})",
)


@needs_chromium
def test_the_chromium_check_sees_console_errors_and_broken_images(tmp_path: Path) -> None:
    """The browser check can fail: a console error and an image that does not decode."""
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><head><link rel='icon' href='data:,'></head><body>"
        "<img src='data:image/png;base64,AAAA'><script>console.error('boom')</script></body></html>"
    )
    check = chromium_cdp.check_page(page, tmp_path / "bad.png")
    assert any("boom" in e for e in check.console_errors), check
    assert [i["naturalWidth"] for i in check.images] == [0]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The README's local demo: profile the script (20,000 samples, 1 epoch), launch it with the
    profile for that epoch (free); --budget, --check-interval and --job-id only for the test."""
    from tests.test_provider_local import kill_leftovers

    home = tmp_path_factory.mktemp("kplan-demo")
    env = {**os.environ, "KPLAN_HOME": str(home), "OMP_NUM_THREADS": "1", "COLUMNS": "120"}
    profile = home / "mlp.profile.json"
    job = "kp-rep-demo"
    try:
        subprocess.run(
            [str(KPLAN), "profile", str(SCRIPT), "--dataset-size", "20000", "--base-batch", "256",
             "--out", str(profile)],
            env=env, check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        done = subprocess.run(
            [str(KPLAN), "launch", str(SCRIPT), "--nodes", "2", "--budget", "1", "--profile",
             str(profile), "--check-interval", "0.5", "--job-id", job, "--quiet", "--",
             "--epochs", "1"],
            env=env, capture_output=True, timeout=300, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        yield home, job
    finally:
        kill_leftovers(home)


def _kplan(home: Path, *args: str) -> str:
    env = {**os.environ, "KPLAN_HOME": str(home), "COLUMNS": "120"}
    done = subprocess.run([str(KPLAN), *args], env=env, capture_output=True, text=True, check=False,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_local_demo_report_has_predicted_and_actual_time_and_cost(
    demo: tuple[Path, str],
) -> None:
    home, job = demo
    doc = json.loads(_kplan(home, "report", job, "--json"))
    for key in ("predicted_hours", "predicted_hours_p90", "predicted_cost_usd",
                "predicted_cost_p90_usd", "predicted_step_s", "predicted_step_p90_s",
                "actual_hours", "total_usd", "actual_start_s", "actual_train_s"):  # fmt: skip
        value = doc[key]
        assert isinstance(value, float) and math.isfinite(value), (key, value)
    assert doc["predicted_hours_p90"] > doc["predicted_hours"] > 0 < doc["actual_hours"]
    assert doc["predicted_step_p90_s"] > doc["predicted_step_s"] > 0
    assert doc["predicted_cost_usd"] == 0.0 == doc["total_usd"]  # free: no --price
    assert doc["plan"]["profile"] == "mlp_regression"
    assert "20,000 per epoch x 1 epoch; epochs: the script's --epochs" in doc["plan"]["work"]
    # The runtime trains whole batches: 6000 // 256 steps per epoch; the plan rounds up.
    assert doc["predicted_steps"] == 79 and doc["metrics"]["steps"] == 20000 // 256
    assert doc["metrics"]["loss"] and doc["metrics"]["throughput"]
    text = _kplan(home, "report", job)
    for label in ("│ time ", "│ cost ", "│ step time (s)"):
        line = next(x for x in text.splitlines() if label in x)
        assert "n/a" not in line, line
    assert "on this machine (local)" in text and "local local" not in text


@pytest.mark.slow
@needs_chromium
def test_local_demo_html_report_in_chromium(demo: tuple[Path, str]) -> None:
    pytest.importorskip("matplotlib")
    home, job = demo
    page = home / "report.html"
    _kplan(home, "report", job, "--html", str(page))
    check = chromium_cdp.check_page(page, home / "report.png")
    assert check.console_errors == []
    assert check.title == f"kplan report: {job}"
    assert len(check.images) >= 5  # spend, step time, throughput, loss, batches (+ GNS)
    for img in check.images:
        assert img["complete"] and img["naturalWidth"] > 0 and img["naturalHeight"] > 0, img
        assert img["width"] > 900, img  # full width of a 1280 px window
    assert all(u.startswith(("file://", "data:")) for u in check.requests), check.requests
    shot = home / "report.png"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height = int.from_bytes(shot.read_bytes()[20:24], "big")
    assert height > 2000  # the whole page, not the first screen


def test_a_local_launch_says_its_prediction_first(
    cpu_machine: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from kplan.cli.main import app

    monkeypatch.setenv("KPLAN_HOME", str(tmp_path))
    argv = ["launch", str(SCRIPT), "--nodes", "2", "--budget", "1", "--profile", str(PROFILE),
            "--epochs", "2", "--dataset-size", "6000", "--price", "0.36", "--dry-run"]  # fmt: skip
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("predicted on this machine: ") and " x 47 steps; " in first, first
    assert "(p90 " in first and "$" in first and "6,000 per epoch x 2 epochs" in first
    quiet = CliRunner().invoke(app, [*argv[:-1], "--json", "--dry-run"])
    assert quiet.exit_code == 0 and "predicted on this machine" not in quiet.output
