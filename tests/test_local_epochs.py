"""Issue 25, item 5: a local launch predicts the epochs the script will run (its own `--epochs`
after `--`, the kplan examples' convention) or says it cannot know them; its start is an
assumption with a wide sigma, said so. Before: the README's `-- --epochs 3` launch was predicted
for the profile's 1 epoch (63 steps against the 186 it ran) and a 10 s start with no spread."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kplan.app import local_plan as lp
from kplan.app.launching import LaunchRequest, build_spec
from kplan.app.planning import load_profile
from kplan.launcher.jobspec import LOCAL_CHECK_INTERVAL_S
from kplan.planner import costs

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "tests" / "data" / "mlp-regression.cpu.profile.json"
SCRIPT = ROOT / "kplan" / "examples" / "mlp_regression.py"
CPU: lp.MachineFacts = {"cpu": "test CPU", "cores": 2, "gpus": []}


@pytest.mark.parametrize(
    ("args", "epochs"),
    [
        (("--epochs", "3"), 3.0),
        (("--epochs=2.5", "--lr", "1e-3"), 2.5),
        (("--epochs", "3", "--epochs", "4"), 4.0),  # argparse: the last one wins
        (("--lr", "1e-3"), None),
        ((), None),
        (("--epochs",), None),  # no value: the script will fail on it, not predicted
        (("--epochs", "many"), None),
        (("--epochs", "0"), None),
        (("--", "--epochs", "3"), None),  # a positional after --: not the flag
    ],
)
def test_script_epochs_reads_the_scripts_own_flag(
    args: tuple[str, ...], epochs: float | None
) -> None:
    assert lp.script_epochs(args) == epochs


def _plan(**kw: object) -> dict[str, object]:
    prof = load_profile(PROFILE)
    base = {"nodes": 2, "workers_per_node": 1, "dataset_size": 20000, "facts": CPU}
    return lp.local_plan(prof, **{**base, **kw}).to_dict()  # type: ignore[arg-type]


def test_the_scripts_epochs_are_predicted() -> None:
    one = _plan(script_args=("--epochs", "1"))["chosen"]
    three = _plan(script_args=("--epochs", "3"))
    assert one["steps"] == math.ceil(20000 / 256)  # 79
    assert three["chosen"]["steps"] == math.ceil(3 * 20000 / 256)  # 235 (before: 79)
    assert "x 3 epochs; epochs: the script's --epochs" in three["local"]["work"]
    assert not three["notes"]


def test_kplan_epochs_that_disagree_with_the_script_are_noted() -> None:
    doc = _plan(epochs=5, script_args=("--epochs", "3"))
    assert "x 3 epochs" in doc["local"]["work"]
    assert any("the script's arguments say --epochs 3: predicted for 3" in n for n in doc["notes"])
    given = _plan(epochs=5)
    assert "x 5 epochs; epochs: as given" in given["local"]["work"] and not given["notes"]


def test_unknown_script_epochs_are_said_to_be_unknown() -> None:
    doc = _plan(script_args=("--lr", "1e-3"))
    assert "the script's own are unknown" in doc["local"]["work"]
    assert any("which kplan cannot know" in n for n in doc["notes"])


def test_the_assumed_start_carries_a_wide_p90_and_says_it_is_assumed() -> None:
    doc = _plan(script_args=("--epochs", "1"))
    row = doc["chosen"]
    start_p90 = lp.LOCAL_START_S * math.exp(costs.Z90 * lp.LOCAL_START_LOG_SIGMA)
    assert start_p90 > 3 * lp.LOCAL_START_S
    train_p90 = row["steps"] * row["step_time_p90_s"]
    end = lp.end_of(load_profile(PROFILE))  # the test profile measured no exit: assumed
    assert "the exit assumed" in end.basis and end.p90_s > end.seconds
    assert row["hours_p90"] * 3600 >= train_p90 + start_p90 + end.p90_s - 1e-6
    assert row["hours"] * 3600 == pytest.approx(
        row["steps"] * row["step_time_s"] + lp.LOCAL_START_S + end.seconds, rel=0.01
    )
    assert "is assumed, not measured" in doc["uncertainty"]


def test_a_launch_predicts_the_epochs_after_the_double_dash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lp, "machine_facts", lambda: dict(CPU))
    req = LaunchRequest(
        script=SCRIPT, budget_usd=0.0, profile=PROFILE, nodes=2, args=("--epochs", "3"),
        dataset_size=20000, job_id="kp-local-epochs",
    )  # fmt: skip
    plan = build_spec(req).plan
    assert plan is not None
    assert plan.chosen.steps == math.ceil(3 * 20000 / 256)


def test_a_start_the_profile_measured_is_used_and_said_so() -> None:
    from dataclasses import replace

    from kplan.planner.profile import profile_from_dict, profile_to_dict

    prof = replace(load_profile(PROFILE), startup_s=20.0, shutdown_s=1.5)
    again = profile_from_dict(profile_to_dict(prof), "round trip")
    assert again.startup_s == 20.0 and again.shutdown_s == 1.5 and again == prof
    # one group starts at once; with several, the others at the launcher's next tick
    assert lp.start_of(prof, nodes=1).seconds == 20.0
    start = lp.start_of(prof, nodes=2)
    assert start.seconds == 20.0 + LOCAL_CHECK_INTERVAL_S
    assert start.log_sigma == lp.MEASURED_START_LOG_SIGMA < lp.LOCAL_START_LOG_SIGMA
    end = lp.end_of(prof)  # the measured exit, then the launcher's next tick (half expected)
    assert end.seconds == 1.5 + LOCAL_CHECK_INTERVAL_S / 2
    assert end.p90_s == pytest.approx(
        1.5 * math.exp(costs.Z90 * lp.MEASURED_START_LOG_SIGMA) + 0.9 * LOCAL_CHECK_INTERVAL_S
    )
    doc = lp.local_plan(
        prof, nodes=2, workers_per_node=1, dataset_size=20000, facts=CPU,
        script_args=("--epochs", "1"),
    ).to_dict()  # fmt: skip
    row = doc["chosen"]
    assert doc["local"]["start_s"] == start.seconds
    assert row["hours"] * 3600 == pytest.approx(
        row["steps"] * row["step_time_s"] + start.seconds + end.seconds, rel=0.01
    )
    assert "measured by the profile (20 s)" in doc["uncertainty"]
    assert "the exit measured by the profile (1.5 s)" in doc["uncertainty"]
    p90 = row["steps"] * row["step_time_p90_s"] + start.p90_s + end.p90_s
    assert row["hours_p90"] * 3600 >= p90 - 1e-6


def test_a_cloud_launch_plans_the_epochs_after_the_double_dash(tmp_path: Path) -> None:
    """`kplan launch --cloud aws --profile p.json -- --epochs 3` plans the 3 epochs the script
    will run, read as the local launch reads them (before: the profile's, the script's ignored)."""
    from dataclasses import replace

    from kplan.app.launching import LaunchRequest, PlanPins, plan_now

    req = LaunchRequest(
        script=SCRIPT, budget_usd=0.0, cloud="aws", profile=PROFILE, dataset_size=20000,
        pins=PlanPins(instance_types=("g4dn.xlarge",), plan_nodes="1", global_batch=256),
    )  # fmt: skip
    one = plan_now(replace(req, args=("--epochs", "1")), "aws").chosen
    three = plan_now(replace(req, args=("--lr", "1e-3", "--epochs=3")), "aws")
    assert three.chosen.samples == pytest.approx(3 * one.samples)
    assert three.chosen.steps == pytest.approx(3 * one.steps, abs=2)
    disagree = plan_now(replace(req, args=("--epochs", "3"), epochs=5.0), "aws")
    assert disagree.chosen.samples == pytest.approx(three.chosen.samples)
    assert any("the script's arguments say --epochs 3" in n for n in disagree.notes)
    unknown = plan_now(req, "aws")  # no --epochs anywhere: the profile's, and said so
    assert unknown.chosen.samples == pytest.approx(load_profile(PROFILE).epochs * one.samples)
    assert any("which kplan cannot know" in n for n in unknown.notes)
