"""``kplan catalog list`` through the real typer app: tables, JSON, filters and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from tests.test_catalog_loader import FILES, write_catalog

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["catalog", "list", *args])
    return result.exit_code, result.stdout, result.stderr


def listing(*args: str) -> list[dict[str, object]]:
    code, out, err = run(*args, "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert isinstance(rows, list)
    return rows


def test_table_lists_the_reference_hardware() -> None:
    code, out, _ = run("--instance-type", "g4dn.12xlarge", "--region", "us-east-1")
    assert code == 0
    assert "catalog shipped-2026.11: 10 offer(s)" in out
    assert "g4dn.12xlarge" in out and "4x T4" in out and "us-east-1/use1-az1" in out
    assert "3.9120" in out  # on-demand $/h
    assert "--notes lists them" in out


def test_json_rows_have_every_field_and_are_cheapest_first() -> None:
    rows = listing("--gpu", "t4", "--region", "us-east-1")
    assert rows, "no T4 offers in us-east-1"
    assert {r["gpu"] for r in rows} == {"T4"}
    assert {r["region"] for r in rows} == {"us-east-1"}
    prices = [r["usd_per_hour"] for r in rows]
    assert prices == sorted(prices)
    assert set(rows[0]) == {
        "cloud",
        "instance_type",
        "gpu",
        "gpu_count",
        "gpu_memory_gb",
        "vcpus",
        "memory_gb",
        "network_gbps",
        "interconnect",
        "interconnect_gbps",
        "market",
        "region",
        "zone",
        "usd_per_hour",
        "source",
    }


def test_each_row_shows_its_gpus_memory() -> None:
    """The table's GB/GPU column and the JSON's gpu_memory_gb come from gpus.csv (issue 12)."""
    code, out, _ = run("--instance-type", "p4de.24xlarge", "--market", "on-demand")
    assert code == 0
    header = next(line for line in out.splitlines() if "instance" in line)
    assert "GB/GPU" in header
    row = next(line for line in out.splitlines() if "p4de.24xlarge" in line)
    assert "8x A100-80GB" in row and " 80 " in row
    memory = {r["gpu"]: r["gpu_memory_gb"] for r in listing("--region", "us-east-1")}
    assert memory["T4"] == 16.0 and memory["A100-80GB"] == 80.0


def test_filters_combine() -> None:
    rows = listing("--cloud", "GCP", "--market", "spot", "--max-price", "0.5")
    assert rows
    for r in rows:
        assert (r["cloud"], r["market"]) == ("gcp", "spot")
        assert isinstance(r["usd_per_hour"], float) and r["usd_per_hour"] <= 0.5
    everything = listing()
    assert len(everything) > len(rows) > 0
    n1 = listing("--instance-type", "N1-STANDARD-8+1XT4", "--market", "on-demand")
    assert {r["instance_type"] for r in n1} == {"n1-standard-8+1xT4"}


def test_a_gpu_alias_selects_its_canonical_gpu() -> None:
    rows = listing("--gpu", "nvidia-a100-80gb", "--cloud", "aws")
    assert {r["instance_type"] for r in rows} == {"p4de.24xlarge"}


def test_no_match_is_an_empty_result_not_an_error() -> None:
    assert listing("--gpu", "B200", "--max-price", "1") == []
    code, out, _ = run("--gpu", "B200", "--max-price", "1")
    assert code == 0 and "no offers match" in out


@pytest.mark.parametrize(
    ("args", "error", "hint"),
    [
        (["--gpu", "h1000"], "error: unknown GPU 'h1000'", "hint: known GPUs: A100, A100-80GB"),
        (["--cloud", "azure"], "error: unknown cloud 'azure'", "hint: known clouds: aws, gcp"),
        (
            ["--cloud", "gcp", "--region", "us-east-1"],
            "error: unknown region 'us-east-1' on gcp",
            "hint: did you mean us-east1",
        ),
        (
            ["--instance-type", "g4dn.12xlarg"],
            "error: unknown instance type 'g4dn.12xlarg'",
            "hint: did you mean g4dn.12xlarge",
        ),
        (
            ["--market", "preemptible"],
            "error: unknown market 'preemptible'",
            "hint: known markets: on-demand, spot",
        ),
        (["--max-price", "0"], "error: --max-price 0 must be > 0", "hint: a price in USD"),
        (["--catalog", "/nonexistent/kplan"], "does not exist", "hint: a catalog directory"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_a_hint(args: list[str], error: str, hint: str) -> None:
    code, out, err = run(*args)
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith("error: ") and error in lines[0]
    assert lines[1].startswith(hint)
    assert "Traceback" not in err


def test_user_catalog_and_its_notes(tmp_path: Path) -> None:
    prices = FILES["prices.csv"].replace("spot,1.6,sky", "spot,5,sky")
    root = write_catalog(tmp_path / "cat", prices_csv=prices)
    code, out, _ = run("--catalog", str(root), "--notes")
    assert code == 0
    assert "catalog user-test: 4 offer(s)" in out
    assert "1 validation note(s):" in out
    assert "prices.csv:3: spot price 5 is above the on-demand price 3.912" in out


def test_a_broken_user_catalog_is_one_error_line(tmp_path: Path) -> None:
    root = write_catalog(tmp_path / "cat", billing_csv=None)
    code, _, err = run("--catalog", str(root))
    assert code == 2
    assert err.splitlines()[0].startswith("error: catalog file ")
    assert "billing.csv is missing" in err
