"""The cloud-independent half of ``kplan catalog update``: the current catalog, merging,
publishing (validate, then rename), and the warning for an old catalog."""

from __future__ import annotations

import datetime as dt
import json
import shutil
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.catalogs.current import (
    catalog_date,
    current_catalog_dir,
    load_current,
    staleness_note,
    user_catalogs,
)
from kplan.catalogs.update import Fetch, Refresh, publish, read_tables, update_catalog
from kplan.cli.main import app
from kplan.core.errors import CatalogError, InputError

runner = CliRunner()
SHIPPED = Path(str(resources.files("kplan.catalogs").joinpath("data")))


def today() -> dt.date:
    """Read when a test runs, not when the module is collected: a suite that crosses midnight
    (UTC) between the two saw a 45-day-old catalog as 46 days old."""
    return dt.datetime.now(dt.UTC).date()


def user_copy(root: Path, name: str, version: str) -> Path:
    """A copy of the shipped catalog as the user catalog ``root/name``."""
    target = root / name
    shutil.copytree(SHIPPED, target, ignore=shutil.ignore_patterns("*.md", "*.json", "LICENSE*"))
    (target / "VERSION.txt").write_text(version + "\n")
    return target


def estimate_doc(*extra: str) -> dict[str, object]:
    args = ["estimate", "--example", "cifar10-resnet18", "--json", "--top", "2", *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def test_newest_dated_directory_is_current(tmp_path: Path) -> None:
    assert current_catalog_dir(tmp_path) is None
    for name in ("2026-10-01", "2026-11-02", "2026-11-02.2", "2026-11-02.10", "notes", ".x"):
        (tmp_path / name).mkdir()
    (tmp_path / "2027-01-01").write_text("a file, not a catalog")
    assert [p.name for p in user_catalogs(tmp_path)] == [
        "2026-10-01",
        "2026-11-02",
        "2026-11-02.2",
        "2026-11-02.10",
    ]
    assert current_catalog_dir(tmp_path) == tmp_path / "2026-11-02.10"


def test_catalog_dates_and_staleness() -> None:
    assert catalog_date("user-2026-11-20") == dt.date(2026, 11, 20)
    assert catalog_date("user-2026-11-20.3") == dt.date(2026, 11, 20)
    assert catalog_date("shipped-2026.11") == dt.date(2026, 11, 1)
    assert catalog_date("user-2026-13-40") is None
    assert catalog_date("my-own") is None
    today = dt.date(2026, 12, 31)
    assert staleness_note("user-2026-12-01", today) is None  # 30 days: not yet
    note = staleness_note("user-2026-11-30", today)
    assert note is not None and "31 days old" in note and "kplan catalog update" in note
    assert staleness_note("my-own", today) is None


def test_estimate_prefers_newest_user_catalog_and_warns_when_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KPLAN_HOME", str(tmp_path))
    root = tmp_path / "catalogs"
    now = today()
    old_day = now - dt.timedelta(days=45)
    user_copy(root, old_day.isoformat(), f"user-{old_day}")
    doc = estimate_doc()
    assert doc["catalog"] == f"user-{old_day}"
    notes = [n for n in doc["notes"] if "days old" in n]  # type: ignore[attr-defined]
    assert notes == [
        f"catalog user-{old_day} is 45 days old: prices and offers may have changed; "
        "refresh it with `kplan catalog update --cloud aws` (or gcp)"
    ]
    table = runner.invoke(app, ["estimate", "--example", "cifar10-resnet18", "--top", "2"])
    assert "45 days old" in " ".join(table.output.split())
    user_copy(root, now.isoformat(), f"user-{now}")  # a newer one wins, and is fresh
    doc = estimate_doc()
    assert doc["catalog"] == f"user-{now}"
    assert not [n for n in doc["notes"] if "days old" in n]  # type: ignore[attr-defined]


def test_catalog_list_uses_current_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KPLAN_HOME", str(tmp_path))
    user_copy(tmp_path / "catalogs", today().isoformat(), "user-mine")
    assert load_current().version == "user-mine"
    result = runner.invoke(app, ["catalog", "list", "--gpu", "T4", "--max-price", "1"])
    assert result.exit_code == 0, result.output
    assert "user-mine" in result.output


def fake_fetch(price: str, offers: bool = True) -> Fetch:
    """A fetch that refreshes g4dn.12xlarge with one on-demand offer in use1-az1."""

    def fetch(
        tables: dict[str, list[dict[str, str]]], regions: tuple[str, ...], today: dt.date
    ) -> Refresh:
        inst = next(r for r in tables["instances.csv"] if r["name"] == "g4dn.12xlarge")
        offer = {
            "cloud": "aws",
            "instance_type": "g4dn.12xlarge",
            "region": regions[0],
            "zone": "use1-az1",
            "market": "on-demand",
            "usd_per_hour": price,
            "source": f"test {today}",
        }
        return Refresh([dict(inst, source=f"test {today}")], [offer] if offers else [], regions)

    return fetch


def test_update_merges_one_region_and_keeps_the_rest(tmp_path: Path) -> None:
    result = update_catalog(
        "aws", ("us-east-1",), fake_fetch("1.5"), root=tmp_path, today=dt.date(2026, 11, 22)
    )
    assert result.directory == tmp_path / "2026-11-22"
    assert result.catalog.version == "user-2026-11-22" and result.base == "shipped"
    g4 = [o for o in result.catalog.offers if o.instance_type == "g4dn.12xlarge"]
    assert {(o.zone, o.market, o.usd_per_hour) for o in g4 if o.region == "us-east-1"} == {
        ("use1-az1", "on-demand", 1.5)
    }
    assert any(o.region == "us-west-2" for o in g4)  # other regions carried over
    shipped = load_current(SHIPPED)
    assert len(result.catalog.gpus) == len(shipped.gpus)
    assert sum(o.cloud == "gcp" for o in result.catalog.offers) == sum(
        o.cloud == "gcp" for o in shipped.offers
    )
    # a second update the same day gets its own name and starts from the first
    again = update_catalog(
        "aws", ("us-west-2",), fake_fetch("2.5"), root=tmp_path, today=dt.date(2026, 11, 22)
    )
    assert again.directory.name == "2026-11-22.2" and again.base == str(result.directory)
    prices = {(o.region, o.usd_per_hour) for o in again.catalog.offers if o.zone == "use1-az1"}
    assert ("us-east-1", 1.5) in prices
    assert current_catalog_dir(tmp_path) == again.directory


def test_failed_validation_leaves_previous_catalog_current(tmp_path: Path) -> None:
    first = update_catalog("aws", ("us-east-1",), fake_fetch("1.5"), root=tmp_path)
    tables = read_tables(first.directory)
    tables["billing.csv"] = [r for r in tables["billing.csv"] if r["cloud"] != "aws"]
    with pytest.raises(CatalogError, match="no billing rule for aws"):
        publish(tables, tmp_path, today())
    with pytest.raises(CatalogError, match="returned no offers"):
        update_catalog("aws", ("us-east-1",), fake_fetch("1.5", offers=False), root=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.directory.name]
    assert current_catalog_dir(tmp_path) == first.directory


def test_update_rejects_unknown_cloud_and_flags(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        update_catalog("azure", (), fake_fetch("1"), root=tmp_path)
    result = runner.invoke(app, ["catalog", "update", "--cloud", "azure"])
    assert result.exit_code == 2 and result.output.startswith("error: unknown cloud 'azure'")
