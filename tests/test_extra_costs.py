"""Issue 27 item 4: a plan counts its disks, checkpoint and data storage and the data's egress
(kplan/planner/extra_costs.py), in its cost, its p90 and so in the budget; the plan file holds
them (schema 2.1; a 2.0 plan loads with zeros); `kplan estimate --wide` and --json show them."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from kplan.catalogs.loader import shipped_catalog
from kplan.cli.main import app
from kplan.core.errors import DataFileError, InfeasibleError, InputError
from kplan.planner import extra_costs
from kplan.planner.catalog import Catalog
from kplan.planner.extra_costs import DataSpec, ExtraCosts
from kplan.planner.plan import Plan
from kplan.planner.search import SearchOptions, search
from tests.planner_fixtures import catalog, device_model, workload

runner = CliRunner()
PIN = SearchOptions(
    markets=("on-demand",),
    instance_types=("g4dn.12xlarge",),
    min_nodes=2,
    max_nodes=2,
    global_batch=128,
    accum_steps=(1,),
    mixed=False,
    top=1,
)


def _catalog(priced: bool = True) -> Catalog:
    """The test catalog (g4dn in us-east-1), with the shipped storage prices or none."""
    return replace(catalog(), storage=shipped_catalog().storage if priced else {})


def _chosen(opts: SearchOptions = PIN, priced: bool = True) -> Plan:
    return search(workload(), _catalog(priced), device_model(), opts)


def test_the_extras_follow_the_stated_formula() -> None:
    price = shipped_catalog().storage[("aws", "us-east-1")]
    rates = extra_costs.rates_for(
        shipped_catalog().storage, "aws", "us-east-1", DataSpec(100.0, "us-central1"), 1e9
    )
    x = rates.at(nodes=4, hours=73.0)  # a tenth of a month
    assert x.disk_usd == pytest.approx(4 * 75 * price.disk_usd_gb_month * 0.1)
    assert x.checkpoint_usd == pytest.approx(3.0 * 2 * price.object_usd_gb_month * 0.1)
    gcp = shipped_catalog().storage[("gcp", "us-central1")]
    assert x.data_usd == pytest.approx(100 * gcp.object_usd_gb_month * 0.1)
    assert (x.egress, x.egress_usd) == ("cross-cloud", pytest.approx(100 * gcp.egress_cloud_usd_gb))
    assert x.checkpoints_kept == 2 and x.data_region == "us-central1"
    assert "storage_prices.csv" in x.source and "2026-" in x.source


def test_with_no_data_only_disks_and_checkpoints_are_added() -> None:
    """The same configuration with and without storage prices: the cost differs by exactly the
    extras at the expected hours, the p90 by the same rates at the p90 hours."""
    with_x, without = _chosen().chosen, _chosen(priced=False).chosen
    assert (with_x.hours, with_x.hours_p90) == (without.hours, without.hours_p90)
    x = with_x.extras
    assert x.egress == "none" and x.egress_usd == 0 and x.data_usd == 0
    assert x.disk_usd > 0 and x.checkpoint_usd > 0
    assert with_x.cost_usd - without.cost_usd == pytest.approx(x.total_usd, rel=1e-9)
    p90_extra = x.total_usd * with_x.hours_p90 / with_x.hours
    assert with_x.cost_p90_usd - without.cost_p90_usd == pytest.approx(p90_extra, rel=1e-9)
    assert without.extras == ExtraCosts()


@pytest.mark.parametrize(
    ("region", "kind", "usd_gb"),
    [("us-west-2", "inter-region", 0.02), ("us-east1", "cross-cloud", 0.12)],
)
def test_data_elsewhere_pays_its_egress_once(region: str, kind: str, usd_gb: float) -> None:
    base = _chosen().chosen
    row = _chosen(replace(PIN, data=DataSpec(1000.0, region))).chosen
    assert (row.extras.egress, row.extras.egress_usd) == (kind, pytest.approx(1000 * usd_gb))
    assert row.cost_usd - base.cost_usd == pytest.approx(
        row.extras.egress_usd + row.extras.data_usd, rel=1e-9
    )


def test_the_budget_counts_the_egress() -> None:
    data = DataSpec(1000.0, "us-east1")  # 1 TB from GCP: $120 of egress
    p90 = _chosen(replace(PIN, data=data)).chosen.cost_p90_usd
    without = _chosen().chosen.cost_p90_usd
    assert p90 > without + 100
    assert _chosen(replace(PIN, data=data, budget_usd=p90 * 1.01)).chosen.cost_p90_usd <= p90
    with pytest.raises(InfeasibleError):
        _chosen(replace(PIN, data=data, budget_usd=(p90 + without) / 2))


def test_bad_data_is_refused() -> None:
    with pytest.raises(InputError, match="data size nan GB"):
        SearchOptions(data=DataSpec(math.nan))
    with pytest.raises(InputError, match="unknown data region 'mars-1'"):
        _chosen(replace(PIN, data=DataSpec(1.0, "mars-1")))


def test_plan_files_keep_the_extras_and_older_ones_load_with_none() -> None:
    plan = _chosen(replace(PIN, data=DataSpec(50.0, "us-west-2")))
    doc = json.loads(json.dumps(plan.to_dict()))
    assert doc["schema"] == "kplan.plan/2.1" and doc["chosen"]["extras"]["egress"] == "inter-region"
    assert Plan.from_dict(doc) == plan
    for key in ("plans", "frontier"):
        for row in doc[key]:
            del row["extras"]
    del doc["chosen"]["extras"]
    old = Plan.from_dict({**doc, "schema": "kplan.plan/2.0"})
    assert old.chosen.extras == ExtraCosts() and old.chosen.cost_usd == plan.chosen.cost_usd
    doc["chosen"]["extras"] = {"egress": "by-pigeon"}
    with pytest.raises(DataFileError, match=r"extras\.egress"):
        Plan.from_dict(doc)


def test_estimate_wide_and_json_show_the_lines() -> None:
    args = ["estimate", "-e", "yolov3", "--cloud", "aws", "--top", "2"]
    data = ["--data-gb", "200", "--data-region", "us-central1"]
    wide = runner.invoke(app, [*args, *data, "--wide"], env={"COLUMNS": "160"})
    assert wide.exit_code == 0, wide.output
    assert "disk" in wide.output and "egress" in wide.output
    assert "besides the instances, the cost holds: disks" in wide.output
    assert "200 GB cross-cloud" in wide.output
    out = runner.invoke(app, [*args, *data, "--json"])
    chosen = json.loads(out.output)["chosen"]
    assert chosen["extras"]["egress_usd"] == pytest.approx(200 * 0.12)
    assert chosen["cost_usd"] > chosen["extras"]["egress_usd"]
