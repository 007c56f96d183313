"""Acceptance: a GCP job through the launcher's lifecycle, on the local Compute and Cloud Storage
servers, with the backend made by the registered factory from the environment.

The test stands in for the nodes' bootstrap: it preempts a spot instance on the server when the
launcher launches it, and marks the nodes done by writing their status files through the same
``GCSStorage`` the launcher reads (then powers the instances off, as the bootstrap does).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kplan.launcher.clock import FakeClock
from kplan.launcher.down import down_job
from kplan.launcher.jobspec import JobSpec, NodeSpec, new_job_id
from kplan.launcher.lifecycle import run_job
from kplan.launcher.provider import TAG_JOB, ClusterSpec, InstanceSpec
from kplan.launcher.providers import Backend, ProviderSettings, get_backend
from kplan.launcher.state import EventRecord, StateDB
from tests.gcp_server import FakeCompute
from tests.gcs_server import FakeGCS

PROJECT = "kplan-e2e-1"
BUCKET = "kplan-e2e-bucket"
ZONE = "us-central1-a"
T4 = "n1-standard-8+1xT4"


@pytest.fixture
def servers() -> Iterator[tuple[FakeCompute, FakeGCS, str, str]]:
    compute, gcs = FakeCompute(boot_delay_s=0.05), FakeGCS(BUCKET)
    with compute.serve() as compute_url, gcs.serve() as gcs_url:
        yield compute, gcs, compute_url, gcs_url


@pytest.fixture
def backend(
    servers: tuple[FakeCompute, FakeGCS, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Backend:
    _, _, compute_url, gcs_url = servers
    monkeypatch.setenv("KPLAN_GCP_PROJECT", PROJECT)
    monkeypatch.setenv("KPLAN_GCP_ENDPOINT", compute_url)
    monkeypatch.setenv("KPLAN_GCS_ENDPOINT", gcs_url)
    monkeypatch.setenv("KPLAN_GCP_ANONYMOUS", "1")
    monkeypatch.setenv("KPLAN_GCP_STORAGE_URI", f"gs://{BUCKET}/jobs")
    return get_backend("gcp", ProviderSettings(home=tmp_path))


def job_spec(tmp_path: Path, **options: float) -> JobSpec:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text("print('training')\n")
    node = NodeSpec(0, T4, "spot", ZONE, gpus=1, usd_per_hour=0.16)
    settings = {"check_interval_s": 1.0, "grace_s": 5.0, "teardown_s": 30.0, **options}
    return JobSpec.build(
        job_id=new_job_id(),
        cloud="gcp",
        region="us-central1",
        script=str(script),
        nodes=(node, NodeSpec(1, T4, "spot", ZONE, gpus=1, usd_per_hour=0.16)),
        budget_usd=5.0,
        **settings,  # type: ignore[arg-type]
    )


def finish_node(compute: FakeCompute, backend: Backend, job_id: str, name: str) -> None:
    """What the bootstrap does when torchrun exits 0: upload the status, power off."""
    rank = int(name.rsplit("-n", 1)[1].split("-", maxsplit=1)[0])
    status = {"exit_code": 0, "time": 0.0, "node_rank": rank, "instance": name}
    backend.storage.put_bytes(f"{job_id}/status/node-{rank}.json", json.dumps(status).encode())
    resource = compute.find(name)
    assert resource is not None
    resource["status"] = "TERMINATED"


def test_launch_preemption_replacement_completion_teardown(
    servers: tuple[FakeCompute, FakeGCS, str, str], backend: Backend, tmp_path: Path
) -> None:
    compute, gcs, _, _ = servers
    spec = job_spec(tmp_path)
    job = spec.job_id
    launched: list[str] = []

    def drive(event: EventRecord) -> None:
        if event.kind == "launch" and event.data is not None:
            launched.append(str(event.data["name"]))
            if event.data["name"] == f"{job}-n1-r0":
                compute.preempt(f"{job}-n1-r0")  # GCP takes the spot VM back at once
        elif event.kind == "recovered":  # the replacement runs: the job then runs to its end
            finish_node(compute, backend, job, f"{job}-n0-r0")
            finish_node(compute, backend, job, f"{job}-n1-r1")

    db = StateDB.open(tmp_path / "kplan.db")
    outcome = run_job(spec, backend, db, clock=FakeClock(), on_event=drive)

    assert (outcome.status, outcome.preemptions) == ("succeeded", 1), db.events(job)
    assert launched == [f"{job}-n0-r0", f"{job}-n1-r0", f"{job}-n1-r1"]
    kinds = [e.kind for e in db.events(job)]
    assert kinds.index("preempted") < kinds.index("recovered") < kinds.index("succeeded")
    preempted = next(e for e in db.events(job) if e.kind == "preempted")
    assert preempted.data is not None and preempted.data["reason"] == "spot preemption"
    states = {r.name: r.state for r in db.instances(job)}
    assert states[f"{job}-n1-r0"] == "preempted"

    # what went over the wire: spot inserts with the job's labels and a gsutil bootstrap
    inserts = compute.bodies("POST", "/instances")
    assert [b["name"] for b in inserts] == launched
    for body in inserts:
        assert body["scheduling"]["provisioningModel"] == "SPOT"
        assert body["labels"][TAG_JOB] == job
        script = next(i["value"] for i in body["metadata"]["items"] if i["key"] == "startup-script")
        assert f"gs://{BUCKET}/jobs/{job}" in script and "gsutil" in script
    assert (BUCKET, f"jobs/{job}/code/job.tar.gz") in gcs.objects

    # teardown: nothing labelled with the job, no firewall rule, a closed ledger
    assert not [i for i in compute.instances.values() if i["labels"].get(TAG_JOB) == job]
    assert compute.firewalls == {}
    assert all(row.end is not None for row in db.ledger(job))
    assert backend.provider.query_instances(job) == []


def test_stop_request_tears_down_and_kplan_down_finds_nothing_left(
    servers: tuple[FakeCompute, FakeGCS, str, str], backend: Backend, tmp_path: Path
) -> None:
    compute, _, _, _ = servers
    spec = job_spec(tmp_path)
    job = spec.job_id
    db = StateDB.open(tmp_path / "kplan.db")
    clock = FakeClock()
    requested: list[str] = []

    def stop_when_running(event: EventRecord) -> None:
        if event.kind == "launch" and len(requested) == 0 and "-n1-" in str(event.data):
            requested.append(job)
            db.request_stop(job, "cancelled by the test", clock.now())

    outcome = run_job(spec, backend, db, clock=clock, on_event=stop_when_running)

    assert outcome.status == "cancelled"
    assert not [i for i in compute.instances.values() if i["labels"].get(TAG_JOB) == job]
    assert compute.firewalls == {}
    result = down_job(job, backend, db, clock)  # a second teardown finds nothing to do
    assert result.terminated == ()


def test_kplan_down_from_a_fresh_process_with_no_database(
    servers: tuple[FakeCompute, FakeGCS, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compute, _, compute_url, gcs_url = servers
    for var, value in (
        ("KPLAN_GCP_PROJECT", PROJECT),
        ("KPLAN_GCP_ENDPOINT", compute_url),
        ("KPLAN_GCS_ENDPOINT", gcs_url),
        ("KPLAN_GCP_ANONYMOUS", "1"),
        ("KPLAN_GCP_STORAGE_URI", f"gs://{BUCKET}/jobs"),
    ):
        monkeypatch.setenv(var, value)
    settings = ProviderSettings(home=tmp_path)
    job = new_job_id()
    cluster = ClusterSpec(job_id=job, cloud="gcp", region="us-central1", ssh_cidr="203.0.113.0/24")
    launcher = get_backend("gcp", settings).provider  # a launcher that then dies
    launcher.prepare(cluster)
    specs = [
        InstanceSpec(
            job, f"{job}-n{r}-r0", "gcp", "us-central1", ZONE, T4, "spot", r, "#!/bin/bash"
        )
        for r in (0, 1)
    ]
    launcher.run_instances(cluster, specs)
    compute.preempt(f"{job}-n1-r0")

    db = StateDB.open(tmp_path / "empty.db")
    result = down_job(job, get_backend("gcp", settings), db, FakeClock(), cluster=cluster)

    assert result.terminated == (f"{ZONE}/{job}-n0-r0",)  # the preempted one is not alive
    assert not [i for i in compute.instances.values() if i["labels"].get(TAG_JOB) == job]
    assert compute.firewalls == {}
