"""``--idle-minutes`` (issue 26, item 3): the launcher's monitor ends a cluster whose workers
stopped writing step records, or whose job finished on some nodes while the rest run on; on the
fake clock, with the simulated cloud of tests/launcher_fakes.py."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kplan.app.launch_request import LaunchRequest
from kplan.app.launch_spec import options
from kplan.core.errors import InputError
from kplan.launcher.clock import FakeClock
from kplan.launcher.jobspec import JobSpec, NodeSpec
from kplan.launcher.lifecycle import JobOutcome, run_job
from kplan.launcher.provider import Instance
from kplan.launcher.providers import Backend
from kplan.launcher.state import StateDB
from kplan.launcher.storage import LocalStorage
from kplan.planner.catalog import Billing
from tests.launcher_fakes import SimProvider, fast_dir

AWS = Billing("aws", 60.0, 1.0, "test")
JOB = "kp-idle-1"
MIN = 60.0


@dataclass
class TrainingSim(SimProvider):
    """A cloud whose job writes one rank-0 step record per monitor check while the clock is
    before ``train_until``, then hangs (its nodes keep running, no record comes)."""

    train_until: float = 0.0
    steps: int = 0

    def query_instances(self, job_id: str) -> list[Instance]:
        now = self.clock.now()
        running = [i for i in super().query_instances(job_id) if i.state == "running"]
        if running and now < self.train_until:
            self.steps += 1
            record = {"step": self.steps, "rank": 0, "step_time": 0.5, "time": now}
            key = f"{job_id}/metrics/rank0.jsonl"
            old = self.storage.get_bytes(key) or b""  # type: ignore[attr-defined]
            line = json.dumps(record).encode() + b"\n"
            self.storage.put_bytes(key, old + line)  # type: ignore[attr-defined]
        return super().query_instances(job_id)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    folder = fast_dir(tmp_path, "idle")
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    storage = LocalStorage(folder / "store")
    storage.uri = "s3://bucket/kplan"
    with StateDB.open(folder / "kplan.db") as db:
        yield {"clock": FakeClock(), "storage": storage, "db": db, "script": str(script)}
    shutil.rmtree(folder, ignore_errors=True)


def _spec(env: dict[str, Any], nodes: int = 2, **kw: Any) -> JobSpec:
    node_specs = tuple(
        NodeSpec(r, "g4dn.xlarge", "on-demand", "us-east-1a", 1, 0.5) for r in range(nodes)
    )
    return JobSpec.build(
        job_id=JOB,
        cloud="aws",
        region="us-east-1",
        script=env["script"],
        nodes=node_specs,
        budget_usd=100.0,
        check_interval_s=30.0,
        grace_s=0.0,
        teardown_s=60.0,
        **kw,
    )


def _run(env: dict[str, Any], spec: JobSpec, sim: SimProvider) -> JobOutcome:
    return run_job(spec, Backend(sim, env["storage"]), env["db"], clock=env["clock"], billing=AWS)


def test_workers_without_new_step_records_end_the_cluster(env: dict[str, Any]) -> None:
    clock = env["clock"]
    start = clock.now()
    sim = TrainingSim(clock, env["storage"], boot_s=120.0, train_until=start + 20 * MIN)
    out = _run(env, _spec(env, idle_s=10 * MIN), sim)
    assert out.status == "stopped"
    assert out.reason.startswith("idle: no step record for 10 min (--idle-minutes 10)")
    assert sim.steps > 30  # it trained, then hung
    # ended within two monitor checks (plus the one check the step count lags) of N minutes
    # after the last record, and nothing is left running or billed past the teardown
    last_record = start + 20 * MIN
    assert last_record + 10 * MIN <= clock.now() <= last_record + 10 * MIN + 3 * 30.0 + 60.0
    assert sim.alive() == []
    assert all(r.end is not None and r.end <= clock.now() for r in env["db"].ledger(JOB))
    idle = [e for e in env["db"].events(JOB) if e.kind == "idle"]
    assert len(idle) == 1 and idle[0].data is not None and idle[0].data["idle_s"] >= 10 * MIN


def test_a_job_that_keeps_training_is_never_idle(env: dict[str, Any]) -> None:
    clock = env["clock"]
    start = clock.now()
    sim = TrainingSim(
        clock, env["storage"], train_until=start + 10 * 3600, finish_at=start + 3 * 3600
    )
    out = _run(env, _spec(env, idle_s=5 * MIN), sim)
    assert (out.status, out.reason) == ("succeeded", "every node finished")
    assert "idle" not in [e.kind for e in env["db"].events(JOB)]


def test_bootstrap_without_step_records_is_not_idle(env: dict[str, Any]) -> None:
    """No step record yet (installing, or a script without the kplan runtime): the cluster is
    not ended for idleness; it ends when the script finishes."""
    clock = env["clock"]
    start = clock.now()
    sim = TrainingSim(clock, env["storage"], finish_at=start + 2 * 3600)  # never trains
    out = _run(env, _spec(env, idle_s=5 * MIN), sim)
    assert (out.status, out.reason) == ("succeeded", "every node finished")
    assert sim.steps == 0


def test_a_finished_node_ends_the_rest_after_the_idle_minutes(env: dict[str, Any]) -> None:
    """Node 0 finishes, node 1 hangs: with --idle-minutes shorter than the finish grace the
    cluster ends at the idle minutes."""
    clock = env["clock"]
    start = clock.now()
    sim = TrainingSim(clock, env["storage"], node_exit={f"{JOB}-n0-r0": (15 * MIN, 0)})
    spec = _spec(env, idle_s=3 * MIN, finish_grace_s=3600.0)
    out = _run(env, spec, sim)
    assert out.status == "succeeded"
    assert out.reason == "node(s) [0] finished; the rest ended after 3 min"
    assert clock.now() <= start + 15 * MIN + 3 * MIN + 2 * 30.0 + 60.0
    assert sim.alive() == []


@pytest.mark.parametrize("minutes", [0.0, -1.0, float("nan"), 1e-300, 0.5])
def test_idle_minutes_must_be_positive(env: dict[str, Any], minutes: float) -> None:
    with pytest.raises(InputError, match="--idle-minutes"):
        _spec(env, idle_s=minutes * 60)


def test_the_flag_reaches_the_job_spec(env: dict[str, Any]) -> None:
    req = LaunchRequest(script=Path(env["script"]), budget_usd=5.0, idle_minutes=45.0)
    assert options(req)["idle_s"] == 45 * 60
