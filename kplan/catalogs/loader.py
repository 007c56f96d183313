"""Load and validate a catalog: the one shipped with kplan, or a directory of the same files.

Files (columns in ``kplan.catalogs.rows``; meaning and sources in docs/catalogs.md):
``gpus.csv``, ``instances.csv``, ``prices.csv``, ``spot_rates.csv``, ``billing.csv`` and
``VERSION.txt``; optional ``zones.csv`` (the opt-in zones, ``kplan.catalogs.zones``) and
``storage_prices.csv`` (storage and egress list prices per region; a user directory without one
uses the shipped file's). A region with offers but no storage prices is noted: its plans count
no disk, storage or egress.

Rules: a file that is missing or malformed raises ``CatalogError``. A bad row is never used: it
is dropped and ``Catalog.notes`` records ``file:line: reason``. Rows are bad when a required field
is empty, a number is not a number or has the wrong sign, a word is not an allowed one, the row
repeats an earlier key, an instance names an unknown GPU, or an offer names an unknown instance
type. A spot price above the on-demand price of the same instance in the same zone is dropped; a
spot price equal to it, or a spot price with no on-demand price to check it against (AWS p5e), is
kept and noted. Loading the shipped catalog takes a few milliseconds (plain ``csv``, no pandas).
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TypeVar

from kplan.catalogs import catalog_cache
from kplan.catalogs.csvfile import FILES_HINT, Row, RowError, read_table
from kplan.catalogs.rows import (
    BILLING_COLUMNS,
    GPU_COLUMNS,
    INSTANCE_COLUMNS,
    PRICE_COLUMNS,
    SPOT_RATE_COLUMNS,
    STORAGE_COLUMNS,
    parse_billing,
    parse_gpu,
    parse_instance,
    parse_offer,
    parse_spot_rate,
    parse_storage,
)
from kplan.catalogs.spot_model_file import shipped_spot_model
from kplan.catalogs.zones import ZONE_COLUMNS, ZONE_FILE, parse_zone, zone_type_from_id
from kplan.core.errors import CatalogError
from kplan.planner.catalog import (
    Billing,
    Catalog,
    GpuSpec,
    InstanceType,
    Offer,
    SpotRate,
    StoragePrice,
    ZoneType,
)

VERSION_FILE = "VERSION.txt"
STORAGE_FILE = "storage_prices.csv"
SHIPPED_LABEL = "kplan.catalogs/data"
T = TypeVar("T")


def load_catalog(directory: Path | None = None) -> Catalog:
    """Read and validate the catalog in ``directory``, or the shipped one when it is None; a
    catalog loaded before from the same files comes from ``$KPLAN_HOME/cache``
    (``kplan.catalogs.catalog_cache``)."""
    if directory is not None and not directory.is_dir():
        raise CatalogError(f"catalog directory {directory} does not exist", hint=FILES_HINT)
    root = resources.files("kplan.catalogs").joinpath("data") if directory is None else directory
    key = catalog_cache.cache_key(root, user_folder=directory is not None)
    found = None if key is None else catalog_cache.read(key)
    if found is not None:
        return found
    catalog = _load_catalog(directory)
    if key is not None:
        catalog_cache.write(key, catalog)
    return catalog


def _load_catalog(directory: Path | None) -> Catalog:
    if directory is None:
        files = _Files(resources.files("kplan.catalogs").joinpath("data"), SHIPPED_LABEL)
    elif not directory.is_dir():
        raise CatalogError(f"catalog directory {directory} does not exist", hint=FILES_HINT)
    else:
        files = _Files(directory, str(directory))
    gpus = {g.name: g for _, g in files.unique("gpus.csv", GPU_COLUMNS, parse_gpu, _gpu_key)}
    instances: dict[tuple[str, str], InstanceType] = {}
    for line, inst in files.unique("instances.csv", INSTANCE_COLUMNS, parse_instance, _inst_key):
        if inst.gpu in gpus:
            instances[_inst_key(inst)] = inst
        else:
            files.note(
                f"instances.csv:{line}: unknown GPU {inst.gpu!r} (not in gpus.csv); row dropped"
            )
    offers = _with_zone_types(files, _load_offers(files, instances))
    spot_rates = tuple(
        r
        for _, r in files.unique(
            "spot_rates.csv", SPOT_RATE_COLUMNS, parse_spot_rate, lambda r: (r.cloud, r.family)
        )
    )
    billing = {
        str(b.cloud): b
        for _, b in files.unique("billing.csv", BILLING_COLUMNS, parse_billing, lambda b: b.cloud)
    }
    _check_complete(files, offers, spot_rates, billing)
    storage = _load_storage(files, offers)
    return Catalog(
        gpus=gpus,
        instances=instances,
        offers=offers,
        spot_rates=spot_rates,
        billing=billing,
        version=_version(files, directory),
        notes=tuple(files.notes),
        spot_model=shipped_spot_model(),
        storage=storage,
    )


@functools.cache
def shipped_catalog() -> Catalog:
    """The shipped catalog, loaded once per process."""
    return load_catalog(None)


@dataclass
class _Files:
    """A catalog directory being read, and the notes on the rows it dropped or doubted."""

    root: Traversable
    label: str
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def unique(
        self,
        name: str,
        columns: tuple[str, ...],
        parse: Callable[[Row], T],
        key: Callable[[T], object],
    ) -> Iterator[tuple[int, T]]:
        """(line, record) of each row that parses and whose key is new; others are noted."""
        first: dict[object, int] = {}
        for row in read_table(self.root, name, columns, label=self.label):
            try:
                record = parse(row)
            except RowError as err:
                self.note(f"{name}:{row.line}: {err}; row dropped")
                continue
            k = key(record)
            if k in first:
                shown = ":".join(map(str, k)) if isinstance(k, tuple) else str(k)
                self.note(f"{name}:{row.line}: duplicate of line {first[k]} ({shown}); row dropped")
                continue
            first[k] = row.line
            yield row.line, record


def _gpu_key(gpu: GpuSpec) -> str:
    return gpu.name


def _inst_key(inst: InstanceType) -> tuple[str, str]:
    return (inst.cloud, inst.name)


def _load_offers(
    files: _Files, instances: dict[tuple[str, str], InstanceType]
) -> tuple[Offer, ...]:
    """Offers of known instances; spot checked against on-demand in the same zone."""
    kept: list[tuple[int, Offer]] = []
    for line, offer in files.unique(
        "prices.csv",
        PRICE_COLUMNS,
        parse_offer,
        lambda o: (o.cloud, o.instance_type, o.zone, o.market),
    ):
        if (offer.cloud, offer.instance_type) not in instances:
            files.note(
                f"prices.csv:{line}: unknown instance type "
                f"{offer.cloud}:{offer.instance_type} (not in instances.csv, or its "
                "row was dropped); row dropped"
            )
        else:
            kept.append((line, offer))
    on_demand = {
        (o.cloud, o.instance_type, o.zone): o.usd_per_hour
        for _, o in kept
        if o.market == "on-demand"
    }
    offers: list[Offer] = []
    for line, offer in kept:
        if offer.market == "spot":
            what = f"{offer.cloud} {offer.instance_type} in {offer.zone}"
            od = on_demand.get((offer.cloud, offer.instance_type, offer.zone))
            if od is None:
                files.note(
                    f"prices.csv:{line}: no on-demand price for {what}; spot offer "
                    "kept, not checked against on-demand"
                )
            elif offer.usd_per_hour > od:
                files.note(
                    f"prices.csv:{line}: spot price {offer.usd_per_hour:g} is above "
                    f"the on-demand price {od:g} for {what}; spot offer dropped"
                )
                continue
            elif offer.usd_per_hour == od:
                files.note(
                    f"prices.csv:{line}: spot price equals the on-demand price "
                    f"{od:g} for {what}; kept"
                )
        offers.append(offer)
    return tuple(offers)


def _load_storage(files: _Files, offers: tuple[Offer, ...]) -> dict[tuple[str, str], StoragePrice]:
    """Storage and egress prices by (cloud, region): the directory's file, else the shipped one;
    a region with offers and no prices is noted."""
    source = files
    if not (files.root / STORAGE_FILE).is_file() and files.label != SHIPPED_LABEL:
        source = _Files(resources.files("kplan.catalogs").joinpath("data"), SHIPPED_LABEL)
    storage: dict[tuple[str, str], StoragePrice] = {
        (p.cloud, p.region): p
        for _, p in source.unique(
            STORAGE_FILE, STORAGE_COLUMNS, parse_storage, lambda p: (p.cloud, p.region)
        )
    }
    if source is not files:
        files.notes.extend(source.notes)
    for cloud, region in sorted({(o.cloud, o.region) for o in offers} - set(storage)):
        files.note(
            f"{STORAGE_FILE}: no prices for {cloud}:{region}; its plans count no disk, "
            "storage or egress"
        )
    return storage


def _with_zone_types(files: _Files, offers: tuple[Offer, ...]) -> tuple[Offer, ...]:
    """Each offer's zone type: from zones.csv (optional), else from its zone id's form."""
    listed: dict[tuple[str, str], ZoneType] = {}
    if (files.root / ZONE_FILE).is_file():
        for _, (cloud, zone, kind) in files.unique(
            ZONE_FILE, ZONE_COLUMNS, parse_zone, lambda z: (z[0], z[1])
        ):
            listed[(cloud, zone)] = kind
    out: list[Offer] = []
    for o in offers:
        kind = listed.get((o.cloud, o.zone)) or zone_type_from_id(o.cloud, o.zone)
        out.append(o if kind == o.zone_type else replace(o, zone_type=kind))
    return tuple(out)


def _check_complete(
    files: _Files,
    offers: tuple[Offer, ...],
    spot_rates: tuple[SpotRate, ...],
    billing: dict[str, Billing],
) -> None:
    """Every cloud with offers needs a billing rule, and a default spot rate if it has spot."""
    if not offers:
        first = "; ".join(files.notes[:3]) or "prices.csv has no rows"
        raise CatalogError(
            f"catalog {files.label} has no usable offers", hint=f"first problems: {first}"
        )
    for cloud in sorted({o.cloud for o in offers}):
        if cloud not in billing:
            raise CatalogError(
                f"catalog {files.label}: no billing rule for {cloud} in billing.csv",
                hint=f"add a row: {cloud},60,1,<source>",
            )
        has_spot = any(o.cloud == cloud and o.market == "spot" for o in offers)
        if has_spot and not any(r.cloud == cloud and r.family == "*" for r in spot_rates):
            raise CatalogError(
                f"catalog {files.label}: {cloud} has spot offers but no default spot rate",
                hint=f"add a row to spot_rates.csv: {cloud},*,<preemptions per hour>,<source>",
            )


def _version(files: _Files, directory: Path | None) -> str:
    """VERSION.txt's first line; a user directory without one gets ``user-<newest file date>``."""
    path, label = files.root / VERSION_FILE, files.label
    if not path.is_file():
        if directory is None:
            raise CatalogError(
                f"{label}/{VERSION_FILE} is missing",
                hint="the shipped catalog is damaged: reinstall kplan",
            )
        newest = max(p.stat().st_mtime for p in directory.glob("*.csv"))
        return "user-" + dt.datetime.fromtimestamp(newest, dt.UTC).strftime("%Y-%m-%d")
    try:
        lines = path.read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError) as err:
        raise CatalogError(
            f"cannot read {label}/{VERSION_FILE}: {err}",
            hint="it must hold one word, e.g. user-2026-11-20",
        ) from None
    if len(lines) != 1:
        raise CatalogError(
            f"{label}/{VERSION_FILE} must hold one word, got {' '.join(lines)[:60]!r}",
            hint="e.g. user-2026-11-20",
        )
    return lines[0]
