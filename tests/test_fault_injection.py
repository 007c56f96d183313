"""Fault injection over a whole simulated job: the k-th write fails, then every later one.

For every k from 0 to the number of writes of a clean run, the job runs on SimProvider and the
FakeClock with its state database (a real SQLite file) failing from the k-th write transaction
on (``disk I/O error`` at BEGIN, ``database or disk is full`` at COMMIT, or ``database is
locked`` for 120 s of simulated time), or with the journal and the storage raising ENOSPC from
the k-th file write on. Each run must end with no instance alive; then ``down_job`` with a
healthy database must succeed and leave no ledger row open.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from kplan.core.errors import KplanError
from kplan.launcher.clock import FakeClock
from kplan.launcher.down import down_job
from kplan.launcher.jobspec import JobSpec, NodeSpec, ZoneOffer
from kplan.launcher.journal import Journal
from kplan.launcher.lifecycle import run_job
from kplan.launcher.providers import Backend
from kplan.launcher.state import StateDB
from kplan.launcher.storage import LocalStorage
from kplan.planner.catalog import Billing
from tests.launcher_fakes import SimProvider, fast_dir

AWS = Billing("aws", 60.0, 1.0, "test")
JOB = "kp-fault-1"
# The counts of the last full sweep, for docs/benchmarks.md (printed with -s).
RESULTS: dict[str, dict[str, int]] = {}


@dataclass
class Faults:
    """When writes start failing (``at``: the index of the first failing write)."""

    clock: FakeClock
    at: int | None = None
    mode: str = "io"  # io (BEGIN), full (COMMIT), locked (BEGIN, for lock_s), enospc (files)
    lock_s: float = 120.0
    writes: int = 0
    file_writes: int = 0
    locked_until: float | None = None
    fired: list[str] = field(default_factory=list)

    def db_write(self) -> bool:
        """A write transaction begins: whether it fails (modes io, full, locked)."""
        index = self.writes
        self.writes += 1
        if self.at is None or self.mode == "enospc" or index < self.at:
            return False
        if self.mode == "locked":
            if self.locked_until is None:
                self.locked_until = self.clock.now() + self.lock_s
            return self.clock.now() < self.locked_until
        return True

    def file_write(self) -> None:
        index = self.file_writes
        self.file_writes += 1
        if self.mode == "enospc" and self.at is not None and index >= self.at:
            self.fired.append("enospc")
            raise OSError(errno.ENOSPC, "No space left on device")


class FaultyConn:
    """A sqlite3 connection whose write transactions fail as ``faults`` says."""

    def __init__(self, conn: sqlite3.Connection, faults: Faults) -> None:
        self.conn = conn
        self.faults = faults
        self.failing = False

    @property
    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        f = self.faults
        if sql == "BEGIN IMMEDIATE":
            self.failing = f.db_write()
            if self.failing and f.mode in ("io", "locked"):
                self.failing = False
                f.fired.append(f.mode)
                msg = "database is locked" if f.mode == "locked" else "disk I/O error"
                if f.mode == "locked":
                    f.writes -= 1  # a retry of the same write is not a new write
                raise sqlite3.OperationalError(msg)
        if sql == "COMMIT" and self.failing:
            self.failing = False
            f.fired.append("full")
            raise sqlite3.OperationalError("database or disk is full")
        return self.conn.execute(sql, params)

    def close(self) -> None:
        self.conn.close()


class FaultyJournal(Journal):
    def __init__(self, path: Path, faults: Faults) -> None:
        super().__init__(path)
        self.faults = faults

    def _append(self, data: bytes) -> None:
        self.faults.file_write()
        super()._append(data)


class FaultyStorage(LocalStorage):
    """The launcher's view of the bucket: its puts fail with ENOSPC (the nodes' do not)."""

    def __init__(self, inner: LocalStorage, faults: Faults) -> None:
        self.root = inner.root
        self.uri = inner.uri
        self.faults = faults

    def put_bytes(self, key: str, data: bytes) -> None:
        self.faults.file_write()
        super().put_bytes(key, data)


class LaggySim(SimProvider):
    """A cloud whose listing misses instances for their first 30 s (AWS's describe is
    eventually consistent): teardown must terminate what it knows before it asks."""

    def query_instances(self, job_id: str) -> list[Any]:
        now = self.clock.now()
        return [
            i for i in super().query_instances(job_id) if now - self.instances[i.id].created >= 30.0
        ]


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    path = fast_dir(tmp_path, "fault")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _spec(script: str) -> JobSpec:
    nodes = (
        NodeSpec(0, "g4dn.xlarge", "on-demand", "us-east-1a", 1, 0.5),
        NodeSpec(1, "g4dn.xlarge", "spot", "us-east-1a", 1, 0.2),
    )
    return JobSpec.build(
        job_id=JOB,
        cloud="aws",
        region="us-east-1",
        script=script,
        nodes=nodes,
        budget_usd=100.0,
        check_interval_s=120.0,
        grace_s=60.0,
        teardown_s=120.0,
        offers=(
            ZoneOffer("g4dn.xlarge", "us-east-1a", "spot", 0.2),
            ZoneOffer("g4dn.xlarge", "us-east-1b", "spot", 0.25),
        ),
    )


def _one_run(root: Path, script: str, mode: str, at: int | None) -> tuple[Faults, int, int]:
    """One job with faults from write ``at``; (faults, instances alive, open ledger rows)."""
    work = root / f"{mode}-{at}"
    work.mkdir()
    clock = FakeClock()
    mode, _, variant = mode.partition("-")
    faults = Faults(clock, at, mode)
    store = LocalStorage(work / "store")
    store.uri = "s3://bucket/kplan"
    # Training ends 40 min in; the spot worker is preempted once at 15 min (and replaced).
    sim = (LaggySim if variant == "laggy" else SimProvider)(
        clock,
        store,
        boot_s=60.0,
        finish_at=clock.now() + 2400.0,
        preempt_after=lambda s: 900.0 if s.name.endswith("-n1-r0") else None,
    )
    db = StateDB.open(work / "kplan.db", clock=clock)
    db._conn = FaultyConn(db._conn, faults)  # type: ignore[assignment]
    journal = FaultyJournal(work / "journal" / f"{JOB}.jsonl", faults)
    launcher_storage = FaultyStorage(store, faults)
    launcher_storage.uri = store.uri
    try:
        run_job(
            _spec(script),
            Backend(sim, launcher_storage),
            db,
            clock=clock,
            billing=AWS,
            journal=journal,
        )
    except KplanError:
        pass  # the injected failure, reported as one: what matters is what is left running
    finally:
        db.close()
    alive = len(sim.alive())
    with StateDB.open(work / "kplan.db", clock=clock) as healthy:
        if healthy.job(JOB) is not None or journal.path.exists():
            down_job(JOB, Backend(sim, store), healthy, clock, wait_launcher_s=0.0)
        open_rows = sum(1 for r in healthy.ledger(JOB) if not r.closed)
        assert all(not i.alive for i in healthy.instances(JOB))
        job = healthy.job(JOB)
        assert job is None or job.terminal, job
    assert sim.alive() == []
    return faults, alive, open_rows


def _sweep(folder: Path, tmp_path: Path, mode: str) -> dict[str, int]:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text("print('train')\n")
    clean, alive, open_rows = _one_run(folder, str(script), mode, None)
    assert (alive, open_rows) == (0, 0)
    total = clean.file_writes if mode.startswith("enospc") else clean.writes
    assert total > 10
    runs = left_alive = left_open = fired = 0
    for k in range(total + 1):
        faults, alive, open_rows = _one_run(folder, str(script), mode, k)
        runs += 1
        fired += bool(faults.fired)
        left_alive += alive
        left_open += open_rows
        assert alive == 0, f"{mode}: write {k} failing left {alive} instance(s) alive"
        assert open_rows == 0, f"{mode}: write {k} failing left {open_rows} ledger row(s) open"
    assert fired == total  # every k below the clean run's count really failed a write
    out = {"runs": runs, "k_max": total, "alive": left_alive, "open_ledger_rows": left_open}
    RESULTS[mode] = out
    print(f"fault injection {mode}: {out}")
    return out


@pytest.mark.parametrize("mode", ["io", "full", "locked", "enospc", "io-laggy"])
def test_no_instance_survives_a_failing_write(folder: Path, tmp_path: Path, mode: str) -> None:
    out = _sweep(folder, tmp_path, mode)
    assert out["alive"] == 0 and out["open_ledger_rows"] == 0


def test_a_lock_shorter_than_the_retry_window_is_waited_out(folder: Path, tmp_path: Path) -> None:
    """``database is locked`` for 30 s of simulated time: StateDB retries, the job succeeds."""
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    clock = FakeClock()
    faults = Faults(clock, 10, "locked", lock_s=30.0)
    store = LocalStorage(folder / "store")
    store.uri = "s3://bucket/kplan"
    sim = SimProvider(clock, store, boot_s=60.0, finish_at=clock.now() + 2400.0)
    with StateDB.open(folder / "kplan.db", clock=clock) as db:
        db._conn = FaultyConn(db._conn, faults)  # type: ignore[assignment]
        out = run_job(_spec(str(script)), Backend(sim, store), db, clock=clock, billing=AWS)
    assert out.status == "succeeded" and faults.fired and sim.alive() == []


def test_down_terminates_first_even_when_every_database_write_fails(
    folder: Path, tmp_path: Path
) -> None:
    """A job whose launcher died mid-run; `kplan down` with a database that refuses every write
    still terminates every instance (known by tag and from the journal), then says it could
    not record it; a later down with a healthy database records it and closes the ledger."""
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    clock = FakeClock()
    store = LocalStorage(folder / "store")
    store.uri = "s3://bucket/kplan"
    sim = SimProvider(clock, store, boot_s=60.0)
    spec = _spec(str(script))

    class Died(BaseException):
        pass

    # The launcher "dies" (no teardown can run in a killed process) after the cluster started.
    journal = Journal.for_job(folder, JOB)
    with StateDB.open(folder / "kplan.db", clock=clock) as db:
        from kplan.launcher import lifecycle

        real = lifecycle._Run._teardown_always

        def killed(self: Any, status: str, reason: str) -> None:
            raise Died

        lifecycle._Run._teardown_always = killed  # type: ignore[method-assign]
        try:
            with pytest.raises(Died):  # the guard stops it at the deadline; teardown "dies"
                run_job(
                    replace(
                        spec, timing=replace(spec.timing, check_interval_s=60.0), deadline_h=0.2
                    ),
                    Backend(sim, store),
                    db,
                    clock=clock,
                    billing=AWS,
                    journal=journal,
                )
        finally:
            lifecycle._Run._teardown_always = real  # type: ignore[method-assign]
        assert len(sim.alive()) == 2
        db.set_status(JOB, "running", clock.now())
        db.set_launcher(JOB, 2**22 + 12345)  # a pid that is not running
    with StateDB.open(folder / "kplan.db", clock=clock) as broken:
        broken._conn = FaultyConn(broken._conn, Faults(clock, 0, "io"))  # type: ignore[assignment]
        result = down_job(JOB, Backend(sim, store), broken, clock, wait_launcher_s=0.0)
    assert sim.alive() == [] and len(result.terminated) == 2
    assert not result.recorded and result.note and "disk I/O error" in result.note
    with StateDB.open(folder / "kplan.db", clock=clock) as healthy:
        assert any(r for r in healthy.ledger(JOB) if not r.closed)
        again = down_job(JOB, Backend(sim, store), healthy, clock, wait_launcher_s=0.0)
        assert again.recorded and again.terminated == ()
        assert all(r.closed for r in healthy.ledger(JOB))
        assert healthy.job(JOB).status == "cancelled"  # type: ignore[union-attr]


def test_the_guard_refuses_before_anything_is_uploaded_and_files_are_private(
    folder: Path, tmp_path: Path
) -> None:
    """Nothing is uploaded before the guard agrees; what the launcher writes is 0600."""
    import stat

    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    clock = FakeClock()
    store = LocalStorage(folder / "store")
    store.uri = "s3://bucket/kplan"
    sim = SimProvider(clock, store, boot_s=60.0, finish_at=clock.now() + 600.0)
    with StateDB.open(folder / "kplan.db", clock=clock) as db:
        poor = replace(_spec(str(script)), budget_usd=0.001)
        out = run_job(poor, Backend(sim, store), db, clock=clock, billing=AWS)
        assert out.status == "stopped" and store.list_keys("") == []
        assert "prepare" not in sim.calls and "run_instances" not in sim.calls
        rich = replace(_spec(str(script)), job_id="kp-fault-2")
        assert run_job(rich, Backend(sim, store), db, clock=clock, billing=AWS).status == (
            "succeeded"
        )
    keys = store.list_keys("kp-fault-2/")
    assert any(k.endswith("job.tar.gz") for k in keys)
    for path in [store.root / k for k in keys] + [folder / "journal" / "kp-fault-2.jsonl"]:
        if path.name.endswith(".json") and "status" in path.parts:
            continue  # written by the simulated node, not the launcher
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE((folder / "journal").stat().st_mode) == 0o700


def test_down_finds_a_job_only_its_journal_knows(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job row was never written (the database failed) but an instance was created: the
    journal names the cloud and region, `kplan down --all` finds and ends it."""
    from typer.testing import CliRunner

    from kplan.cli.main import app
    from kplan.launcher import providers
    from kplan.launcher.bootstrap import instance_spec, rendezvous
    from kplan.launcher.journal import instance_doc
    from kplan.launcher.state import InstanceRecord
    from tests import launcher_fakes

    monkeypatch.setenv("KPLAN_HOME", str(folder))
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    clock = FakeClock()
    store = LocalStorage(folder / "store")
    store.uri = "s3://bucket/kplan"
    sim = SimProvider(clock, store)
    monkeypatch.setitem(providers.FACTORIES, "aws", "tests.launcher_fakes:current_backend")
    monkeypatch.setitem(launcher_fakes.CURRENT, "backend", Backend(sim, store))
    spec = _spec(str(script))
    node = spec.nodes[0]
    (inst,) = sim.run_instances(
        None,  # type: ignore[arg-type]
        [instance_spec(spec, node, f"{JOB}-n0-r0", rendezvous(spec, 0, None), store.uri)],
    )
    journal = Journal.for_job(folder, JOB)
    journal.write("job", clock.now(), job=JOB, cloud="aws", region="us-east-1")
    rec = InstanceRecord(
        inst.id, JOB, inst.name, 0, "aws", "us-east-1", "us-east-1a", "g4dn.xlarge",
        "on-demand", 0.5, "running", clock.now(),
    )  # fmt: skip
    journal.write("created", clock.now(), instances=[instance_doc(rec)])
    StateDB.open().close()
    res = CliRunner().invoke(app, ["down", "--all", "--json"])
    assert res.exit_code == 0, res.output
    import json

    assert json.loads(res.output)[0]["terminated"] == [inst.id] and sim.alive() == []
    res = CliRunner().invoke(app, ["down", "--all", "--json"])
    assert res.exit_code == 0 and json.loads(res.output) == []
