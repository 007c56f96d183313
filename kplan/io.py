"""Reading and writing user files with clear errors (the CLI's file boundary)."""

from __future__ import annotations

import csv
import json
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kplan.errors import DataFileError, InputError


def read_json(path: Path, what: str) -> Any:
    if not path.exists():
        raise InputError(f"{what} file not found: {path}", hint="check the path")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataFileError(
            f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})",
            hint=f"the {what} must be a JSON document",
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataFileError(f"{path}: cannot read ({err})", hint="check the file") from None


def write_atomic(path: Path, text: str) -> None:
    """Write a file atomically (temp file in the same folder, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, doc: Any) -> None:
    write_atomic(path, json.dumps(doc, indent=1) + "\n")


def read_csv_rows(
    path: Path, required: Sequence[str], optional: Sequence[str], what: str
) -> list[dict[str, str]]:
    """Rows of a CSV with the required columns; unknown columns are an error (typos)."""
    if not path.exists():
        raise InputError(f"{what} file not found: {path}", hint="check the path")
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            header = [h.strip() for h in (reader.fieldnames or [])]
            missing = [c for c in required if c not in header]
            if missing:
                raise DataFileError(
                    f"{path}: missing column(s) {', '.join(missing)}",
                    hint=f"required columns: {', '.join(required)}; optional: "
                    f"{', '.join(optional)}",
                )
            unknown = [c for c in header if c not in required and c not in optional]
            if unknown:
                raise DataFileError(
                    f"{path}: unknown column(s) {', '.join(unknown)}",
                    hint=f"allowed columns: {', '.join([*required, *optional])}",
                )
            rows = [{k.strip(): (v or "").strip() for k, v in r.items() if k} for r in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DataFileError(f"{path}: cannot read CSV ({err})", hint="check the file") from None
    if not rows:
        raise DataFileError(f"{path}: no data rows", hint=f"the {what} needs at least one row")
    return rows


def cell_number(
    row: dict[str, str],
    col: str,
    path: Path,
    line: int,
    *,
    integer: bool = False,
    positive: bool = True,
) -> float:
    text = row.get(col, "")
    try:
        value = float(text)
    except ValueError:
        raise DataFileError(
            f"{path}, line {line}: {col}={text!r} is not a number", hint="fix the row"
        ) from None
    if not math.isfinite(value) or (positive and value <= 0) or (not positive and value < 0):
        raise DataFileError(
            f"{path}, line {line}: {col}={text!r} must be {'> 0' if positive else '>= 0'}",
            hint="fix the row",
        )
    if integer and value != int(value):
        raise DataFileError(
            f"{path}, line {line}: {col}={text!r} must be an integer", hint="fix the row"
        )
    return value
