"""The JSON-lines metrics stream (records and events are listed in kplan/runtime/API.md; their
types, shared with every reader, are kplan/core/records.py).

A path ending in ``.jsonl`` is one file that every rank appends to; each record is one
``os.write`` on an ``O_APPEND`` descriptor, so lines from different processes never interleave
on a local file system. Any other path is a directory with ``rank-<R>.jsonl`` per rank. Step
records are written at most ``flush_interval`` seconds (1 s) after they happen, in one write;
events flush at once. A reader (the launcher's monitor) is thus at most a second behind.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from kplan.core import records
from kplan.core.errors import InputError
from kplan.core.records import StepRecord
from kplan.runtime.private import make_dirs, open_private


def rank_path(path: Path, rank: int) -> Path:
    """The file rank ``rank`` writes for ``KPLAN_METRICS_PATH=path``."""
    return path if path.suffix == ".jsonl" else path / f"rank-{rank}.jsonl"


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


class MetricsWriter:
    """Appends records for one rank; a writer without a path discards them."""

    def __init__(
        self, path: Path | None, rank: int, job_id: str = "local", flush_interval: float = 1.0
    ) -> None:
        self.rank = rank
        self.job_id = job_id
        self.flush_interval = flush_interval
        self._pending: list[str] = []
        self._last_flush = time.monotonic()
        self.path = None if path is None else rank_path(path, rank)
        self._fd: int | None = None
        if self.path is not None:
            try:
                make_dirs(self.path.parent)
                self._fd = open_private(self.path, os.O_WRONLY | os.O_APPEND)  # 0600
                atexit.register(self.close)  # a loop left early still gets its last records
            except OSError as err:
                raise InputError(
                    f"cannot open metrics file {self.path}: {err.strerror}",
                    "set KPLAN_METRICS_PATH to a writable directory or .jsonl file",
                ) from err

    def step(self, record: StepRecord) -> None:
        """One step record (flushed within ``flush_interval``)."""
        self.write(record)

    def write(self, record: records.Record, flush: bool = False) -> None:
        if self._fd is None:
            return
        full = {**record.to_dict(), "rank": self.rank, "job": self.job_id}
        if full.get("time") is None:
            full["time"] = time.time()
        self._pending.append(json.dumps(_clean(full), separators=(",", ":")) + "\n")
        if flush or time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()

    def flush(self) -> None:
        """Write the pending records (one ``write``; lines stay whole in a shared file)."""
        if self._fd is not None and self._pending:
            os.write(self._fd, "".join(self._pending).encode())
        self._pending = []
        self._last_flush = time.monotonic()

    def event(self, name: str, **fields: Any) -> None:
        """One event of kind ``name`` (records.EVENTS: its fields are checked), written at once."""
        self.write(records.event(name, **fields), flush=True)

    def close(self) -> None:
        self.flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_records(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics file or directory (every rank), in file order; a last line
    still being written (no newline yet) is left for the next read."""
    files = [path] if path.suffix == ".jsonl" else sorted(path.glob("rank-*.jsonl"))
    out: list[dict[str, Any]] = []
    for file in files:
        with open(file) as handle:
            out.extend(json.loads(line) for line in handle if line.strip() and line.endswith("\n"))
    return out
