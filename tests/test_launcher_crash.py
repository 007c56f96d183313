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
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.cli import app
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
            sys.executable, "-c", "from kplan.cli import main; main()",
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
            sys.executable, "-c", "from kplan.cli import main; main()",
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
