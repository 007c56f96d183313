"""A loaded catalog kept under ``$KPLAN_HOME/cache``, keyed by what it was loaded from.

Reading and validating the catalog's CSV files and the spot model takes a few hundredths of a
second of every ``kplan estimate``; reading back the validated ``Catalog`` takes a few
thousandths. The key is a hash of the bytes of every file the loader reads (the catalog's files,
the shipped spot model) and of the loader's own source files, so any edit to either loads afresh
(timestamps are not trusted: two writes within one clock tick keep the same one). A cache that
cannot be read, written or trusted is ignored: the catalog is then loaded from its files, as
without a cache. The file is kplan's own pickle in kplan's own folder, read only by kplan.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import sys
import tempfile
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from kplan.core.errors import KplanError
from kplan.planner.catalog import Catalog

CACHE_FOLDER = "cache"
PREFIX = "catalog-"
KEEP = 4  # cached catalogs kept (the shipped one and a few user catalogs)
# The files the loader reads from a catalog folder (missing ones hash as missing).
CATALOG_FILES = (
    "gpus.csv",
    "instances.csv",
    "prices.csv",
    "spot_rates.csv",
    "billing.csv",
    "zones.csv",
    "storage_prices.csv",
    "VERSION.txt",
)
# The code that turns those files into a Catalog: a change to any of them loads afresh.
_SOURCES = (
    "kplan/catalogs/loader.py",
    "kplan/catalogs/rows.py",
    "kplan/catalogs/csvfile.py",
    "kplan/catalogs/zones.py",
    "kplan/catalogs/spot_model_file.py",
    "kplan/catalogs/catalog_cache.py",
    "kplan/planner/catalog.py",
    "kplan/planner/spot.py",
)


def cache_key(root: Traversable, user_folder: bool) -> str | None:
    """The hash of the catalog at ``root``, the shipped spot model and the loader's code; None
    when any cannot be read, or when a user folder has no VERSION.txt (its version is then
    taken from file times, which the key does not hold)."""
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{sys.version_info[:2]}|{pickle.HIGHEST_PROTOCOL}".encode())
    try:
        for name in CATALOG_FILES:
            f = root / name
            if not f.is_file():
                if user_folder and name == "VERSION.txt":
                    return None
                h.update(f"{name}:missing\n".encode())
                continue
            data = f.read_bytes()
            h.update(f"{name}:{len(data)}\n".encode())
            h.update(data)
        model = resources.files("kplan.catalogs").joinpath("data", "spot_model.json")
        h.update(model.read_bytes())
        # a user folder without storage prices uses the shipped ones
        h.update(
            resources.files("kplan.catalogs").joinpath("data", "storage_prices.csv").read_bytes()
        )
        base = Path(__file__).resolve().parent.parent.parent
        for src in _SOURCES:
            h.update((base / src).read_bytes())
    except OSError:
        return None
    return h.hexdigest()


def _folder() -> Path | None:
    from kplan.core.paths import kplan_home

    try:
        return kplan_home() / CACHE_FOLDER
    except KplanError:  # a KPLAN_HOME that is not a folder: reported where it is used
        return None


def read(key: str) -> Catalog | None:
    """The catalog cached under ``key``, or None."""
    folder = _folder()
    if folder is None:
        return None
    try:
        with open(folder / f"{PREFIX}{key}.pickle", "rb") as f:
            found = pickle.load(f)
    except Exception:  # missing, damaged or foreign (unpickling raises many types): load afresh
        return None
    return found if isinstance(found, Catalog) else None


def write(key: str, catalog: Catalog) -> None:
    """Keep ``catalog`` under ``key`` (atomically), and the ``KEEP`` newest cached catalogs."""
    folder = _folder()
    if folder is None:
        return
    with contextlib.suppress(OSError, pickle.PicklingError):
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".catalog-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                pickle.dump(catalog, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, folder / f"{PREFIX}{key}.pickle")
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        old = sorted(folder.glob(f"{PREFIX}*.pickle"), key=lambda p: p.stat().st_mtime_ns)
        for p in old[:-KEEP]:
            p.unlink(missing_ok=True)
