"""``kplan catalog update --cloud gcp`` end to end: the real google-cloud-compute client against
the local Compute REST server (machineTypes, acceleratorTypes), the Cloud Billing Catalog SKUs
from a local server with the API's JSON, then ``kplan estimate`` planning with the result."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kplan.catalogs.current import current_catalog_dir, user_catalogs
from kplan.cli.main import app
from tests.gcp_billing_server import FakeBilling, sku
from tests.gcp_http import ApiError
from tests.gcp_server import FakeCompute

runner = CliRunner()
US = ["us-central1", "us-east1"]
ZONES = ("us-central1-a", "us-central1-b")
T4_USD = 0.10  # list price $0.35: the refreshed catalog makes T4 hosts cheaper


def skus(t4_usd: float = T4_USD) -> list[dict[str, Any]]:
    """Compute Engine SKUs with their list prices (us-central1), and some to be ignored."""
    out = []
    for prefix, usage, scale in (("", "OnDemand", 1.0), ("Spot Preemptible ", "Preemptible", 0.3)):
        for text, group, usd, unit in (
            ("N1 Predefined Instance Core", "N1Standard", 0.031611, "h"),
            ("N1 Predefined Instance Ram", "N1Standard", 0.004237, "GiBy.h"),
            ("A2 Instance Core", "CPU", 0.031611, "h"),
            ("A2 Instance Ram", "RAM", 0.004237, "GiBy.h"),
            ("Nvidia Tesla T4 GPU", "GPU", t4_usd, "h"),
            ("Nvidia Tesla A100 GPU", "GPU", 2.933908, "h"),
        ):
            description = f"{prefix}{text} running in Americas"
            out.append(sku(description, group, usage, usd * scale, US, unit))
    out.append(
        sku("Commitment v1: Nvidia Tesla T4 GPU running in Americas", "GPU", "Commit1Yr", 0.01, US)
    )
    out.append(
        sku(
            "Nvidia Tesla T4 GPU (DWS Defined Duration) running in Americas",
            "GPU",
            "OnDemand",
            0.01,
            US,
        )
    )
    return out


@pytest.fixture
def servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[FakeCompute, FakeBilling]]:
    compute, billing = FakeCompute(), FakeBilling(skus())
    for zone in ZONES:
        compute.add_machine_type(zone, "n1-standard-4", 4, 15360)
        compute.add_machine_type(zone, "n1-standard-8", 8, 30720)
        compute.add_machine_type(zone, "e2-standard-8", 8, 32768)
        compute.add_accelerator_type(zone, "nvidia-tesla-t4", "NVIDIA T4", 4)
    compute.add_machine_type("us-central1-a", "a2-highgpu-1g", 12, 87040, ("nvidia-tesla-a100", 1))
    compute.add_accelerator_type("us-central1-a", "nvidia-tesla-a100", "NVIDIA A100 40GB", 16)
    compute.add_machine_type("europe-west4-a", "a2-highgpu-1g", 12, 87040, ("nvidia-tesla-a100", 1))
    with compute.serve() as compute_url, billing.serve() as billing_url:
        monkeypatch.setenv("KPLAN_HOME", str(tmp_path))
        monkeypatch.setenv("KPLAN_GCP_PROJECT", "kplan-catalog-1")
        monkeypatch.setenv("KPLAN_GCP_ENDPOINT", compute_url)
        monkeypatch.setenv("KPLAN_GCP_ANONYMOUS", "1")
        monkeypatch.setenv("KPLAN_GCP_BILLING_ENDPOINT", billing_url)
        yield compute, billing


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def plan() -> dict[str, Any]:
    args = ["estimate", "--example", "cifar10-resnet18", "--cloud", "gcp", "--gpu", "T4"]
    args += ["--region", "us-central1", "--on-demand", "--objective", "cost", "--no-mixed"]
    result = runner.invoke(app, [*args, "--json", "--top", "3"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def update() -> Any:
    return runner.invoke(app, ["catalog", "update", "--cloud", "gcp", "--region", "us-central1"])


def test_update_gcp_writes_catalog_that_estimate_uses(
    servers: tuple[FakeCompute, FakeBilling], tmp_path: Path
) -> None:
    compute, billing = servers
    before = plan()["chosen"]
    assert (before["instance_type"], before["usd_per_hour"]) == ("n1-standard-4+1xT4", 0.539999)
    result = update()
    assert result.exit_code == 0, result.output
    assert "now current" in result.output
    directory = current_catalog_dir(tmp_path / "catalogs")
    assert directory is not None
    assert len(billing.requests) == 5  # 14 SKUs, 3 per page: every page was read
    assert any("aggregated/machineTypes" in s.path for s in compute.requests)

    rows = read_csv(directory / "prices.csv")
    n1 = [r for r in rows if r["instance_type"] == "n1-standard-8+1xT4"]
    central = {(r["zone"], r["market"]): r for r in n1 if r["region"] == "us-central1"}
    assert set(central) == {(z, m) for z in ZONES for m in ("on-demand", "spot")}
    od = central[("us-central1-a", "on-demand")]
    assert od["usd_per_hour"] == "0.479998"  # 8 x 0.031611 + 30 GiB x 0.004237 + 0.10
    assert od["source"].startswith("GCP Cloud Billing Catalog SKUs 20")
    assert central[("us-central1-a", "spot")]["usd_per_hour"] == "0.143999"
    a2 = [r for r in rows if r["instance_type"] == "a2-highgpu-1g" and r["region"] == "us-central1"]
    assert {(r["zone"], r["usd_per_hour"]) for r in a2 if r["market"] == "on-demand"} == {
        ("us-central1-a", "3.673385")  # 12 x 0.031611 + 85 x 0.004237 + 2.933908
    }
    assert any(r["region"] == "us-east1" for r in n1)  # other regions carried over
    inst = {r["name"]: r for r in read_csv(directory / "instances.csv") if r["cloud"] == "gcp"}
    assert (inst["a2-highgpu-1g"]["vcpus"], inst["a2-highgpu-1g"]["memory_gb"]) == ("12", "85")
    assert inst["a2-highgpu-1g"]["source"].startswith("GCP Compute API machine type 20")
    assert "Compute API" not in inst["g2-standard-8"]["source"]  # not listed: carried over

    after = plan()
    assert after["catalog"].startswith("user-")
    chosen = after["chosen"]
    assert (chosen["instance_type"], chosen["usd_per_hour"]) == ("n1-standard-4+1xT4", 0.289999)


def test_failed_gcp_update_leaves_previous_catalog_current(
    servers: tuple[FakeCompute, FakeBilling], tmp_path: Path
) -> None:
    _, billing = servers
    assert update().exit_code == 0
    root = tmp_path / "catalogs"
    first = current_catalog_dir(root)
    billing.errors.append(ApiError(403, "forbidden", "Cloud Billing API has not been used"))
    billing.skus = skus(t4_usd=0.01)
    bad = update()
    assert bad.exit_code == 1, bad.output
    assert bad.output.startswith("error: GCP Cloud Billing API GET ")
    assert "HTTP 403" in bad.output and "Cloud Billing API" in bad.output
    assert user_catalogs(root) == [first] and len(list(root.iterdir())) == 1
    assert plan()["chosen"]["usd_per_hour"] == 0.289999


def test_gcp_compute_errors_are_translated(
    servers: tuple[FakeCompute, FakeBilling], tmp_path: Path
) -> None:
    compute, _ = servers
    compute.fail("GET", "aggregated/machineTypes", 403, "forbidden", "Compute API disabled", 9)
    bad = update()
    assert bad.exit_code == 1, bad.output
    assert bad.output.startswith("error: ") and "machine types" in bad.output
    assert not (tmp_path / "catalogs").exists() or not user_catalogs(tmp_path / "catalogs")
