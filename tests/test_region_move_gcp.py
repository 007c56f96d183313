"""The move rule in the launcher on GCP (kplan/launcher/region_move.py): the local Compute and
Cloud Storage servers, the backend of each region made by the registered factory from the
environment (the launcher's default ``backend_for``), on the fake clock.

The outage: every insert of node 1 after its first instance ends ZONE_RESOURCE_POOL_EXHAUSTED
(GCP's stockout) until the job moves."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kplan.launcher.clock import FakeClock
from kplan.launcher.jobspec import JobSpec, NodeSpec, ZoneOffer, new_job_id
from kplan.launcher.lifecycle import run_job
from kplan.launcher.move_spec import MoveRegion
from kplan.launcher.provider import TAG_JOB
from kplan.launcher.providers import Backend, ProviderSettings, get_backend
from kplan.launcher.state import EventRecord, StateDB
from kplan.planner.spotmove import MoveTerms, break_even_s, copy_cost
from tests.gcp_server import FakeCompute
from tests.gcs_server import FakeGCS

PROJECT, BUCKET = "kplan-move-1", "kplan-move-bucket"
HOME, WEST = "us-central1", "us-west1"
T4 = "n1-standard-8+1xT4"
SPOT, ON_DEMAND, WEST_SPOT = 0.16, 0.73, 0.15
CKPT_GB, EGRESS_GB, TICK = 10.0, 0.02, 30.0


@pytest.fixture
def servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCompute]:
    compute, gcs = FakeCompute(boot_delay_s=0.0), FakeGCS(BUCKET)
    with compute.serve() as compute_url, gcs.serve() as gcs_url:
        monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "home"))
        monkeypatch.setenv("KPLAN_GCP_PROJECT", PROJECT)
        monkeypatch.setenv("KPLAN_GCP_ENDPOINT", compute_url)
        monkeypatch.setenv("KPLAN_GCS_ENDPOINT", gcs_url)
        monkeypatch.setenv("KPLAN_GCP_ANONYMOUS", "1")
        monkeypatch.setenv("KPLAN_GCP_STORAGE_URI", f"gs://{BUCKET}/jobs")
        yield compute


def _spec(tmp_path: Path) -> JobSpec:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('training')\n")
    home = (
        ZoneOffer(T4, f"{HOME}-a", "spot", SPOT),
        ZoneOffer(T4, f"{HOME}-a", "on-demand", ON_DEMAND),
    )
    west = (ZoneOffer(T4, f"{WEST}-b", "spot", WEST_SPOT),)
    return JobSpec.build(
        job_id=new_job_id(),
        cloud="gcp",
        region=HOME,
        script=str(script),
        nodes=tuple(NodeSpec(r, T4, "spot", f"{HOME}-a", 1, SPOT) for r in (0, 1)),
        budget_usd=5.0,
        check_interval_s=TICK,
        grace_s=0.0,
        teardown_s=60.0,
        capacity_wait_s=3000.0,
        offers=home,
        move_regions=(MoveRegion(HOME, home, EGRESS_GB), MoveRegion(WEST, west, EGRESS_GB)),
        checkpoint_gb=CKPT_GB,
    )


def _finish(compute: FakeCompute, backend: Backend, job_id: str) -> None:
    """The bootstrap's end on every live node: its status file, then power-off."""
    for inst in backend.provider.query_instances(job_id):
        if inst.alive:
            doc = {"exit_code": 0, "time": 0.0, "node_rank": inst.node_rank, "instance": inst.name}
            backend.storage.put_bytes(f"{job_id}/status/node-{inst.node_rank}.json",
                                      json.dumps(doc).encode())  # fmt: skip
            found = compute.find(inst.name)
            assert found is not None
            found["status"] = "TERMINATED"


def test_a_gcp_job_moves_to_another_region_and_finishes_there(
    servers: FakeCompute, tmp_path: Path
) -> None:
    compute = servers
    spec = _spec(tmp_path)
    job = spec.job_id
    backend = get_backend("gcp", ProviderSettings(home=tmp_path / "home", region=HOME))
    db = StateDB.open(tmp_path / "kplan.db")

    def drive(event: EventRecord) -> None:
        data = event.data or {}
        if event.kind == "launch" and data.get("name") == f"{job}-n1-r0":
            compute.preempt(f"{job}-n1-r0")
            compute.fail_insert(
                rf"{job}-n1-r[1-9][0-9]*$", "ZONE_RESOURCE_POOL_EXHAUSTED", "stockout"
            )
        if event.kind == "move":
            compute.clear_insert_failures()  # the other region has capacity
        moved = any(e.kind == "move" for e in db.events(job))
        if moved and event.kind == "launch" and data.get("node_rank") == 1:
            _finish(compute, backend, job)

    out = run_job(spec, backend, db, clock=FakeClock(), on_event=drive)
    assert out.status == "succeeded", out.reason
    events = {e.kind: e for e in db.events(job)}
    cost = copy_cost(MoveTerms("gcp", CKPT_GB), EGRESS_GB)
    t_star = break_even_s(cost, 2, ON_DEMAND, WEST_SPOT)
    assert t_star <= events["move"].time - events["preempted"].time <= t_star + TICK + 1e-6
    record = db.job(job)
    assert record is not None and record.region == WEST
    after = [i for i in db.instances(job) if i.launched_at >= events["move"].time]
    assert {(i.node_rank, i.region, i.zone) for i in after} == {
        (0, WEST, f"{WEST}-b"),
        (1, WEST, f"{WEST}-b"),
    }
    inserted = [s.path for s in compute.requests if s.method == "POST"]
    assert any(f"/zones/{WEST}-b/instances" in p for p in inserted)
    assert [r.instance for r in db.ledger(job) if r.kind == "egress"] == [
        f"egress/move-1: {HOME} -> {WEST}"
    ]
    assert not [i for i in compute.instances.values() if i["labels"].get(TAG_JOB) == job]
