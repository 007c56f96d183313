"""The controller on an instance of its own, through the gcp provider, on the local Compute and
Cloud Storage servers: the catalog's e2-small, standard (not spot) provisioning, the job's
labels and node rank -1, a startup-script that runs ``kplan controller JOB`` against the job's
bucket, the hard stop set by the server (``maxRunDuration`` with ``DELETE``), billed in the
ledger from its request; ``kplan down JOB`` deletes it and closes its ledger row once.
"""

from __future__ import annotations

from pathlib import Path

from kplan.app.controller_instance import start_on_instance
from kplan.launcher.clock import FakeClock
from kplan.launcher.controller_node import choose_site, controller_name
from kplan.launcher.down import down_job
from kplan.launcher.provider import TAG_JOB, TAG_NODE
from kplan.launcher.providers import Backend
from kplan.launcher.state import StateDB
from tests.gcp_server import FakeCompute
from tests.gcs_server import FakeGCS
from tests.test_provider_gcp_e2e import BUCKET, PROJECT, backend, job_spec, servers

__all__ = ["backend", "servers"]  # the fixtures


def test_the_controller_instance_on_gcp(
    servers: tuple[FakeCompute, FakeGCS, str, str], backend: Backend, tmp_path: Path
) -> None:
    compute, gcs, _, _ = servers
    spec = job_spec(tmp_path)
    job = spec.job_id
    site = choose_site(spec, None)
    assert site.offer is not None and site.offer.instance_type == "e2-small"
    assert "cloud.google.com/compute/vm-instance-pricing" in site.offer.source
    db = StateDB.open(tmp_path / "kplan.db")
    iid = start_on_instance(spec, backend, db, site)
    (body,) = compute.bodies("POST", "/instances")
    assert body["name"] == controller_name(job)
    assert body["machineType"].endswith("/machineTypes/e2-small")
    assert body["labels"][TAG_JOB] == job and body["labels"][TAG_NODE] == "-1"
    scheduling = body["scheduling"]
    assert scheduling.get("provisioningModel", "STANDARD") == "STANDARD"
    assert scheduling["instanceTerminationAction"] == "DELETE"
    assert int(scheduling["maxRunDuration"]["seconds"]) > 0
    script = next(i["value"] for i in body["metadata"]["items"] if i["key"] == "startup-script")
    assert f"controller {job} --cloud gcp --region us-central1" in script
    assert f"--storage gs://{BUCKET}/jobs --mode detached" in script
    assert f"export KPLAN_GCP_PROJECT={PROJECT}" in script  # forwarded: a name
    assert "KPLAN_GCP_ANONYMOUS" not in script and "KPLAN_GCP_ENDPOINT" not in script
    assert 'gsutil -q cat "$STORE/lease.json"' in script  # the lease watchdog
    assert (BUCKET, f"jobs/{job}/controller.json") in gcs.objects
    assert (BUCKET, f"jobs/{job}/code/job.tar.gz") in gcs.objects
    (row,) = db.ledger(job)
    assert row.instance == iid and not row.closed
    result = down_job(job, backend, db, FakeClock(), wait_launcher_s=0.0, teardown_s=30.0)
    assert iid in result.terminated
    assert not [i for i in backend.provider.query_instances(job) if i.alive]
    (row,) = db.ledger(job)
    assert row.closed and row.usd >= 0
