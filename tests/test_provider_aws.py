"""The aws provider's verbs with the real boto3 client against a moto server in this process."""

from __future__ import annotations

import base64
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from kplan.core.errors import CloudError, InputError
from kplan.launcher.provider import TAG_JOB, TAG_MANAGED, TAG_NODE, ClusterSpec, InstanceSpec
from kplan.launcher.providers.aws import AwsProvider
from kplan.launcher.providers.aws_common import AwsConfig
from tests.aws_server import (
    ACCESS_KEY,
    PROFILE,
    REGION,
    SECRET_KEY,
    SESSION_TOKEN,
    ZONE,
    MotoAws,
    fake_credentials,
)

USER_DATA = "#!/bin/bash\nset -eu\necho 'kplan node bootstrap'\npoweroff\n"
_jobs = itertools.count(1)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoAws]:
    # One server and no reset between tests (moto rebuilds EC2's defaults slowly): each test
    # has its own job id, and everything is found by the job's tag.
    server = MotoAws()
    with pytest.MonkeyPatch.context() as env:
        fake_credentials(env)
        server.instance_profile()
    yield server
    server.stop()


@dataclass
class World:
    moto: MotoAws
    provider: AwsProvider
    job: str

    def cluster(self, ssh_cidr: str | None = None, region: str = REGION) -> ClusterSpec:
        return ClusterSpec(job_id=self.job, cloud="aws", region=region, ssh_cidr=ssh_cidr)

    def spec(self, rank: int, market: str = "spot", user_data: str = USER_DATA) -> InstanceSpec:
        return InstanceSpec(
            job_id=self.job,
            name=f"{self.job}-n{rank}-r0",
            cloud="aws",
            region=REGION,
            zone=ZONE,
            instance_type="g5.xlarge",
            market=market,  # type: ignore[arg-type]
            node_rank=rank,
            user_data=user_data,
            env={"KPLAN_w.job_ID": self.job},
            tags={"team": "research"},
        )

    def group(self) -> dict[str, Any]:
        groups = self.moto.client("ec2").describe_security_groups(
            Filters=[{"Name": f"tag:{TAG_JOB}", "Values": [self.job]}]
        )["SecurityGroups"]
        assert len(groups) == 1
        return dict(groups[0])


@pytest.fixture
def w(moto: MotoAws, monkeypatch: pytest.MonkeyPatch) -> World:
    fake_credentials(monkeypatch)
    config = AwsConfig(
        region=REGION,
        endpoint_url=moto.url,
        instance_profile=PROFILE,
        image_id="ami-12c6146b",
        backoff_s=0.0,
        poll_s=0.05,
        cleanup_timeout_s=2.0,
    )
    return World(moto, AwsProvider(config), f"kp-261122-101500-{next(_jobs):04x}")


def open_to_world(group: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        rule
        for rule in group["IpPermissions"]
        if any(r.get("CidrIp") == "0.0.0.0/0" for r in rule.get("IpRanges", []))
        or any(r.get("CidrIpv6") == "::/0" for r in rule.get("Ipv6Ranges", []))
    ]


def test_prepare_opens_the_port_range_only_to_the_group_itself(w: World) -> None:
    w.provider.prepare(w.cluster())
    w.provider.prepare(w.cluster())  # idempotent: same group, no duplicate-rule error
    group = w.group()
    tags = {t["Key"]: t["Value"] for t in group["Tags"]}
    assert tags[TAG_JOB] == w.job and tags[TAG_MANAGED] == "true"
    assert open_to_world(group) == []
    ports = {(r["IpProtocol"], r["FromPort"], r["ToPort"]) for r in group["IpPermissions"]}
    assert ports == {("tcp", 29400, 29600), ("udp", 29400, 29600)}
    for rule in group["IpPermissions"]:
        assert [p["GroupId"] for p in rule["UserIdGroupPairs"]] == [group["GroupId"]]
        assert rule["IpRanges"] == []


def test_ssh_is_opened_only_when_asked_and_only_from_that_cidr(w: World) -> None:
    w.provider.prepare(w.cluster(ssh_cidr="203.0.113.7/32"))
    group = w.group()
    ssh = [r for r in group["IpPermissions"] if r["FromPort"] == 22]
    assert len(ssh) == 1
    assert [r["CidrIp"] for r in ssh[0]["IpRanges"]] == ["203.0.113.7/32"]
    assert open_to_world(group) == []


def test_a_bad_ssh_cidr_fails_before_anything_is_created(w: World) -> None:
    with pytest.raises(InputError, match="ssh_cidr 'my laptop'"):
        w.provider.prepare(w.cluster(ssh_cidr="my laptop"))
    assert w.moto.leftovers(w.job)["security_groups"] == []


def test_run_instances_launches_tagged_spot_and_on_demand_nodes(w: World) -> None:
    w.provider.prepare(w.cluster())
    created = w.provider.run_instances(w.cluster(), [w.spec(0, "spot"), w.spec(1, "on-demand")])
    assert [(i.node_rank, i.market, i.job_id) for i in created] == [
        (0, "spot", w.job),
        (1, "on-demand", w.job),
    ]
    assert all(i.state in ("pending", "running") and i.zone == ZONE for i in created)

    raw = {i["InstanceId"]: i for i in w.moto.raw_instances(w.job)}
    spot, on_demand = raw[created[0].id], raw[created[1].id]
    assert spot["InstanceLifecycle"] == "spot"
    assert "InstanceLifecycle" not in on_demand
    tags = {t["Key"]: t["Value"] for t in spot["Tags"]}
    assert tags == {
        TAG_JOB: w.job,
        TAG_NODE: "0",
        TAG_MANAGED: "true",
        "Name": f"{w.job}-n0-r0",
        "team": "research",
    }
    assert [g["GroupId"] for g in spot["SecurityGroups"]] == [w.group()["GroupId"]]
    assert PROFILE in spot["IamInstanceProfile"]["Arn"]

    ec2 = w.moto.client("ec2")
    for instance_id in raw:
        user_data = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        assert base64.b64decode(user_data["UserData"]["Value"]).decode() == USER_DATA
        behaviour = ec2.describe_instance_attribute(
            InstanceId=instance_id, Attribute="instanceInitiatedShutdownBehavior"
        )
        assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    volumes = ec2.describe_volumes(Filters=[{"Name": f"tag:{TAG_JOB}", "Values": [w.job]}])
    assert {v["Attachments"][0]["InstanceId"] for v in volumes["Volumes"]} == set(raw)


def test_no_credential_reaches_user_data_or_tags(w: World) -> None:
    w.provider.prepare(w.cluster())
    w.provider.run_instances(w.cluster(), [w.spec(0), w.spec(1)])
    ec2 = w.moto.client("ec2")
    for raw in w.moto.raw_instances(w.job):
        attr = ec2.describe_instance_attribute(InstanceId=raw["InstanceId"], Attribute="userData")
        seen = base64.b64decode(attr["UserData"]["Value"]).decode()
        seen += " ".join(f"{t['Key']}={t['Value']}" for t in raw["Tags"])
        for secret in (ACCESS_KEY, SECRET_KEY, SESSION_TOKEN):
            assert secret not in seen


@pytest.mark.parametrize(
    "leak",
    [
        f"export AWS_SECRET_ACCESS_KEY={SECRET_KEY}",
        f"aws configure set aws_session_token {SESSION_TOKEN}",
        "export KEY=AKIAIOSFODNN7EXAMPLE",
        "AWS_SECRET_ACCESS_KEY=x",
    ],
)
def test_user_data_with_credentials_is_refused_before_any_launch(w: World, leak: str) -> None:
    w.provider.prepare(w.cluster())
    with pytest.raises(InputError, match="refusing to send AWS credentials"):
        w.provider.run_instances(
            w.cluster(), [w.spec(0), w.spec(1, user_data=f"{USER_DATA}{leak}\n")]
        )
    assert w.moto.raw_instances(w.job) == []


def test_a_spot_interruption_is_reported_preempted(w: World) -> None:
    w.provider.prepare(w.cluster())
    head, worker = w.provider.run_instances(w.cluster(), [w.spec(0), w.spec(1)])
    w.moto.interrupt_spot(worker.id)
    states = {i.id: i for i in w.provider.query_instances(w.job)}
    assert states[worker.id].state == "preempted"
    assert states[worker.id].reason == "spot interruption"
    assert states[head.id].state == "running"
    assert states[head.id].private_ip


def test_an_instance_terminated_by_kplan_is_terminated_not_preempted(
    w: World,
) -> None:
    w.provider.prepare(w.cluster())
    (node,) = w.provider.run_instances(w.cluster(), [w.spec(0)])
    w.provider.terminate_instances([node.id])
    (seen,) = w.provider.query_instances(w.job)
    assert (seen.state, seen.reason) == (
        "terminated",
        "Client.UserInitiatedShutdown: User initiated shutdown",
    )


def test_wait_instances_returns_running_and_lost_nodes(w: World) -> None:
    w.provider.prepare(w.cluster())
    head, worker = w.provider.run_instances(w.cluster(), [w.spec(0), w.spec(1)])
    w.moto.interrupt_spot(worker.id)
    seen = w.provider.wait_instances([head.id, worker.id], timeout_s=2.0)
    assert [(i.id, i.state) for i in seen] == [(head.id, "running"), (worker.id, "preempted")]
    with pytest.raises(CloudError, match="i-0123456789abcdef0 not found"):
        w.provider.wait_instances([head.id, "i-0123456789abcdef0"], timeout_s=0.1)


def test_terminate_is_idempotent_and_teardown_leaves_nothing_tagged(w: World) -> None:
    w.provider.prepare(w.cluster(ssh_cidr="198.51.100.0/24"))
    nodes = w.provider.run_instances(w.cluster(), [w.spec(0), w.spec(1, "on-demand")])
    w.moto.interrupt_spot(nodes[0].id)
    ids = [n.id for n in nodes]
    w.provider.terminate_instances(ids)
    w.provider.terminate_instances([*ids, "i-0123456789abcdef0"])  # again, plus an unknown id
    w.provider.terminate_instances([])
    assert {i.state for i in w.provider.query_instances(w.job)} == {"terminated", "preempted"}
    w.provider.cleanup(w.cluster())
    w.provider.cleanup(w.cluster())  # nothing left to delete is not an error
    assert w.moto.leftovers(w.job) == {"instances": [], "security_groups": [], "volumes": []}


def test_cleanup_keeps_the_group_while_an_instance_runs_and_says_how_to_finish(w: World) -> None:
    w.provider.prepare(w.cluster())
    (node,) = w.provider.run_instances(w.cluster(), [w.spec(0)])
    with pytest.raises(CloudError, match=f"still has instances {node.id}") as err:
        w.provider.cleanup(w.cluster())
    assert f"kplan down {w.job}" in err.value.hint
    assert len(w.moto.leftovers(w.job)["security_groups"]) == 1


def test_run_instances_needs_prepare_and_the_providers_region(w: World) -> None:
    with pytest.raises(CloudError, match="has no security group") as err:
        w.provider.run_instances(w.cluster(), [w.spec(0)])
    assert "prepare" in err.value.hint
    other = ClusterSpec(job_id=w.job, cloud="aws", region="eu-west-1")
    with pytest.raises(InputError, match="region 'eu-west-1'"):
        w.provider.prepare(other)


def test_query_finds_the_job_by_tag_from_a_fresh_provider(w: World) -> None:
    w.provider.prepare(w.cluster())
    created = w.provider.run_instances(w.cluster(), [w.spec(1), w.spec(0)])
    fresh = AwsProvider(w.provider.config)  # e.g. `kplan down` in another process
    seen = fresh.query_instances(w.job)
    assert [i.node_rank for i in seen] == [0, 1]
    assert {i.id for i in seen} == {i.id for i in created}
    assert fresh.query_instances("kp-000000-000000-0000") == []
