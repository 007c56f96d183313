"""The lifecycle on a simulated cloud: recovery, failures, guard stops, teardown, cancel."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kplan.core.errors import CloudError, InputError
from kplan.launcher.clock import FakeClock
from kplan.launcher.jobspec import JobSpec, NodeSpec, ZoneOffer
from kplan.launcher.lifecycle import JobOutcome, run_job
from kplan.launcher.providers import Backend
from kplan.launcher.state import StateDB
from kplan.launcher.storage import LocalStorage
from kplan.planner.catalog import Billing
from tests.launcher_fakes import SimProvider, fast_dir

AWS = Billing("aws", 60.0, 1.0, "test")
HOUR = 3600.0


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    folder = fast_dir(tmp_path, "life")
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('train')\n")
    storage = LocalStorage(folder / "store")
    storage.uri = "s3://bucket/kplan"
    clock = FakeClock()
    with StateDB.open(folder / "kplan.db") as db:
        yield {"clock": clock, "storage": storage, "db": db, "script": str(script)}
    shutil.rmtree(folder, ignore_errors=True)


def _spec(
    env: dict[str, Any], markets: tuple[str, ...] = ("on-demand", "spot"), **kw: Any
) -> JobSpec:
    nodes = tuple(
        NodeSpec(r, "g4dn.xlarge", m, "us-east-1a", 1, 0.5 if m == "on-demand" else 0.2)  # type: ignore[arg-type]
        for r, m in enumerate(markets)
    )
    options: dict[str, Any] = {
        "job_id": "kp-life-1",
        "cloud": "aws",
        "region": "us-east-1",
        "script": env["script"],
        "nodes": nodes,
        "budget_usd": 100.0,
        "check_interval_s": 30.0,
        "grace_s": 60.0,
        "teardown_s": 60.0,
        "offers": (
            ZoneOffer("g4dn.xlarge", "us-east-1a", "spot", 0.2),
            ZoneOffer("g4dn.xlarge", "us-east-1b", "spot", 0.25),
            ZoneOffer("g4dn.xlarge", "us-east-1a", "on-demand", 0.5),
        ),
    }
    options.update(kw)
    return JobSpec.build(**options)


def _sim(env: dict[str, Any], **kw: Any) -> SimProvider:
    return SimProvider(env["clock"], env["storage"], **kw)


def _run(env: dict[str, Any], spec: JobSpec, sim: SimProvider) -> JobOutcome:
    return run_job(spec, Backend(sim, env["storage"]), env["db"], clock=env["clock"], billing=AWS)


def _kinds(env: dict[str, Any], job: str = "kp-life-1") -> list[str]:
    return [e.kind for e in env["db"].events(job)]


def test_success_with_a_preempted_worker_replaced_in_its_zone(env: dict[str, Any]) -> None:
    clock = env["clock"]
    delays = iter([600.0])
    sim = _sim(env, boot_s=30, term_latency_s=10, finish_at=clock.now() + HOUR)
    sim.preempt_after = lambda spec: next(delays, None)
    out = _run(env, _spec(env), sim)
    assert (out.status, out.preemptions) == ("succeeded", 1)
    db: StateDB = env["db"]
    kinds = _kinds(env)
    assert kinds.index("head") < kinds.index("preempted") < kinds.index("recovered")
    names = [s.name for s in sim.launched]
    assert names == ["kp-life-1-n0-r0", "kp-life-1-n1-r0", "kp-life-1-n1-r1"]
    assert sim.launched[2].zone == "us-east-1a" and sim.launched[2].market == "spot"
    recovered = next(e for e in db.events("kp-life-1") if e.kind == "recovered")
    assert recovered.data is not None and recovered.data["downtime_s"] == pytest.approx(30.0)
    rows = {r.instance: r for r in db.ledger("kp-life-1")}
    assert all(r.closed for r in rows.values())
    # The preempted spot node was billed from its request to the check that saw it gone.
    head, first = rows["i-0000"], rows["i-0001"]
    assert head.billed_seconds == HOUR and head.usd == pytest.approx(0.5)
    assert first.billed_seconds == pytest.approx(600 + 30, abs=30)
    assert out.spend_usd == pytest.approx(sum(r.usd for r in rows.values()))
    assert sim.alive() == []
    job = db.job("kp-life-1")
    assert job is not None and job.status == "succeeded"
    # Powered-off and preempted VMs may still exist (GCP keeps them TERMINATED): deleted too.
    assert sorted(sim.terminate_requests) == ["i-0000", "i-0001", "i-0002"]


def test_replacement_tries_other_zones_then_on_demand(env: dict[str, Any]) -> None:
    clock = env["clock"]
    delays = iter([300.0])
    sim = _sim(env, finish_at=clock.now() + 2 * HOUR)
    sim.preempt_after = lambda spec: next(delays, None)
    sim.no_capacity = set()
    spec = _spec(env, allow_on_demand=True)

    def block_spot(e: Any) -> None:
        if e.kind == "preempted":
            sim.no_capacity.update({("us-east-1a", "spot"), ("us-east-1b", "spot")})

    out = run_job(
        spec, Backend(sim, env["storage"]), env["db"], clock=clock, billing=AWS, on_event=block_spot
    )
    assert out.status == "succeeded"
    assert [(s.zone, s.market) for s in sim.launched[2:]] == [("us-east-1a", "on-demand")]
    failed = [e.message for e in env["db"].events("kp-life-1") if e.kind == "launch-failed"]
    assert len(failed) == 2 and "us-east-1b" in failed[1]
    inst = env["db"].instances("kp-life-1")[-1]
    assert (inst.market, inst.price) == ("on-demand", 0.5)


def test_losing_the_head_restarts_every_group_with_a_new_rendezvous(env: dict[str, Any]) -> None:
    clock = env["clock"]
    sim = _sim(env, finish_at=clock.now() + HOUR, term_latency_s=20)
    sim.preempt_after = lambda spec: 900.0 if spec.name == "kp-life-1-n0-r0" else None
    out = _run(env, _spec(env, markets=("spot", "on-demand")), sim)
    assert out.status == "succeeded"
    names = [s.name for s in sim.launched]
    assert names == [
        "kp-life-1-n0-r0",
        "kp-life-1-n1-r0",
        "kp-life-1-n0-r1",
        "kp-life-1-n1-r1",
    ]
    assert "--rdzv-id=kp-life-1-g0" in sim.launched[1].user_data
    assert "--rdzv-id=kp-life-1-g1" in sim.launched[3].user_data
    assert "restart" in _kinds(env)
    old_worker = env["db"].instances("kp-life-1")[1]
    assert old_worker.state == "terminated" and old_worker.reason == "terminated by request"


def test_a_node_failing_as_the_head_is_lost_is_replaced_not_fatal(env: dict[str, Any]) -> None:
    """The head (and its rendezvous store) is preempted without notice; the worker node's agent
    then exits 1 (RendezvousConnectionError), its status written before it powers off. That exit
    is the loss's doing: every node restarts and the job succeeds (before, it failed the job:
    test_launch_survives_three_preemptions under load)."""
    clock = env["clock"]
    storage = env["storage"]
    sim = _sim(env, finish_at=clock.now() + HOUR)
    sim.preempt_after = lambda spec: 900.0 if spec.name == "kp-life-1-n0-r0" else None

    def store_gone(e: Any) -> None:
        if e.kind == "preempted" and "node 0" in e.message:
            doc = {"exit_code": 1, "time": e.time, "instance": "kp-life-1-n1-r0"}
            storage.put_bytes("kp-life-1/status/node-1.json", json.dumps(doc).encode())

    spec = _spec(env, markets=("spot", "on-demand"))
    out = run_job(
        spec, Backend(sim, storage), env["db"], clock=clock, billing=AWS, on_event=store_gone
    )
    assert out.status == "succeeded", out.reason
    names = [s.name for s in sim.launched]
    assert names[:2] == ["kp-life-1-n0-r0", "kp-life-1-n1-r0"]
    assert "kp-life-1-n0-r1" in names and "kp-life-1-n1-r1" in names
    lost = [e.message for e in env["db"].events("kp-life-1") if e.kind == "lost"]
    assert any("after node 0 was lost" in m for m in lost), lost


def test_a_failing_script_fails_the_job_and_tears_down(env: dict[str, Any]) -> None:
    clock = env["clock"]
    sim = _sim(env, node_exit={"kp-life-1-n1-r0": (120.0, 1)}, term_latency_s=5)
    out = _run(env, _spec(env), sim)
    assert (out.status, out.reason) == ("failed", "node 1 exited with code 1")
    assert sim.alive() == []
    assert clock.now() < 1_800_000_000 + 400


def test_a_node_killed_by_a_signal_is_replaced_not_failed(env: dict[str, Any]) -> None:
    clock = env["clock"]
    sim = _sim(env, node_exit={"kp-life-1-n1-r0": (200.0, 143)}, finish_at=clock.now() + HOUR)
    out = _run(env, _spec(env), sim)
    assert out.status == "succeeded"
    assert [s.name for s in sim.launched][-1] == "kp-life-1-n1-r1"
    lost = [e.message for e in env["db"].events("kp-life-1") if e.kind == "lost"]
    assert lost == ["node 1: exited with signal code 143"]


def test_budget_stop_checkpoints_and_stays_under_budget(env: dict[str, Any]) -> None:
    sim = _sim(env, term_latency_s=100)  # never finishes
    spec = _spec(env, budget_usd=0.35)  # 0.7 $/h: half an hour, minus the guard's horizon
    out = _run(env, spec, sim)
    assert (out.status, out.reason) == ("stopped", "budget")
    assert out.spend_usd <= 0.35
    assert out.spend_usd > 0.35 - 0.7 * spec.horizon_s / HOUR - 1e-9  # stopped no earlier
    guard = [e for e in env["db"].events("kp-life-1") if e.kind == "guard"]
    assert guard and "would exceed the budget $0.35" in guard[0].message
    assert sim.calls.count("terminate_instances") >= 1 and sim.alive() == []


def test_deadline_stop(env: dict[str, Any]) -> None:
    clock = env["clock"]
    start = clock.now()
    sim = _sim(env, term_latency_s=60)
    out = _run(env, _spec(env, deadline_h=1.0), sim)
    assert (out.status, out.reason) == ("stopped", "deadline")
    assert clock.now() <= start + HOUR
    assert all(r.end <= start + HOUR for r in env["db"].ledger("kp-life-1"))


def test_a_budget_that_cannot_start_the_cluster_launches_nothing(env: dict[str, Any]) -> None:
    sim = _sim(env)
    out = _run(env, _spec(env, budget_usd=0.001), sim)
    assert out.status == "stopped" and sim.launched == []
    assert "not launching the cluster" in env["db"].events("kp-life-1")[-3].message


def test_failed_teardown_names_the_instances_and_kplan_down(env: dict[str, Any]) -> None:
    sim = _sim(env, node_exit={"kp-life-1-n0-r0": (60.0, 2)}, fail_terminate=True)
    pattern = r"instances i-0001 may still be running \(last error: terminate refused"
    with pytest.raises(CloudError, match=pattern) as info:
        _run(env, _spec(env), sim)
    assert "kplan down kp-life-1" in info.value.hint
    job = env["db"].job("kp-life-1")
    assert job is not None and job.status == "error" and "teardown failed" in (job.reason or "")


def test_a_stop_request_from_another_connection_cancels(env: dict[str, Any]) -> None:
    db: StateDB = env["db"]
    other = StateDB.open(db.path)  # what `kplan down` in another process does
    sim = _sim(env)

    def cancel(e: Any) -> None:
        if e.kind == "launch" and "node 1" in e.message:
            other.request_stop("kp-life-1", "cancelled by kplan down", e.time)

    out = run_job(
        _spec(env),
        Backend(sim, env["storage"]),
        db,
        clock=env["clock"],
        billing=AWS,
        on_event=cancel,
    )
    other.close()
    assert (out.status, out.reason) == ("cancelled", "cancelled by kplan down")
    assert sim.alive() == []


def test_a_pending_instance_that_never_boots_is_replaced(env: dict[str, Any]) -> None:
    clock = env["clock"]
    sim = _sim(env, finish_at=clock.now() + 3 * HOUR)
    spec = _spec(env, provision_timeout_s=600.0)
    sim.boot_by_name = {"kp-life-1-n1-r0": 10.0**9}  # the first worker never leaves "pending"
    out = _run(env, spec, sim)
    assert out.status == "succeeded"
    lost = [e.message for e in env["db"].events("kp-life-1") if e.kind == "lost"]
    assert lost == ["node 1: not running after 600 s"]


def test_a_stray_instance_with_the_job_tag_is_terminated(env: dict[str, Any]) -> None:
    clock = env["clock"]
    sim = _sim(env, finish_at=clock.now() + HOUR)
    spec = _spec(env)
    stray = _spec(env, job_id="kp-life-1")
    from kplan.launcher.bootstrap import instance_spec, rendezvous

    sim.run_instances(
        None,  # type: ignore[arg-type]
        [instance_spec(stray, stray.nodes[0], "leftover", rendezvous(stray, 0, None), "s3://b")],
    )
    out = _run(env, spec, sim)
    assert out.status == "succeeded" and sim.alive() == []
    assert "stray" in _kinds(env)


def test_job_ids_are_unique_and_validated(env: dict[str, Any]) -> None:
    sim = _sim(env, finish_at=env["clock"].now() + 100)
    _run(env, _spec(env), sim)
    with pytest.raises(InputError, match="already exists"):
        _run(env, _spec(env), sim)
    with pytest.raises(InputError, match="job id 'Bad_ID' is not valid"):
        _spec(env, job_id="Bad_ID")
    with pytest.raises(InputError, match=r"--budget -1\.0 must be >= 0"):
        _spec(env, budget_usd=-1.0)


def test_a_late_status_from_a_replaced_instance_is_ignored(env: dict[str, Any]) -> None:
    clock = env["clock"]
    sim = _sim(env, finish_at=clock.now() + HOUR)
    storage = env["storage"]

    def stale_write(e: Any) -> None:
        if e.kind == "launch" and "node 1" in e.message:  # an old instance of rank 1 fails late
            doc = {"exit_code": 1, "time": e.time, "instance": "kp-life-1-n1-r9"}
            storage.put_bytes("kp-life-1/status/node-1.json", json.dumps(doc).encode())

    out = run_job(
        _spec(env), Backend(sim, storage), env["db"], clock=clock, billing=AWS, on_event=stale_write
    )
    assert (out.status, out.reason) == ("succeeded", "every node finished")


class _ExpiredCredentials(SimProvider):
    """Every cloud call fails as with credentials that expired after the factory checked them."""

    def _denied(self, verb: str) -> None:
        self.calls.append(verb)
        raise CloudError("the request's credentials expired", hint="log in again")

    def prepare(self, cluster: Any) -> None:
        self._denied("prepare")

    def query_instances(self, job_id: str) -> list[Any]:
        self._denied("query_instances")
        return []

    def cleanup(self, cluster: Any) -> None:
        self._denied("cleanup")


def test_a_cloud_that_refuses_before_any_instance_ends_at_once(env: dict[str, Any]) -> None:
    # Before: teardown polled query_instances for grace + teardown (minutes on a real cloud)
    # and then warned that "instances (unknown) may still be running".
    sim = _ExpiredCredentials(env["clock"], env["storage"])
    start = env["clock"].now()
    with pytest.raises(CloudError, match="credentials expired"):
        _run(env, _spec(env), sim)
    assert env["clock"].now() - start < 1.0
    assert sim.launched == [] and sim.calls.count("query_instances") == 1
    job = env["db"].job("kp-life-1")
    assert job is not None and job.status == "error"
    assert "may still be running" not in (job.reason or "")
    assert "cleanup" in _kinds(env)
