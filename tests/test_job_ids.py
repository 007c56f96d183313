"""Job ids by unique prefix and ``last`` (``StateDB.resolve_job_id``), and ``kplan logs``:
a finished job's logs per node, ``-f`` printing each file's header once and ending when the
job ends or when its launcher is gone (issue 12). Real SQLite, real ``kplan`` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.core.errors import InputError
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.state import JobRecord, StateDB

KPLAN = Path(sys.executable).with_name("kplan")


def add_job(
    db: StateDB, job_id: str, created: float, status: str = "succeeded", pid: int | None = None
) -> None:
    spec = JobSpec.local("train.py", job_id=job_id, nodes=2, rdzv_port=29500)
    db.create_job(
        JobRecord(
            job_id, status, None, "local", "local", spec.to_dict(), None, 0.0, None,
            None, None, None, pid, None, created, created,
        )
    )  # fmt: skip


@pytest.fixture
def home(tmp_path: Path) -> Path:
    with StateDB.open(tmp_path / "kplan.db") as db:
        add_job(db, "kp-261101-100000-aaaa", 1000.0)
        add_job(db, "kp-261101-100000-aabb", 2000.0)
        add_job(db, "kp-261102-090000-cccc", 3000.0)
        add_job(db, "kp-261101-080000-dddd", 500.0)  # older, though its id sorts earlier
    return tmp_path


def test_resolve_exact_prefix_last(home: Path) -> None:
    with StateDB.open(home / "kplan.db", readonly=True) as db:
        assert db.resolve_job_id("kp-261101-100000-aaaa") == "kp-261101-100000-aaaa"
        assert db.resolve_job_id("kp-261102") == "kp-261102-090000-cccc"
        assert db.resolve_job_id("kp-261101-100000-aab") == "kp-261101-100000-aabb"
        assert db.resolve_job_id("last") == "kp-261102-090000-cccc"  # created last
        with pytest.raises(InputError, match=r"matches 2 jobs: kp-261101-100000-aabb, kp-261"):
            db.resolve_job_id("kp-261101-100000-a")
        with pytest.raises(InputError, match="no job 'kp-3'") as err:
            db.resolve_job_id("kp-3")
        assert err.value.exit_code == 2 and "kplan status" in (err.value.hint or "")
        assert db.resolve_job_id("kp-3", known_only=False) == "kp-3"
        with pytest.raises(InputError, match="is not valid"):
            db.resolve_job_id("kp/../x")
        with pytest.raises(InputError, match="is not valid"):
            db.resolve_job_id("")
        # a prefix is not a pattern: SQL wildcards match nothing
        with pytest.raises(InputError, match="no job"):
            db.resolve_job_id("kp_")


def test_resolve_lists_at_most_five(tmp_path: Path) -> None:
    with StateDB.open(tmp_path / "kplan.db") as db:
        for i in range(7):
            add_job(db, f"kp-job-{i}", 100.0 + i)
        with pytest.raises(InputError) as err:
            db.resolve_job_id("kp-job")
        message = err.value.message
        assert "matches 7 jobs" in message and "and 2 more" in message
        assert message.count("kp-job-") == 5 and "kp-job-6" in message  # newest first
        with pytest.raises(InputError, match="no jobs in"):
            StateDB.open(tmp_path / "empty.db").resolve_job_id("last")


def test_every_job_argument_takes_a_prefix_and_last(home: Path) -> None:
    runner = CliRunner()
    env = {"KPLAN_HOME": str(home)}
    out = runner.invoke(app, ["status", "kp-261102", "--json"], env=env)
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["id"] == "kp-261102-090000-cccc"
    out = runner.invoke(app, ["report", "last", "--json"], env=env)
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["id"] == "kp-261102-090000-cccc"
    out = runner.invoke(app, ["logs", "kp-261101-08"], env=env)
    assert out.exit_code == 0 and "kp-261101-080000-dddd succeeded and left no log" in out.stderr
    out = runner.invoke(app, ["down", "kp-261101-100000-aab", "--json", "--wait", "0"], env=env)
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)[0]["job_id"] == "kp-261101-100000-aabb"
    out = runner.invoke(app, ["status", "kp-261101-100000"], env=env)
    assert out.exit_code == 2
    assert "matches 2 jobs: kp-261101-100000-aabb, kp-261101-100000-aaaa" in out.stderr


def _write_log(home: Path, job: str, rank: int, text: str) -> None:
    folder = home / "jobs" / job / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"node-{rank}.log").open("a") as f:
        f.write(text)


def test_logs_of_one_node_of_a_finished_job(home: Path) -> None:
    job = "kp-261102-090000-cccc"
    _write_log(home, job, 0, "head line\n")
    _write_log(home, job, 1, "worker line\nModuleNotFoundError: No module named 'x'\n")
    runner = CliRunner()
    out = runner.invoke(app, ["logs", "last", "--node", "1"], env={"KPLAN_HOME": str(home)})
    assert out.exit_code == 0, out.output
    assert out.stdout == "worker line\nModuleNotFoundError: No module named 'x'\n"
    out = runner.invoke(app, ["logs", job, "--node", "5"], env={"KPLAN_HOME": str(home)})
    assert out.exit_code == 0
    assert "left no log node 5: node 5 never ran (its nodes: 0-1" in out.stderr
    out = runner.invoke(app, ["logs", job, "-f"], env={"KPLAN_HOME": str(home)})  # ended: returns
    assert out.exit_code == 0
    assert out.stdout.count("==> node-0.log <==") == 1
    assert out.stdout.count("==> node-1.log <==") == 1


def _follow(home: Path, job: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(KPLAN), "logs", job, "-f"],
        env={**os.environ, "KPLAN_HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_logs_follow_prints_a_header_once_and_ends_with_the_job(tmp_path: Path) -> None:
    job = "kp-follow"
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    follower = None
    try:
        with StateDB.open(tmp_path / "kplan.db") as db:
            add_job(db, job, time.time(), status="running", pid=launcher.pid)
        _write_log(tmp_path, job, 0, "line 1\n")
        follower = _follow(tmp_path, job)
        for i in (2, 3):
            time.sleep(1.5)
            _write_log(tmp_path, job, 0, f"line {i}\n")
        time.sleep(1.5)
        with StateDB.open(tmp_path / "kplan.db") as db:
            _write_log(tmp_path, job, 0, "last line\n")  # written as the job ends
            db.set_status(job, "succeeded", time.time(), "every node finished")
        out, err = follower.communicate(timeout=30)
        assert follower.returncode == 0, err
        assert out == "==> node-0.log <==\nline 1\nline 2\nline 3\nlast line\n"
    finally:
        for proc in (launcher, follower):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.mark.parametrize("reaped", [True, False], ids=["reaped", "zombie"])
def test_logs_follow_ends_when_the_launcher_is_gone(tmp_path: Path, reaped: bool) -> None:
    job = "kp-orphan"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    if reaped:
        dead.wait(timeout=30)
    else:  # exited, not yet reaped by its parent: its pid still answers kill(pid, 0)
        os.waitid(os.P_PID, dead.pid, os.WEXITED | os.WNOWAIT)
    with StateDB.open(tmp_path / "kplan.db") as db:
        add_job(db, job, time.time(), status="running", pid=dead.pid)  # its launcher died
    _write_log(tmp_path, job, 1, "still here\n")
    follower = _follow(tmp_path, job)
    try:
        out, err = follower.communicate(timeout=30)  # nothing of it runs: ends at the first check
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait(timeout=10)
        dead.wait(timeout=30)
    assert follower.returncode == 0
    assert out == "==> node-1.log <==\nstill here\n"
    assert "its launcher is gone and nothing is running; `kplan down kp-orphan`" in err
