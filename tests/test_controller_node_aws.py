"""The controller on an instance of its own, through the aws provider: boto3 against moto.

``start_on_instance`` (what ``kplan launch --detach`` does for a cloud job) creates one
controller instance: the catalog's t3.small, on-demand, tagged with the job and node rank -1,
``InstanceInitiatedShutdownBehavior=terminate``, a user data that arms the hard stop and runs
``kplan controller JOB`` against the job's bucket; it bills it in the launcher's ledger from its
request. The controller that instance runs (``resume_job(..., own=name)`` on a database of its
own, imported from ``controller.json``) runs the job to its end, counts its own instance in the
guard and the ledger once, does not end it in its teardown, and ends it after recording the
job's end: nothing of the job is left running in EC2.
"""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path

import pytest

from kplan.app.controller_instance import start_on_instance
from kplan.catalogs.controllers import controller_offer
from kplan.launcher.bootstrap import status_key
from kplan.launcher.clock import SystemClock
from kplan.launcher.controller import read_controller
from kplan.launcher.controller_node import choose_site, controller_name
from kplan.launcher.controller_resume import resume_job
from kplan.launcher.jobspec import JobSpec, NodeSpec, ZoneOffer, new_job_id
from kplan.launcher.journal import Journal
from kplan.launcher.providers import Backend
from kplan.launcher.state import EventRecord, StateDB
from tests.aws_server import BUCKET, REGION, SECRET_KEY, MotoAws, fake_credentials, moto_backend

ZONE = "us-east-1a"
SPOT = 0.45


def _spec(tmp_path: Path) -> JobSpec:
    script = tmp_path / "job" / "train.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text("print('training')\n")
    return JobSpec.build(
        job_id=new_job_id(),
        cloud="aws",
        region=REGION,
        script=str(script),
        nodes=tuple(NodeSpec(r, "g5.xlarge", "spot", ZONE, 1, SPOT) for r in (0, 1)),
        budget_usd=20.0,
        check_interval_s=0.1,
        grace_s=1.0,
        teardown_s=10.0,
        finish_grace_s=5.0,
        provision_timeout_s=30.0,
        offers=(ZoneOffer("g5.xlarge", ZONE, "spot", SPOT),),
    )


def _finish_nodes(backend: Backend, moto: MotoAws, job_id: str) -> None:
    """The nodes' bootstrap ends: status file to S3, then poweroff (the controller runs on)."""
    for inst in backend.provider.query_instances(job_id):
        if inst.alive and inst.node_rank >= 0:
            doc = {"exit_code": 0, "time": 0.0, "node_rank": inst.node_rank, "instance": inst.name}
            backend.storage.put_bytes(status_key(job_id, inst.node_rank), json.dumps(doc).encode())
            moto.power_off(inst.id)


def test_the_controller_instance_is_created_runs_the_job_and_is_billed_once(
    moto: MotoAws, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake_credentials(monkeypatch)
    monkeypatch.setenv("KPLAN_AWS_SUBNET", "subnet-0abc")  # forwarded: a name, not a secret
    backend = moto_backend(moto)
    spec = _spec(tmp_path)
    job = spec.job_id
    site = choose_site(spec, None)
    assert site.where == "instance" and "spot" in site.reason
    assert site.offer == controller_offer("aws", REGION)
    assert site.offer is not None and site.offer.instance_type == "t3.small"
    assert "aws.amazon.com/ec2/pricing" in site.offer.source
    # the launcher's side: create it, bill it, write the job's state for it
    with StateDB.open(tmp_path / "laptop.db") as laptop:
        iid = start_on_instance(spec, backend, laptop, site)
        rows = laptop.ledger(job)
        assert [(r.instance, r.closed) for r in rows] == [(iid, False)]
        assert [(i.id, i.node_rank, i.price) for i in laptop.instances(job)] == [
            (iid, -1, site.offer.usd_per_hour)
        ]
    (raw,) = moto.raw_instances(job)
    assert raw["InstanceType"] == "t3.small"
    assert "InstanceLifecycle" not in raw  # on-demand
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags["kplan-job"] == job and tags["kplan-node"] == "-1"
    assert tags["kplan-managed"] == "true" and tags["Name"] == controller_name(job)
    ec2 = moto.client("ec2")
    attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")
    user_data = base64.b64decode(attr["UserData"]["Value"]).decode()
    behaviour = ec2.describe_instance_attribute(
        InstanceId=iid, Attribute="instanceInitiatedShutdownBehavior"
    )
    assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    assert f"controller {job} --cloud aws --region {REGION}" in user_data
    assert f"--storage s3://{BUCKET}/jobs --mode detached" in user_data
    assert "shutdown -h +" in user_data  # the cap's timer (the hard stop)
    assert "lease.json" in user_data and "poweroff" in user_data  # the lease watchdog
    assert "export KPLAN_AWS_SUBNET=subnet-0abc" in user_data
    assert f"export KPLAN_CONTROLLER_NAME={controller_name(job)}" in user_data
    assert SECRET_KEY not in user_data and "AWS_SECRET" not in user_data
    doc = read_controller(backend.storage, job)
    assert doc is not None and [r.id for r in doc.instances] == [iid]
    # the controller node's side: a database of its own, imported from controller.json
    done = threading.Event()

    def on_event(event: EventRecord) -> None:
        data = event.data or {}
        if event.kind == "launch" and data.get("name") == f"{job}-n1-r0":
            threading.Timer(1.0, lambda: done.is_set() or _finish_nodes(backend, moto, job)).start()

    with StateDB.open(tmp_path / "node.db") as node:
        out = resume_job(
            job,
            backend,
            node,
            clock=SystemClock(),
            on_event=on_event,
            journal=Journal(tmp_path / "node-journal.jsonl"),
            mode="detached",
            own=controller_name(job),
        )
        done.set()
        rows = node.ledger(job)
        own = [i for i in node.instances(job) if i.id == iid]
        events = [e.kind for e in node.events(job)]
    assert out.status == "succeeded", out.reason
    assert moto.leftovers(job)["instances"] == []  # the nodes, and the controller itself
    made = sorted(str(i["InstanceId"]) for i in moto.raw_instances(job))
    assert sorted(r.instance for r in rows) == made, "one ledger row per instance, none twice"
    assert len(made) == 3 and all(r.closed for r in rows)
    assert own[0].state == "terminated" and own[0].reason == "ended with its job"
    assert "stray" not in events
    ctl_row = next(r for r in rows if r.instance == iid)
    billed_h = ctl_row.billed_seconds / 3600
    assert ctl_row.usd == pytest.approx(billed_h * site.offer.usd_per_hour)
