"""The hard stop's fields in every create request, with the real clients: boto3 against moto,
``google.cloud.compute_v1`` against the local Compute server (tests/gcp_server.py).

- AWS: ``InstanceInitiatedShutdownBehavior=terminate`` on every instance, and the user data
  arms ``shutdown -h +N`` with N the cap's minutes, then starts the lease watchdog;
- GCP: ``scheduling.maxRunDuration`` of the cap's seconds with ``instanceTerminationAction``
  ``DELETE``, spot and on demand; a VM that reaches it is gone; a job run through the launcher
  sends the cap it computed from the budget with every insert and renews its lease in the bucket.
"""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path

import pytest

from kplan.core.errors import KplanError
from kplan.launcher.bootstrap import instance_spec, rendezvous
from kplan.launcher.clock import FakeClock
from kplan.launcher.hardstop import LEASE_KEY, cap_seconds
from kplan.launcher.jobspec import JobSpec, NodeSpec
from kplan.launcher.lifecycle import run_job
from kplan.launcher.providers import Backend
from kplan.launcher.providers.gcp import GcpProvider
from kplan.launcher.state import EventRecord, StateDB
from tests.gcp_server import FakeCompute
from tests.gcs_server import FakeGCS
from tests.test_provider_aws import World, moto, w  # noqa: F401 - the moto fixtures
from tests.test_provider_gcp import JOB, cluster, fake, gcp, spec, url  # noqa: F401
from tests.test_provider_gcp_e2e import BUCKET, backend, finish_node, job_spec, servers  # noqa: F401

CAP_S = 5430  # 90.5 minutes: 90 whole minutes for shutdown


def _aws_job(tmp_path: Path, job: str) -> JobSpec:
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    nodes = (
        NodeSpec(0, "g5.xlarge", "spot", "us-east-1a", 1, 1.0),
        NodeSpec(1, "g5.xlarge", "on-demand", "us-east-1a", 1, 1.0),
    )
    return JobSpec.build(job, "aws", "us-east-1", str(script), nodes, 10.0, lease_s=900.0)


def test_every_aws_instance_terminates_on_power_off_and_arms_its_cap(
    w: World,  # noqa: F811
    tmp_path: Path,
) -> None:
    job = _aws_job(tmp_path, w.job)
    specs = [
        instance_spec(job, n, f"{w.job}-n{n.node_rank}-r0", rendezvous(job, 0, None), "s3://b/k")
        for n in job.nodes
    ]
    specs = [replace(s, max_run_s=CAP_S, user_data=_with_cap(job, s.node_rank)) for s in specs]
    w.provider.prepare(w.cluster())
    created = w.provider.run_instances(w.cluster(), specs)
    ec2 = w.moto.client("ec2")
    assert {i.market for i in created} == {"spot", "on-demand"}
    for inst in created:
        behaviour = ec2.describe_instance_attribute(
            InstanceId=inst.id, Attribute="instanceInitiatedShutdownBehavior"
        )
        assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        attr = ec2.describe_instance_attribute(InstanceId=inst.id, Attribute="userData")
        text = base64.b64decode(attr["UserData"]["Value"]).decode()
        assert 'shutdown -h +90 "kplan hard stop"' in text
        assert "( sleep 5400; poweroff )" in text  # where shutdown is missing
        assert f'aws s3 cp --only-show-errors "$STORE/{LEASE_KEY}" -' in text
        assert "-ge 900 ]" in text and "poweroff" in text  # the lease watchdog
        # the timer and the watchdog come before anything that may hang (the install)
        assert text.index("shutdown -h") < text.index("pip install")
        assert text.index(LEASE_KEY) < text.index("pip install")


def _with_cap(job: JobSpec, rank: int) -> str:
    from kplan.launcher.bootstrap import cloud_user_data

    node = job.nodes[rank]
    name = f"{job.job_id}-n{rank}-r0"
    return cloud_user_data(job, node, name, rendezvous(job, 0, None), "s3://b/k", max_run_s=CAP_S)


@pytest.mark.parametrize(
    ("market", "scheduling"),
    [
        (
            "spot",
            {
                "provisioningModel": "SPOT",
                "instanceTerminationAction": "DELETE",
                "onHostMaintenance": "TERMINATE",
                "automaticRestart": False,
                "maxRunDuration": {"seconds": str(CAP_S)},
            },
        ),
        (
            "on-demand",
            {
                "provisioningModel": "STANDARD",
                "instanceTerminationAction": "DELETE",
                "onHostMaintenance": "TERMINATE",
                "automaticRestart": True,
                "maxRunDuration": {"seconds": str(CAP_S)},
            },
        ),
    ],
)
def test_every_gcp_insert_carries_its_cap_and_delete(
    gcp: GcpProvider,  # noqa: F811
    fake: FakeCompute,  # noqa: F811
    market: str,
    scheduling: dict[str, object],
) -> None:
    gcp.run_instances(cluster(), [replace(spec(0, market=market), max_run_s=CAP_S)])
    (body,) = fake.bodies("POST", "/instances")
    assert body["scheduling"] == scheduling
    name = f"{JOB}-n0-r0"
    assert [i.alive for i in gcp.query_instances(JOB)] == [True]
    fake.run_out(name)  # GCP ends it at maxRunDuration: deleted
    assert fake.find(name) is None
    assert [i for i in gcp.query_instances(JOB) if i.alive] == []


def test_the_compute_server_refuses_a_cap_gcp_refuses(
    gcp: GcpProvider,  # noqa: F811
    fake: FakeCompute,  # noqa: F811
) -> None:
    with pytest.raises(KplanError, match="maxRunDuration"):
        gcp.run_instances(cluster(), [replace(spec(0), max_run_s=10)])


def test_a_gcp_job_sends_its_budget_caps_and_renews_its_lease(
    servers: tuple[FakeCompute, FakeGCS, str, str],  # noqa: F811
    backend: Backend,  # noqa: F811
    tmp_path: Path,
) -> None:
    compute, gcs, _, _ = servers
    job = job_spec(tmp_path, lease_s=600.0)  # $5 at 0.32 $/h: 15.6 h
    clock = FakeClock()
    started = clock.now()

    def drive(event: EventRecord) -> None:
        if event.kind == "head":
            clock.sleep(3600.0)  # an hour between the head and the other node
        if event.kind == "launch" and event.data and str(event.data["name"]).endswith("-n1-r0"):
            finish_node(compute, backend, job.job_id, f"{job.job_id}-n0-r0")
            finish_node(compute, backend, job.job_id, f"{job.job_id}-n1-r0")

    with StateDB.open(tmp_path / "kplan.db") as db:
        outcome = run_job(job, backend, db, clock=clock, on_event=drive)
    assert outcome.status == "succeeded"
    first, second = compute.bodies("POST", "/instances")
    want_first = cap_seconds(job, 0.0, [], [0.16, 0.16], started, None)
    assert want_first == int(5.0 / 0.32 * 3600)
    for body in (first, second):
        assert body["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert first["scheduling"]["maxRunDuration"] == {"seconds": str(want_first)}
    # the second node, an hour later (and the head's few seconds of boot): what is left after
    # the head's hour, at the cluster's rate
    later = int(second["scheduling"]["maxRunDuration"]["seconds"])
    assert later == pytest.approx((5.0 - 0.16) / 0.32 * 3600, abs=10.0)
    lease = json.loads(gcs.objects[(BUCKET, f"jobs/{job.job_id}/{LEASE_KEY}")])
    assert lease["job"] == job.job_id and lease["lease_s"] == 600.0
    assert lease["expires_at"] == lease["renewed_at"] + 600.0 and lease["renewed_at"] > started
