"""The state database: schema, transactions, concurrent processes, a writer killed mid-way."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kplan.launcher.state import (
    SCHEMA_VERSION,
    InstanceRecord,
    JobRecord,
    LedgerRow,
    StateDB,
    default_db_path,
)
from kplan.launcher.statecheck import StateError


def _job(job_id: str = "kp-state-1", t: float = 100.0) -> JobRecord:
    return JobRecord(
        id=job_id,
        status="pending",
        reason=None,
        cloud="aws",
        region="us-east-1",
        spec={"nodes": [{"gpus": 1}]},
        plan=None,
        budget_usd=5.0,
        deadline_h=2.0,
        predicted_hours=1.0,
        predicted_cost_usd=3.0,
        predicted_cost_p90_usd=4.0,
        launcher_pid=None,
        stop_requested=None,
        created_at=t,
        updated_at=t,
    )


def test_wal_mode_schema_version_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "home" / "kplan.db"
    with StateDB.open(path) as db:
        db.create_job(_job())
        inst = InstanceRecord(
            "i-1", "kp-state-1", "kp-state-1-n0-r0", 0, "aws", "us-east-1", "us-east-1a",
            "g4dn.xlarge", "spot", 0.2, "running", 100.0,
        )  # fmt: skip
        db.add_instance(inst)
        db.update_instance("kp-state-1", "i-1", "preempted", ended_at=200.0, reason="spot")
        db.update_instance("kp-state-1", "i-1", "terminated", ended_at=300.0)  # keeps 200, reason
        db.add_event("kp-state-1", 150.0, "launch", "node 0", {"a": [1, 2]})
        db.set_status("kp-state-1", "running", 160.0)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    with StateDB.open(path) as db:
        job = db.job("kp-state-1")
        assert job is not None and job.status == "running" and job.spec["nodes"] == [{"gpus": 1}]
        (got,) = db.instances("kp-state-1")
        assert (got.state, got.ended_at, got.reason, got.alive) == (
            "terminated",
            200.0,
            "spot",
            False,
        )
        (event,) = db.events("kp-state-1")
        assert event.data == {"a": [1, 2]}
        assert db.events("kp-state-1", after=event.seq) == []
        with pytest.raises(ValueError, match="unknown job status 'bogus'"):
            db.set_status("kp-state-1", "bogus", 1.0)


def test_closed_ledger_rows_never_change(tmp_path: Path) -> None:
    with StateDB.open(tmp_path / "kplan.db") as db:
        db.create_job(_job())
        db.put_ledger(LedgerRow("kp-state-1", "i-1", 0.0, 10.0, 60.0, 0.01, False))
        db.put_ledger(LedgerRow("kp-state-1", "i-1", 0.0, 90.0, 90.0, 0.02, True))
        db.put_ledger(LedgerRow("kp-state-1", "i-1", 0.0, 500.0, 500.0, 9.99, False))
        (row,) = db.ledger("kp-state-1")
        assert (row.end, row.usd, row.closed) == (90.0, 0.02, True)
        assert db.spend("kp-state-1") == 0.02


def test_a_failed_transaction_leaves_nothing(tmp_path: Path) -> None:
    with StateDB.open(tmp_path / "kplan.db") as db:
        db.create_job(_job())
        with pytest.raises(RuntimeError), db.transaction():
            db.add_event("kp-state-1", 1.0, "a", "first")
            db.set_status("kp-state-1", "running", 2.0)
            raise RuntimeError("boom")
        assert db.events("kp-state-1") == []
        job = db.job("kp-state-1")
        assert job is not None and job.status == "pending"


def test_newer_schema_and_foreign_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "kplan.db"
    StateDB.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StateError, match=f"schema version {SCHEMA_VERSION + 1}"):
        StateDB.open(path)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StateError, match="is not a kplan state database"):
        StateDB.open(junk)


def test_default_path_follows_kplan_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "h"))
    assert default_db_path() == tmp_path / "h" / "kplan.db"
    monkeypatch.delenv("KPLAN_HOME")
    assert default_db_path() == Path.home() / ".kplan" / "kplan.db"


_WRITER = """
import sys, time
from kplan.launcher.state import StateDB
db = StateDB.open(__import__("pathlib").Path(sys.argv[1]))
print("ready", flush=True)
for i in range(int(sys.argv[2])):
    with db.transaction():
        db.add_event("kp-state-1", time.time(), "tick", sys.argv[3] + str(i))
        db.set_status("kp-state-1", "running", time.time())
print("done", flush=True)
"""


def test_two_processes_write_at_once_and_a_killed_writer_loses_nothing_committed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kplan.db"
    with StateDB.open(path) as db:
        db.create_job(_job())
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _WRITER, str(path), "150", tag],
                stdout=subprocess.PIPE,
                text=True,
            )
            for tag in ("a", "b")
        ]
        for i in range(50):  # and this process too
            db.add_event("kp-state-1", time.time(), "tick", f"main{i}")
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0 and "done" in out
        messages = [e.message for e in db.events("kp-state-1")]
        assert len(messages) == 350 and len(set(messages)) == 350
        # A writer killed with SIGKILL in the middle: every committed event is there.
        victim = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), "100000", "k"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert victim.stdout is not None and victim.stdout.readline().strip() == "ready"
        deadline = time.time() + 60
        while len(db.events("kp-state-1")) < 400 and time.time() < deadline:
            time.sleep(0.05)
        victim.kill()
        victim.wait(timeout=30)
        victim.stdout.close()
    with StateDB.open(path) as db:
        killed = [e.message for e in db.events("kp-state-1") if e.message.startswith("k")]
        assert len(killed) >= 50
        assert killed == [f"k{i}" for i in range(len(killed))]  # a prefix, no gap
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()


def test_home_is_0700_and_the_database_and_its_wal_are_0600(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database holds script arguments: only the owner may read it (issue 10, item 7)."""
    import os
    import stat

    def mode(p: Path) -> int:
        return stat.S_IMODE(p.stat().st_mode)

    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)  # an existing, too open home is tightened
    monkeypatch.setenv("KPLAN_HOME", str(home))
    old = os.umask(0o022)
    try:
        with StateDB.open() as db:
            db.create_job(_job())
            assert mode(home) == 0o700
            for name in ("kplan.db", "kplan.db-wal", "kplan.db-shm"):
                assert mode(home / name) == 0o600, name
        (home / "kplan.db").chmod(0o644)  # an older kplan's file is tightened on open
        with StateDB.open():
            assert mode(home / "kplan.db") == 0o600
        fresh = tmp_path / "new" / "deeper"  # a home kplan creates
        monkeypatch.setenv("KPLAN_HOME", str(fresh))
        StateDB.open().close()
        assert mode(fresh) == 0o700 and mode(fresh / "kplan.db") == 0o600
    finally:
        os.umask(old)


def test_a_locked_database_is_retried_then_refused_with_one_line(tmp_path: Path) -> None:
    """Another process holds the write lock: a write waits (busy timeout, then retries with
    backoff up to lock_wait_s) and then raises StateWriteError, leaving no transaction open."""
    from kplan.launcher.clock import FakeClock
    from kplan.launcher.state import StateWriteError

    path = tmp_path / "kplan.db"
    clock = FakeClock()
    with StateDB.open(path, clock=clock, lock_wait_s=30.0) as db:
        db._conn.execute("PRAGMA busy_timeout=10")  # keep the real wait short in the test
        db.create_job(_job())
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        t0 = clock.now()
        with pytest.raises(StateWriteError, match="database is locked"):
            db.set_status("kp-state-1", "running", 1.0)
        assert 30.0 <= clock.now() - t0 < 33.0  # retried for lock_wait_s of (fake) time
        other.execute("ROLLBACK")
        other.close()
        db.set_status("kp-state-1", "running", 2.0)  # nothing was left open
        assert db.job("kp-state-1").status == "running"  # type: ignore[union-attr]


def test_a_failed_commit_leaves_no_transaction_open(tmp_path: Path) -> None:
    from kplan.launcher.state import StateWriteError

    class FullAtCommit:
        def __init__(self, conn: sqlite3.Connection) -> None:
            self.conn = conn
            self.fail = True

        @property
        def in_transaction(self) -> bool:
            return self.conn.in_transaction

        def execute(self, sql: str, params: object = ()) -> sqlite3.Cursor:
            if sql == "COMMIT" and self.fail:
                self.fail = False
                raise sqlite3.OperationalError("database or disk is full")
            return self.conn.execute(sql, params)  # type: ignore[arg-type]

        def close(self) -> None:
            self.conn.close()

    with StateDB.open(tmp_path / "kplan.db") as db:
        db._conn = FullAtCommit(db._conn)  # type: ignore[assignment]
        with pytest.raises(StateWriteError, match="disk is full"):
            db.create_job(_job())
        assert db.job("kp-state-1") is None
        db.create_job(_job())  # the next write works
        assert db.job("kp-state-1") is not None


# A process other than the test asks for a write lock on SQLite's shared-lock bytes of the file
# (os.c: PENDING_BYTE 0x40000000, SHARED_FIRST two bytes on, SHARED_SIZE 510).
_PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 510, 0x40000000 + 2, 0)
    print("free")
except OSError:
    print("held")
"""


def _shared_lock(path: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_a_second_open_in_one_process_keeps_the_first_connections_locks(tmp_path: Path) -> None:
    """An open WAL connection holds a shared lock on the file; closing any descriptor of the file
    in the same process drops it (POSIX), and then another process's last connection takes the
    exclusive lock, checkpoints and deletes the WAL under the living one: three detached jobs
    corrupted kplan.db that way ("Page 11 is never used"). A second ``StateDB.open`` (a
    controller's, a live view's) must not read the header with a descriptor of its own."""
    path = tmp_path / "kplan.db"
    with StateDB.open(path) as first:
        first.create_job(_job())
        assert _shared_lock(path) == "held"  # the probe sees the first connection's lock
        with StateDB.open(path) as second:
            assert second.job("kp-state-1") is not None
            assert _shared_lock(path) == "held"
        assert _shared_lock(path) == "held"
        assert first.job("kp-state-1") is not None
    assert _shared_lock(path) == "free"  # no connection left: the probe can take it
