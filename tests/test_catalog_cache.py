"""The validated catalog kept under ``$KPLAN_HOME/cache`` (kplan/catalogs/catalog_cache.py):
the same catalog as loading the files, keyed by their bytes (an edit that keeps the size and the
time is seen), and a cache that is damaged or cannot be written is ignored."""

from __future__ import annotations

import os
import shutil
from importlib import resources
from pathlib import Path

import pytest

from kplan.catalogs import catalog_cache
from kplan.catalogs.loader import _load_catalog, load_catalog

DATA = Path(str(resources.files("kplan.catalogs").joinpath("data")))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _cached(home: Path) -> list[Path]:
    return sorted((home / "cache").glob("catalog-*.pickle"))


def test_the_cached_catalog_is_the_loaded_one(home: Path) -> None:
    first = load_catalog(None)
    assert len(_cached(home)) == 1
    again = load_catalog(None)  # from the cache
    assert again == first == _load_catalog(None)
    assert again.offers and again.notes == first.notes


def test_an_edit_of_the_same_size_and_time_loads_afresh(home: Path, tmp_path: Path) -> None:
    folder = tmp_path / "cat"
    shutil.copytree(DATA, folder)
    prices = folder / "prices.csv"
    before = load_catalog(folder)
    stat = prices.stat()
    lines = prices.read_text().splitlines(keepends=True)
    head, row = lines[0].split(","), lines[1].split(",")
    col = head.index("usd_per_hour")
    price = row[col]  # one digit changed: the same size
    row[col] = price[:-1] + ("1" if price[-1] != "1" else "2")
    lines[1] = ",".join(row)
    prices.write_text("".join(lines))
    assert prices.stat().st_size == stat.st_size
    os.utime(prices, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = load_catalog(folder)
    assert after == _load_catalog(folder) != before
    assert len(_cached(home)) == 2


def test_a_damaged_cache_is_ignored_and_replaced(home: Path) -> None:
    load_catalog(None)
    (path,) = _cached(home)
    path.write_bytes(b"not a pickle")
    assert load_catalog(None) == _load_catalog(None)
    assert path.read_bytes() != b"not a pickle"


def test_a_home_that_cannot_hold_a_cache_still_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("KPLAN_HOME", str(blocker))  # a file: kplan_home refuses it
    assert load_catalog(None) == _load_catalog(None)
    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "h"))
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / catalog_cache.CACHE_FOLDER).write_text("a file where the folder goes")
    assert load_catalog(None) == _load_catalog(None)


def test_a_user_folder_without_a_version_file_is_not_cached(home: Path, tmp_path: Path) -> None:
    folder = tmp_path / "cat"
    shutil.copytree(DATA, folder)
    (folder / "VERSION.txt").unlink()
    assert load_catalog(folder) == _load_catalog(folder)
    assert _cached(home) == []
