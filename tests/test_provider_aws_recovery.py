"""The recovery rules (planner/spot.py) through the aws provider: the real boto3 client against a
moto server in this process.

moto has no notion of capacity, so the outage is injected on the server side: the test wraps
moto's EC2 ``run_instances`` to answer ``InsufficientInstanceCapacity`` (a real EC2 error
response, parsed by botocore, translated by the provider into a ``CapacityError``) for the zones
and markets that are out. Spot interruptions are set in moto's backend (``MotoAws``), and the
test plays the nodes' bootstrap at the end (status files to S3, power-off).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kplan.launcher.bootstrap import status_key
from kplan.launcher.clock import SystemClock
from kplan.launcher.jobspec import JobSpec, NodeSpec, ZoneOffer, new_job_id
from kplan.launcher.lifecycle import JobOutcome, run_job
from kplan.launcher.providers import Backend
from kplan.launcher.state import EventRecord, StateDB
from tests.aws_server import REGION, MotoAws, fake_credentials, moto_backend

ZONE_A, ZONE_B = "us-east-1a", "us-east-1b"
SPOT, ON_DEMAND = 0.45, 1.01


class Capacity:
    """Which (zone, market) pairs EC2 (moto) has no capacity for, changed while a job runs."""

    def __init__(self) -> None:
        self.out: set[tuple[str, str]] = set()
        self.refused: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def set(self, *pairs: tuple[str, str]) -> None:
        with self.lock:
            self.out = set(pairs)


@pytest.fixture
def capacity(monkeypatch: pytest.MonkeyPatch) -> Capacity:
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models.instances import InstanceBackend

    cap = Capacity()
    real = InstanceBackend.run_instances

    def run_instances(self: Any, image_id: str, count: int, *args: Any, **kwargs: Any) -> Any:
        zone = str(kwargs.get("placement") or "")
        market = "spot" if kwargs.get("instance_market_options") == "spot" else "on-demand"
        with cap.lock:
            out = (zone, market) in cap.out
            if out:
                cap.refused.append((zone, market))
        if out:
            raise EC2ClientError(
                "InsufficientInstanceCapacity",
                f"We currently do not have sufficient g5.xlarge capacity in the Availability "
                f"Zone you requested ({zone}).",
            )
        return real(self, image_id, count, *args, **kwargs)

    monkeypatch.setattr(InstanceBackend, "run_instances", run_instances)
    return cap


@pytest.fixture
def backend(moto: MotoAws, monkeypatch: pytest.MonkeyPatch) -> Backend:
    fake_credentials(monkeypatch)
    return moto_backend(moto)


def _job(tmp_path: Path, **kw: Any) -> JobSpec:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text("print('training')\n")
    options: dict[str, Any] = {
        "job_id": new_job_id(),
        "cloud": "aws",
        "region": REGION,
        "script": str(script),
        "nodes": tuple(NodeSpec(r, "g5.xlarge", "spot", ZONE_A, 1, SPOT) for r in (0, 1)),
        "budget_usd": 20.0,
        "check_interval_s": 0.1,
        "grace_s": 1.0,
        "teardown_s": 10.0,
        "finish_grace_s": 5.0,
        "provision_timeout_s": 30.0,
        "offers": (
            ZoneOffer("g5.xlarge", ZONE_A, "spot", SPOT),
            ZoneOffer("g5.xlarge", ZONE_B, "spot", SPOT),
            ZoneOffer("g5.xlarge", ZONE_A, "on-demand", ON_DEMAND),
        ),
    }
    options.update(kw)
    return JobSpec.build(**options)


def _finish(backend: Backend, moto: MotoAws, job_id: str) -> None:
    """The bootstrap's last steps on every live node: status file to S3, then poweroff."""
    for inst in backend.provider.query_instances(job_id):
        if inst.alive:
            doc = {"exit_code": 0, "time": 0.0, "node_rank": inst.node_rank, "instance": inst.name}
            backend.storage.put_bytes(status_key(job_id, inst.node_rank), json.dumps(doc).encode())
            moto.power_off(inst.id)


def _run(
    spec: JobSpec, backend: Backend, db: StateDB, script: Callable[[EventRecord], None]
) -> JobOutcome:
    return run_job(spec, backend, db, clock=SystemClock(), on_event=script)


def _interrupt_worker(moto: MotoAws, spec: JobSpec, event: EventRecord) -> None:
    data = event.data or {}
    if event.kind == "launch" and data.get("name") == f"{spec.job_id}-n1-r0":
        moto.interrupt_spot(str(data["instance"]))


def _clean(moto: MotoAws, db: StateDB, job_id: str) -> None:
    assert moto.leftovers(job_id) == {"instances": [], "security_groups": [], "volumes": []}
    assert all(row.closed for row in db.ledger(job_id))
    assert not any(i.alive for i in db.instances(job_id))


def test_the_job_waits_for_capacity_then_fails_over_to_another_zone(
    backend: Backend, moto: MotoAws, capacity: Capacity, tmp_path: Path
) -> None:
    spec = _job(tmp_path, capacity_wait_s=60.0)
    db = StateDB.open(tmp_path / "kplan.db")
    back_at: list[float] = []

    def script(event: EventRecord) -> None:
        _interrupt_worker(moto, spec, event)
        if event.kind == "preempted":  # the region has no spot capacity for a while
            capacity.set((ZONE_A, "spot"), (ZONE_B, "spot"))
        if event.kind == "waiting":
            back_at.append(time.time() + 1.0)
        if event.kind == "recovered":
            _finish(backend, moto, spec.job_id)

    # The job waits quietly (no events): a thread lifts the outage of zone b 1 s into the wait.
    stop = threading.Event()

    def lift() -> None:
        while not stop.wait(0.05):
            if back_at and time.time() >= back_at[0]:
                capacity.set((ZONE_A, "spot"))  # zone a stays out

    helper = threading.Thread(target=lift, daemon=True)
    helper.start()
    try:
        out = _run(spec, backend, db, script)
    finally:
        stop.set()
        helper.join()
    assert (out.status, out.preemptions) == ("succeeded", 1), out.reason
    kinds = [e.kind for e in db.events(spec.job_id)]
    assert kinds.index("preempted") < kinds.index("waiting") < kinds.index("capacity")
    assert kinds.index("capacity") < kinds.index("recovered")
    (wait,) = [e for e in db.events(spec.job_id) if e.kind == "capacity"]
    assert wait.data is not None and wait.data["waited_s"] >= 1.0
    # The refusals came from EC2 (moto) through boto3 and the provider's error translation.
    failed = [e.message for e in db.events(spec.job_id) if e.kind == "launch-failed"]
    assert failed and "InsufficientInstanceCapacity" in failed[0]
    assert (ZONE_A, "spot") in capacity.refused and (ZONE_B, "spot") in capacity.refused
    records = {r.name: r for r in db.instances(spec.job_id)}
    replacement = records[max(n for n in records if "-n1-" in n)]
    assert (replacement.zone, replacement.market) == (ZONE_B, "spot")
    _clean(moto, db, spec.job_id)


def test_a_region_outage_beyond_capacity_wait_fails_and_terminates_everything(
    backend: Backend, moto: MotoAws, capacity: Capacity, tmp_path: Path
) -> None:
    spec = _job(tmp_path, capacity_wait_s=1.0)
    db = StateDB.open(tmp_path / "kplan.db")

    def script(event: EventRecord) -> None:
        _interrupt_worker(moto, spec, event)
        if event.kind == "preempted":
            capacity.set((ZONE_A, "spot"), (ZONE_B, "spot"))

    out = _run(spec, backend, db, script)
    assert out.status == "failed"
    assert (out.reason or "").startswith(
        f"no capacity for node(s) [1] in any zone of {REGION} (spot) for "
    )
    job = db.job(spec.job_id)
    assert job is not None and job.status == "failed" and job.reason == out.reason
    _clean(moto, db, spec.job_id)


def test_an_on_demand_fallback_returns_to_spot(
    backend: Backend, moto: MotoAws, capacity: Capacity, tmp_path: Path
) -> None:
    spec = _job(tmp_path, allow_on_demand=True, spot_probe_interval_s=0.2)
    db = StateDB.open(tmp_path / "kplan.db")

    def script(event: EventRecord) -> None:
        _interrupt_worker(moto, spec, event)
        if event.kind == "preempted":
            capacity.set((ZONE_A, "spot"), (ZONE_B, "spot"))
        data = event.data or {}
        if event.kind == "launch" and data.get("name") == f"{spec.job_id}-n1-r3":
            capacity.set()  # the on-demand replacement (r3: after two refused tries) runs
        if event.kind == "spot-return":
            _finish(backend, moto, spec.job_id)

    out = _run(spec, backend, db, script)
    assert out.status == "succeeded", out.reason
    records = sorted(db.instances(spec.job_id), key=lambda r: r.launched_at)
    assert [(r.node_rank, r.market, r.price) for r in records] == [
        (0, "spot", SPOT),
        (1, "spot", SPOT),
        (1, "on-demand", ON_DEMAND),
        (1, "spot", SPOT),
    ]
    on_demand = records[2]
    assert on_demand.state == "terminated"
    assert on_demand.reason == "Client.UserInitiatedShutdown: User initiated shutdown"  # by kplan
    rows = {r.instance: r for r in db.ledger(spec.job_id)}
    od = rows[on_demand.id]
    assert od.usd == pytest.approx(od.billed_seconds * ON_DEMAND / 3600)
    (back,) = [e for e in db.events(spec.job_id) if e.kind == "spot-return"]
    assert back.message.startswith("node 1 returned to spot")
    _clean(moto, db, spec.job_id)
