"""The state database: jobs, instances, events and the ledger in one SQLite file (WAL mode).

``$KPLAN_HOME/kplan.db`` (default ``~/.kplan/kplan.db``). The CLI and a running launcher open it
at the same time: every mutation is one ``BEGIN IMMEDIATE`` transaction, readers never block the
writer (WAL), and ``synchronous=FULL`` makes a committed transaction survive a kill or a power
cut. The schema is versioned with ``PRAGMA user_version``; a newer file is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kplan.core.errors import InputError
from kplan.core.paths import kplan_home
from kplan.core.text import clipped
from kplan.launcher.clock import Clock, SystemClock
from kplan.launcher.statecheck import StateError, check_state_file, connected, open_readonly

SCHEMA_VERSION = 2  # 2: ledger rows have a kind (issue 27)
LAST_JOB = "last"  # names the most recently created job wherever a job id is taken
_JOB_TEXT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")  # an id or a prefix of one
GONE_STATES = ("terminated", "preempted")  # instance states that bill nothing more
TERMINAL_STATUSES = ("succeeded", "failed", "stopped", "cancelled", "error")
JOB_STATUSES = (
    "pending",
    "provisioning",
    "running",
    "recovering",
    "resizing",
    "stopping",
    *TERMINAL_STATUSES,
)

_SCHEMA_V1 = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    reason TEXT,
    cloud TEXT NOT NULL,
    region TEXT NOT NULL,
    spec TEXT NOT NULL,
    plan TEXT,
    budget_usd REAL NOT NULL,
    deadline_h REAL,
    predicted_hours REAL,
    predicted_cost_usd REAL,
    predicted_cost_p90_usd REAL,
    launcher_pid INTEGER,
    stop_requested TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE instances (
    id TEXT NOT NULL,
    job TEXT NOT NULL REFERENCES jobs(id),
    name TEXT NOT NULL,
    node_rank INTEGER NOT NULL,
    cloud TEXT NOT NULL,
    region TEXT NOT NULL,
    zone TEXT NOT NULL,
    type TEXT NOT NULL,
    market TEXT NOT NULL,
    price REAL NOT NULL,
    state TEXT NOT NULL,
    launched_at REAL NOT NULL,
    ended_at REAL,
    reason TEXT,
    PRIMARY KEY (job, id)
);
CREATE TABLE events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL REFERENCES jobs(id),
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    message TEXT NOT NULL,
    data TEXT
);
CREATE INDEX events_job ON events(job, seq);
CREATE TABLE ledger (
    job TEXT NOT NULL REFERENCES jobs(id),
    instance TEXT NOT NULL,
    start REAL NOT NULL,
    "end" REAL NOT NULL,
    billed_seconds REAL NOT NULL,
    usd REAL NOT NULL,
    closed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job, instance)
);
"""
# Ledger kinds: an instance's own row, its boot disk (billed with it), the job's object storage
# (checkpoints, data) and the data's egress (kplan/launcher/ledger.py)
_SCHEMA_V2 = "ALTER TABLE ledger ADD COLUMN kind TEXT NOT NULL DEFAULT 'instance';"
LEDGER_KINDS = ("instance", "disk", "storage", "egress")
_MIGRATIONS = {1: _SCHEMA_V1, 2: _SCHEMA_V2}  # version -> script from version-1 to version


def default_db_path() -> Path:
    return kplan_home() / "kplan.db"


HOME_MODE = 0o700  # KPLAN_HOME and the folders kplan makes in it: only the owner
FILE_MODE = 0o600  # the database (it holds script arguments), its -wal/-shm, the journal, logs
BUSY_TIMEOUT_S = 10.0  # SQLite's own wait for a lock, per statement
LOCK_WAIT_S = 60.0  # then kplan retries a locked write with backoff for this long in all


def _tighten(path: Path, mode: int) -> None:
    """``chmod`` ``path`` to ``mode`` if it is ours and grants more (never someone else's)."""
    with contextlib.suppress(OSError):
        st = path.stat()
        if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & ~mode:
            path.chmod(mode)


def secure_home(home: Path) -> Path:
    """Create ``home`` ``0700`` (tightened when it exists and is ours); return it."""
    home.mkdir(mode=HOME_MODE, parents=True, exist_ok=True)
    _tighten(home, HOME_MODE)
    return home


def _secure_db_file(path: Path) -> None:
    """Create the database file ``0600`` before SQLite does (SQLite gives its -wal and -shm the
    database's mode), and tighten an existing one and its companions."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        _tighten(p, FILE_MODE)


def _is_locked(err: sqlite3.Error) -> bool:
    text = str(err).lower()
    return "locked" in text or "busy" in text


@dataclass(frozen=True)
class JobRecord:
    id: str
    status: str
    reason: str | None
    cloud: str
    region: str
    spec: dict[str, Any]
    plan: dict[str, Any] | None
    budget_usd: float
    deadline_h: float | None
    predicted_hours: float | None
    predicted_cost_usd: float | None
    predicted_cost_p90_usd: float | None
    launcher_pid: int | None
    stop_requested: str | None
    created_at: float
    updated_at: float

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True)
class InstanceRecord:
    id: str
    job: str
    name: str
    node_rank: int
    cloud: str
    region: str
    zone: str
    type: str
    market: str
    price: float  # USD per hour
    state: str
    launched_at: float  # when the launcher asked for it (ledger start)
    ended_at: float | None = None
    reason: str | None = None

    @property
    def alive(self) -> bool:
        """Not yet seen gone: pending, running or stopping (billed until terminated)."""
        return self.state not in GONE_STATES


@dataclass(frozen=True)
class EventRecord:
    seq: int
    job: str
    time: float
    kind: str
    message: str
    data: dict[str, Any] | None


@dataclass(frozen=True)
class LedgerRow:
    job: str
    instance: str
    start: float
    end: float
    billed_seconds: float
    usd: float
    closed: bool
    kind: str = "instance"  # LEDGER_KINDS


class StateWriteError(StateError):
    """A write to the state database failed (disk full, I/O error, a lock held too long)."""


class StateDB:
    """One connection to the state database. Not shared between threads.

    Writes wait for a lock (SQLite's busy timeout, then retries with backoff on ``clock`` up to
    ``lock_wait_s`` in all) and raise :class:`StateWriteError` when they fail; a failed write
    leaves no transaction open, so the next one can succeed."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        clock: Clock | None = None,
        lock_wait_s: float = LOCK_WAIT_S,
    ) -> None:
        self._conn = conn
        self.path = path
        self._depth = 0
        self.clock: Clock = clock or SystemClock()
        self.lock_wait_s = lock_wait_s

    @classmethod
    def open(
        cls,
        path: Path | None = None,
        *,
        clock: Clock | None = None,
        lock_wait_s: float = LOCK_WAIT_S,
        readonly: bool = False,
    ) -> StateDB:
        path = default_db_path() if path is None else path
        # Refuse a foreign or damaged file before anything writes to it (launcher/statecheck.py).
        check_state_file(path)
        if readonly:  # status, logs, report: no write, so a read-only KPLAN_HOME works
            return cls(open_readonly(path, _SCHEMA_V1 + _SCHEMA_V2), path, clock, lock_wait_s)
        try:
            if path.parent == kplan_home():
                secure_home(path.parent)
            else:
                path.parent.mkdir(mode=HOME_MODE, parents=True, exist_ok=True)
            _secure_db_file(path)
            conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            connected(path)  # a later open in this process must keep this connection's locks
        except (OSError, sqlite3.Error) as err:
            raise StateError(
                f"cannot open the state database {path}: {err}",
                hint="check KPLAN_HOME and the folder's permissions",
            ) from None
        conn.row_factory = sqlite3.Row
        db = cls(conn, path, clock, lock_wait_s)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            db._migrate()
        except StateError:
            conn.close()
            raise
        except sqlite3.DatabaseError as err:
            conn.close()
            raise StateError(  # the file itself passed check_state_file: not its content
                f"cannot open the state database {path} for writing ({err})",
                hint="check the permissions of the file and of KPLAN_HOME (kplan status, logs "
                "and report work read-only)",
            ) from None
        return db

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> StateDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self) -> None:
        with self.transaction():
            version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise StateError(
                    f"{self.path} has schema version {version}; this kplan reads up to "
                    f"{SCHEMA_VERSION}",
                    hint="upgrade kplan",
                )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target].split(";"):
                    if statement.strip():
                        self._conn.execute(statement)
                self._conn.execute(f"PRAGMA user_version={target}")

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One write transaction (``BEGIN IMMEDIATE``); nested calls join the outer one."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self._begin()
        self._depth = 1
        try:
            yield
        except BaseException as err:
            self._depth = 0
            self._rollback()
            if isinstance(err, sqlite3.OperationalError):  # I/O, disk full, locked
                raise self._write_error(err) from None
            raise
        self._depth = 0
        try:
            self._conn.execute("COMMIT")
        except sqlite3.Error as err:
            self._rollback()
            raise self._write_error(err) from None

    def _begin(self) -> None:
        """``BEGIN IMMEDIATE`` (take the write lock), retried with backoff while locked."""
        limit = self.clock.now() + self.lock_wait_s
        delay = 0.05
        while True:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.Error as err:
                if not _is_locked(err) or self.clock.now() >= limit:
                    raise self._write_error(err) from None
            self.clock.sleep(min(delay, max(limit - self.clock.now(), 0.0)))
            delay = min(delay * 2, 2.0)

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")

    def _write_error(self, err: sqlite3.Error) -> StateWriteError:
        return StateWriteError(
            f"cannot write the state database {self.path}: {err}",
            hint="free disk space, or end what holds the database; "
            "`kplan down JOB` terminates a job's instances without it",
        )

    def _write(self, sql: str, params: tuple[Any, ...]) -> int:
        with self.transaction():
            return self._conn.execute(sql, params).rowcount

    # --- jobs -------------------------------------------------------------------------------

    def create_job(self, job: JobRecord) -> None:
        if job.status not in JOB_STATUSES:
            raise ValueError(f"unknown job status {job.status!r}")
        try:
            self._write(
                "INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    job.id,
                    job.status,
                    job.reason,
                    job.cloud,
                    job.region,
                    json.dumps(job.spec),
                    None if job.plan is None else json.dumps(job.plan),
                    job.budget_usd,
                    job.deadline_h,
                    job.predicted_hours,
                    job.predicted_cost_usd,
                    job.predicted_cost_p90_usd,
                    job.launcher_pid,
                    job.stop_requested,
                    job.created_at,
                    job.updated_at,
                ),
            )
        except sqlite3.IntegrityError:
            raise InputError(f"job {job.id!r} already exists", hint="use a new job id") from None

    def job(self, job_id: str) -> JobRecord | None:
        row = self._conn.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        return None if row is None else _job(row)

    def resolve_job_id(self, text: str, *, known_only: bool = True) -> str:
        """The job id that ``text`` names: an id, a prefix of exactly one id, or ``last`` (the
        most recently created job). Raises ``InputError`` (exit 2) for a prefix of several ids
        (up to 5 listed) and, with ``known_only``, for one of none; without it a text that names
        no job comes back as is (``kplan down`` then looks in the journals and by tag)."""
        if not isinstance(text, str) or not _JOB_TEXT.fullmatch(text):
            raise InputError(
                f"job id {clipped(str(text), 80)} is not valid",
                hint="a job id (kp-...), a unique prefix of one, or `last`",
            )
        if text == LAST_JOB:
            row = self._conn.execute(
                "SELECT id FROM jobs ORDER BY created_at DESC, id DESC LIMIT 1"
            ).fetchone()
            if row is None:
                raise InputError(f"no jobs in {self.path}", hint="start one with `kplan launch`")
            return str(row["id"])
        if self.job(text) is not None:
            return text
        rows = self._conn.execute(
            "SELECT id FROM jobs WHERE substr(id, 1, ?) = ? ORDER BY created_at DESC, id DESC",
            (len(text), text),
        ).fetchall()
        ids = [str(r["id"]) for r in rows]
        if len(ids) == 1:
            return ids[0]
        if len(ids) > 1:
            shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
            raise InputError(
                f"job id prefix {text!r} matches {len(ids)} jobs: {shown}",
                hint="type more of the id (`kplan status` lists the jobs)",
            )
        if known_only:
            raise InputError(
                f"no job {text!r} in {self.path}",
                hint="`kplan status` lists the jobs; one launched on another machine: "
                "`kplan attach JOB --storage URI`",
            )
        return text

    def jobs(self) -> list[JobRecord]:
        rows = self._conn.execute("SELECT * FROM jobs ORDER BY created_at, id").fetchall()
        return [_job(r) for r in rows]

    def set_status(self, job_id: str, status: str, time: float, reason: str | None = None) -> None:
        if status not in JOB_STATUSES:
            raise ValueError(f"unknown job status {status!r}")
        self._write(
            "UPDATE jobs SET status=?, reason=COALESCE(?, reason), updated_at=? WHERE id=?",
            (status, reason, time, job_id),
        )

    def update_spec(self, job_id: str, spec: Mapping[str, object]) -> None:
        """The job's spec after the launcher changed it (a resize; a move: its region too)."""
        region = spec.get("region")
        self._write(
            "UPDATE jobs SET spec=?, region=COALESCE(?, region) WHERE id=?",
            (json.dumps(spec), region if isinstance(region, str) else None, job_id),
        )

    def set_launcher(self, job_id: str, pid: int | None) -> None:
        self._write("UPDATE jobs SET launcher_pid=? WHERE id=?", (pid, job_id))

    def request_stop(self, job_id: str, reason: str, time: float) -> None:
        """Ask the job's launcher to stop (read on its next tick)."""
        self._write(
            "UPDATE jobs SET stop_requested=?, updated_at=? WHERE id=?", (reason, time, job_id)
        )

    def forget_job(self, job_id: str) -> None:
        """Remove a job's row, instances, events and ledger rows (``kplan down --forget``)."""
        with self.transaction():
            for table in ("events", "ledger", "instances"):
                self._conn.execute(f"DELETE FROM {table} WHERE job=?", (job_id,))
            self._conn.execute("DELETE FROM jobs WHERE id=?", (job_id,))

    # --- instances --------------------------------------------------------------------------

    def add_instance(self, inst: InstanceRecord) -> None:
        self._write(
            "INSERT OR REPLACE INTO instances VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                inst.id,
                inst.job,
                inst.name,
                inst.node_rank,
                inst.cloud,
                inst.region,
                inst.zone,
                inst.type,
                inst.market,
                inst.price,
                inst.state,
                inst.launched_at,
                inst.ended_at,
                inst.reason,
            ),
        )

    def update_instance(
        self,
        job_id: str,
        instance_id: str,
        state: str,
        *,
        ended_at: float | None = None,
        reason: str | None = None,
    ) -> None:
        self._write(
            "UPDATE instances SET state=?, ended_at=COALESCE(ended_at, ?), "
            "reason=COALESCE(?, reason) WHERE job=? AND id=?",
            (state, ended_at, reason, job_id, instance_id),
        )

    def instances(self, job_id: str) -> list[InstanceRecord]:
        rows = self._conn.execute(
            "SELECT * FROM instances WHERE job=? ORDER BY launched_at, node_rank, id", (job_id,)
        ).fetchall()
        return [_instance(r) for r in rows]

    # --- events -----------------------------------------------------------------------------

    def add_event(
        self,
        job_id: str,
        time: float,
        kind: str,
        message: str,
        data: Mapping[str, object] | None = None,
    ) -> int:
        with self.transaction():
            cur = self._conn.execute(
                "INSERT INTO events (job, time, kind, message, data) VALUES (?,?,?,?,?)",
                (job_id, time, kind, message, None if data is None else json.dumps(data)),
            )
            return int(cur.lastrowid or 0)

    def events(self, job_id: str, after: int = 0) -> list[EventRecord]:
        rows = self._conn.execute(
            "SELECT * FROM events WHERE job=? AND seq>? ORDER BY seq", (job_id, after)
        ).fetchall()
        return [
            EventRecord(
                r["seq"],
                r["job"],
                r["time"],
                r["kind"],
                r["message"],
                None if r["data"] is None else json.loads(r["data"]),
            )
            for r in rows
        ]

    # --- ledger -----------------------------------------------------------------------------

    def put_ledger(self, row: LedgerRow) -> None:
        """Insert or update an open row; a closed row is never changed again."""
        self._write(
            'INSERT INTO ledger (job, instance, start, "end", billed_seconds, usd, closed, kind) '
            "VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(job, instance) DO UPDATE SET "
            '"end"=excluded."end", billed_seconds=excluded.billed_seconds, usd=excluded.usd, '
            "closed=excluded.closed WHERE ledger.closed=0",
            (
                row.job,
                row.instance,
                row.start,
                row.end,
                row.billed_seconds,
                row.usd,
                int(row.closed),
                row.kind,
            ),
        )

    def ledger(self, job_id: str) -> list[LedgerRow]:
        rows = self._conn.execute(
            "SELECT * FROM ledger WHERE job=? ORDER BY start, instance", (job_id,)
        ).fetchall()
        return [
            LedgerRow(
                r["job"],
                r["instance"],
                r["start"],
                r["end"],
                r["billed_seconds"],
                r["usd"],
                bool(r["closed"]),
                r["kind"] if "kind" in r.keys() else "instance",  # noqa: SIM118 (a version-1 file)
            )
            for r in rows
        ]

    def spend(self, job_id: str) -> float:
        """USD billed so far (closed rows plus open rows up to their last accrual)."""
        row = self._conn.execute(
            "SELECT COALESCE(SUM(usd), 0) FROM ledger WHERE job=?", (job_id,)
        ).fetchone()
        return float(row[0])


def _job(r: sqlite3.Row) -> JobRecord:
    return JobRecord(
        id=r["id"],
        status=r["status"],
        reason=r["reason"],
        cloud=r["cloud"],
        region=r["region"],
        spec=json.loads(r["spec"]),
        plan=None if r["plan"] is None else json.loads(r["plan"]),
        budget_usd=r["budget_usd"],
        deadline_h=r["deadline_h"],
        predicted_hours=r["predicted_hours"],
        predicted_cost_usd=r["predicted_cost_usd"],
        predicted_cost_p90_usd=r["predicted_cost_p90_usd"],
        launcher_pid=r["launcher_pid"],
        stop_requested=r["stop_requested"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
    )


def _instance(r: sqlite3.Row) -> InstanceRecord:
    return InstanceRecord(
        id=r["id"],
        job=r["job"],
        name=r["name"],
        node_rank=r["node_rank"],
        cloud=r["cloud"],
        region=r["region"],
        zone=r["zone"],
        type=r["type"],
        market=r["market"],
        price=r["price"],
        state=r["state"],
        launched_at=r["launched_at"],
        ended_at=r["ended_at"],
        reason=r["reason"],
    )
