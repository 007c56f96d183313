"""Acceptance: a two-node spot job through the launcher's lifecycle on the aws provider (real boto3
client, moto server in this process). The test stands in for EC2 and for the node bootstrap: it
interrupts a spot instance in moto's backend, and at the end writes the nodes' status files to S3
and powers the nodes off. Afterwards nothing carries the job's tag."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from kplan.launcher.bootstrap import cluster_spec, instance_spec, rendezvous, status_key
from kplan.launcher.clock import SystemClock
from kplan.launcher.down import down_job
from kplan.launcher.jobspec import JobSpec, NodeSpec, new_job_id
from kplan.launcher.lifecycle import run_job
from kplan.launcher.providers import Backend, ProviderSettings, get_backend
from kplan.launcher.state import EventRecord, StateDB
from tests.aws_server import (
    ACCESS_KEY,
    BUCKET,
    REGION,
    SECRET_KEY,
    SESSION_TOKEN,
    ZONE,
    MotoAws,
    fake_credentials,
    moto_backend,
)


@pytest.fixture
def backend(moto: MotoAws, monkeypatch: pytest.MonkeyPatch) -> Backend:
    fake_credentials(monkeypatch)
    return moto_backend(moto)


def job(tmp_path: Path) -> JobSpec:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('training')\n")
    node = NodeSpec(0, "g5.xlarge", "spot", ZONE, gpus=1, usd_per_hour=0.45)
    return JobSpec.build(
        job_id=new_job_id(),
        cloud="aws",
        region=REGION,
        script=str(script),
        nodes=(node, NodeSpec(1, "g5.xlarge", "spot", ZONE, gpus=1, usd_per_hour=0.45)),
        budget_usd=20.0,
        check_interval_s=0.1,
        grace_s=1.0,
        teardown_s=10.0,
        finish_grace_s=5.0,
        provision_timeout_s=30.0,
    )


def finish(backend: Backend, moto: MotoAws, job_id: str) -> None:
    """The bootstrap's last steps on every live node: status file to S3, then poweroff."""
    for inst in backend.provider.query_instances(job_id):
        if inst.alive:
            doc = {"exit_code": 0, "time": 0.0, "node_rank": inst.node_rank, "instance": inst.name}
            backend.storage.put_bytes(status_key(job_id, inst.node_rank), json.dumps(doc).encode())
            moto.power_off(inst.id)


def on(kind: str, action: Callable[[EventRecord], None]) -> Callable[[EventRecord], None]:
    """Run ``action`` at the first event of ``kind`` (called inside the launcher's loop)."""
    seen: list[int] = []

    def sink(event: EventRecord) -> None:
        if event.kind == kind and not seen:
            seen.append(event.seq)
            action(event)

    return sink


def test_spot_interruption_replacement_completion_and_teardown(
    backend: Backend, moto: MotoAws, tmp_path: Path
) -> None:
    spec = job(tmp_path)
    db = StateDB.open(tmp_path / "kplan.db")
    finish_once = on("recovered", lambda e: finish(backend, moto, spec.job_id))

    def sink(event: EventRecord) -> None:
        data = event.data or {}
        if event.kind == "launch" and data.get("name") == f"{spec.job_id}-n1-r0":
            moto.interrupt_spot(str(data["instance"]))  # the worker's spot capacity is reclaimed
        finish_once(event)  # the replacement runs: training completes on both nodes

    outcome = run_job(spec, backend, db, clock=SystemClock(), on_event=sink)

    assert (outcome.status, outcome.preemptions) == ("succeeded", 1), outcome.reason
    kinds = [e.kind for e in db.events(spec.job_id)]
    for kind in ("prepare", "launch", "preempted", "recovered", "node-exit", "succeeded"):
        assert kind in kinds
    records = {r.name: r for r in db.instances(spec.job_id)}
    assert set(records) == {f"{spec.job_id}-n{r}" for r in ("0-r0", "1-r0", "1-r1")}
    lost = records[f"{spec.job_id}-n1-r0"]
    assert (lost.state, lost.reason) == ("preempted", "spot interruption")
    assert all(r.market == "spot" and not r.alive for r in records.values())
    assert all(row.closed for row in db.ledger(spec.job_id))
    assert backend.storage.get_bytes(f"{spec.job_id}/code/job.tar.gz")
    assert moto.leftovers(spec.job_id) == {"instances": [], "security_groups": [], "volumes": []}

    # The report of this moto-backed job: its total is the ledger's sum exactly (terminal, JSON
    # and HTML carry the same number), the preemption is itemised, and the on-demand comparison
    # prices the same billed seconds at the shipped catalog's g5.xlarge on-demand rate.
    from kplan.app.naive_plan import naive_planner
    from kplan.launcher.report import build_report, catalog_on_demand
    from kplan.launcher.report_html import render_html

    rec = db.job(spec.job_id)
    assert rec is not None
    example = Path(__file__).resolve().parents[1] / "kplan" / "planner" / "examples" / "yolov3.json"
    report = build_report(db, rec, rec.updated_at, storage=backend.storage,
                          on_demand_price=catalog_on_demand(),
                          naive=naive_planner(str(example)))  # fmt: skip
    ledger_sum = math.fsum(row.usd for row in db.ledger(spec.job_id))
    assert report.total_usd == ledger_sum and ledger_sum > 0
    assert json.loads(json.dumps(report.to_dict()))["total_usd"] == ledger_sum
    assert f'data-total-usd="{ledger_sum!r}"' in render_html([report])
    assert [p.kind for p in report.preemptions] == ["preempted"]
    assert report.preemptions[0].replacement is not None
    lost = report.preemptions[0].lost_usd
    assert lost is not None and 0 < lost < ledger_sum  # lost + down time at the cluster's price
    naive = report.naive  # the profile's batch on one on-demand AWS instance, as planned
    assert naive.usd is not None and naive.usd > 0 and naive.config is not None
    assert naive.savings_usd == pytest.approx(naive.usd - ledger_sum)
    assert report.on_demand.usd is not None and report.on_demand.usd > ledger_sum
    assert report.on_demand.savings_usd == pytest.approx(report.on_demand.usd - ledger_sum)

    # No secret from the test's credentials reaches the database, the logs, or the bucket
    # (status files, code, user-data's copies); the DB is checked on disk after closing it.
    db.close()
    blobs = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    blobs += [backend.storage.get_bytes(k) or b"" for k in backend.storage.list_keys(spec.job_id)]
    assert any(b.startswith(b"SQLite format 3") for b in blobs)  # the database was scanned
    for secret in (ACCESS_KEY, SECRET_KEY, SESSION_TOKEN):
        assert not any(secret.encode() in b for b in blobs), secret


def test_a_stop_request_tears_the_job_down(backend: Backend, moto: MotoAws, tmp_path: Path) -> None:
    spec = job(tmp_path)
    db = StateDB.open(tmp_path / "kplan.db")
    stop = on("head", lambda e: db.request_stop(spec.job_id, "kplan down", e.time))

    outcome = run_job(spec, backend, db, clock=SystemClock(), on_event=stop)

    assert outcome.status == "cancelled"
    assert {r.state for r in db.instances(spec.job_id)} == {"terminated"}
    assert all(row.closed for row in db.ledger(spec.job_id))
    assert moto.leftovers(spec.job_id) == {"instances": [], "security_groups": [], "volumes": []}


def test_kplan_down_finds_an_orphaned_job_by_tag_with_no_database(
    backend: Backend, moto: MotoAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = job(tmp_path)
    storage_uri = f"s3://{BUCKET}/jobs"
    cluster = cluster_spec(spec, storage_uri)
    node = spec.nodes[0]
    backend.provider.prepare(cluster)  # a launcher that died after launching two nodes
    backend.provider.run_instances(
        cluster,
        [
            instance_spec(
                spec, replace(node, node_rank=r), f"{spec.job_id}-n{r}-r0", rdzv, storage_uri
            )
            for r, rdzv in ((0, rendezvous(spec, 0, None)), (1, rendezvous(spec, 0, "10.0.0.1")))
        ],
    )
    # `kplan down` in a fresh process: the registered factory, configured from the environment.
    monkeypatch.setenv("KPLAN_AWS_ENDPOINT_URL", moto.url)
    monkeypatch.setenv("KPLAN_AWS_PLACEMENT_GROUPS", "0")
    fresh = get_backend("aws", ProviderSettings(tmp_path, REGION, storage_uri))
    db = StateDB.open(tmp_path / "empty.db")

    result = down_job(spec.job_id, fresh, db, SystemClock(), teardown_s=10.0, cluster=cluster)

    assert len(result.terminated) == 2
    assert moto.leftovers(spec.job_id) == {"instances": [], "security_groups": [], "volumes": []}
