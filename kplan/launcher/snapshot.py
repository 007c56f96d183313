"""A job's durable state published to its storage, and merged into another machine's database.

A detached job's controller runs on its own instance with its own state database; it writes
``<job>/state/snapshot.json`` to the job's storage (local folder, S3 or GCS) as its rows change:
the job row, its instances, events and ledger rows (with kinds), a format tag, a sequence number
that grows with each write and the controller's clock time. ``put_bytes`` replaces the object
whole (S3/GCS objects are atomic; the local folder writes a temporary file and renames it), so a
reader sees one snapshot or the next, never a mix. The events kept are the last
:data:`MAX_EVENTS`, so the size is bounded by the job's nodes and ledger rows.

The read commands (``kplan status``/``report``/``logs``/``down``) pull it and merge it
(:func:`merge_snapshot`) into their own database, idempotently: instances and ledger rows are
upserted by primary key, a closed ledger row never changes (``StateDB.put_ledger``), neither an
instance seen gone here nor an open ledger row accrued further here goes back, an event
already held (same time, kind and message) is not added twice, a snapshot whose sequence number
is not above the last merged one changes nothing, and the rows the local machine wrote itself
(for example the controller instance's row and ledger row written by the laptop) are kept. The
merged sequence number and the snapshot's time are recorded as a ``snapshot`` event, which is
how ``status`` says how old the controller's state is.

A machine without the job's row at all attaches it (:func:`attach`, ``kplan attach JOB --storage
URI``): the snapshot is pulled and checked before the database is opened, then merged, which
creates the job's row from the snapshot's (its spec included, so ``kplan down`` reaches the
cloud), with no launcher on this machine (the pid is the controller's, on its own machine) and
the storage this machine reached it through.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from kplan.core.errors import InputError, KplanError
from kplan.launcher.controller import this_host
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.state import (
    JOB_STATUSES,
    LEDGER_KINDS,
    InstanceRecord,
    JobRecord,
    LedgerRow,
    StateDB,
)
from kplan.launcher.storage import Storage

FORMAT = "kplan-state-snapshot/1"
MAX_EVENTS = 500  # the newest events kept in a snapshot (bounded size)
SNAPSHOT_EVENT = "snapshot"  # the event kind recording a merged snapshot (seq, written_at)
_HINT = (
    "the file under <job>/state/ was not written by this kplan's controller; check --storage "
    "names the job's bucket, or delete the object and let the controller write it again"
)


def snapshot_key(job_id: str) -> str:
    return f"{job_id}/state/snapshot.json"


@dataclass(frozen=True)
class SnapshotEvent:
    time: float
    kind: str
    message: str
    data: dict[str, Any] | None = None


@dataclass(frozen=True)
class Snapshot:
    """A job's rows as its controller published them: ``seq`` grows with each write,
    ``written_at`` is the writer's clock, ``source`` the writing database (host and path)."""

    job_id: str
    seq: int
    written_at: float
    source: str
    job: JobRecord
    instances: tuple[InstanceRecord, ...]
    events: tuple[SnapshotEvent, ...]
    ledger: tuple[LedgerRow, ...]

    def to_json(self) -> bytes:
        doc = {
            "format": FORMAT,
            "job_id": self.job_id,
            "seq": self.seq,
            "written_at": self.written_at,
            "source": self.source,
            "job": asdict(self.job),
            "instances": [asdict(i) for i in self.instances],
            "events": [asdict(e) for e in self.events],
            "ledger": [asdict(r) for r in self.ledger],
        }
        return json.dumps(doc, sort_keys=True).encode()


def build_snapshot(db: StateDB, job_id: str, seq: int, now: float) -> Snapshot:
    """The job's rows now (``seq``: the writer's counter, ``now``: its clock)."""
    job = db.job(job_id)
    if job is None:
        raise InputError(f"no job {job_id!r} in {db.path}", hint="run `kplan status` for the jobs")
    events = [e for e in db.events(job_id) if e.kind != SNAPSHOT_EVENT][-MAX_EVENTS:]
    return Snapshot(
        job_id=job_id,
        seq=int(seq),
        written_at=float(now),
        source=_source(db),
        job=job,
        instances=tuple(db.instances(job_id)),
        events=tuple(SnapshotEvent(e.time, e.kind, e.message, e.data) for e in events),
        ledger=tuple(db.ledger(job_id)),
    )


def _source(db: StateDB) -> str:
    """The writing database (host and path): a snapshot of this very database is not merged."""
    return f"{this_host()}:{Path(db.path).resolve()}"


def publish(db: StateDB, storage: Storage, job_id: str, seq: int, now: float) -> int:
    """Write the job's snapshot to ``storage`` whole; returns its size in bytes."""
    data = build_snapshot(db, job_id, seq, now).to_json()
    storage.put_bytes(snapshot_key(job_id), data)
    return len(data)


def _bad(where: str, why: str) -> InputError:
    return InputError(f"controller state snapshot {where} is unreadable: {why}", hint=_HINT)


def parse_snapshot(data: bytes, job_id: str, where: str) -> Snapshot:
    """The snapshot, checked whole before anything is merged (InputError if not)."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as err:
        raise _bad(where, f"not JSON ({err})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise _bad(where, f"format {got!r}, expected {FORMAT!r}")
    if doc.get("job_id") != job_id:
        raise _bad(where, f"it is job {doc.get('job_id')!r}'s, not {job_id!r}'s")
    try:
        return Snapshot(
            job_id=job_id,
            seq=int(doc["seq"]),
            written_at=float(doc["written_at"]),
            source=str(doc.get("source", "")),
            job=_job_record(doc["job"]),
            instances=tuple(InstanceRecord(**i) for i in doc["instances"]),
            events=tuple(_event(e) for e in doc["events"]),
            ledger=tuple(_ledger_row(r) for r in doc["ledger"]),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise _bad(where, f"a field is missing or of the wrong type ({err})") from None


def _event(raw: dict[str, Any]) -> SnapshotEvent:
    data = raw.get("data")
    if data is not None and not isinstance(data, dict):
        raise TypeError(f"an event's data is {type(data).__name__}, not a mapping")
    return SnapshotEvent(float(raw["time"]), str(raw["kind"]), str(raw["message"]), data)


def pull(storage: Storage, job_id: str) -> Snapshot | None:
    """The job's published snapshot, checked; None when the controller has written none."""
    data = storage.get_bytes(snapshot_key(job_id))
    if data is None:
        return None
    return parse_snapshot(data, job_id, f"{storage.uri}/{snapshot_key(job_id)}")


def _job_record(raw: dict[str, Any]) -> JobRecord:
    job = JobRecord(**raw)
    if job.status not in JOB_STATUSES:
        raise ValueError(f"unknown job status {job.status!r}")
    return job


def _ledger_row(raw: dict[str, Any]) -> LedgerRow:
    row = LedgerRow(**raw)
    if row.kind not in LEDGER_KINDS:
        raise ValueError(f"unknown ledger kind {row.kind!r}")
    return row


def merged_seq(db: StateDB, job_id: str) -> tuple[int, float] | None:
    """The last merged snapshot's (seq, written_at), or None."""
    for event in reversed(db.events(job_id)):
        if event.kind == SNAPSHOT_EVENT and event.data is not None:
            return int(event.data["seq"]), float(event.data["written_at"])
    return None


def merge_snapshot(db: StateDB, snap: Snapshot, storage_uri: str | None = None) -> bool:
    """Merge a parsed snapshot into ``db``; False when it is not newer than the last merged.
    A job row it creates gets ``storage_uri`` (where this machine read it) in its spec."""
    job_id, seq = snap.job_id, snap.seq
    last = merged_seq(db, job_id)
    if (last is not None and seq <= last[0]) or snap.source == _source(db):
        return False  # not newer, or written from this database (the local provider)
    job = snap.job
    with db.transaction():
        local = db.job(job_id)
        if local is None:
            db.create_job(_attached(job, storage_uri))
        elif job.updated_at >= local.updated_at:
            db.set_status(job_id, job.status, job.updated_at, job.reason)
            if job.spec.get("region") == job.region != local.region:  # it moved (region_move)
                where = local.spec.get("storage_uri", job.spec.get("storage_uri"))
                db.update_spec(job_id, {**job.spec, "storage_uri": where})
        gone = {i.id for i in db.instances(job_id) if not i.alive}
        for inst in snap.instances:
            if inst.id not in gone:  # an instance seen gone here stays gone
                db.add_instance(inst)
        accrued = {r.instance: r.end for r in db.ledger(job_id)}
        for row in snap.ledger:
            if row.end >= accrued.get(row.instance, row.end):  # never an older accrual
                db.put_ledger(row)
        held = {(e.time, e.kind, e.message) for e in db.events(job_id)}
        for e in snap.events:
            if (e.time, e.kind, e.message) not in held:
                db.add_event(job_id, e.time, e.kind, e.message, e.data)
        db.add_event(
            job_id,
            snap.written_at,
            SNAPSHOT_EVENT,
            f"merged controller state snapshot {seq}",
            {"seq": seq, "written_at": snap.written_at},
        )
    return True


def _attached(job: JobRecord, storage_uri: str | None) -> JobRecord:
    """A job row made here from another database's: no launcher here (its pid is the
    controller's, on the controller's machine), its storage where this machine found it."""
    spec = job.spec if storage_uri is None else {**job.spec, "storage_uri": storage_uri}
    return replace(job, launcher_pid=None, spec=spec)


def sync(db: StateDB, storage: Storage, job_id: str) -> tuple[int, float] | None:
    """Pull and merge the job's snapshot; the merged (seq, written_at) now held, or None."""
    snap = pull(storage, job_id)
    if snap is not None:
        merge_snapshot(db, snap)
    return merged_seq(db, job_id)


def age_line(merged: tuple[int, float] | None, now: float) -> str | None:
    """``controller state as of 40 s ago`` (the snapshot's own clock against this one)."""
    if merged is None:
        return None
    age = max(0.0, now - merged[1])
    return (
        f"controller state as of {age:.0f} s ago (snapshot {merged[0]}; the age is this "
        "machine's clock minus the controller's, so it carries their clock difference)"
    )


@dataclass(frozen=True)
class Attached:
    """What ``kplan attach`` did: the job's row as it is now, whether it is new here, whether
    the snapshot changed anything (False: it was merged before), and its (seq, written_at)."""

    job: JobRecord
    created: bool
    merged: bool
    seq: int
    written_at: float


def pull_or_fail(storage: Storage, job_id: str) -> Snapshot:
    """The job's snapshot, checked; InputError (exit 2) when there is none at ``storage``."""
    snap = pull(storage, job_id)
    if snap is None:
        raise InputError(
            f"no controller state snapshot of job {job_id!r} at "
            f"{storage.uri}/{snapshot_key(job_id)}",
            hint="give the job's id and the --storage its launch used (`kplan launch --storage`, "
            "else the cloud's default bucket); the controller writes it at every heartbeat",
        )
    try:  # the row made from it must serve `kplan down` and `logs`: its spec must read
        JobSpec.from_dict(snap.job.spec)
    except (KeyError, TypeError, ValueError, KplanError) as err:
        why = err.message if isinstance(err, KplanError) else f"{type(err).__name__}: {err}"
        raise _bad(f"{storage.uri}/{snapshot_key(job_id)}", f"its job spec ({why})") from None
    return snap


def attach(db: StateDB, snap: Snapshot, storage: Storage) -> Attached:
    """Merge a checked snapshot (:func:`pull_or_fail`) into ``db``, creating the job's row if
    this database lacks it; attaching again, or a job already here, merges (never duplicates)."""
    job_id = snap.job_id
    created = db.job(job_id) is None
    merged = merge_snapshot(db, snap, storage.uri)
    job = db.job(job_id)
    if job is None:  # merge_snapshot creates it; a writer that removed it meanwhile
        raise InputError(f"job {job_id!r} vanished from {db.path}", hint="attach it again")
    return Attached(job, created, merged, snap.seq, snap.written_at)
