"""``kplan launch --detach`` end to end: a real two-node local job whose launching process has
exited long before the job ends, followed from fresh processes (status, logs, report).

The launch runs as a subprocess and returns at once with the job id; the controller it started
(its own session) runs the job to the end; ``kplan status --json`` from a new process says the
controller is alive while it runs; afterwards ``status``, ``logs`` and ``report`` show the job,
the controller's process is gone and no process of the job is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kplan.launcher.controller import pid_alive
from tests.test_provider_local import instance_pids, kill_leftovers

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "kplan" / "examples" / "mlp_regression.py"
KPLAN = [sys.executable, "-c", "from kplan.cli.main import main; main()"]


def _kplan(home: Path, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KPLAN_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [*KPLAN, *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_a_detached_local_job_finishes_after_its_launcher_exited(tmp_path: Path) -> None:
    home = tmp_path / "home"
    pid = None
    try:
        started = time.monotonic()
        launch = _kplan(
            home, "launch", str(SCRIPT), "--nodes", "2", "--check-interval", "1",
            "--detach", "--json", "--", "--epochs", "1",
        )  # fmt: skip
        took = time.monotonic() - started
        assert launch.returncode == 0, launch.stderr
        doc = json.loads(launch.stdout)
        job, pid = doc["job_id"], doc["controller_pid"]
        assert f"kplan controller {job}" in doc["commands"]
        assert pid_alive(pid), "the controller runs once the launching process has exited"
        status = json.loads(_kplan(home, "status", job, "--json").stdout)
        assert status["controller"]["alive"] and status["controller"]["mode"] == "detached"
        assert status["status"] not in ("succeeded", "failed", "error", "cancelled")
        _followed_from_another_home(home, tmp_path / "other", job)
        deadline = time.monotonic() + 240
        while status["status"] not in ("succeeded", "failed", "stopped", "error", "cancelled"):
            assert time.monotonic() < deadline, status["status"]
            time.sleep(2)
            status = json.loads(_kplan(home, "status", job, "--json").stdout)
        assert status["status"] == "succeeded", status["reason"]
        for _ in range(50):  # the controller leaves once it recorded the end
            if not pid_alive(pid):
                break
            time.sleep(0.2)
        assert not pid_alive(pid)
        text = _kplan(home, "status", job)
        assert text.returncode == 0 and "succeeded" in text.stdout
        logs = _kplan(home, "logs", job)
        assert logs.returncode == 0
        assert "==> node-0.log <==" in logs.stdout and "==> controller.log <==" in logs.stdout
        assert "controller detached" in logs.stdout  # the controller's own event lines
        report = _kplan(home, "report", job)
        assert report.returncode == 0 and job in report.stdout
        assert not instance_pids(home)
        print(f"detached launch returned in {took:.1f} s; job {job} succeeded")
    finally:
        if pid is not None and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        kill_leftovers(home)


def _followed_from_another_home(home: Path, other: Path, job: str) -> None:
    """A second KPLAN_HOME of this machine attaches the running job from its storage and shows
    it; its `kplan down` is refused (exit 2: its provider cannot see the job's processes) and
    the job runs on."""
    deadline = time.monotonic() + 60
    while True:  # the controller publishes its snapshot at its first heartbeat
        attach = _kplan(other, "attach", job, "--storage", str(home / "jobs"))
        if attach.returncode == 0:
            break
        assert attach.returncode == 2 and "snapshot" in attach.stderr, attach.stderr
        assert time.monotonic() < deadline, attach.stderr
        time.sleep(0.5)
    seen = json.loads(_kplan(other, "status", job, "--json").stdout)
    while len(seen["instances"]) < 2:  # a first snapshot may predate the second node's row
        assert time.monotonic() < deadline, seen["instances"]
        time.sleep(0.5)
        seen = json.loads(_kplan(other, "status", job, "--json").stdout)  # merges the newer one
    assert seen["id"] == job and len(seen["instances"]) == 2
    down = _kplan(other, "down", job)
    assert down.returncode == 2, down.stdout + down.stderr
    assert "another KPLAN_HOME" in down.stderr and f"KPLAN_HOME={home}" in down.stderr
    assert instance_pids(home), "the job runs on after the refused down"


def _steps(home: Path, job: str) -> int:
    path = home / "jobs" / job / "metrics" / "rank-0.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if '"step"' in line)


def test_a_killed_controller_is_restarted_and_the_job_finishes(tmp_path: Path) -> None:
    """kill -9 the detached controller mid-training: the nodes train on; `kplan status` says
    the controller is not running and how to restart it; `kplan controller JOB --detach`
    takes the job over (refused while one is alive) and it ends `succeeded`."""
    home = tmp_path / "home"
    pids: list[int] = []
    try:
        launch = _kplan(
            home, "launch", str(SCRIPT), "--nodes", "2", "--check-interval", "1",
            "--detach", "--json", "--", "--epochs", "4",
        )  # fmt: skip
        assert launch.returncode == 0, launch.stderr
        doc = json.loads(launch.stdout)
        job, first = doc["job_id"], doc["controller_pid"]
        pids.append(first)
        deadline = time.monotonic() + 180
        while _steps(home, job) < 3:  # training has started on both nodes
            assert time.monotonic() < deadline, "no training step"
            time.sleep(0.5)
        refused = _kplan(home, "controller", job)
        assert refused.returncode == 2 and "live controller" in refused.stderr
        os.kill(first, signal.SIGKILL)
        for _ in range(50):
            if not pid_alive(first):
                break
            time.sleep(0.1)
        at_kill = _steps(home, job)
        while _steps(home, job) <= at_kill:  # the nodes train on without their controller
            assert instance_pids(home), f"the nodes stopped at step {at_kill} with the controller"
            assert time.monotonic() < deadline, "no training step after the controller's kill"
            time.sleep(0.2)
        status = _kplan(home, "status", job)
        assert "controller: not running" in status.stdout
        assert f"kplan controller {job}" in status.stdout
        again = _kplan(home, "controller", job, "--detach", "--json")
        assert again.returncode == 0, again.stderr
        second = json.loads(again.stdout)["controller_pid"]
        pids.append(second)
        doc = json.loads(_kplan(home, "status", job, "--json").stdout)
        while doc["status"] not in ("succeeded", "failed", "stopped", "error", "cancelled"):
            assert time.monotonic() < deadline + 120, doc["status"]
            time.sleep(2)
            doc = json.loads(_kplan(home, "status", job, "--json").stdout)
        assert doc["status"] == "succeeded", doc["reason"]
        kinds = [e["kind"] for e in doc["events"]]
        assert "controller" in kinds
        ids = [r["instance"] for r in doc["ledger"]]
        assert len(ids) == len(set(ids)) and all(r["closed"] for r in doc["ledger"])
        for _ in range(50):
            if not pid_alive(second):
                break
            time.sleep(0.2)
        assert not pid_alive(second)
        assert not instance_pids(home)
    finally:
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        kill_leftovers(home)


def test_a_controller_node_runs_a_local_job_to_its_end_after_the_launcher_exited(
    tmp_path: Path,
) -> None:
    """``--controller instance`` on the local provider: the controller is a local instance
    (node rank -1) started as the nodes are; the launching process returns at once, the job
    succeeds, the controller instance is billed once and ends with its job, nothing is left."""
    home = tmp_path / "home"
    try:
        launch = _kplan(
            home, "launch", str(SCRIPT), "--nodes", "2", "--check-interval", "1",
            "--detach", "--controller", "instance", "--json", "--", "--epochs", "1",
        )  # fmt: skip
        assert launch.returncode == 0, launch.stderr
        doc = json.loads(launch.stdout)
        job, ctl = doc["job_id"], doc["controller_instance"]
        assert doc["instance_type"] == "local" and doc["usd_per_hour"] == 0.0
        assert instance_pids(home), "the controller instance runs once the launcher has exited"
        status = json.loads(_kplan(home, "status", job, "--json").stdout)
        deadline = time.monotonic() + 240
        while status["status"] not in ("succeeded", "failed", "stopped", "error", "cancelled"):
            assert time.monotonic() < deadline, status["status"]
            time.sleep(2)
            status = json.loads(_kplan(home, "status", job, "--json").stdout)
        assert status["status"] == "succeeded", status["reason"]
        ranks = {i["id"]: (i["node_rank"], i["state"]) for i in status["instances"]}
        assert ranks[ctl] == (-1, "terminated")
        assert sorted(r for r, _ in ranks.values()) == [-1, 0, 1]
        billed = [r["instance"] for r in status["ledger"]]
        assert sorted(billed) == sorted(ranks) and all(r["closed"] for r in status["ledger"])
        logs = _kplan(home, "logs", job)
        assert "==> controller.log <==" in logs.stdout and "controller detached" in logs.stdout
        for _ in range(100):  # the controller's process ends once it recorded the end
            if not instance_pids(home):
                break
            time.sleep(0.2)
        assert not instance_pids(home)
    finally:
        kill_leftovers(home)
