"""Issue 15, item 4: the user pins the question (instance type, node count or range, global
batch or its cap, --fixed-batch, precision), and `kplan model predict` answers rows that name
another GPU by transferring the model (with the transfer's sigma) or rejects them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.core.errors import DataFileError
from kplan.planner.plan import Plan

runner = CliRunner()
EST = ["estimate", "--example", "imagenet-resnet50", "--json"]


def _plan(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, [*EST, *args])
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.output)
    return doc


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [doc["chosen"], *doc["plans"], *doc["frontier"]]


def test_acceptance_pinned_type_nodes_and_precision() -> None:
    doc = _plan("--instance-type", "p3.16xlarge", "--nodes", "4", "--precision", "fp16")
    assert doc["precision"] == "fp16"
    assert doc["precision_basis"] == "projected from the profile's fp32"
    for r in _rows(doc):
        assert (r["instance_type"], r["nodes"], r["precision"]) == ("p3.16xlarge", 4, "fp16")
        assert r["workers"] == 32 and r["gpu"] == "V100"


def test_profile_precision_is_the_default_and_is_measured() -> None:
    doc = _plan("--top", "3")
    assert (doc["precision"], doc["precision_basis"]) == ("fp32", "measured")
    assert {r["precision"] for r in _rows(doc)} == {"fp32"}


def test_projected_precision_is_less_certain_than_measured() -> None:
    pin = ("--instance-type", "p3.16xlarge", "--nodes", "2", "--global-batch", "1600")
    same = _plan(*pin)["chosen"]
    other = _plan(*pin, "--precision", "bf16")["chosen"]
    spread = [r["step_time_p90_s"] / r["step_time_s"] for r in (same, other)]
    assert spread[1] > spread[0]


def test_exact_nodes_is_exact_and_a_range_stays_in_range() -> None:
    capped = _plan("--max-nodes", "8")
    assert all(r["nodes"] <= 8 for r in _rows(capped))
    assert {r["nodes"] for r in _rows(_plan("--nodes", "8"))} == {8}  # before: a cap (7)
    ranged = _rows(_plan("--nodes", "2-8", "--top", "20"))
    assert all(2 <= r["nodes"] <= 8 for r in ranged)


def test_global_batch_pin_and_cap() -> None:
    pinned = _rows(_plan("--global-batch", "1024", "--nodes", "2"))
    assert {r["global_batch"] for r in pinned} == {1024}
    default_top = max(r["global_batch"] for r in _rows(_plan()))
    assert default_top <= 32 * 200  # the old cap: 32 x B0
    lifted = _plan("--max-global-batch", "51200", "--top", "30")
    assert max(r["global_batch"] for r in _rows(lifted)) > 32 * 200
    assert max(r["global_batch"] for r in _rows(lifted)) <= 51200
    low = _plan("--max-global-batch", "400")
    assert max(r["global_batch"] for r in _rows(low)) <= 400


def test_fixed_batch_keeps_b0_and_a_sane_per_gpu_batch() -> None:
    doc = _plan("--fixed-batch", "--top", "30")
    for r in _rows(doc):
        assert r["global_batch"] == 200
        assert r["global_batch"] / (r["workers"] * r["accum_steps"]) >= 8
    # before: B0 on 128 GPUs (local batch 2) could be planned; now too many GPUs is infeasible
    result = runner.invoke(app, [*EST, "--fixed-batch", "--nodes", "16", "-t", "p3.16xlarge"])
    assert result.exit_code == 2
    assert "too small for 16 x p3.16xlarge (128 GPUs x 8 samples each)" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "0"], "--nodes 0 is outside 1..1024"),
        (["--nodes", "8-2"], "low end 8 is above the high end 2"),
        (["--nodes", "abc"], "not a node count or range"),
        (["--nodes", "4", "--max-nodes", "8"], "not both"),
        (["--global-batch", "0"], "--global-batch=0 must be >= 1"),
        (["--global-batch", "nan"], "Invalid value"),
        (["--max-global-batch", "0"], "--max-global-batch=0 must be >= 1"),
        (["--global-batch", "64", "--fixed-batch"], "at most one of"),
        (["--precision", "fp8"], "'fp8' is not a precision"),
        (["--instance-type", "nope"], "unknown instance type 'nope'"),
        (["--instance-type", "p3.16xlarg"], "did you mean p3.16xlarge"),
        (["-t", "p3.16xlarge", "--nodes", "8", "--global-batch", "16"], "too small for 8 x"),
        (["-t", "p3.16xlarge", "--nodes", "1", "--global-batch", "100000"], "does not fit"),
    ],
)
def test_bad_pins_exit_2_with_one_line_and_a_hint(args: list[str], message: str) -> None:
    result = runner.invoke(app, [*EST, *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    if "Invalid value" not in message:  # click's own usage error otherwise
        lines = [ln for ln in result.output.splitlines() if ln.strip()]
        assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint:")


def test_table_states_the_precision() -> None:
    result = runner.invoke(
        app, ["estimate", "-e", "imagenet-resnet50", "--top", "1", "--precision", "bf16"]
    )
    assert result.exit_code == 0, result.output
    assert "bf16" in result.output and "projected" in result.output


# --- kplan model predict: rows naming another device ---------------------------------------


@pytest.fixture
def t4_model(tmp_path: Path) -> Path:
    root = Path(__file__).resolve().parents[1]
    doc = json.loads((root / "kplan/planner/examples/imagenet-resnet50.json").read_text())
    assert doc["fit"]["gpu"] == "T4"
    path = tmp_path / "model.json"
    path.write_text(json.dumps(doc["fit"]))
    return path


def _predict(model: Path, tmp_path: Path, csv: str) -> list[dict[str, Any]]:
    c = tmp_path / "c.csv"
    c.write_text(csv)
    result = runner.invoke(app, ["model", "predict", "--model", str(model), "-c", str(c), "--json"])
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.output)
    return rows


def test_predict_transfers_rows_naming_another_gpu(t4_model: Path, tmp_path: Path) -> None:
    from kplan.app.modelio import load_model
    from kplan.catalogs.current import load_current
    from kplan.catalogs.device_model import load_device_model
    from kplan.planner import perfmodel
    from kplan.planner.devices import compute_scale

    rows = _predict(
        t4_model,
        tmp_path,
        "nodes,workers,local_batch,gpu,instance_type\n"
        "1,4,64,,\n1,4,64,T4,\n1,4,64,V100,\n1,8,64,,p3.16xlarge\n1,4,64,,g4dn.12xlarge\n",
    )
    own, same, v100, p3, g4 = rows
    assert own["step_time"] == same["step_time"] and same["transferred_from"] == ""
    model = load_model(t4_model)
    assert own["step_time_log_sigma"] == pytest.approx(model.log_sigma)
    # Before: the V100 row got the T4's time. Now: the device model's transfer, wider sigma.
    cat = load_current()
    speed = compute_scale(load_device_model(), cat.gpus["T4"], cat.gpus["V100"])
    assert v100["transferred_from"] == "T4"
    # the device part scales by the factor, the fixed per-step part compute_a by
    # factor**fixed_exponent (less): the device model's held-out fit
    gamma = load_device_model().fixed_exponent
    assert 0.0 <= gamma < 1.0
    moved = perfmodel.transfer(model, compute_factor=speed.factor, fixed_factor=speed.factor**gamma)
    assert v100["compute_time"] == pytest.approx(
        model.compute_a * speed.factor**gamma + model.compute_b * 64 * speed.factor, rel=1e-6
    )
    assert v100["compute_time"] == pytest.approx(
        float(perfmodel.compute_time(moved, [64])[0]), rel=1e-6
    )
    assert v100["step_time"] != pytest.approx(own["step_time"])
    assert v100["step_time_log_sigma"] == pytest.approx(
        math.hypot(model.log_sigma, speed.log_sigma)
    )
    assert v100["step_time_p90"] == pytest.approx(
        v100["step_time"] * math.exp(1.2815515655446004 * v100["step_time_log_sigma"])
    )
    assert p3["transferred_from"] == "T4" and p3["compute_time"] == pytest.approx(
        v100["compute_time"]
    )
    assert g4["transferred_from"] == "T4"  # the model's GPU on the catalog's links
    assert g4["compute_time"] == pytest.approx(own["compute_time"])


@pytest.mark.parametrize(
    ("csv", "message"),
    [
        ("nodes,workers,local_batch,gpu\n1,4,64,Z99\n", "unknown GPU 'Z99'"),
        ("nodes,workers,local_batch,instance_type\n1,4,64,p3.16xlarg\n", "did you mean"),
        ("nodes,workers,local_batch,gpu,instance_type\n1,4,64,T4,p3.16xlarge\n", "not T4"),
    ],
)
def test_predict_rejects_rows_it_cannot_transfer(
    t4_model: Path, tmp_path: Path, csv: str, message: str
) -> None:
    c = tmp_path / "c.csv"
    c.write_text(csv)
    result = runner.invoke(app, ["model", "predict", "--model", str(t4_model), "-c", str(c)])
    assert result.exit_code == 2, result.output
    assert message in result.output and "line 2" in result.output


def test_predict_rejects_another_gpu_when_the_model_names_none(tmp_path: Path) -> None:
    doc = json.loads(
        (
            Path(__file__).resolve().parents[1] / "kplan/planner/examples/imagenet-resnet50.json"
        ).read_text()
    )["fit"]
    doc.pop("gpu")
    model = tmp_path / "m.json"
    model.write_text(json.dumps(doc))
    c = tmp_path / "c.csv"
    c.write_text("nodes,workers,local_batch,gpu\n1,4,64,V100\n")
    result = runner.invoke(app, ["model", "predict", "--model", str(model), "-c", str(c)])
    assert result.exit_code == 2, result.output
    assert "does not say which GPU" in result.output


# --- kplan launch: the same pins where it plans now ----------------------------------------


def test_launch_plans_now_with_the_pins(tmp_path: Path) -> None:
    from kplan.app.launching import LaunchRequest, PlanPins, plan_now

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    req = LaunchRequest(
        script=script,
        budget_usd=5000.0,
        cloud="aws",
        example_profile="imagenet-resnet50",
        pins=PlanPins(instance_types=("p3.16xlarge",), plan_nodes="4", global_batch=1600),
        precision="fp16",
    )
    doc = plan_now(req, "aws").to_dict()
    assert doc["precision"] == "fp16"
    for r in _rows(doc):
        assert (r["instance_type"], r["nodes"], r["global_batch"], r["precision"]) == (
            "p3.16xlarge",
            4,
            1600,
            "fp16",
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--global-batch", "64"], "only for a plan made now"),  # a local job plans nothing
        (["--precision", "fp8"], "not a precision"),  # a local job trains in --precision
        (["--cloud", "aws", "--example-profile", "imagenet-resnet50", "--plan-nodes", "9-3"],
         "--plan-nodes 9-3"),
        (["--cloud", "aws", "--example-profile", "imagenet-resnet50", "--precision", "fp8"],
         "not a precision"),
        (["--cloud", "aws", "--example-profile", "imagenet-resnet50", "--instance-type",
          "nope", "--plan-nodes", "2"], "unknown instance type"),
    ],
)  # fmt: skip
def test_launch_bad_pins(tmp_path: Path, args: list[str], message: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    result = runner.invoke(app, ["launch", str(script), "--budget", "50", *args, "--dry-run"])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_the_plan_precision_reaches_the_workers(tmp_path: Path) -> None:
    """A plan made for fp16 launches workers that train in fp16 (KPLAN_PRECISION in the
    user-data's exports); a local job trains in --precision; an old plan without one in fp32."""
    from kplan.app.launching import LaunchRequest, PlanPins, build_spec, spec_from_plan
    from kplan.launcher.bootstrap import worker_env

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    req = LaunchRequest(
        script=script,
        budget_usd=5000.0,
        cloud="aws",
        example_profile="imagenet-resnet50",
        pins=PlanPins(instance_types=("p3.16xlarge",), plan_nodes="2"),
        precision="fp16",
        storage_uri="s3://bucket/kplan",
    )
    spec = build_spec(req)
    assert spec.training.precision == "fp16"
    assert worker_env(spec, "/opt/kplan")["KPLAN_PRECISION"] == "fp16"
    local = build_spec(LaunchRequest(script=script, budget_usd=0.0, precision="bf16"))
    assert (
        local.training.precision == "bf16" and worker_env(local, "/x")["KPLAN_PRECISION"] == "bf16"
    )
    assert build_spec(LaunchRequest(script=script, budget_usd=0.0)).training.precision == "fp32"
    assert spec.plan is not None
    old = spec.plan.to_dict()
    chosen = {k: v for k, v in old["chosen"].items() if k != "precision"}
    legacy = {k: v for k, v in old.items() if k != "precision"} | {"chosen": chosen}
    plain = LaunchRequest(script=script, budget_usd=5000.0, cloud="aws")
    assert spec_from_plan(plain, Plan.from_dict(legacy), "aws").training.precision == "fp32"
    bad = legacy | {"chosen": chosen | {"precision": "fp8"}}
    with pytest.raises(DataFileError, match="precision 'fp8' is not one of"):
        Plan.from_dict(bad)


def test_launch_compression_and_sync_policy_reach_the_workers(tmp_path: Path) -> None:
    """kplan launch --compression pins the plan it makes now (the chosen row runs it) and a local
    job's workers; --sync-policy reaches the workers on either (issue 14)."""
    from kplan.app.launching import LaunchRequest, PlanPins, build_spec
    from kplan.launcher.bootstrap import worker_env

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    req = LaunchRequest(
        script=script,
        budget_usd=5000.0,
        cloud="aws",
        example_profile="imagenet-resnet50",
        pins=PlanPins(instance_types=("p3.16xlarge",), plan_nodes="2"),
        compression="powersgd:4",
        sync_policy="selective:0.01:8",
        storage_uri="s3://bucket/kplan",
    )
    spec = build_spec(req)
    assert spec.plan is not None and spec.plan.chosen.compression == "powersgd:4"
    env = worker_env(spec, "/opt/kplan")
    assert env["KPLAN_COMPRESSION"] == "powersgd:4"
    assert env["KPLAN_SYNC_POLICY"] == "selective:0.01:8"
    local = build_spec(LaunchRequest(script=script, budget_usd=0.0, compression="topk:0.01:ag"))
    local_env = worker_env(local, "/x")
    assert local_env["KPLAN_COMPRESSION"] == "topk:0.01:ag"
    assert "KPLAN_SYNC_POLICY" not in local_env  # the default (every) is not exported
    dense = worker_env(build_spec(LaunchRequest(script=script, budget_usd=0.0)), "/x")
    assert "KPLAN_COMPRESSION" not in dense
