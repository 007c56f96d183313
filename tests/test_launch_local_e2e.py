"""``kplan launch --cloud local`` end to end: real torchrun worker groups, real preemptions.

Each test runs the ``kplan`` command in a subprocess (its own session, killed in ``finally``)
with two worker groups of one gloo worker each, and checks the runtime's metrics afterwards.
The preemption test injects three spot interruptions keyed to the training's progress (so a
loaded machine cannot make them miss the training): node 1 with a notice (the workers
checkpoint on SIGTERM; a replacement joins the elastic rendezvous), then twice the head (node
0, the rendezvous host: every group restarts), killed without a notice, so that only the
periodic checkpoints limit the loss.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kplan.launcher.providers.local import LocalProvider
from kplan.launcher.state import StateDB
from tests.test_provider_local import instance_pids, kill_leftovers

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "kplan" / "examples" / "mlp_regression.py"
KPLAN = Path(sys.executable).with_name("kplan")
CHECKPOINT_S = 0.5
BATCH = 256  # the example's global batch


@dataclass
class Launch:
    proc: subprocess.Popen[bytes]
    home: Path
    job: str
    log: Path

    def metrics(self, rank: int = 0) -> list[dict[str, Any]]:
        path = self.home / "jobs" / self.job / "metrics" / f"rank-{rank}.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line being written
                out.append(json.loads(line))
        return out

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Any]:
    """Start ``kplan launch`` in the background; kill it and every instance afterwards."""
    started: list[Launch] = []

    def start(job: str, script_args: list[str], flags: tuple[str, ...] = (), **env: str) -> Launch:
        log = tmp_path / f"{job}.out"
        argv = [str(KPLAN), "launch", "--cloud", "local", str(SCRIPT), "--budget", "1", *flags]
        argv += ["--nodes", "2", "--check-interval", "0.5", "--job-id", job, "--", *script_args]
        environ = {
            **os.environ,
            "KPLAN_HOME": str(tmp_path),
            "KPLAN_CHECKPOINT_INTERVAL": str(CHECKPOINT_S),
            "OMP_NUM_THREADS": "1",
            **env,
        }
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                env=environ,
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append(Launch(proc, tmp_path, job, log))
        return started[-1]

    try:
        yield start
    finally:
        killed = False
        for run in started:
            if run.proc.poll() is None:  # the test failed: its launcher's instances remain
                os.killpg(run.proc.pid, signal.SIGKILL)
                killed = True
            run.proc.wait(timeout=30)
        left = kill_leftovers(tmp_path)
        assert killed or not left, f"processes left behind: {sorted(left)}"


def finish(run: Launch, timeout_s: float) -> int:
    try:
        return run.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kplan launch still running after {timeout_s} s:\n{run.output()[-3000:]}")


def steps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if "event" not in r and "step" in r]


def events(records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("event") == name]


def wait_for(run: Launch, check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if run.proc.poll() is not None:
            pytest.fail(f"kplan launch ended while waiting for {what}:\n{run.output()[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}:\n{run.output()[-3000:]}")


def lost_work(records: list[dict[str, Any]], killed_at: float) -> tuple[float, int, int]:
    """Work lost by a kill at ``killed_at``: (seconds from the newest checkpoint the killed
    generation recorded to the kill, that checkpoint's step, the step the next start resumed at).

    The kill time comes from the provider (step records reach the file up to a second late,
    and a killed worker's last ones never do), the checkpoints from rank 0's events. The newest
    checkpoint is taken in file order before the resume, not by time: the provider notes
    ``killed_at`` just before it sends SIGKILL, and on a loaded machine a checkpoint event can
    land in between (its time then follows ``killed_at`` although the worker wrote it first).
    """
    after = [
        i for i, r in enumerate(records) if r.get("event") == "resume" and r["time"] > killed_at
    ]
    assert after, f"no resume after the kill at {killed_at}"
    before = records[: after[0]]
    saved = events(before, "checkpoint")
    assert saved, f"no checkpoint before the kill at {killed_at}"
    lost = max(0.0, killed_at - saved[-1]["time"])
    return lost, saved[-1]["step"], records[after[0]]["step"]


def test_launch_trains_two_workers_to_completion(launch: Any) -> None:
    t0 = time.monotonic()
    run = launch("kp-e2e-clean", ["--epochs", "2", "--samples", "20000"])
    assert finish(run, 120) == 0, run.output()
    assert "succeeded" in run.output()
    records = run.metrics(0)
    (start,) = events(records, "start")
    assert start["world_size"] == 2 and start["backend"] == "gloo"
    (done,) = events(records, "done")
    assert done["step"] == 2 * (20000 // BATCH)
    assert events(run.metrics(1), "done")  # the other worker finished too
    with StateDB.open(run.home / "kplan.db") as db:
        job = db.job(run.job)
        assert job is not None and job.status == "succeeded"
        instances = db.instances(run.job)
    assert sorted(i.reason or "" for i in instances) == ["completed", "completed"]
    assert not instance_pids(run.home)
    print(f"clean launch: {time.monotonic() - t0:.1f} s")


def test_launch_trains_in_the_precision_it_is_given(launch: Any) -> None:
    # kplan launch --precision reaches the workers (KPLAN_PRECISION): both train under bf16
    # autocast and say so in their metrics.
    run = launch("kp-e2e-bf16", ["--epochs", "1", "--samples", "8000"], ("--precision", "bf16"))
    assert finish(run, 120) == 0, run.output()
    for rank in (0, 1):
        (start,) = events(run.metrics(rank), "start")
        assert start["precision"] == "bf16", start
    losses = [r["loss"] for r in steps(run.metrics(0)) if "loss" in r]
    assert losses and all(math.isfinite(x) for x in losses)


def test_launch_survives_three_preemptions(launch: Any) -> None:
    t0 = time.monotonic()
    epochs, samples = 6, 40000
    run = launch("kp-e2e-chaos", ["--epochs", str(epochs), "--samples", str(samples)])
    provider = LocalProvider(run.home)

    def current(rank: int) -> str:
        live = [i for i in provider.query_instances(run.job) if i.alive and i.node_rank == rank]
        assert len(live) == 1, live
        return live[0].id

    def training_since(mark: float) -> bool:
        """Since its newest start after ``mark``, rank 0 trains at full size and has written
        a periodic checkpoint (events reach the file at once, step records up to 1 s late)."""
        records = run.metrics(0)
        starts = [r for r in events(records, "start") if r["time"] > mark]
        if not starts or starts[-1]["world_size"] != 2:
            return False
        saved = [r for r in events(records, "checkpoint") if r["time"] > starts[-1]["time"]]
        return any(r["reason"] == "period" for r in saved)

    total = epochs * (samples // BATCH)
    mark = 0.0
    plan = [(1, 2.0), (0, 0.0), (0, 0.0)]  # (node rank, notice seconds)
    hit: list[tuple[str, float]] = []
    for rank, notice in plan:
        wait_for(run, lambda m=mark: training_since(m), 100, "training")
        if notice == 0:  # kill halfway between two checkpoints
            time.sleep(0.5 * CHECKPOINT_S)
        mark = time.time()
        latest = max(r["step"] for r in steps(run.metrics(0)))
        assert latest < total - 100, f"the training is too short: step {latest} of {total}"
        hit.append((current(rank), notice))
        assert provider.preempt(hit[-1][0], notice_s=notice)
    assert finish(run, 150) == 0, run.output()
    elapsed = time.monotonic() - t0

    with StateDB.open(run.home / "kplan.db") as db:
        job = db.job(run.job)
        assert job is not None and job.status == "succeeded", run.output()
        preempted = [i for i in db.instances(run.job) if i.state == "preempted"]
        recovered = [e.data for e in db.events(run.job) if e.kind == "recovered"]
    assert sorted(i.id for i in preempted) == sorted(i for i, _ in hit)
    assert {i.reason for i in preempted} == {"spot interruption"}

    records = run.metrics(0)
    (done,) = events(records, "done")
    assert done["step"] == total  # every step of the schedule
    step_s = max(r["step_time"] for r in steps(records))
    save_s = max(r["seconds"] for r in events(records, "checkpoint"))
    interval = CHECKPOINT_S + step_s + save_s  # most time between two checkpoint events
    losses = []
    for instance_id, notice in hit:
        ended = json.loads((run.home / "local" / run.job / instance_id / "exit.json").read_text())
        noticed_at = ended["stop_at"]
        if notice > 0:  # the workers checkpoint on the notice: the restart loses nothing
            (ckpt,) = [
                c for c in events(records, "checkpoint")
                if c["reason"] == "sigterm" and noticed_at < c["time"] < noticed_at + notice
            ]  # fmt: skip
            (resume,) = [r for r in events(records, "resume") if r["time"] > ckpt["time"]][:1]
            assert resume["step"] == ckpt["step"]
            losses.append(0.0)
            continue
        lost_s, saved_step, resumed_step = lost_work(records, ended["killed_at"])
        # The restart used the newest checkpoint: never an older one (a newer one can exist when
        # the kill fell between a checkpoint's commit and its event record).
        assert resumed_step >= saved_step, (resumed_step, saved_step)
        assert lost_s <= interval + 0.1, (lost_s, interval)  # at most one checkpoint interval
        losses.append(lost_s)
    print(
        f"3 preemptions in {elapsed:.1f} s; seconds of work lost {[round(s, 2) for s in losses]}"
        f" (checkpoint every {CHECKPOINT_S} s); the launcher's work_lost_s "
        f"{[round(d['work_lost_s'] or 0, 2) for d in recovered if d]}"
    )
    assert not instance_pids(run.home)


def test_down_ends_the_instances_of_a_killed_launcher(launch: Any) -> None:
    run = launch("kp-e2e-down", ["--epochs", "50", "--samples", "20000"])
    wait_for(run, lambda: len(steps(run.metrics(0))) >= 20, 100, "training")
    os.killpg(run.proc.pid, signal.SIGKILL)  # kill -9 of the launcher: the groups go on
    run.proc.wait(timeout=10)
    provider = LocalProvider(run.home)
    assert [i.state for i in provider.query_instances(run.job)] == ["running", "running"]
    down = subprocess.run(
        [str(KPLAN), "down", run.job, "--json"],
        env={**os.environ, "KPLAN_HOME": str(run.home)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert down.returncode == 0, down.stderr
    (result,) = json.loads(down.stdout)
    assert sorted(result["terminated"]) == [f"local-{run.job}-0", f"local-{run.job}-1"]
    assert result["status"] == "cancelled"
    assert {i.reason for i in provider.query_instances(run.job)} == {"terminated"}
    assert not instance_pids(run.home)
    sigterm = [c for c in events(run.metrics(0), "checkpoint") if c["reason"] == "sigterm"]
    assert sigterm  # the workers got the SIGTERM through the bootstrap and checkpointed
