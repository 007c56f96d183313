"""Write what a profile measured: the Profile JSON and the measurements CSV (DESIGN.md)."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from pathlib import Path

from kplan.core.errors import InputError
from kplan.planner.profile import Measurement, Profile, profile_from_dict, profile_to_dict

MEASUREMENT_COLUMNS = (
    "nodes", "workers", "local_batch", "step_time",
    "sync_time", "accum_steps", "instance_type", "gpu",
)  # fmt: skip


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
        values = {
            "nodes": m.nodes,
            "workers": m.workers,
            "local_batch": m.local_batch,
            "step_time": f"{m.step_time:.6g}",
            "sync_time": "" if m.sync_time is None else f"{m.sync_time:.6g}",
            "accum_steps": m.accum_steps,
            "instance_type": m.instance_type or "",
            "gpu": m.gpu or "",
        }
        lines.append(",".join(str(values[c]) for c in MEASUREMENT_COLUMNS))
    return "\n".join(lines) + "\n"


def write_measurements(path: Path, rows: Sequence[Measurement]) -> None:
    _write_atomic(path, measurements_csv(rows))


def read_measurements(path: Path) -> list[dict[str, str]]:
    """The rows of a measurements CSV as dicts (for tests and tools)."""
    with path.open(newline="") as f:
        return list(csv.DictReader(f))
