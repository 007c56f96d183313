"""Crash safety: `kill -9` the launcher mid-job; status still shows the job, `kplan down`
ends every worker process, and the ledger rows survive."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.launcher.state import StateDB
from tests.launcher_fakes import fast_dir

_LONG = """
import os, time
for i in range(600):
    print("rank", os.environ.get("RANK"), "tick", i, flush=True)
    time.sleep(0.2)
"""


def _job_processes(marker: str) -> list[int]:
    """PIDs of our processes whose command line or environment mentions ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmd or marker.encode() in env:
            pids.append(int(entry.name))
    return pids


def _wait(what: str, check: object, timeout: float = 60.0) -> None:
    limit = time.time() + timeout
    while time.time() < limit:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = fast_dir(tmp_path, "crash")
    monkeypatch.setenv("KPLAN_HOME", str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_kill_9_the_launcher_then_status_and_down(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "crashjob" / "long_train.py"
    script.parent.mkdir()
    script.write_text(_LONG)
    marker = str(script)
    job = "kp-crash-1"
    launcher = subprocess.Popen(
        [
            sys.executable, "-c", "from kplan.cli.main import main; main()",
            "launch", marker, "--budget", "0", "--nodes", "2", "--job-id", job,
            "--check-interval", "0.5",
        ],
        env={**os.environ, "KPLAN_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    found: list[int] = []
    try:
        db = StateDB.open(home / "kplan.db")
        _wait("the job to run", lambda: (j := db.job(job)) is not None and j.status == "running")
        log = home / "jobs" / job / "logs"
        _wait(
            "both nodes to train",
            lambda: all(
                (log / f"node-{r}.log").exists() and "tick 3" in (log / f"node-{r}.log").read_text()
                for r in (0, 1)
            ),
        )
        _wait("a ledger accrual", lambda: all(r.billed_seconds > 0 for r in db.ledger(job)))
        found = [p for p in _job_processes(marker) if p != launcher.pid]
        assert len(found) >= 4  # 2 x (sh, torchrun agent, worker)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        before = {r.instance: r for r in db.ledger(job)}
        assert len(before) == 2 and not any(r.closed for r in before.values())
        time.sleep(1.0)
        assert set(_job_processes(marker)) >= set(found)  # the workers outlive the launcher

        runner = CliRunner()
        res = runner.invoke(app, ["status", job, "--json"])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.output)
        assert (doc["status"], doc["launcher"], doc["alive_instances"]) == ("running", "gone", 2)
        res = runner.invoke(app, ["status"])
        assert res.exit_code == 0 and "launcher gone" in res.output

        res = runner.invoke(app, ["down", job, "--json"])
        assert res.exit_code == 0, res.output
        assert len(json.loads(res.output)[0]["terminated"]) == 2
        _wait("every worker process to end", lambda: _job_processes(marker) == [], timeout=60)

        after = {r.instance: r for r in db.ledger(job)}
        assert after.keys() == before.keys()
        for iid, row in after.items():
            assert row.closed and row.start == before[iid].start
            assert row.billed_seconds >= before[iid].billed_seconds > 0
        final = db.job(job)
        assert final is not None and final.status == "cancelled"
        assert all(i.state == "terminated" for i in db.instances(job))
        res = runner.invoke(app, ["down", job])
        assert res.exit_code == 0 and "nothing running" in res.output
        db.close()
        conn = sqlite3.connect(home / "kplan.db")
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        conn.close()
    finally:
        if launcher.poll() is None:
            os.kill(launcher.pid, signal.SIGKILL)
            launcher.wait(timeout=30)
        for pid in _job_processes(marker):  # never leave a worker behind, even on failure
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_sigterm_to_the_launcher_tears_the_job_down(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "termjob" / "long_train.py"
    script.parent.mkdir()
    script.write_text(_LONG)
    marker = str(script)
    job = "kp-term-1"
    launcher = subprocess.Popen(
        [
            sys.executable, "-c", "from kplan.cli.main import main; main()",
            "launch", marker, "--budget", "0", "--nodes", "2", "--job-id", job,
            "--check-interval", "0.5",
        ],
        env={**os.environ, "KPLAN_HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        db = StateDB.open(home / "kplan.db")
        _wait("the job to run", lambda: (j := db.job(job)) is not None and j.status == "running")
        log = home / "jobs" / job / "logs" / "node-1.log"
        _wait("node 1 to train", lambda: log.exists() and "tick 2" in log.read_text())
        os.kill(launcher.pid, signal.SIGTERM)
        _, err = launcher.communicate(timeout=120)
        assert launcher.returncode == 1, err
        assert f"job {job} cancelled: interrupted" in err
        assert _job_processes(marker) == []
        final = db.job(job)
        assert final is not None and final.status == "cancelled"
        assert all(r.closed for r in db.ledger(job)) and len(db.ledger(job)) == 2
        db.close()
    finally:
        if launcher.poll() is None:
            os.kill(launcher.pid, signal.SIGKILL)
            launcher.communicate(timeout=30)
        for pid in _job_processes(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# --- after the launcher died: what `kplan down` records, `logs -f`, `down --forget` ----------


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _orphan(home: Path, script: Path, job: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A job whose launcher died with its 2 nodes running, on the simulated cloud (real SQLite
    state, the job's journal written as the launcher writes it)."""
    from kplan.launcher import providers
    from kplan.launcher.bootstrap import instance_spec, rendezvous
    from kplan.launcher.clock import FakeClock
    from kplan.launcher.jobspec import JobSpec, NodeSpec
    from kplan.launcher.journal import Journal, instance_doc
    from kplan.launcher.providers import Backend
    from kplan.launcher.state import InstanceRecord, JobRecord
    from kplan.launcher.storage import LocalStorage
    from tests import launcher_fakes
    from tests.launcher_fakes import SimProvider

    clock = FakeClock(time.time() - 3600)
    storage = LocalStorage(home / "store")
    storage.uri = "s3://bucket/kplan"
    sim = SimProvider(clock, storage)
    monkeypatch.setitem(providers.FACTORIES, "aws", "tests.launcher_fakes:current_backend")
    monkeypatch.setitem(launcher_fakes.CURRENT, "backend", Backend(sim, storage))
    nodes = tuple(NodeSpec(r, "g4dn.xlarge", "spot", "a", 1, 0.4) for r in range(2))
    spec = JobSpec.build(job, "aws", "r", str(script), nodes, 5.0, storage_uri=storage.uri)
    specs = [
        instance_spec(spec, n, f"{job}-n{n.node_rank}-r0", rendezvous(spec, 0, None), "s3://b")
        for n in nodes
    ]
    made = sim.run_instances(None, specs)  # type: ignore[arg-type]
    journal = Journal.for_job(home, job)
    with StateDB.open() as db:
        db.create_job(
            JobRecord(
                job, "running", None, "aws", "r", spec.to_dict(), None, 5.0, None, None, None,
                None, _dead_pid(), None, clock.now(), clock.now(),
            )
        )  # fmt: skip
        for inst in made:
            rec = InstanceRecord(
                inst.id, job, inst.name, inst.node_rank, "aws", "r", "a", "g4dn.xlarge", "spot",
                0.4, "running", clock.now(),
            )  # fmt: skip
            db.add_instance(rec)
            from kplan.launcher.ledger import Ledger
            from kplan.planner.catalog import Billing

            Ledger(db, job, Billing("aws", 60.0, 1.0, "test")).open(rec)
            journal.write("created", clock.now(), instances=[instance_doc(rec)])
    return sim, clock, storage


def test_down_records_a_job_that_finished_on_its_own_as_succeeded(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher died; the training then finished (every status file exit 0) and the nodes
    powered off. `kplan down` must record `succeeded`, not `cancelled` (issue 10, item 10)."""
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    job = "kp-done-alone-1"
    sim, clock, _ = _orphan(home, script, job, monkeypatch)
    sim.finish_at = clock.now() + 600.0
    clock.advance(900.0)
    assert sim.alive() == []  # both wrote exit 0 and powered off
    res = CliRunner().invoke(app, ["down", job, "--json"])
    assert res.exit_code == 0, res.output
    (doc,) = json.loads(res.output)
    assert doc["terminated"] == [] and doc["status"] == "succeeded" and doc["recorded"]
    with StateDB.open() as db:
        final = db.job(job)
        assert final is not None and final.status == "succeeded", final
        assert all(r.closed for r in db.ledger(job)) and len(db.ledger(job)) == 2
        assert all(not i.alive for i in db.instances(job))


def test_down_of_a_gone_launcher_job_a_node_failed_is_failed(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    job = "kp-failed-alone-1"
    sim, clock, _ = _orphan(home, script, job, monkeypatch)
    sim.exit_code = 3
    sim.finish_at = clock.now() + 60.0
    clock.advance(120.0)
    res = CliRunner().invoke(app, ["down", job, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)[0]["status"] == "failed"


def test_logs_follow_returns_when_the_launcher_is_gone(home: Path) -> None:
    """`kplan logs -f` on a job whose launcher died and whose instances are gone returns
    (it used to wait for a terminal status that nothing would ever write)."""
    from kplan.launcher.jobspec import JobSpec
    from kplan.launcher.state import JobRecord

    job = "kp-logs-gone-1"
    spec = JobSpec.local("train.py", (), nodes=1)
    spec = replace(spec, job_id=job)
    with StateDB.open() as db:
        db.create_job(
            JobRecord(
                job, "running", None, "local", "local", spec.to_dict(), None, 0.0, None, None,
                None, None, _dead_pid(), None, time.time(), time.time(),
            )
        )  # fmt: skip
    log = home / "jobs" / job / "logs" / "node-0.log"
    log.parent.mkdir(parents=True)
    log.write_text("epoch 1 loss 0.25\n")
    proc = subprocess.run(  # returns on its own: the timeout only guards against a hang
        [sys.executable, "-c", "from kplan.cli.main import main; main()", "logs", job, "-f"],
        env={**os.environ, "KPLAN_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "epoch 1 loss 0.25" in proc.stdout
    assert "launcher is gone" in proc.stderr and f"kplan down {job}" in proc.stderr


def test_down_forget_refuses_while_an_instance_lives_then_forgets(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    job = "kp-forget-1"
    sim, clock, _ = _orphan(home, script, job, monkeypatch)
    with StateDB.open() as db:
        db.set_status(job, "error", clock.now(), "teardown failed")  # the stuck job
    runner = CliRunner()
    res = runner.invoke(app, ["down", "--forget", job])
    assert res.exit_code == 1, res.output
    assert "still has live instances" in res.output and f"kplan down {job}" in res.output
    assert len(sim.alive()) == 2
    res = runner.invoke(app, ["down", job, "--json"])  # down works on an `error` job
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.output)[0]["terminated"]) == 2 and sim.alive() == []
    with StateDB.open() as db:
        assert db.job(job).status == "error"  # type: ignore[union-attr]
        assert all(r.closed for r in db.ledger(job))
        spent = db.spend(job)
    assert spent > 0
    res = runner.invoke(app, ["down", "--forget", job, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"job_id": job, "forgotten": True, "spend_usd": spent}
    with StateDB.open() as db:
        assert db.job(job) is None and db.ledger(job) == [] and db.events(job) == []
    kept = home / "journal" / f"{job}.forgotten.jsonl"
    lines = [json.loads(x) for x in kept.read_text().splitlines()]
    assert lines[-1]["kind"] == "forgotten" and lines[-1]["spend_usd"] == spent
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    assert oct((home / "journal").stat().st_mode & 0o777) == "0o700"
    res = runner.invoke(app, ["down", "--forget", job])
    assert res.exit_code == 2 and "is not in" in res.output  # nothing left to find it by
    res = runner.invoke(app, ["down", "--forget", "--all"])
    assert res.exit_code == 2
