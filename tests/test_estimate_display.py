"""What `kplan estimate` prints: the assumptions, the next command, where the plan went, a table
that fits 80 columns, readable money, times and step times, and --list-examples as a table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.planner import fmt
from tests.test_estimate_choice import tiny_profile

runner = CliRunner()


def _run(args: list[str], columns: int = 80) -> str:
    result = runner.invoke(app, args, env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


def _plan_rows(out: str) -> list[list[str]]:
    """The lines of each numbered row of the plans table."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("─")) + 1
    rows: list[list[str]] = []
    for ln in lines[start:]:
        if ln.startswith("order:"):
            break
        if re.match(r"^\s{0,2}\d+\s+\S", ln):  # the row number, right-aligned in its column
            rows.append([ln])
        elif rows:
            rows[-1].append(ln)
    return rows


@pytest.mark.parametrize(
    "args",
    [
        ["--example", "yolov3", "--budget", "50", "--spot"],
        ["--example", "imagenet-resnet50"],
        ["--example", "bert-squad", "--deadline", "2"],
    ],
)
def test_fits_80_columns_and_no_row_wraps(args: list[str]) -> None:
    out = _run(["estimate", *args])
    assert max(len(ln.rstrip()) for ln in out.splitlines()) <= 80
    doc = json.loads(_run(["estimate", *args, "--json"]))
    rows = _plan_rows(out)
    assert len(rows) == len(doc["plans"])
    for row, plan in zip(rows, doc["plans"], strict=True):
        # one line per instance group, then where (and the opt-in zone): never wrapped
        expected = len(plan["groups"]) + 1 + (plan["zone_type"] != "availability-zone")
        assert len(row) == expected, "\n".join(row)
        assert plan["groups"][0]["instance_type"] in row[0]
        assert f"{plan['cloud']} {plan['region']}" in "\n".join(row)
    order = [ln for ln in out.splitlines() if ln.startswith("order: ")]
    assert len(order) == 1 and order[0].rstrip() == f"order: {doc['order']}"  # one line


def test_wide_into_a_pipe_prints_every_cell_whole() -> None:
    """--wide has 15 columns: into a pipe (no terminal) each table is printed at its own
    width, where rich cut every cell to 80 columns ("$1…")."""
    out = _run(["estimate", "--example", "yolov3", "--wide"])
    doc = json.loads(_run(["estimate", "--example", "yolov3", "--wide", "--json"]))
    rows = _plan_rows(out)
    assert len(rows) == len(doc["plans"]) and "…" not in "\n".join(ln for row in rows for ln in row)
    for row, plan in zip(rows, doc["plans"], strict=True):
        assert fmt.money(plan["usd_per_hour"]) in row[0]
    # without --wide the table still fits 80 columns, whole (the one-space gap)
    plain = _run(["estimate", "--example", "imagenet-resnet50"])
    assert "…" not in "\n".join(ln for row in _plan_rows(plain) for ln in row)


def test_assumptions_and_next_command_without_out() -> None:
    out = _run(["estimate", "--example", "yolov3", "--budget", "50", "--spot"])
    flat = " ".join(out.split())
    assert "yolov3 (built-in example): YOLOv3 / PASCAL VOC" in flat
    assert "16,552 samples x 50 epochs, base batch B0 = 8" in flat
    assert "g4dn.12xlarge (4 x T4)" in flat and "in fp32" in flat
    assert "every region; spot; 1-64 nodes" in flat
    assert "times within 5% are tied: the cheaper wins" in flat
    assert "save the plan (add --out plan.json)" in flat
    assert "kplan launch train.py --plan plan.json --budget 50" in flat


def test_out_says_where_the_plan_went_and_the_command_uses_it(tmp_path: Path) -> None:
    plan = tmp_path / "plans" / "p.json"
    out = _run(["estimate", "--example", "yolov3", "--out", str(plan)], columns=200)
    assert f"plan saved to {plan}" in out
    doc = json.loads(plan.read_text())
    assert doc["schema"] == "kplan.plan/2.1"
    budget = doc["next_command"].split("--budget ")[1]
    assert float(budget) >= doc["chosen"]["cost_p90_usd"]
    assert f"kplan launch train.py --plan {plan} --budget {budget}" in out
    assert doc["next_command"] == f"kplan launch train.py --plan {plan} --budget {budget}"
    # the command it prints is what `kplan launch` takes (dry run: offline)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    res = runner.invoke(
        app, ["launch", str(script), "--plan", str(plan), "--budget", budget, "--dry-run"]
    )
    assert res.exit_code == 0, res.output


def test_json_keeps_its_fields_and_adds_the_assumptions() -> None:
    doc = json.loads(_run(["estimate", "-e", "cifar10-resnet18", "--json"]))
    assert {"schema", "objective", "reason", "chosen", "plans", "frontier", "profile"} <= set(doc)
    a = doc["assumptions"]
    assert (a["dataset_size"], a["epochs"], a["base_batch"]) == (50048, 100.0, 128)
    assert a["measured_on"] == "g4dn.12xlarge (4 x T4)"
    assert a["search"]["opt_in_zones"] is False and doc["tie_tolerance"] == 0.05
    assert doc["order"].startswith("knee first")


def test_profile_made_from_an_example_script_names_it(tmp_path: Path) -> None:
    doc = json.loads((Path(tiny_profile(tmp_path / "t.json"))).read_text())
    doc["name"] = "mlp-regression"
    path = tmp_path / "mlp.json"
    path.write_text(json.dumps(doc))
    out = _run(["estimate", "--profile", str(path), "--on-demand"], columns=120)
    assert "kplan launch kplan/examples/mlp_regression.py --plan plan.json" in out
    assert "train.py: your training script" not in out
    # a profile of a script (`kplan profile my_job.py`) names it in its provenance
    doc["name"] = "my_job"
    doc["provenance"] = "kplan 0.1.0 profile of my_job.py on cpu, 1 local worker(s), ..."
    path.write_text(json.dumps(doc))
    out = _run(["estimate", "--profile", str(path), "--on-demand"], columns=120)
    assert "kplan launch my_job.py --plan plan.json" in out
    doc["provenance"] = "kplan 0.1.0 profile of mlp_regression.py on cpu, ..."
    path.write_text(json.dumps(doc))
    out = _run(["estimate", "--profile", str(path), "--on-demand"], columns=120)
    assert "kplan launch kplan/examples/mlp_regression.py --plan plan.json" in out


def test_short_jobs_read_in_minutes_and_ms_and_sub_cent_money(tmp_path: Path) -> None:
    path = tiny_profile(tmp_path / "tiny.json")
    out = _run(["estimate", "--profile", str(path)])
    assert " ms " in out and "0.000" not in out
    assert " min" in out
    frontier = out[out.index("frontier:") :].split("chosen:")[0]
    rows = [ln.split() for ln in frontier.splitlines() if re.match(r"^\s*[\d.]+ (min|h|s)", ln)]
    pairs = {(r[0], r[2]) for r in rows}  # (time, cost)
    times = [t for t, _ in pairs]
    assert len(times) == len(set(times)), frontier  # no two prices at one shown time
    assert not re.search(r"\$\d+\.\d{5,}", out)


def test_money_has_no_six_decimals() -> None:
    out = _run(["estimate", "-e", "yolov3", "--budget", "2.5"], columns=120)
    assert "$2.50" in out and not re.search(r"\d\.\d{5,}", out)
    res = runner.invoke(app, ["estimate", "-e", "yolov3", "--budget", "1"])
    assert res.exit_code == 2 and "budget $1.00" in res.output
    assert not re.search(r"\d\.\d{5,}", res.output)


@pytest.mark.parametrize(
    ("usd", "text"),
    [
        (0.0, "$0.00"),
        (0.0045, "$0.0045"),
        (0.025, "$0.025"),
        (0.46, "$0.46"),
        (1.0, "$1.00"),
        (12.345, "$12.35"),
        (1234.5, "$1,234"),
    ],
)
def test_money_format(usd: float, text: str) -> None:
    assert fmt.money(usd) == text


def test_durations_and_steps() -> None:
    assert fmt.duration(241 / 3600) == "4.0 min"
    assert fmt.durations([241 / 3600, 244 / 3600]) == ["4.0 min", "4.1 min"]
    assert fmt.durations([241 / 3600, 242 / 3600]) == ["4.02 min", "4.03 min"]
    assert fmt.duration(30 / 3600) == "30 s"
    assert fmt.duration(11.64) == "11.6 h" and fmt.duration(2.345) == "2.35 h"
    assert [fmt.step(x) for x in (0.00012, 0.0036, 0.103, 1.5)] == [
        "0.12 ms",
        "3.60 ms",
        "103 ms",
        "1.50 s",
    ]


def test_wide_adds_prices_zones_and_throughput() -> None:
    out = _run(["estimate", "-e", "yolov3", "--wide", "--top", "3"], columns=160)
    assert "samples" in out and "price" in out and "step" in out
    doc = json.loads(_run(["estimate", "-e", "yolov3", "--top", "3", "--json"]))
    assert f"({doc['chosen']['zone']})" in out


def test_list_examples_is_a_table() -> None:
    out = _run(["estimate", "--list-examples"])
    assert max(len(ln.rstrip()) for ln in out.splitlines()) <= 80
    for name, model in (("yolov3", "YOLOv3 / PASCAL VOC"), ("bert-squad", "BERT-base / SQuAD")):
        line = next(ln for ln in out.splitlines() if ln.startswith(name + " "))
        assert model in line and "g4dn.12xlarge (4 x T4)" in line
    assert "epochs" in out and "B0" in out
    rows = json.loads(_run(["estimate", "--list-examples", "--json"]))
    yolo = next(r for r in rows if r["name"] == "yolov3")
    assert (yolo["epochs"], yolo["base_batch"]) == (50.0, 8)
    assert yolo["description"]
