"""The storage and egress price catalog (storage_prices.csv): shipped coverage and the loader's
rules on its rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from kplan.catalogs import load_catalog
from kplan.catalogs.loader import shipped_catalog
from tests.test_catalog_loader import write_catalog

HEADER = (
    "cloud,region,object_usd_gb_month,disk_usd_gb_month,egress_region_usd_gb,"
    "egress_internet_usd_gb,egress_cloud_usd_gb,source,as_of\n"
)
GOOD = (
    "aws,us-east-1,0.023,0.08,0.02,0.09,0.09,list,2026-11-01\n"
    "gcp,us-central1,0.02,0.1,0.02,0.12,0.12,list,2026-11-01\n"
)


def _write(tmp_path: Path, rows: str) -> Path:
    root = write_catalog(tmp_path)
    (root / "storage_prices.csv").write_text(HEADER + rows, encoding="utf-8")
    return root


def test_shipped_storage_prices_cover_every_region_with_offers() -> None:
    cat = shipped_catalog()
    regions = {(o.cloud, o.region) for o in cat.offers}
    assert regions <= set(cat.storage), sorted(regions - set(cat.storage))
    assert not [n for n in cat.notes if "storage_prices" in n]
    for p in cat.storage.values():
        assert "list price" in p.source and "http" not in p.source.split()[0]
        assert p.as_of.count("-") == 2
        # the cross-cloud path is the internet: never cheaper than another region
        assert p.egress_region_usd_gb <= p.egress_cloud_usd_gb


def test_a_user_catalog_without_the_file_uses_the_shipped_prices(tmp_path: Path) -> None:
    cat = load_catalog(write_catalog(tmp_path))
    assert cat.storage[("aws", "us-east-1")] == shipped_catalog().storage[("aws", "us-east-1")]
    assert cat.notes == ()


def test_user_storage_prices_are_read(tmp_path: Path) -> None:
    cat = load_catalog(_write(tmp_path, GOOD.replace("0.08", "0.5")))
    assert cat.storage[("aws", "us-east-1")].disk_usd_gb_month == 0.5
    assert cat.notes == ()


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("aws,us-east-1,-1,0.08,0.02,0.09,0.09,list,2026-11-01", "must be >= 0"),
        ("aws,us-east-1,0.023,nan,0.02,0.09,0.09,list,2026-11-01", "not a finite number"),
        ("aws,us-east-1,0.023,80,0.02,0.09,0.09,list,2026-11-01", "not cents or per TB"),
        ("aws,us-east-1,0.023,0.08,0.02,0.09,0.09,list,last week", "is not a date"),
        ("aws,us-east-1,0.023,0.08,0.02,0.09,0.09,,2026-11-01", "source is empty"),
        ("azure,eastus,0.023,0.08,0.02,0.09,0.09,list,2026-11-01", "cloud='azure'"),
    ],
)
def test_bad_rows_are_dropped_with_one_line_each(tmp_path: Path, row: str, reason: str) -> None:
    rows = GOOD.splitlines()[1] + "\n" + row + "\n"
    cat = load_catalog(_write(tmp_path, rows))
    bad = [n for n in cat.notes if n.startswith("storage_prices.csv:3:")]
    assert len(bad) == 1 and reason in bad[0] and bad[0].endswith("row dropped"), cat.notes
    if not row.startswith("azure"):
        # the region lost its row: the loader says what that means for its plans
        assert any("no prices for aws:us-east-1" in n for n in cat.notes)


def test_duplicate_region_is_dropped(tmp_path: Path) -> None:
    cat = load_catalog(_write(tmp_path, GOOD + GOOD.splitlines()[0] + "\n"))
    assert any("duplicate of line 2" in n for n in cat.notes)
