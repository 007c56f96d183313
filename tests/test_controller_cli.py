"""``kplan controller`` and the controller's liveness in ``kplan status`` (no job runs here).

A local job is recorded as ``kplan launch --detach`` records it (``record_job``), and its
``controller.json`` written as a controller would: dead (the pid of a process that exited) or
alive (this test's own pid); a heartbeat from another host is judged by its age.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.launcher.controller import (
    STALE_CHECKS,
    STALE_SLACK_S,
    ControllerDoc,
    liveness,
    read_controller,
    this_host,
    write_controller,
)
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.lifecycle import record_job
from kplan.launcher.providers import Backend
from kplan.launcher.state import StateDB
from kplan.launcher.storage import LocalStorage
from tests.launcher_fakes import SimProvider, fast_dir

runner = CliRunner()
JOB = "kp-261128-120000-c0de"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = fast_dir(tmp_path, "home")
    monkeypatch.setenv("KPLAN_HOME", str(folder))
    yield folder


def _record(home: Path, tmp_path: Path) -> tuple[JobSpec, LocalStorage]:
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    spec = JobSpec.local(str(script), (), nodes=2, job_id=JOB)
    storage = LocalStorage(home / "jobs")
    with StateDB.open(home / "kplan.db") as db:
        record_job(spec, Backend(SimProvider(None, storage), storage), db)  # type: ignore[arg-type]
    return spec, storage


def _doc(pid: int, host: str, heartbeat_at: float) -> ControllerDoc:
    return ControllerDoc(
        job=JOB, host=host, pid=pid, mode="detached", started_at=heartbeat_at - 60,
        heartbeat_at=heartbeat_at, check_interval_s=2.0, job_started_at=heartbeat_at - 60,
        generation=1, launches={0: 2, 1: 1}, lost_nodes=1, counted=((0, 12.5),),
    )  # fmt: skip


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _invoke(*args: str) -> Any:
    return runner.invoke(app, list(args))


def test_the_controller_document_round_trips() -> None:
    doc = _doc(1234, "node-a", 1000.0)
    again = ControllerDoc.from_json(doc.to_json())
    assert again == doc and again.launches == {0: 2, 1: 1} and again.counted == ((0, 12.5),)


def test_a_heartbeat_from_another_host_is_judged_by_its_age() -> None:
    doc = _doc(1, "another-host", 1000.0)
    stale_after = STALE_CHECKS * doc.check_interval_s + STALE_SLACK_S
    fresh = liveness(doc, 1000.0 + stale_after - 1, host="here")
    stale = liveness(doc, 1000.0 + stale_after + 1, host="here")
    assert (fresh.alive, fresh.how) == (True, "heartbeat")
    assert (stale.alive, stale.how) == (False, "heartbeat")
    here = liveness(replace(doc, host="here", pid=_dead_pid()), 1000.0, host="here")
    assert (here.alive, here.how) == (False, "pid")


def test_status_says_a_dead_controller_is_not_running_and_how_to_restart_it(
    home: Path, tmp_path: Path
) -> None:
    _, storage = _record(home, tmp_path)
    write_controller(storage, _doc(_dead_pid(), this_host(), 1.0))
    res = _invoke("status", JOB)
    assert res.exit_code == 0, res.output
    assert "controller: not running (detached, pid" in res.output
    assert f"kplan controller {JOB}" in res.output and f"kplan down {JOB}" in res.output
    doc = json.loads(_invoke("status", JOB, "--json").output)
    assert doc["controller"]["alive"] is False and doc["controller"]["how"] == "pid"


def test_a_second_controller_is_refused_while_one_is_alive(home: Path, tmp_path: Path) -> None:
    import time

    _, storage = _record(home, tmp_path)
    write_controller(storage, _doc(os.getpid(), this_host(), time.time()))
    assert "controller: alive (detached" in _invoke("status", JOB).output
    res = _invoke("controller", JOB)
    assert res.exit_code == 2
    assert "has a live controller" in res.output and "hint:" in res.output


@pytest.mark.parametrize(
    ("flag", "value", "have"),
    [("--cloud", "azure", "cloud 'local'"), ("--cloud", "aws", "cloud 'local'"),
     ("--region", "us-east-1", "region 'local'"), ("--storage", "s3://bucket-ok/x", "storage")],
)  # fmt: skip
def test_flags_that_contradict_the_database_are_refused(
    home: Path, tmp_path: Path, flag: str, value: str, have: str
) -> None:
    """--cloud/--region/--storage name a job missing from the database: for one in it they were
    ignored without a word (``--cloud azure`` included). The controller is alive, so a
    regression stops at "has a live controller" and runs nothing."""
    import time

    _, storage = _record(home, tmp_path)
    write_controller(storage, _doc(os.getpid(), this_host(), time.time()))
    res = _invoke("controller", JOB, flag, value)
    assert res.exit_code == 2, res.output
    assert f"is in this machine's database with {have}" in res.output and "hint:" in res.output


def test_recording_a_job_id_that_exists_leaves_its_journal_as_it_was(
    home: Path, tmp_path: Path
) -> None:
    """A launch with the --job-id of a job that exists was refused by the database only after
    it had appended its own ``job`` line (cloud, region, storage) to that job's journal: the
    line `kplan down` reads where the database has no row."""
    from kplan.core.errors import InputError
    from kplan.launcher.journal import journal_path

    spec, storage = _record(home, tmp_path)
    journal = journal_path(home, JOB)
    before = journal.read_bytes()
    with StateDB.open(home / "kplan.db") as db, pytest.raises(InputError, match="already exists"):
        record_job(spec, Backend(SimProvider(None, storage), storage), db)  # type: ignore[arg-type]
    assert journal.read_bytes() == before


def test_controller_of_an_unknown_or_finished_job_is_one_line_and_exit_2(
    home: Path, tmp_path: Path
) -> None:
    res = _invoke("controller", "kp-261128-000000-dead")
    assert res.exit_code == 2 and "no job" in res.output and "--cloud" in res.output
    _record(home, tmp_path)
    with StateDB.open(home / "kplan.db") as db:
        db.set_status(JOB, "succeeded", 5.0, "every node finished")
    res = _invoke("controller", JOB)
    assert res.exit_code == 2 and "already ended (succeeded)" in res.output
    assert "Traceback" not in res.output


def test_a_job_recorded_for_detach_has_its_row_and_no_controller_yet(
    home: Path, tmp_path: Path
) -> None:
    spec, storage = _record(home, tmp_path)
    with StateDB.open(home / "kplan.db") as db:
        job = db.job(JOB)
        assert job is not None and job.status == "pending"
        assert [e.kind for e in db.events(JOB)] == ["created"]
    assert read_controller(storage, JOB) is None
    assert spec.nodes[1].node_rank == 1
