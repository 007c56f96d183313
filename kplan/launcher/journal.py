"""The launch journal: an append-only file per job that records instances before SQLite does.

``<KPLAN_HOME>/journal/<job>.jsonl``, one JSON object per line, each line written with one
``write`` and ``fsync``'d before the call returns. The launcher writes ``intent`` (the names it
is about to ask for) *before* ``run_instances`` and ``created`` (their ids) right after, then
``gone`` when teardown sees an instance end. It does not depend on the state database, so
``kplan down`` finds every instance a launcher created even when the database write that should
have recorded it failed (disk full, a lock held for minutes), and closes its ledger row with the
time the journal says it ended.

Lines: ``{"t": epoch_s, "kind": "job"|"intent"|"created"|"gone"|"note"|"forgotten", ...}``. A torn
last line (a crash mid-write) is skipped on reading. Files are created ``0600`` in a ``0700``
folder.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from kplan.core.errors import KplanError

if TYPE_CHECKING:
    from kplan.launcher.state import InstanceRecord

FOLDER = "journal"


class JournalError(KplanError):
    """The journal could not be written (disk full, permissions)."""


def journal_path(home: Path, job_id: str) -> Path:
    """The job's journal beside the state database in ``home``."""
    return home / FOLDER / f"{job_id}.jsonl"


class Journal:
    """Appends to one job's journal. Every method may raise ``OSError`` (disk full): callers
    before an instance exists let it stop the launch; callers in teardown ignore it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def for_job(cls, home: Path, job_id: str) -> Journal:
        return cls(journal_path(home, job_id))

    def write(self, kind: str, time: float, **data: Any) -> None:
        line = json.dumps({"t": time, "kind": kind, **data}, sort_keys=True) + "\n"
        try:
            self._append(line.encode())
        except OSError as err:
            raise JournalError(
                f"cannot write the launch journal {self.path}: {err.strerror or err}",
                hint="free disk space in KPLAN_HOME; `kplan down JOB` ends a job's instances",
            ) from None

    def _append(self, data: bytes) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> JournalLog:
        return read_journal(self.path)


def read_journal(path: Path) -> JournalLog:
    """What a journal says (empty when there is none): its complete lines, read once."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raw = b""
    lines = []
    for line in raw.splitlines():
        try:
            doc = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # a torn last line
        if isinstance(doc, dict) and isinstance(doc.get("kind"), str):
            lines.append(doc)
    return JournalLog(
        _instances(lines), _job(lines), _terminated(lines), _intents(lines), _stopping(lines)
    )


@dataclass(frozen=True)
class JournalInstance:
    """An instance as the journal knows it: created at ``launched_at``, gone at ``gone_at``."""

    id: str
    name: str
    node_rank: int
    zone: str
    type: str
    market: str
    price: float
    launched_at: float
    gone_at: float | None
    state: str | None  # the state seen at ``gone_at`` (terminated / preempted)


class InstanceDoc(TypedDict):
    """One instance of a ``created`` line."""

    id: str
    name: str
    node_rank: int
    zone: str
    type: str
    market: str
    price: float
    launched_at: float


def instance_doc(rec: InstanceRecord) -> InstanceDoc:
    """What a ``created`` line holds about one instance."""
    return {
        "id": rec.id,
        "name": rec.name,
        "node_rank": rec.node_rank,
        "zone": rec.zone,
        "type": rec.type,
        "market": rec.market,
        "price": rec.price,
        "launched_at": rec.launched_at,
    }


def instance_record(
    j: JournalInstance,
    job_id: str,
    cloud: str,
    region: str,
    *,
    ended_at: float | None = None,
    reason: str | None = None,
) -> InstanceRecord:
    """The state database's record of an instance the journal knows of (a restarted
    controller or ``kplan down`` adds it when the database write that should have was lost)."""
    from kplan.launcher.state import InstanceRecord

    return InstanceRecord(
        id=j.id,
        job=job_id,
        name=j.name,
        node_rank=j.node_rank,
        cloud=cloud,
        region=region,
        zone=j.zone,
        type=j.type,
        market=j.market,
        price=j.price,
        state=j.state or "running",
        launched_at=j.launched_at,
        ended_at=ended_at,
        reason=reason,
    )


@dataclass(frozen=True)
class JournalJob:
    """The ``job`` line: where the job runs."""

    cloud: str
    region: str | None
    storage_uri: str | None


@dataclass(frozen=True)
class JournalLog:
    """A journal, read: its instances, its ``job`` line and what ``kplan down`` terminated."""

    instances: dict[str, JournalInstance] = field(default_factory=dict)  # by id
    job: JournalJob | None = None  # None: no job line, or one without a cloud
    terminated: frozenset[str] = frozenset()  # ids in ``down`` lines
    intents: dict[str, float] = field(default_factory=dict)  # names asked for -> request time
    stopping: str | None = None  # the final status the last teardown began for


def _instances(lines: list[dict[str, object]]) -> dict[str, JournalInstance]:
    """Instances by id from ``created`` and ``gone`` lines (malformed ones skipped)."""
    found: dict[str, JournalInstance] = {}
    for e in lines:
        try:
            if e["kind"] == "created":
                made = e["instances"]
                if not isinstance(made, list):
                    continue
                for d in made:
                    iid = str(d["id"])
                    found[iid] = JournalInstance(
                        id=iid,
                        name=str(d["name"]),
                        node_rank=int(d["node_rank"]),
                        zone=str(d["zone"]),
                        type=str(d["type"]),
                        market=str(d["market"]),
                        price=float(d["price"]),
                        launched_at=float(d["launched_at"]),
                        gone_at=None,
                        state=None,
                    )
            elif e["kind"] == "gone" and str(e["id"]) in found:
                iid = str(e["id"])
                prev = found[iid]
                if prev.gone_at is None:
                    found[iid] = replace(prev, gone_at=_number(e["t"]), state=str(e["state"]))
        except (KeyError, TypeError, ValueError):
            continue
    return found


def _number(value: object) -> float:
    """``value`` as a float (``TypeError``/``ValueError``: it is no number)."""
    if not isinstance(value, int | float | str):
        raise TypeError(f"not a number: {value!r}")
    return float(value)


def _job(lines: list[dict[str, object]]) -> JournalJob | None:
    """The last ``job`` line (cloud, region, storage), if any and it names a cloud: where the
    job runs now (a move to another region writes one: kplan/launcher/region_move.py)."""
    line = next((e for e in reversed(lines) if e.get("kind") == "job"), None)
    if line is None:
        return None
    cloud, region, storage = line.get("cloud"), line.get("region"), line.get("storage_uri")
    if not isinstance(cloud, str):
        return None
    return JournalJob(
        cloud,
        region if isinstance(region, str) else None,
        storage if isinstance(storage, str) else None,
    )


def _intents(lines: list[dict[str, object]]) -> dict[str, float]:
    """The instance names ``intent`` lines asked for, with the time of the request (a
    restarted controller adopts an instance the cloud made whose ``created`` line is missing)."""
    out: dict[str, float] = {}
    for e in lines:
        names = e.get("names")
        if e.get("kind") == "intent" and isinstance(names, list):
            try:
                when = _number(e["t"])
            except (KeyError, TypeError, ValueError):
                continue
            for name in names:
                out.setdefault(str(name), when)
    return out


def _stopping(lines: list[dict[str, object]]) -> str | None:
    """The status of the last ``stopping: <status> (<reason>)`` note (teardown's first line)."""
    found = None
    for e in lines:
        what = e.get("what")
        if e.get("kind") == "note" and isinstance(what, str) and what.startswith("stopping: "):
            found = what.split()[1]
    return found


def _terminated(lines: list[dict[str, object]]) -> frozenset[str]:
    """The instances that ``down`` lines say were terminated."""
    out: set[str] = set()
    for e in lines:
        ids = e.get("terminated")
        if e.get("kind") == "down" and isinstance(ids, list):
            out.update(str(i) for i in ids)
    return frozenset(out)
