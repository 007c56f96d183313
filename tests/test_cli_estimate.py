"""`kplan estimate` and `kplan model` through typer's CliRunner: success and every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app

runner = CliRunner()


def _ok(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.output


def _bad(args: list[str], code: int = 2) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("error: "), result.output
    return result.output


def test_estimate_example_json_contract() -> None:
    doc = json.loads(_ok(["estimate", "--example", "imagenet-resnet50", "--json", "--top", "5"]))
    assert set(doc) >= {"chosen", "plans", "frontier"}
    need = {
        "cloud",
        "region",
        "instance_type",
        "market",
        "nodes",
        "workers",
        "local_batch",
        "global_batch",
        "step_time_s",
        "steps",
        "hours",
        "cost_usd",
        "cost_p90_usd",
    }
    for row in [doc["chosen"], *doc["plans"], *doc["frontier"]]:
        assert need <= set(row)
        assert row["cost_usd"] >= 0 and row["cost_p90_usd"] >= row["cost_usd"] - 1e-9
    assert doc["chosen"] == doc["plans"][0]
    assert len(doc["plans"]) <= 5


def test_estimate_table_output_and_filters() -> None:
    out = _ok(
        ["estimate", "-e", "cifar10-resnet18", "--cloud", "gcp", "--on-demand", "--max-nodes", "8"]
    )
    assert "frontier" in out and "chosen:" in out and "uncertainty" in out
    doc = json.loads(
        _ok(["estimate", "-e", "bert-squad", "--gpu", "A100", "--spot", "--no-mixed", "--json"])
    )
    assert all(p["gpu"].startswith("A100") and p["market"] == "spot" for p in doc["plans"])


def test_budget_and_deadline_are_applied() -> None:
    doc = json.loads(
        _ok(
            [
                "estimate",
                "-e",
                "imagenet-resnet50",
                "--objective",
                "time",
                "--budget",
                "200",
                "--json",
            ]
        )
    )
    assert doc["chosen"]["cost_p90_usd"] <= 200
    doc = json.loads(_ok(["estimate", "-e", "imagenet-resnet50", "--deadline", "12", "--json"]))
    assert doc["chosen"]["hours_p90"] <= 12


def test_estimate_profile_without_fit_is_fitted(tmp_path: Path) -> None:
    from kplan.app import planning
    from kplan.planner.profile import profile_to_dict

    doc = profile_to_dict(planning.load_example("deepspeech2"))
    with_fit = json.loads(_ok(["estimate", "-e", "deepspeech2", "--json", "--no-mixed"]))
    doc.pop("fit")
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    refit = json.loads(_ok(["estimate", "--profile", str(path), "--json", "--no-mixed"]))
    a, b = with_fit["chosen"], refit["chosen"]
    assert (a["instance_type"], a["nodes"]) == (b["instance_type"], b["nodes"])
    assert b["step_time_s"] == pytest.approx(a["step_time_s"], rel=1e-3)


def test_estimate_writes_plan_file(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    _ok(["estimate", "-e", "yolov3", "--out", str(out), "--json"])
    assert json.loads(out.read_text())["schema"] == "kplan.plan/2.1"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["estimate", "--example", "nope"], "unknown example"),
        (["estimate"], "exactly one of --example or --profile"),
        (["estimate", "-e", "yolov3", "--gpu", "Z100"], "unknown GPU"),
        (["estimate", "-e", "yolov3", "--region", "mars-north-1"], "unknown region"),
        (["estimate", "-e", "yolov3", "--cloud", "azure"], "unknown cloud"),
        (["estimate", "-e", "yolov3", "--budget", "-5"], "budget"),
        (["estimate", "-e", "imagenet-resnet50", "--deadline", "0.01"], "no plan meets"),
        (["estimate", "-e", "imagenet-resnet50", "--budget", "0.5"], "no plan meets"),
        (["estimate", "-e", "yolov3", "--objective", "fun"], "unknown objective"),
        (["estimate", "-e", "yolov3", "--epochs", "-1"], "epochs"),
    ],
)
def test_estimate_bad_input(args: list[str], message: str) -> None:
    out = _bad(args)
    assert message in out
    assert "hint: " in out


def test_estimate_bad_profile_files(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert "not valid JSON" in _bad(["estimate", "--profile", str(broken)])
    future = tmp_path / "future.json"
    future.write_text(json.dumps({"schema": "kplan.profile/9.0"}))
    assert "not supported" in _bad(["estimate", "--profile", str(future)])
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"schema": "kplan.profile/1.0", "device": {}}))
    assert "missing field" in _bad(["estimate", "--profile", str(missing)])
    assert "not found" in _bad(["estimate", "--profile", str(tmp_path / "nope.json")])


def test_model_fit_and_predict_round_trip(tmp_path: Path) -> None:
    m = tmp_path / "m.csv"
    lines = ["nodes,workers,local_batch,step_time,sync_time"]
    for n, k in [(1, 1), (1, 2), (1, 4), (2, 8), (4, 16)]:
        for b in (8, 16, 32, 64):
            sync = 0.0 if k == 1 else (0.02 if n == 1 else 0.2)
            lines.append(f"{n},{k},{b},{0.05 + 0.004 * b + sync:.5f},{sync}")
    m.write_text("\n".join(lines) + "\n")
    model = tmp_path / "model.json"
    out = _ok(["model", "fit", "--measurements", str(m), "--out", str(model)])
    assert "MAPE" in out and model.exists()
    c = tmp_path / "c.csv"
    c.write_text("nodes,workers,local_batch,accum_steps\n1,1,32,1\n8,32,32,2\n")
    pred = tmp_path / "p.csv"
    _ok(["model", "predict", "--model", str(model), "--configs", str(c), "--out", str(pred)])
    header, first, _second = pred.read_text().splitlines()
    cols = header.split(",")
    assert cols[4:] == [
        "step_time",
        "step_time_p90",
        "step_time_log_sigma",
        "compute_time",
        "sync_time",
        "transferred_from",
        "extrapolated",
    ]
    assert float(first.split(",")[4]) == pytest.approx(0.05 + 0.004 * 32, rel=0.1)
    assert first.split(",")[-2:] == ["", ""]  # no gpu named (own device); not extrapolated
    rows = json.loads(
        _ok(["model", "predict", "--model", str(model), "--configs", str(c), "--json"])
    )
    assert rows[1]["step_time"] > rows[0]["step_time"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("nodes,workers,local_batch\n1,1,8\n", "missing column"),
        ("nodes,workers,local_batch,step_time,colour\n1,1,8,0.1,red\n", "unknown column"),
        ("nodes,workers,local_batch,step_time\n1,1,eight,0.1\n", "not a number"),
        ("nodes,workers,local_batch,step_time\n1,1,8,-0.1\n", "must be > 0"),
        ("nodes,workers,local_batch,step_time\n2,1,8,0.1\n", "need 1 <= nodes <= workers"),
        ("nodes,workers,local_batch,step_time\n", "no data rows"),
    ],
)
def test_model_fit_bad_csv(tmp_path: Path, content: str, message: str) -> None:
    m = tmp_path / "m.csv"
    m.write_text(content)
    out = _bad(["model", "fit", "--measurements", str(m), "--out", str(tmp_path / "x.json")])
    assert message in out
    assert not (tmp_path / "x.json").exists()


def test_model_predict_bad_model(tmp_path: Path) -> None:
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"schema": "kplan.perfmodel/1.0", "gamma": 3}))
    c = tmp_path / "c.csv"
    c.write_text("nodes,workers,local_batch\n1,1,8\n")
    assert "not a kplan performance model" in _bad(
        ["model", "predict", "--model", str(model), "--configs", str(c)]
    )
