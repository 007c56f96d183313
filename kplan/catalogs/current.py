"""Which catalog kplan uses by default, and how old it is.

``kplan catalog update`` writes dated catalogs under ``$KPLAN_HOME/catalogs/`` (default
``~/.kplan/catalogs/``): ``2026-11-22``, then ``2026-11-22.2`` for a second update that day. The
newest of them is the current catalog; without one, the shipped catalog is. A catalog whose
version dates it more than ``STALE_DAYS`` ago gets a warning in every plan made with it.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

from kplan.core.paths import kplan_home
from kplan.planner.catalog import Catalog

STALE_DAYS = 30
USER_DIR_RE = re.compile(r"(\d{4}-\d{2}-\d{2})(?:\.(\d+))?")
_USER_VERSION_RE = re.compile(r"user-(\d{4}-\d{2}-\d{2})(?:\.\d+)?")
_SHIPPED_VERSION_RE = re.compile(r"shipped-(\d{4})\.(\d{2})")


def user_catalogs_root() -> Path:
    """``$KPLAN_HOME/catalogs`` (``~/.kplan/catalogs``)."""
    return kplan_home() / "catalogs"


def _order(path: Path) -> tuple[str, int] | None:
    m = USER_DIR_RE.fullmatch(path.name)
    if m is None or not path.is_dir():
        return None
    return (m[1], int(m[2] or 1))


def user_catalogs(root: Path | None = None) -> list[Path]:
    """The dated catalog directories under ``root``, oldest first."""
    root = user_catalogs_root() if root is None else root
    if not root.is_dir():
        return []
    dated = [(key, p) for p in root.iterdir() if (key := _order(p)) is not None]
    return [p for _, p in sorted(dated)]


def current_catalog_dir(root: Path | None = None) -> Path | None:
    """The newest user catalog directory, or None when there is none (the shipped one applies)."""
    dirs = user_catalogs(root)
    return dirs[-1] if dirs else None


def load_current(directory: Path | None = None) -> Catalog:
    """``directory`` if given, else the newest user catalog, else the shipped one."""
    from kplan.catalogs.loader import load_catalog, shipped_catalog

    chosen = directory if directory is not None else current_catalog_dir()
    return shipped_catalog() if chosen is None else load_catalog(chosen)


def catalog_date(version: str) -> dt.date | None:
    """The date a catalog version names: ``user-2026-11-22`` (or ``.2``), ``shipped-2026.11``
    (the first of that month); None for other versions."""
    try:
        if m := _USER_VERSION_RE.fullmatch(version):
            return dt.date.fromisoformat(m[1])
        if m := _SHIPPED_VERSION_RE.fullmatch(version):
            return dt.date(int(m[1]), int(m[2]), 1)
    except ValueError:
        return None
    return None


def staleness_note(version: str, today: dt.date | None = None) -> str | None:
    """A warning when the catalog is more than ``STALE_DAYS`` old, else None."""
    made = catalog_date(version)
    if made is None:
        return None
    today = today or dt.datetime.now(dt.UTC).date()
    age = (today - made).days
    if age <= STALE_DAYS:
        return None
    return (
        f"catalog {version} is {age} days old: prices and offers may have changed; "
        "refresh it with `kplan catalog update --cloud aws` (or gcp)"
    )
