"""Prices are the catalog's, not the plan's: an edited or stale plan file cannot make a cluster
look cheaper to the budget guard or the ledger (issue 10, item 3)."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kplan.app.launching import LaunchRequest, build_spec
from kplan.cli.main import app
from kplan.core.errors import DataFileError
from kplan.launcher import providers
from kplan.launcher.clock import FakeClock
from kplan.launcher.jobspec import JobSpec, NodeSpec
from kplan.launcher.lifecycle import run_job
from kplan.launcher.pricing import CatalogPrice, differs, reprice
from kplan.launcher.providers import Backend
from kplan.launcher.state import StateDB
from kplan.launcher.storage import LocalStorage
from kplan.planner.catalog import Billing
from tests.launcher_fakes import SimProvider, fast_dir

runner = CliRunner()
HOUR = 3600.0


# --- the re-pricing itself ----------------------------------------------------------------------

OFFERS = (
    CatalogPrice("aws", "us-east-1", "use1-az1", "g5.xlarge", "spot", 0.40),
    CatalogPrice("aws", "us-east-1", "use1-az1", "g5.xlarge", "on-demand", 1.00),
    CatalogPrice("aws", "us-west-2", "usw2-az1", "g5.xlarge", "spot", 0.10),  # other region
)


def _node(rank: int, price: float, market: str = "spot", zone: str = "use1-az1") -> NodeSpec:
    return NodeSpec(rank, "g5.xlarge", market, zone, 1, price)  # type: ignore[arg-type]


def test_a_lower_plan_price_is_replaced_by_the_catalog_price_and_reported() -> None:
    nodes, notes = reprice([_node(0, 0.01), _node(1, 0.0)], "aws", "us-east-1", OFFERS, "cat v1")
    assert [n.usd_per_hour for n in nodes] == [0.40, 0.40]
    assert len(notes) == 2  # two different plan prices, one note each
    assert "$0.0100/h" in notes[0] and "cat v1 $0.4000/h" in notes[0] and "node(s) 0 " in notes[0]


def test_a_stale_higher_plan_price_is_kept_and_reported() -> None:
    nodes, notes = reprice([_node(0, 0.6), _node(1, 0.6)], "aws", "us-east-1", OFFERS)
    assert [n.usd_per_hour for n in nodes] == [0.6, 0.6]
    assert len(notes) == 1 and "node(s) 0, 1" in notes[0] and "$0.6000/h" in notes[0]


def test_within_five_percent_the_higher_price_is_used_silently() -> None:
    nodes, notes = reprice([_node(0, 0.39), _node(1, 0.41)], "aws", "us-east-1", OFFERS)
    assert [n.usd_per_hour for n in nodes] == [0.40, 0.41]
    assert notes == ()
    assert differs(0.43, 0.40) and not differs(0.42, 0.40) and differs(0.01, 0.0)


@pytest.mark.parametrize(
    "node",
    [
        _node(0, 0.4, zone="use1-az9"),  # a zone the catalog does not have
        NodeSpec(0, "g9.huge", "spot", "use1-az1", 1, 0.4),  # an unknown type
        _node(0, 0.4, market="on-demand", zone="usw2-az1"),  # a market the zone lacks
    ],
)
def test_a_node_the_catalog_does_not_offer_is_rejected(node: NodeSpec) -> None:
    with pytest.raises(DataFileError, match="does not offer") as err:
        reprice([node], "aws", "us-east-1", OFFERS)
    assert "kplan estimate" in err.value.hint


def test_the_local_cloud_is_not_repriced() -> None:
    local = NodeSpec(0, "local", "on-demand", "local", 1, 0.0)
    assert reprice([local], "local", "local", ()) == ((local,), ())


# --- through the CLI: kplan launch --plan FILE --dry-run --json --------------------------------


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = fast_dir(tmp_path, "prices")
    monkeypatch.setenv("KPLAN_HOME", str(folder))
    monkeypatch.setitem(providers.FACTORIES, "aws", "tests.launcher_fakes:refusing_backend")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def honest_plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    res = runner.invoke(
        app,
        ["estimate", "--example", "cifar10-resnet18", "--cloud", "aws", "--out", str(path)],
    )
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(path.read_text())
    assert doc["chosen"]["usd_per_hour"] > 1.0  # a GPU cluster that $0.02 cannot start
    return doc


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "code" / "train.py"
    path.parent.mkdir()
    path.write_text("print('train')\n")
    return path


def _edited(plan: dict[str, Any], row: bool = True, **fields: Any) -> dict[str, Any]:
    """The plan with every group's (and, with ``row``, the row's) fields replaced."""
    doc = copy.deepcopy(plan)
    if row:
        doc["chosen"].update({k: v for k, v in fields.items() if k in doc["chosen"]})
    for group in doc["chosen"]["groups"]:
        group.update(fields)
    return doc


def _dry_run(tmp_path: Path, script: Path, plan: dict[str, Any], budget: str = "0.5") -> Any:
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(plan))
    return runner.invoke(
        app,
        ["launch", str(script), "--budget", budget, "--plan", str(path), "--dry-run", "--json"],
    )


@pytest.mark.parametrize("price", [0.01, 0.0])
def test_an_edited_plan_price_cannot_raise_the_startable_budget_hours(
    home: Path, script: Path, tmp_path: Path, honest_plan: dict[str, Any], price: float
) -> None:
    # a budget the plan's catalog price cannot start (its first check projects more), but an
    # edited price of a cent an hour could
    honest = _dry_run(tmp_path, script, honest_plan, budget="0.02")
    assert honest.exit_code == 0, honest.output
    edited = _dry_run(tmp_path, script, _edited(honest_plan, usd_per_hour=price), budget="0.02")
    assert edited.exit_code == 0, edited.output
    want, got = json.loads(honest.output), json.loads(edited.output)
    assert want["startable"] is False and want["price_notes"] == []
    assert got["startable"] == want["startable"]
    assert got["budget_hours"] == pytest.approx(want["budget_hours"])
    assert got["usd_per_hour"] == pytest.approx(honest_plan["chosen"]["usd_per_hour"])
    assert len(got["price_notes"]) == 1 and f"${price:.4f}/h" in got["price_notes"][0]


def test_a_stale_higher_plan_price_is_kept_and_shown(
    home: Path, script: Path, tmp_path: Path, honest_plan: dict[str, Any]
) -> None:
    catalog_usd = honest_plan["chosen"]["groups"][0]["usd_per_hour"]
    stale = _edited(honest_plan, usd_per_hour=round(catalog_usd * 2, 4))
    res = _dry_run(tmp_path, script, stale, budget="1000")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    nodes = honest_plan["chosen"]["nodes"]
    assert doc["usd_per_hour"] == pytest.approx(nodes * round(catalog_usd * 2, 4))
    assert len(doc["price_notes"]) == 1 and "the higher" in doc["price_notes"][0]
    # The table rendering shows the same note.
    path = tmp_path / "stale.json"
    path.write_text(json.dumps(stale))
    res = runner.invoke(
        app, ["launch", str(script), "--budget", "1000", "--plan", str(path), "--dry-run"]
    )
    assert res.exit_code == 0, res.output
    assert "price:" in res.output and "the higher" in res.output


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"zone": "use2-az99"}, "does not offer"),
        ({"instance_type": "p9.mega"}, "'p9.mega' is not a type of aws in catalog"),
        ({"usd_per_hour": float("nan")}, "nan"),  # the JSON reader or NodeSpec refuses it
        ({"usd_per_hour": float("inf")}, "inf"),
        ({"usd_per_hour": -1.0}, "usd_per_hour -1.0 is not a finite number in [0,"),
        ({"usd_per_hour": "cheap"}, "usd_per_hour 'cheap' is not a finite number"),
    ],
)
def test_a_plan_row_the_catalog_cannot_price_is_rejected(
    home: Path,
    script: Path,
    tmp_path: Path,
    honest_plan: dict[str, Any],
    fields: dict[str, Any],
    needle: str,
) -> None:
    res = _dry_run(tmp_path, script, _edited(honest_plan, row=False, **fields))
    assert res.exit_code == 2, res.output
    assert needle in res.output.lower() and "Traceback" not in res.output
    assert "hint:" in res.output


@pytest.mark.parametrize("name", ["cost_usd", "cost_p90_usd", "hours"])
@pytest.mark.parametrize("value", [float("nan"), float("-inf"), -0.5, True, "1"])
def test_the_plan_rows_money_fields_must_be_finite_and_not_negative(
    home: Path,
    script: Path,
    tmp_path: Path,
    honest_plan: dict[str, Any],
    name: str,
    value: Any,
) -> None:
    doc = copy.deepcopy(honest_plan)
    doc["chosen"][name] = value
    res = _dry_run(tmp_path, script, doc)
    assert res.exit_code == 2, res.output
    # NaN and infinities are refused by the JSON reader already; the rest here.
    assert f"the plan's chosen.{name}" in res.output or "is not a number" in res.output


# --- at launch: the guard and the ledger bill the catalog's price, and an event says so --------


def test_the_ledger_bills_the_catalog_price_of_an_edited_plan(
    tmp_path: Path, honest_plan: dict[str, Any], script: Path
) -> None:
    path = tmp_path / "cheap.json"
    path.write_text(json.dumps(_edited(honest_plan, usd_per_hour=0.01)))
    spec = build_spec(
        LaunchRequest(script=script, budget_usd=1000.0, plan_file=path, job_id="kp-price-1")
    )
    assert (
        spec.predicted.price_notes
        and JobSpec.from_dict(spec.to_dict()).predicted.price_notes == spec.predicted.price_notes
    )
    catalog_usd = honest_plan["chosen"]["groups"][0]["usd_per_hour"]
    assert {n.usd_per_hour for n in spec.nodes} == {catalog_usd}
    folder = fast_dir(tmp_path, "ledger")
    clock = FakeClock()
    storage = LocalStorage(folder / "store")
    storage.uri = "s3://bucket/kplan"
    sim = SimProvider(clock, storage, finish_at=clock.now() + HOUR)
    try:
        with StateDB.open(folder / "kplan.db") as db:
            out = run_job(
                spec, Backend(sim, storage), db, clock=clock, billing=Billing("aws", 60, 1, "t")
            )
            assert out.status == "succeeded"
            rows = db.ledger("kp-price-1")
            assert {i.price for i in db.instances("kp-price-1")} == {catalog_usd}
            # each instance ran about the hour at the catalog's price; its disk and the job's
            # storage are rows of their own kinds (priced from storage_prices.csv)
            machines = [r for r in rows if r.kind == "instance"]
            assert machines and out.spend_usd >= len(machines) * catalog_usd * 0.98
            assert sum(r.usd for r in machines) == pytest.approx(
                len(machines) * catalog_usd, rel=0.02
            )
            assert out.spend_usd == pytest.approx(sum(r.usd for r in rows), rel=1e-6)
            events = [e for e in db.events("kp-price-1") if e.kind == "price"]
            assert [e.message for e in events] == list(spec.predicted.price_notes)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
