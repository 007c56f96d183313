"""Resizes on the local provider, end to end: real torchrun groups, a runtime policy asks, the
launcher restarts the job on the new node count from the SIGTERM checkpoint, inside the budget.

The launcher runs in the test's process (``run_job``), the workers are real processes; the
policy is a file written by the test and loaded by the runtime through ``KPLAN_POLICIES``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kplan.app.launching import free_port
from kplan.launcher.clock import SystemClock
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.lifecycle import run_job
from kplan.launcher.providers import ProviderSettings
from kplan.launcher.providers.local import create
from kplan.launcher.state import StateDB
from tests.test_provider_local import kill_leftovers

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "kplan" / "examples" / "mlp_regression.py"
BATCH = 256

GROW = """
import time

from kplan.runtime.policy import Policy


class GrowAt(Policy):
    \"\"\"Ask for a second node once, at step {at}, while the job runs on one worker; then
    slow the single worker down (50 ms a step) so that the launcher, checking every 0.5 s,
    always acts before the job could finish on its own (a 5 ms step finished it first on a
    loaded machine).\"\"\"

    def after_step(self, m, act):
        if m.world_size == 1 and m.step == {at}:
            act.resize(nodes=2, reason="test: grow to two nodes")
        elif m.world_size == 1 and m.step > {at}:
            time.sleep(0.05)
"""


def _records(home: Path, job: str, rank: int = 0) -> list[dict[str, Any]]:
    path = home / "jobs" / job / "metrics" / f"rank-{rank}.jsonl"
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _events(records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("event") == name]


def _spec(tmp_path: Path, job: str, epochs: int, **options: Any) -> JobSpec:
    policy = tmp_path / "grow.py"
    policy.write_text(GROW.format(at=25))
    return JobSpec.local(
        str(SCRIPT),
        ("--epochs", str(epochs), "--samples", "16000"),
        nodes=1,
        max_nodes=2,
        job_id=job,
        policies=(f"{policy}:GrowAt",),
        check_interval_s=0.5,
        checkpoint_interval_s=1.0,
        rdzv_port=free_port(),
        python=sys.executable,
        **options,
    )


def _run(tmp_path: Path, spec: JobSpec) -> tuple[Any, StateDB]:
    backend = create(ProviderSettings(home=tmp_path, region=None, storage_uri=None))
    db = StateDB.open(tmp_path / "kplan.db")
    try:
        outcome = run_job(spec, backend, db, clock=SystemClock())
    finally:
        left = kill_leftovers(tmp_path)
    assert not left, f"processes left behind: {sorted(left)}"
    return outcome, db


def test_policy_resize_keeps_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    epochs = 3
    spec = _spec(tmp_path, "kp-adapt-grow", epochs)
    outcome, db = _run(tmp_path, spec)
    kinds = [e.kind for e in db.events(spec.job_id)]
    assert outcome.status == "succeeded", (outcome, kinds)
    (resize,) = [e for e in db.events(spec.job_id) if e.kind == "resize"]
    assert resize.data is not None and (resize.data["from_nodes"], resize.data["nodes"]) == (1, 2)
    job = db.job(spec.job_id)
    assert job is not None and len(job.spec["nodes"]) == 2  # the stored spec follows the resize
    assert "restarted" in kinds  # training resumed after the change, timed

    records = _records(tmp_path, spec.job_id)
    starts = _events(records, "start")
    assert [s["world_size"] for s in starts] == [1, 2]
    # The resize's SIGTERM checkpoint is where the second generation resumed: nothing lost.
    sigterm = [c for c in _events(records, "checkpoint") if c["reason"] == "sigterm"]
    (resumed,) = _events(records, "resume")
    assert sigterm and resumed["step"] == sigterm[-1]["step"] >= 25
    (done,) = _events(records, "done")
    assert done["step"] == epochs * (16000 // BATCH)  # the same samples, in the same steps
    assert _events(_records(tmp_path, spec.job_id, rank=1), "done")  # the new worker finished
    # every step was trained exactly once, across both generations
    trained = sorted({r["step"] for r in records if "event" not in r and "step" in r})
    assert trained == list(range(done["step"]))
    db.close()


def test_resize_that_would_break_the_budget_stops_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Priced local nodes: $36/h ($0.01/s) each. One node fits the budget; two would not, so the
    launcher refuses the resize, trains on, and the guard stops the job in time, with its
    checkpoint, within the budget."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    spec = _spec(tmp_path, "kp-adapt-budget", epochs=200, grace_s=20.0, teardown_s=20.0)
    priced = tuple(replace(n, usd_per_hour=36.0) for n in spec.nodes)
    # horizon 40.5 s: one node projects $0.405 ahead, so it may run ~29 s in $0.70; two new
    # nodes alone project $0.81
    spec = replace(spec, nodes=priced, budget_usd=0.7)
    outcome, db = _run(tmp_path, spec)
    kinds = [e.kind for e in db.events(spec.job_id)]
    assert outcome.status == "stopped" and outcome.reason == "budget", (outcome, kinds)
    assert "resize-refused" in kinds and "resize" not in kinds and "guard" in kinds
    assert db.spend(spec.job_id) <= spec.budget_usd
    assert all(not i.alive for i in db.instances(spec.job_id))
    records = _records(tmp_path, spec.job_id)
    sigterm = [c for c in _events(records, "checkpoint") if c["reason"] == "sigterm"]
    assert sigterm and sigterm[-1]["step"] >= 25  # the work up to the resize is saved
    db.close()


def test_docs_example_policy_runs_under_kplan_launch(tmp_path: Path) -> None:
    """docs/policies.md's example (examples/policies/plateau.py) through `kplan launch --policy`
    on the local provider: the policy raises the batch, the launcher sees the change in the
    metrics, the job completes, and `kplan status --json` shows the online model."""
    import os
    import subprocess

    kplan = Path(sys.executable).with_name("kplan")
    policy = ROOT / "kplan" / "examples" / "policies" / "plateau.py"
    job = "kp-adapt-docs"
    argv = [str(kplan), "launch", "--cloud", "local", str(SCRIPT), "--budget", "0"]
    argv += ["--nodes", "1", "--check-interval", "0.5", "--job-id", job]
    argv += ["--policy", f"{policy.relative_to(ROOT)}:BatchOnPlateau", "--json"]
    argv += ["--", "--epochs", "3", "--samples", "20000"]
    env = {**os.environ, "KPLAN_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    try:
        proc = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
        )
    finally:
        left = kill_leftovers(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not left
    records = _records(tmp_path, job)
    changes = [e for e in _events(records, "policy") if e["policy"] == "BatchOnPlateau"]
    assert changes and changes[0]["action"] == "set_batch"
    first = changes[0]
    steps = [r for r in records if "event" not in r and "step" in r]
    assert {r["global_batch"] for r in steps if r["step"] < first["step"]} == {BATCH}
    assert {r["global_batch"] for r in steps if r["step"] >= first["step"]} >= {BATCH * 2}
    status = subprocess.run(
        [str(kplan), "status", job, "--json"], env=env, capture_output=True, text=True, check=True
    )
    doc = json.loads(status.stdout)
    assert doc["status"] == "succeeded"
    model = doc["model"]
    assert model is not None and model["configs_measured"] >= 2  # before and after the change
    assert model["mape"] is not None  # the second batch was predicted before it was measured
