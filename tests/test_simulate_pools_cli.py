"""kplan simulate over two pools (issue 27 item 3): moves, egress dollars, against staying."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.app.simulating_pools import split_spec
from kplan.cli.main import app
from kplan.core.errors import InputError

runner = CliRunner()
EGRESS_US_EAST_1 = 0.02  # $/GB to another AWS region (storage_prices.csv)


def _plan(tmp_path: Path) -> Path:
    out = tmp_path / "plan.json"
    res = runner.invoke(
        app,
        [
            "estimate", "--example", "cifar10-resnet18", "--spot", "--instance-type",
            "p3.2xlarge", "--region", "us-east-1", "--nodes", "1", "--epochs", "40",
            "--deadline", "3", "--out", str(out), "--json",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return out


def _dry_spells(path: Path, dry_s: float, zone: str = "") -> Path:
    """A pool whose node is taken 30 minutes into every period (``dry_s`` plus an hour), and
    none is granted for ``dry_s``; 20 hours."""
    period = dry_s + 3600.0
    rows = ["# end_s=72000", "time_s,event,node" + (",zone" if zone else "")]
    z = f",{zone}" if zone else ""
    rows.append(f"0,add,n0{z}")
    k = 0
    while (k + 1) * period < 72000:
        rows.append(f"{k * period + 1800:g},remove,n{k}{z}")
        rows.append(f"{k * period + 1800 + dry_s:g},add,n{k + 1}{z}")
        k += 1
    path.write_text("\n".join(rows) + "\n")
    return path


def _always(path: Path) -> Path:
    path.write_text("# end_s=72000\ntime_s,event,node\n0,add,b0\n0,add,b1\n")
    return path


def _simulate(tmp_path: Path, dry_s: float, *extra: str) -> dict:  # type: ignore[type-arg]
    plan = _plan(tmp_path)
    a = _dry_spells(tmp_path / "a.csv", dry_s)
    b = _always(tmp_path / "b.csv")
    res = runner.invoke(
        app,
        ["simulate", "--plan", str(plan), "--trace", f"us-east-1={a}", "--trace",
         f"us-east-2={b}", "--runs", "200", "--json", *extra],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    return json.loads(res.output)  # type: ignore[no-any-return]


def test_a_pool_that_runs_dry_moves_the_job_and_the_egress_is_priced_exactly(
    tmp_path: Path,
) -> None:
    out = _simulate(tmp_path, 2.5 * 3600, "--checkpoint-gb", "10")
    m = out["moves"]
    assert m["pools"] == ["us-east-1", "us-east-2"]
    assert m["moves_mean"] > 0.03  # the replays that met a removal of A moved to B
    # every move copies 10 GB at $0.02/GB: egress per replay = moves per replay x $0.20
    assert m["egress_usd_mean"] == pytest.approx(m["moves_mean"] * 10 * EGRESS_US_EAST_1)
    (there, _back) = m["prices"]
    assert there["egress_usd"] == pytest.approx(0.2) and there["copy_s"] == pytest.approx(80.0)
    assert there["kind"] == "inter-region" and there["break_even_s"] > 80.0
    # the deadline holds with moves, and moving costs less than waiting or paying on demand
    assert out["replayed"]["met_deadline"] == 1.0 and m["stay_met_deadline"] == 1.0
    assert m["cost_vs_stay"] < 1.0
    assert out["truncated"] == 0


def test_a_short_outage_and_a_big_checkpoint_do_not_move(tmp_path: Path) -> None:
    out = _simulate(tmp_path, 600.0, "--checkpoint-gb", "5000")  # dry 10 min; $100, 11 h copy
    m = out["moves"]
    assert m["moves_mean"] == 0 and m["egress_usd_mean"] == 0
    assert m["prices"][0]["break_even_s"] > 600.0
    assert m["cost_vs_stay"] == pytest.approx(1.0) and m["hours_vs_stay"] == pytest.approx(1.0)


def test_the_table_shows_the_moves_the_egress_and_staying(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    a = _dry_spells(tmp_path / "a.csv", 7200.0)
    b = _always(tmp_path / "b.csv")
    res = runner.invoke(
        app,
        ["simulate", "--plan", str(plan), "--trace", f"us-east-1={a}", "--trace",
         f"us-east-2={b}", "--runs", "50", "--checkpoint-gb", "10", "--copy-gbps", "2"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "us-east-1 -> us-east-2: inter-region, $0.020/GB = $0.2 egress, 40 s copy" in res.output
    assert "moves:" in res.output and "staying" in res.output
    assert "cost USD (mean)" in res.output


@pytest.mark.parametrize(
    ("traces", "match"),
    [
        (("us-east-2={b}", "us-east-1={a}"), "the first --trace is where the job starts"),
        (("us-east-1={a}", "eu-mars-9={b}"), "unknown pool 'eu-mars-9'"),
        (("us-east-1={z}", "us-east-2={b}"), "is of zone us-west-2a"),
        (("us-east-1={a}", "{b}"), "has no pool name"),
        (("us-east-1={a}", "us-east-1={b}"), "named twice"),
        # a region and one of its own zones: the region's trace holds the zone's nodes
        (("us-east-1={a}", "use1-az2={b}"), "is a zone of pool 'us-east-1'"),
        (("use1-az2={a}", "us-east-1={b}"), "is a zone of pool 'us-east-1'"),
    ],
)
def test_bad_pools_are_one_line_with_a_hint_and_exit_2(
    tmp_path: Path, traces: tuple[str, ...], match: str
) -> None:
    plan = _plan(tmp_path)
    files = {
        "a": _dry_spells(tmp_path / "a.csv", 600.0),
        "b": _always(tmp_path / "b.csv"),
        "z": _dry_spells(tmp_path / "z.csv", 600.0, zone="us-west-2a"),
    }
    argv = ["simulate", "--plan", str(plan)]
    for t in traces:
        argv += ["--trace", t.format(**{k: str(v) for k, v in files.items()})]
    res = runner.invoke(app, argv)
    assert res.exit_code == 2, res.output
    assert match in res.output
    assert "Traceback" not in res.output and "hint" in res.output.lower()


def test_zones_of_one_region_move_at_once_and_copy_nothing(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    a = _dry_spells(tmp_path / "a.csv", 2.5 * 3600, zone="use1-az6")
    b = _always(tmp_path / "b.csv")
    res = runner.invoke(
        app,
        ["simulate", "--plan", str(plan), "--trace", f"use1-az6={a}", "--trace",
         f"use1-az5={b}", "--runs", "100", "--json", "--checkpoint-gb", "100"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    m = json.loads(res.output)["moves"]
    there = m["prices"][0]
    assert there["kind"] == "zone" and there["egress_usd"] == 0 and there["break_even_s"] == 0
    assert m["moves_mean"] > 0 and m["egress_usd_mean"] == 0


def test_the_plan_states_a_moves_price_and_simulate_copies_the_plans_checkpoint(
    tmp_path: Path,
) -> None:
    """The plan's extras price one move (its checkpoint x the region's egress, the copy at 1
    Gbit/s); without --checkpoint-gb a replayed move costs exactly that."""
    plan = _plan(tmp_path)
    x = json.loads(plan.read_text())["chosen"]["extras"]
    assert x["checkpoint_gb"] > 0
    assert x["move_usd"] == pytest.approx(x["checkpoint_gb"] * EGRESS_US_EAST_1)
    assert x["move_copy_s"] == pytest.approx(x["checkpoint_gb"] * 8 / 1.0)
    a = _dry_spells(tmp_path / "a.csv", 2.5 * 3600)
    b = _always(tmp_path / "b.csv")
    res = runner.invoke(
        app,
        ["simulate", "--plan", str(plan), "--trace", f"us-east-1={a}", "--trace",
         f"us-east-2={b}", "--runs", "100", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    m = json.loads(res.output)["moves"]
    assert m["checkpoint_gb"] == x["checkpoint_gb"]
    assert m["prices"][0]["egress_usd"] == pytest.approx(x["move_usd"])
    assert m["prices"][0]["copy_s"] == pytest.approx(x["move_copy_s"])
    assert m["egress_usd_mean"] == pytest.approx(m["moves_mean"] * x["move_usd"])


def test_a_trace_file_with_an_equals_sign_in_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--trace a=b.csv``: the file of that name when only it exists, pool ``a`` of ``b.csv``
    when only that exists, and a one-line refusal when both do (it read as the pool)."""
    monkeypatch.chdir(tmp_path)
    assert split_spec("us-east-1=b.csv") == ("us-east-1", Path("b.csv"))
    _always(tmp_path / "us-east-1=b.csv")
    assert split_spec("us-east-1=b.csv") == (None, Path("us-east-1=b.csv"))
    _always(tmp_path / "b.csv")
    with pytest.raises(InputError, match="is both the file") as err:
        split_spec("us-east-1=b.csv")
    assert "./us-east-1=b.csv" in err.value.hint
    assert split_spec("./us-east-1=b.csv") == (None, Path("./us-east-1=b.csv"))
    assert split_spec("us-east-1=./b.csv") == ("us-east-1", Path("./b.csv"))
