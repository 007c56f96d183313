"""``kplan catalog update``: refresh one cloud's instance types and prices from its APIs.

This module owns the catalog side (merge, write, validate, publish); what the clouds say comes
from a ``Fetch`` function passed in, ``kplan.launcher.providers.aws_catalog.fetch_aws`` or
``gcp_catalog.fetch_gcp`` (the launcher layer owns every cloud API call).

The update starts from the current catalog (the newest user catalog, else the shipped one),
replaces the refreshed cloud's rows (instance types the API describes; their offers in the
regions asked for) and carries every other row over unchanged (GPUs, spot rates, billing, the
other cloud, types the API does not describe). The result is written to a temporary directory
under ``$KPLAN_HOME/catalogs``, validated by loading it like any catalog, and only then renamed
to its dated name, which makes it current. A failed fetch or validation leaves the previous
catalog current and nothing half-written behind.
"""

from __future__ import annotations

import csv
import datetime as dt
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from kplan.catalogs.current import current_catalog_dir, user_catalogs, user_catalogs_root
from kplan.catalogs.loader import VERSION_FILE, load_catalog
from kplan.catalogs.rows import (
    BILLING_COLUMNS,
    GPU_COLUMNS,
    INSTANCE_COLUMNS,
    PRICE_COLUMNS,
    SPOT_RATE_COLUMNS,
)
from kplan.core.errors import CatalogError, InputError
from kplan.planner.catalog import CLOUDS, Catalog

Record = dict[str, str]
COLUMNS: dict[str, tuple[str, ...]] = {
    "gpus.csv": GPU_COLUMNS,
    "instances.csv": INSTANCE_COLUMNS,
    "prices.csv": PRICE_COLUMNS,
    "spot_rates.csv": SPOT_RATE_COLUMNS,
    "billing.csv": BILLING_COLUMNS,
}


@dataclass(frozen=True)
class Refresh:
    """What one cloud's APIs said: instance rows and offer rows (catalog columns), the regions
    whose offers they replace, and remarks on what could not be refreshed."""

    instances: list[Record]
    offers: list[Record]
    regions: tuple[str, ...]
    remarks: list[str] = field(default_factory=list)


# (the current catalog's rows, the regions to refresh, the date) -> what the APIs said
Fetch = Callable[[dict[str, list[Record]], tuple[str, ...], dt.date], Refresh]


@dataclass(frozen=True)
class UpdateResult:
    directory: Path
    catalog: Catalog
    base: str  # the catalog the update started from
    instances: int  # instance rows refreshed
    offers: int  # offer rows refreshed
    regions: tuple[str, ...]
    remarks: list[str]


def price_text(usd: float) -> str:
    """USD per hour as written to prices.csv: six decimals, trailing zeros dropped."""
    return f"{usd:.6f}".rstrip("0").rstrip(".")


def offer_record(
    cloud: str, name: str, region: str, zone: str, market: str, usd: float, src: str
) -> Record:
    """One prices.csv row."""
    return {
        "cloud": cloud,
        "instance_type": name,
        "region": region,
        "zone": zone,
        "market": market,
        "usd_per_hour": price_text(usd),
        "source": src,
    }


def read_tables(directory: Traversable) -> dict[str, list[Record]]:
    """The rows of a catalog's five CSV files (checked by loading it first)."""
    tables: dict[str, list[Record]] = {}
    for name, columns in COLUMNS.items():
        text = (directory / name).read_text(encoding="utf-8")
        rows = csv.DictReader(text.splitlines())
        tables[name] = [{c: (r.get(c) or "") for c in columns} for r in rows]
    return tables


def write_tables(directory: Path, tables: dict[str, list[Record]], version: str) -> None:
    for name, columns in COLUMNS.items():
        with (directory / name).open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
            writer.writeheader()
            writer.writerows(tables[name])
    (directory / VERSION_FILE).write_text(version + "\n", encoding="utf-8")


def merge(tables: dict[str, list[Record]], cloud: str, fresh: Refresh) -> dict[str, list[Record]]:
    """The current rows with ``cloud``'s refreshed instance types and offers replaced."""
    names = {r["name"] for r in fresh.instances}
    regions = set(fresh.regions)
    kept_instances = [
        r for r in tables["instances.csv"] if not (r["cloud"] == cloud and r["name"] in names)
    ]
    kept_offers = [
        r
        for r in tables["prices.csv"]
        if not (r["cloud"] == cloud and r["instance_type"] in names and r["region"] in regions)
    ]
    out = dict(tables)
    out["instances.csv"] = kept_instances + fresh.instances
    out["prices.csv"] = kept_offers + fresh.offers
    return out


def default_regions(tables: dict[str, list[Record]], cloud: str) -> tuple[str, ...]:
    """The regions the current catalog has offers in for ``cloud``."""
    return tuple(sorted({r["region"] for r in tables["prices.csv"] if r["cloud"] == cloud}))


def update_catalog(
    cloud: str,
    regions: Sequence[str],
    fetch: Fetch,
    *,
    root: Path | None = None,
    today: dt.date | None = None,
) -> UpdateResult:
    """Refresh ``cloud`` in ``regions`` (default: the current catalog's) and make it current."""
    if cloud not in CLOUDS:
        raise InputError(f"unknown cloud {cloud!r}", hint=f"one of {', '.join(CLOUDS)}")
    root = user_catalogs_root() if root is None else root
    today = today or dt.datetime.now(dt.UTC).date()
    base_dir = current_catalog_dir(root)
    base: Traversable = (
        resources.files("kplan.catalogs").joinpath("data") if base_dir is None else base_dir
    )
    base_label = "shipped" if base_dir is None else str(base_dir)
    tables = read_tables(base)
    wanted = tuple(regions) or default_regions(tables, cloud)
    if not wanted:
        raise InputError(
            f"no {cloud} regions to refresh", hint="name them: --region us-east-1 (repeatable)"
        )
    fresh = fetch(tables, wanted, today)
    if not fresh.offers:
        raise CatalogError(
            f"the {cloud} APIs returned no offers for {', '.join(wanted)}",
            hint="check the region names and that the account can see these instance types",
        )
    directory, catalog = publish(merge(tables, cloud, fresh), root, today)
    return UpdateResult(
        directory,
        catalog,
        base_label,
        len(fresh.instances),
        len(fresh.offers),
        wanted,
        fresh.remarks,
    )


def publish(tables: dict[str, list[Record]], root: Path, today: dt.date) -> tuple[Path, Catalog]:
    """Write, validate, then rename into place: ``root/<date>`` (``.2``, ``.3`` the same day)."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".update-", dir=root))
    try:
        name = _next_name(root, today)
        write_tables(tmp, tables, f"user-{name}")
        catalog = load_catalog(tmp)
        final = root / name
        tmp.rename(final)  # atomic on one file system; the name is new, so nothing is replaced
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, catalog


def _next_name(root: Path, today: dt.date) -> str:
    day = today.isoformat()
    taken = {p.name for p in user_catalogs(root)}
    if day not in taken:
        return day
    n = 2
    while f"{day}.{n}" in taken:
        n += 1
    return f"{day}.{n}"
