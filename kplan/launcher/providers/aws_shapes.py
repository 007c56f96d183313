"""kplan's dataclasses as EC2 request shapes, and EC2's answers as kplan's ``Instance``.

Pure functions (no client, no network), so the requests the provider sends can be read and tested
on their own.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

from kplan.core.errors import InputError
from kplan.launcher.provider import (
    TAG_JOB,
    TAG_MANAGED,
    TAG_NODE,
    ClusterSpec,
    Instance,
    InstanceSpec,
    InstanceState,
)
from kplan.launcher.providers.aws_common import AwsConfig

# StateReason codes of an interruption by EC2 (terminate, or stop for persistent requests).
SPOT_INTERRUPTION_CODES = frozenset(
    {"Server.SpotInstanceTermination", "Server.SpotInstanceShutdown"}
)
EC2_STATES: dict[str, InstanceState] = {
    "pending": "pending",
    "running": "running",
    "stopping": "stopping",
    "shutting-down": "stopping",
    "stopped": "terminated",  # the shutdown behaviour is terminate: a stopped node is gone
    "terminated": "terminated",
}
MAX_USER_DATA = 16 * 1024  # EC2's limit on user data before base64
RESERVED_TAGS = frozenset({TAG_JOB, TAG_NODE, TAG_MANAGED, "Name"})
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def group_name(job_id: str) -> str:
    """The name of the job's security group and placement group."""
    return f"kplan-{job_id}"


# The EC2 request shapes kplan builds (the boto3 keyword arguments, as the API names them).
class Tag(TypedDict):
    Key: str
    Value: str


class TagSpec(TypedDict):
    ResourceType: str
    Tags: list[Tag]


class GroupPair(TypedDict):
    GroupId: str
    Description: str


class IpRange(TypedDict):
    CidrIp: str
    Description: str


class Ipv6Range(TypedDict):
    CidrIpv6: str
    Description: str


class IngressRule(TypedDict):
    """One IpPermissions entry of AuthorizeSecurityGroupIngress."""

    IpProtocol: str
    FromPort: int
    ToPort: int
    UserIdGroupPairs: NotRequired[list[GroupPair]]
    IpRanges: NotRequired[list[IpRange]]
    Ipv6Ranges: NotRequired[list[Ipv6Range]]


class SpotOptions(TypedDict):
    SpotInstanceType: str
    InstanceInterruptionBehavior: str


class MarketOptions(TypedDict):
    MarketType: str
    SpotOptions: SpotOptions


class Ec2Placement(TypedDict, total=False):
    AvailabilityZone: str
    GroupName: str


class RunInstancesRequest(TypedDict):
    """RunInstances' arguments for one node (the provider adds SecurityGroupIds)."""

    ImageId: str
    InstanceType: str
    MinCount: int
    MaxCount: int
    UserData: str
    InstanceInitiatedShutdownBehavior: str
    MetadataOptions: dict[str, str]
    TagSpecifications: list[TagSpec]
    ClientToken: str
    InstanceMarketOptions: NotRequired[MarketOptions]
    Placement: NotRequired[Ec2Placement]
    SubnetId: NotRequired[str]
    IamInstanceProfile: NotRequired[dict[str, str]]
    KeyName: NotRequired[str]
    SecurityGroupIds: NotRequired[list[str]]


class Filter(TypedDict):
    Name: str
    Values: list[str]


class DescribeRequest(TypedDict):
    Filters: list[Filter]
    MaxResults: int
    NextToken: NotRequired[str]


class CreateGroupRequest(TypedDict):
    GroupName: str
    Description: str
    TagSpecifications: list[TagSpec]
    VpcId: NotRequired[str]


def tag_list(tags: Mapping[str, str]) -> list[Tag]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def job_tag_spec(kind: str, job_id: str) -> TagSpec:
    """TagSpecifications entry for a job-wide resource (security group, placement group, rule)."""
    tags = {TAG_JOB: job_id, TAG_MANAGED: "true", "Name": group_name(job_id)}
    return {"ResourceType": kind, "Tags": tag_list(tags)}


def tags_of(raw: Mapping[str, Any]) -> dict[str, str]:
    return {str(t["Key"]): str(t["Value"]) for t in raw.get("Tags", []) or []}


def ssh_network(cidr: str | None) -> IpNetwork | None:
    if cidr is None:
        return None
    try:
        return ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise InputError(
            f"ssh_cidr {cidr!r} is not a CIDR block",
            hint="give your address as a /32, e.g. 203.0.113.7/32",
        ) from None


def ingress_rules(cluster: ClusterSpec, group_id: str) -> list[IngressRule]:
    """The job's port range (TCP and UDP) from the group itself; SSH only from ``ssh_cidr``."""
    low, high = cluster.ports
    if not 0 < low <= high < 65536:
        raise InputError(
            f"port range {cluster.ports} of job {cluster.job_id!r} is not valid",
            hint="give two ports LOW <= HIGH in 1..65535",
        )
    rules: list[IngressRule] = [
        {
            "IpProtocol": proto,
            "FromPort": low,
            "ToPort": high,
            "UserIdGroupPairs": [{"GroupId": group_id, "Description": "kplan nodes"}],
        }
        for proto in ("tcp", "udp")
    ]
    ssh = ssh_network(cluster.ssh_cidr)
    if ssh is not None:
        rule: IngressRule = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22}
        if ssh.version == 4:
            rule["IpRanges"] = [{"CidrIp": str(ssh), "Description": "ssh"}]
        else:
            rule["Ipv6Ranges"] = [{"CidrIpv6": str(ssh), "Description": "ssh"}]
        rules.append(rule)
    return rules


def instance_tags(spec: InstanceSpec) -> dict[str, str]:
    """The spec's tags plus kplan's own; an extra tag may repeat kplan's value, not change it."""
    tags = {
        TAG_JOB: spec.job_id,
        TAG_NODE: str(spec.node_rank),
        TAG_MANAGED: "true",
        "Name": spec.name,
    }
    for key, value in spec.tags.items():
        if key.lower().startswith("aws:"):
            raise InputError(
                f"tag {key!r} of instance {spec.name!r}: AWS reserves aws:*",
                hint="rename the tag without the aws: prefix",
            )
        if key in RESERVED_TAGS and value != tags[key]:
            raise InputError(
                f"tag {key}={value!r} of instance {spec.name!r} contradicts kplan's "
                f"{key}={tags[key]!r}",
                hint=f"kplan sets {', '.join(sorted(RESERVED_TAGS))} itself",
            )
    tags = {**dict(spec.tags), **tags}
    if len(tags) > 50:
        raise InputError(
            f"instance {spec.name!r} has {len(tags)} tags; EC2 allows 50",
            hint="drop some of the job's own tags (kplan adds a few of its own)",
        )
    for key, value in tags.items():
        if len(key) > 128 or len(value) > 256:
            raise InputError(
                f"tag {key!r}={value[:40]!r}... is too long for EC2 (128/256)",
                hint="keep tag keys to 128 characters and values to 256",
            )
    return tags


def client_token(spec: InstanceSpec) -> str:
    """Idempotency token: a retried request returns the first launch instead of a second one.

    It covers the request's placement and market too: EC2 refuses a token reused with other
    parameters, and the launcher retries a rank's launch in another zone or market.
    """
    what = "|".join((spec.name, spec.zone, spec.market, spec.instance_type, spec.image or ""))
    digest = hashlib.sha256(what.encode()).hexdigest()[:16]
    return f"{spec.name[:47]}-{digest}"


def run_request(
    config: AwsConfig, cluster: ClusterSpec, spec: InstanceSpec, placement_group: str | None
) -> RunInstancesRequest:
    """The run_instances arguments for one spec (the caller adds SecurityGroupIds)."""
    if spec.job_id != cluster.job_id or spec.cloud != "aws":
        raise InputError(
            f"instance {spec.name!r} is for job {spec.job_id!r} on {spec.cloud!r}, "
            f"not job {cluster.job_id!r} on 'aws'",
            hint="launch each job's instances with that job's cluster, on its own cloud",
        )
    if spec.region != config.region:
        raise InputError(
            f"instance {spec.name!r} asks for region {spec.region!r}; this AWS provider "
            f"runs in {config.region!r}",
            hint="create the provider with the plan's region",
        )
    size = len(spec.user_data.encode())
    if size > MAX_USER_DATA:
        raise InputError(
            f"user data of {spec.name!r} is {size} bytes; EC2 allows {MAX_USER_DATA}",
            hint="keep the bootstrap short: fetch the rest from storage",
        )
    tags = tag_list(instance_tags(spec))
    request: RunInstancesRequest = {
        "ImageId": spec.image or config.image_id,
        "InstanceType": spec.instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "UserData": spec.user_data,
        "InstanceInitiatedShutdownBehavior": "terminate",  # a powered-off node stops billing
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},  # IMDSv2
        "TagSpecifications": [
            {"ResourceType": kind, "Tags": tags}
            for kind in ("instance", "volume", "network-interface")
        ],
        "ClientToken": client_token(spec),
    }
    if spec.market == "spot":
        request["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {
                "SpotInstanceType": "one-time",
                "InstanceInterruptionBehavior": "terminate",
            },
        }
        request["TagSpecifications"].append(
            {"ResourceType": "spot-instances-request", "Tags": tags}
        )
    placement: Ec2Placement = {}
    if spec.zone and config.subnet_id is None:  # a subnet fixes the zone itself
        placement["AvailabilityZone"] = spec.zone
    if placement_group is not None:
        placement["GroupName"] = placement_group
    if placement:
        request["Placement"] = placement
    if config.subnet_id is not None:
        request["SubnetId"] = config.subnet_id
    if config.instance_profile is not None:
        request["IamInstanceProfile"] = {"Name": config.instance_profile}
    if config.key_name is not None:
        request["KeyName"] = config.key_name
    return request


def to_instance(raw: Mapping[str, Any], region: str) -> Instance:
    """One entry of DescribeInstances / RunInstances as an ``Instance``."""
    tags = tags_of(raw)
    ec2_state = str(raw.get("State", {}).get("Name", "pending"))
    reason_code = str(raw.get("StateReason", {}).get("Code") or "")
    reason: str | None = str(raw.get("StateReason", {}).get("Message") or "") or None
    state: InstanceState = EC2_STATES.get(ec2_state, "stopping")
    if state != "running" and reason_code in SPOT_INTERRUPTION_CODES:
        state, reason = "preempted", "spot interruption"
    elif ec2_state == "stopped":
        reason = f"stopped ({reason_code or 'unknown reason'})"
    launch = raw.get("LaunchTime")
    rank = tags.get(TAG_NODE, "")
    return Instance(
        id=str(raw["InstanceId"]),
        job_id=tags.get(TAG_JOB, ""),
        name=tags.get("Name", str(raw["InstanceId"])),
        cloud="aws",
        region=region,
        zone=str(raw.get("Placement", {}).get("AvailabilityZone", "")),
        instance_type=str(raw.get("InstanceType", "")),
        market="spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand",
        state=state,
        node_rank=int(rank) if rank.isdigit() else -1,
        private_ip=raw.get("PrivateIpAddress") or None,
        public_ip=raw.get("PublicIpAddress") or None,
        launched_at=launch.timestamp() if launch is not None else None,
        reason=reason if state in ("terminated", "preempted", "stopping") else None,
    )
