"""``kplan catalog update --cloud aws`` end to end: the real boto3 EC2 client against a moto
server (instance types, zone offerings, spot history), the Price List API through botocore's
Stubber (moto has no ``pricing`` service), then ``kplan estimate`` planning with the result."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import ANY, Stubber
from typer.testing import CliRunner

from kplan.catalogs.current import current_catalog_dir, user_catalogs
from kplan.cli.main import app
from kplan.launcher.providers import aws_catalog
from tests.aws_server import MotoAws, fake_credentials

runner = CliRunner()
# Price List answers: (instance type, USD/hour). g4dn.12xlarge is made cheap (list: $3.912), so
# the plan switches to it from g4dn.xlarge.
PRICES = {"g4dn.xlarge": 0.526, "g4dn.12xlarge": 0.2, "g5.xlarge": 1.006, "p4d.24xlarge": 21.96}


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoAws]:
    server = MotoAws()
    try:
        yield server
    finally:
        server.stop()


def price_item(name: str, usd: float, region: str = "us-east-1", **attrs: str) -> str:
    """One PriceList entry as the Price List API returns it (a JSON string)."""
    sku = f"SKU{abs(hash(name)) % 10**8:08d}"
    attributes = {
        "instanceType": name,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "licenseModel": "No License required",
        "marketoption": "OnDemand",
        **attrs,
    }
    term = {
        "offerTermCode": "JRTCKXETXF",
        "sku": sku,
        "effectiveDate": "2026-11-01T00:00:00Z",
        "priceDimensions": {
            f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                "unit": "Hrs",
                "pricePerUnit": {"USD": f"{usd:.10f}"},
                "description": f"${usd} per On Demand Linux {name} Instance Hour",
                "beginRange": "0",
                "endRange": "Inf",
            }
        },
    }
    doc = {
        "product": {"productFamily": "Compute Instance", "attributes": attributes, "sku": sku},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": term}},
        "version": "20261101000000",
        "publicationDate": "2026-11-01T00:00:00Z",
    }
    return json.dumps(doc)


def stubbed_pricing(pages: list[list[str]] | None = None, error: str | None = None) -> Any:
    import boto3

    client = boto3.client("pricing", region_name="us-east-1")
    stub = Stubber(client)
    expected = {"ServiceCode": "AmazonEC2", "Filters": ANY, "FormatVersion": "aws_v1"}
    if error is not None:
        stub.add_client_error("get_products", error, "not allowed", 400, expected_params=None)
    for i, page in enumerate(pages or []):
        params = {**expected, "MaxResults": 100, **({"NextToken": f"t{i}"} if i else {})}
        response: dict[str, Any] = {"FormatVersion": "aws_v1", "PriceList": page}
        if i + 1 < len(pages or []):
            response["NextToken"] = f"t{i + 1}"
        stub.add_response("get_products", response, params)
    stub.activate()
    client.kplan_stub = stub
    return client


@pytest.fixture
def aws(moto: MotoAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake_credentials(monkeypatch)
    monkeypatch.setenv("KPLAN_AWS_ENDPOINT_URL", moto.url)
    monkeypatch.setenv("KPLAN_HOME", str(tmp_path))
    return tmp_path / "catalogs"


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def plan(*extra: str) -> dict[str, Any]:
    args = ["estimate", "--example", "cifar10-resnet18", "--cloud", "aws", "--gpu", "T4"]
    args += ["--region", "us-east-1", "--on-demand", "--objective", "cost", "--no-mixed"]
    result = runner.invoke(app, [*args, "--json", "--top", "3", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def test_update_aws_writes_catalog_that_estimate_uses(
    aws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = plan()["chosen"]
    assert (before["instance_type"], before["usd_per_hour"]) == ("g4dn.xlarge", 0.526)
    items = [price_item(n, usd) for n, usd in PRICES.items()]
    items.append(price_item("g4dn.xlarge", 9.99, tenancy="Dedicated"))  # filtered out
    client = stubbed_pricing([items[:2], items[2:]])  # two pages: NextToken is followed
    monkeypatch.setattr(aws_catalog, "pricing_client", lambda: client)
    result = runner.invoke(
        app, ["catalog", "update", "--cloud", "aws", "--region", "us-east-1", "--json"]
    )
    assert result.exit_code == 0, result.output
    client.kplan_stub.assert_no_pending_responses()
    doc = json.loads(result.output)
    directory = Path(doc["directory"])
    assert current_catalog_dir(aws) == directory and doc["version"].startswith("user-")
    assert doc["regions"] == ["us-east-1"] and doc["instances_refreshed"] >= 10, doc
    assert any("p3.2xlarge: not described" in r for r in doc["remarks"]), doc["remarks"]
    prices = read_csv(directory / "prices.csv")
    fresh = [r for r in prices if r["instance_type"] == "g4dn.12xlarge"]
    east = [r for r in fresh if r["region"] == "us-east-1"]
    od = [r for r in east if r["market"] == "on-demand"]
    assert len(od) >= 2  # one row per zone that offers the type (zone ids, as AWS names them)
    assert all(r["usd_per_hour"] == "0.2" and r["zone"].startswith("use1-az") for r in od)
    assert all(r["source"].startswith("AWS Price List API GetProducts 20") for r in od)
    spot = [r for r in east if r["market"] == "spot"]  # moto quotes every spot price 0.00001
    assert {r["zone"] for r in spot} == {r["zone"] for r in od}
    assert all(r["usd_per_hour"] == "0.00001" for r in spot)
    assert all(r["source"].startswith("AWS EC2 DescribeSpotPriceHistory 20") for r in spot)
    west = [r for r in fresh if r["region"] == "us-west-2"]
    assert west and all("list price" in r["source"] for r in west)  # carried over
    g5 = next(r for r in read_csv(directory / "instances.csv") if r["name"] == "g5.xlarge")
    assert (g5["gpu"], g5["gpu_count"], g5["vcpus"], g5["memory_gb"]) == ("A10G", "1", "4", "16")
    assert g5["network_gbps"] == "2.5"  # the published baseline of "Up to 10 Gigabit"
    assert g5["source"].startswith("AWS EC2 DescribeInstanceTypes 20")

    after = plan()
    assert after["catalog"] == doc["version"]
    assert (after["chosen"]["instance_type"], after["chosen"]["usd_per_hour"]) == (
        "g4dn.12xlarge",
        0.2,
    )


def test_failed_aws_update_leaves_previous_catalog_current(
    aws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = stubbed_pricing([[price_item("g4dn.xlarge", 0.5)]])
    monkeypatch.setattr(aws_catalog, "pricing_client", lambda: client)
    ok = runner.invoke(app, ["catalog", "update", "--cloud", "aws", "--region", "us-east-1"])
    assert ok.exit_code == 0, ok.output
    assert "now current" in ok.output
    first = current_catalog_dir(aws)
    denied = stubbed_pricing(error="AccessDeniedException")
    monkeypatch.setattr(aws_catalog, "pricing_client", lambda: denied)
    bad = runner.invoke(app, ["catalog", "update", "--cloud", "aws", "--region", "us-east-1"])
    assert bad.exit_code == 1, bad.output
    assert bad.output.startswith("error: AWS could not get on-demand prices for us-east-1: ")
    assert "AccessDeniedException" in bad.output and "IAM policy" in bad.output
    assert first is not None and user_catalogs(aws) == [first]
    assert [p.name for p in aws.iterdir()] == [first.name]  # no temporary directory left
    assert plan()["chosen"]["usd_per_hour"] == 0.5


def test_network_rules_match_the_shipped_catalog() -> None:
    assert aws_catalog.network_gbps("4x 100 Gigabit", None)[0] == 400
    assert aws_catalog.network_gbps("50 Gigabit", None)[0] == 50
    assert aws_catalog.network_gbps("Up to 25 Gigabit", 5.0) == (
        5.0,
        "NetworkPerformance 'Up to 25 Gigabit', its published baseline 5 Gbit/s",
    )
    assert aws_catalog.network_gbps("Up to 10 Gigabit", None)[0] == 2.5
    with pytest.raises(ValueError):
        aws_catalog.network_gbps("Moderate", None)
