"""Write what a profile measured: the Profile JSON and the measurements CSV (DESIGN.md)."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path

from kplan.core.errors import InputError
from kplan.planner.profile import Measurement, Profile, profile_from_dict, profile_to_dict

MEASUREMENT_COLUMNS = tuple(f.name for f in dataclasses.fields(Measurement))
"""The measurements CSV's columns: the measurement record's fields, in its order (the keys of
the profile JSON's measurement rows are the same names)."""


def _write_atomic(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as err:
        raise InputError(
            f"cannot write {path}: {err.strerror}", hint="choose a writable path"
        ) from None


def profile_json(profile: Profile) -> str:
    """The Profile document, checked by reading it back exactly as ``kplan estimate`` will."""
    doc = profile_to_dict(profile)
    text = json.dumps(doc, indent=2) + "\n"
    again = profile_from_dict(json.loads(text), source="profile written by kplan profile")
    if profile_to_dict(again) != doc:  # pragma: no cover - a bug in the Profile mapping
        raise AssertionError("the Profile JSON does not round-trip")
    return text


def write_profile(path: Path, profile: Profile) -> None:
    _write_atomic(path, profile_json(profile))


def measurements_csv(rows: Sequence[Measurement]) -> str:
    lines = [",".join(MEASUREMENT_COLUMNS)]
    for m in rows:
        lines.append(",".join(_cell(getattr(m, c)) for c in MEASUREMENT_COLUMNS))
    return "\n".join(lines) + "\n"


def _cell(value: object) -> str:
    """A CSV cell: times to 6 significant digits, an absent value empty."""
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def write_measurements(path: Path, rows: Sequence[Measurement]) -> None:
    _write_atomic(path, measurements_csv(rows))


def read_measurements(path: Path) -> list[dict[str, str]]:
    """The rows of a measurements CSV as dicts (for tests and tools)."""
    with path.open(newline="") as f:
        return list(csv.DictReader(f))
