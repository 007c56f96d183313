"""AWS failures moto cannot produce, injected with botocore's Stubber into a real boto3 client:
each reaches the caller as a kplan error with a hint, never as a botocore exception."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import boto3
import pytest
from botocore.stub import ANY, Stubber

from kplan.core.errors import CapacityError, CloudError, InputError, QuotaError
from kplan.launcher.clock import FakeClock
from kplan.launcher.provider import ClusterSpec, InstanceSpec
from kplan.launcher.providers.aws import AwsProvider, config_from_env
from kplan.launcher.providers.aws_common import AwsConfig
from kplan.launcher.providers.aws_shapes import client_token, run_request
from tests.aws_server import REGION, ZONE, fake_credentials

JOB = "kp-261122-120000-c0de"
GROUP = {"GroupId": "sg-0a1b2c3d4e5f60718", "GroupName": f"kplan-{JOB}"}


@dataclass
class Stubbed:
    provider: AwsProvider
    stub: Stubber
    clock: FakeClock


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stubbed]:
    fake_credentials(monkeypatch)
    client = boto3.client("ec2", region_name=REGION)  # the Stubber answers; nothing is sent
    clock = FakeClock()
    config = AwsConfig(
        region=REGION, image_id="ami-0abcdef1234567890", max_attempts=3, cleanup_timeout_s=30.0
    )
    provider = AwsProvider(config, client_factory=lambda service: client, clock=clock)
    with Stubber(client) as stub:
        yield Stubbed(provider, stub, clock)
        stub.assert_no_pending_responses()


def cluster(placement_group: bool = False) -> ClusterSpec:
    return ClusterSpec(job_id=JOB, cloud="aws", region=REGION, placement_group=placement_group)


def spec(rank: int, zone: str = ZONE, market: str = "spot") -> InstanceSpec:
    return InstanceSpec(
        job_id=JOB,
        name=f"{JOB}-n{rank}-r0",
        cloud="aws",
        region=REGION,
        zone=zone,
        instance_type="p4d.24xlarge",
        market=market,  # type: ignore[arg-type]
        node_rank=rank,
        user_data="#!/bin/bash\necho node\n",
    )


def launched(instance_id: str, rank: int, state: str = "pending") -> dict[str, Any]:
    return {
        "InstanceId": instance_id,
        "InstanceType": "p4d.24xlarge",
        "State": {"Name": state},
        "Placement": {"AvailabilityZone": ZONE},
        "InstanceLifecycle": "spot",
        "Tags": [{"Key": "kplan-job", "Value": JOB}, {"Key": "kplan-node", "Value": str(rank)}],
    }


def expect_group(stub: Stubber) -> None:
    stub.add_response("describe_security_groups", {"SecurityGroups": [GROUP]})


def fail(stub: Stubber, method: str, code: str, message: str = "", status: int = 400) -> None:
    stub.add_client_error(
        method, service_error_code=code, service_message=message, http_status_code=status
    )


def test_insufficient_capacity_is_a_capacity_error_the_launcher_can_act_on(aws: Stubbed) -> None:
    expect_group(aws.stub)
    fail(
        aws.stub,
        "run_instances",
        "InsufficientInstanceCapacity",
        "We currently do not have sufficient p4d.24xlarge capacity in us-east-1a.",
        500,
    )
    with pytest.raises(CapacityError, match="InsufficientInstanceCapacity: We currently") as err:
        aws.provider.run_instances(cluster(), [spec(0)])
    assert isinstance(err.value, CloudError)
    assert "another zone" in err.value.hint and "market" in err.value.hint


@pytest.mark.parametrize(
    ("code", "kind", "hint"),
    [
        ("VcpuLimitExceeded", QuotaError, "Service Quotas"),
        ("MaxSpotInstanceCountExceeded", QuotaError, "quota"),
        ("UnauthorizedOperation", CloudError, "credentials"),
        ("AuthFailure", CloudError, "credentials"),
        ("InvalidAMIID.NotFound", CloudError, "KPLAN_AWS_IMAGE"),
    ],
)
def test_quota_auth_and_image_errors_carry_their_hint(
    aws: Stubbed, code: str, kind: type[CloudError], hint: str
) -> None:
    expect_group(aws.stub)
    fail(aws.stub, "run_instances", code, "refused")
    with pytest.raises(kind, match=f"{code}: refused") as err:
        aws.provider.run_instances(cluster(), [spec(0)])
    assert not isinstance(err.value, CapacityError)
    assert hint in err.value.hint


def test_throttling_is_retried_with_backoff_then_succeeds(aws: Stubbed) -> None:
    expect_group(aws.stub)
    fail(aws.stub, "run_instances", "RequestLimitExceeded", "Request limit exceeded.", 503)
    fail(aws.stub, "run_instances", "RequestLimitExceeded", "Request limit exceeded.", 503)
    aws.stub.add_response("run_instances", {"Instances": [launched("i-0aaaaaaaaaaaaaaa1", 0)]})
    start = aws.clock.now()
    (node,) = aws.provider.run_instances(cluster(), [spec(0)])
    assert (node.id, node.state, node.market) == ("i-0aaaaaaaaaaaaaaa1", "pending", "spot")
    assert 0.0 <= aws.clock.now() - start <= 1.0 + 2.0  # jittered, at most base + 2 * base


def test_throttling_gives_up_after_max_attempts(aws: Stubbed) -> None:
    expect_group(aws.stub)
    for _ in range(3):
        fail(aws.stub, "run_instances", "RequestLimitExceeded", "Request limit exceeded.", 503)
    with pytest.raises(CloudError, match="RequestLimitExceeded") as err:
        aws.provider.run_instances(cluster(), [spec(0)])
    assert "throttling" in err.value.hint


def test_other_errors_are_not_retried(aws: Stubbed) -> None:
    expect_group(aws.stub)
    fail(aws.stub, "run_instances", "InvalidParameterValue", "bad value")
    with pytest.raises(CloudError, match="InvalidParameterValue: bad value"):
        aws.provider.run_instances(cluster(), [spec(0)])


def test_a_partly_failed_launch_terminates_what_it_started(aws: Stubbed) -> None:
    expect_group(aws.stub)
    aws.stub.add_response("run_instances", {"Instances": [launched("i-0aaaaaaaaaaaaaaa1", 0)]})
    fail(aws.stub, "run_instances", "InsufficientInstanceCapacity", "no capacity", 500)
    aws.stub.add_response(
        "describe_instances",
        {"Reservations": [{"Instances": [launched("i-0aaaaaaaaaaaaaaa1", 0, "running")]}]},
        {
            "Filters": [{"Name": "instance-id", "Values": ["i-0aaaaaaaaaaaaaaa1"]}],
            "MaxResults": ANY,
        },
    )
    aws.stub.add_response("terminate_instances", {}, {"InstanceIds": ["i-0aaaaaaaaaaaaaaa1"]})
    with pytest.raises(CapacityError, match="no capacity"):
        aws.provider.run_instances(cluster(), [spec(0), spec(1)])


def test_a_failed_rollback_names_the_instances_and_kplan_down(aws: Stubbed) -> None:
    expect_group(aws.stub)
    aws.stub.add_response("run_instances", {"Instances": [launched("i-0aaaaaaaaaaaaaaa1", 0)]})
    fail(aws.stub, "run_instances", "InsufficientInstanceCapacity", "no capacity", 500)
    aws.stub.add_response(
        "describe_instances",
        {"Reservations": [{"Instances": [launched("i-0aaaaaaaaaaaaaaa1", 0, "running")]}]},
    )
    fail(aws.stub, "terminate_instances", "UnauthorizedOperation", "not allowed", 403)
    with pytest.raises(CloudError, match="i-0aaaaaaaaaaaaaaa1") as err:
        aws.provider.run_instances(cluster(), [spec(0), spec(1)])
    assert "no capacity" in err.value.message
    assert f"kplan down {JOB}" in err.value.hint


def test_a_failed_terminate_names_the_instances_and_kplan_down(aws: Stubbed) -> None:
    aws.stub.add_response(
        "describe_instances",
        {"Reservations": [{"Instances": [launched("i-0aaaaaaaaaaaaaaa1", 0, "running")]}]},
    )
    fail(aws.stub, "terminate_instances", "UnauthorizedOperation", "not allowed", 403)
    with pytest.raises(CloudError, match="could not terminate instances i-0aaaaaaaaaaaaaaa1") as e:
        aws.provider.terminate_instances(["i-0aaaaaaaaaaaaaaa1"])
    assert f"kplan down {JOB}" in e.value.hint and "credentials" in e.value.hint


def test_multi_node_prepare_and_cleanup_manage_a_cluster_placement_group(aws: Stubbed) -> None:
    tags = ANY
    aws.stub.add_response("describe_security_groups", {"SecurityGroups": []})
    aws.stub.add_response("create_security_group", {"GroupId": GROUP["GroupId"]})
    aws.stub.add_response("authorize_security_group_ingress", {"Return": True})
    aws.stub.add_response("authorize_security_group_ingress", {"Return": True})
    aws.stub.add_response(
        "create_placement_group",
        {"PlacementGroup": {"GroupName": f"kplan-{JOB}", "Strategy": "cluster"}},
        {"GroupName": f"kplan-{JOB}", "Strategy": "cluster", "TagSpecifications": tags},
    )
    aws.provider.prepare(cluster(placement_group=True))

    # cleanup: the instances are gone; the group and the placement group are still held a while
    aws.stub.add_response(
        "describe_instances",
        {"Reservations": [{"Instances": [launched("i-0aaaaaaaaaaaaaaa1", 0, "terminated")]}]},
    )
    aws.stub.add_response("describe_security_groups", {"SecurityGroups": [GROUP]})
    fail(aws.stub, "delete_security_group", "DependencyViolation", "has a dependent object")
    aws.stub.add_response("delete_security_group", {}, {"GroupId": GROUP["GroupId"]})
    fail(aws.stub, "delete_placement_group", "InvalidPlacementGroup.InUse", "in use")
    aws.stub.add_response("delete_placement_group", {}, {"GroupName": f"kplan-{JOB}"})
    start = aws.clock.now()
    aws.provider.cleanup(cluster(placement_group=True))
    assert aws.clock.now() - start == pytest.approx(2 * aws.provider.config.poll_s)


def test_cleanup_that_cannot_delete_the_group_names_it_and_kplan_down(aws: Stubbed) -> None:
    aws.stub.add_response("describe_instances", {"Reservations": []})
    aws.stub.add_response("describe_security_groups", {"SecurityGroups": [GROUP]})
    polls = int(aws.provider.config.cleanup_timeout_s / aws.provider.config.poll_s) + 1
    for _ in range(polls):
        fail(aws.stub, "delete_security_group", "DependencyViolation", "has a dependent object")
    with pytest.raises(
        CloudError, match=f"could not delete security group {GROUP['GroupId']}"
    ) as e:
        aws.provider.cleanup(cluster())
    assert f"kplan down {JOB}" in e.value.hint


def test_placement_group_goes_into_the_request_and_tokens_follow_the_placement() -> None:
    config = AwsConfig(region=REGION, instance_profile="kplan-node", subnet_id=None)
    request = run_request(config, cluster(True), spec(0), f"kplan-{JOB}")
    assert request["Placement"] == {"AvailabilityZone": ZONE, "GroupName": f"kplan-{JOB}"}
    assert request["IamInstanceProfile"] == {"Name": "kplan-node"}
    assert request["ImageId"].startswith("resolve:ssm:/aws/service/deeplearning/")
    kinds = [t["ResourceType"] for t in request["TagSpecifications"]]
    assert kinds == ["instance", "volume", "network-interface", "spot-instances-request"]
    assert "InstanceMarketOptions" not in run_request(
        config, cluster(), spec(0, market="on-demand"), None
    )
    token = client_token(spec(0))
    assert token == client_token(spec(0)) and len(token) <= 64
    assert token != client_token(spec(0, zone="us-east-1b"))
    assert token != client_token(spec(0, market="on-demand"))


def test_sdk_failures_without_an_error_code_are_translated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_credentials(monkeypatch)
    closed = AwsConfig(region=REGION, endpoint_url="http://127.0.0.1:9", max_attempts=1)
    with pytest.raises(CloudError, match="EndpointConnectionError") as err:
        AwsProvider(closed).query_instances(JOB)
    assert "network" in err.value.hint
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    with pytest.raises(CloudError, match="NoCredentialsError") as err:
        AwsProvider(closed).query_instances(JOB)
    assert "credentials" in err.value.hint


def test_config_is_validated_and_read_from_the_environment() -> None:
    with pytest.raises(InputError, match="region 'us-east' is not a region name"):
        AwsConfig(region="us-east")
    with pytest.raises(InputError, match="endpoint_url 'localhost:5000'"):
        AwsConfig(region=REGION, endpoint_url="localhost:5000")
    env = {
        "AWS_DEFAULT_REGION": "eu-west-2",
        "KPLAN_AWS_INSTANCE_PROFILE": "kplan-node",
        "KPLAN_AWS_PLACEMENT_GROUPS": "0",
        "KPLAN_AWS_IMAGE": "ami-0123456789abcdef0",
    }
    config = config_from_env(None, env)
    assert (config.region, config.instance_profile, config.placement_groups) == (
        "eu-west-2",
        "kplan-node",
        False,
    )
    assert config.image_id == "ami-0123456789abcdef0"
    assert config_from_env("us-west-2", env).region == "us-west-2"
    with pytest.raises(InputError, match="no AWS region"):
        config_from_env(None, {})


def test_extra_tags_may_repeat_kplans_tags_but_not_change_them() -> None:
    config = AwsConfig(region=REGION)
    same = replace(spec(0), tags={"kplan-job": JOB, "kplan-node": "0", "owner": "ml"})
    tags = run_request(config, cluster(), same, None)["TagSpecifications"][0]["Tags"]
    assert {"Key": "owner", "Value": "ml"} in tags and {"Key": "kplan-node", "Value": "0"} in tags
    with pytest.raises(InputError, match=r"kplan-node='3' .* contradicts kplan's kplan-node='0'"):
        run_request(config, cluster(), replace(spec(0), tags={"kplan-node": "3"}), None)
    with pytest.raises(InputError, match="AWS reserves aws"):
        run_request(config, cluster(), replace(spec(0), tags={"aws:cost": "x"}), None)
