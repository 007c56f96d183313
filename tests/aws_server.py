"""A moto server for the AWS tests: started in this process on 127.0.0.1, reached by the real
boto3 client over HTTP, plus what moto has no API for (a spot interruption, set in its backend).

Tests use fake credentials only (:func:`fake_credentials`); nothing here can reach AWS.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from kplan.launcher.providers import Backend
    from kplan.launcher.providers.aws_common import AwsConfig

REGION = "us-east-1"
ZONE = "us-east-1a"
# Distinctive fake credentials: tests check that none of them reaches an instance.
ACCESS_KEY = "testing-access-key-4c1d9e"
SECRET_KEY = "testing-secret-key-8a7f2b6e0d"
SESSION_TOKEN = "testing-session-token-31f0c5a9"
PROFILE = "kplan-test-node"
BUCKET = "kplan-moto-jobs"  # the job bucket of the `moto` fixture (tests/conftest.py)


def fake_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """Point boto3 at fake credentials and away from any real AWS configuration."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_REGION", "KPLAN_AWS_STORAGE_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/kplan-test-aws-config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/kplan-test-aws-credentials")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


class MotoAws:
    """One moto server (all services) for a test module.

    moto keeps its state in process-wide backends shared by every server, so a new server starts
    from a reset: a test module never sees what an earlier one left.
    """

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.url = f"http://{host}:{port}"
        self.reset()

    def stop(self) -> None:
        self._server.stop()

    def reset(self) -> None:
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(service, endpoint_url=self.url, region_name=REGION)

    def instance_profile(self, name: str = PROFILE) -> str:
        """Create the IAM role and instance profile the nodes run with; returns its name."""
        iam = self.client("iam")
        iam.create_role(
            RoleName=name,
            AssumeRolePolicyDocument='{"Version":"2012-10-17","Statement":[{"Effect":"Allow",'
            '"Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}',
        )
        iam.create_instance_profile(InstanceProfileName=name)
        iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
        return name

    def interrupt_spot(self, instance_id: str, region: str = REGION) -> None:
        """What EC2 does on a spot interruption: terminate, with the reason
        ``Server.SpotInstanceTermination`` (moto has no API for it: set it in the backend)."""
        self._end(
            instance_id, region, "Server.SpotInstanceTermination", "Spot instance termination"
        )

    def power_off(self, instance_id: str, region: str = REGION) -> None:
        """What a node's ``poweroff`` does with shutdown behaviour terminate."""
        self._end(
            instance_id, region, "Client.InstanceInitiatedShutdown", "Instance initiated shutdown"
        )

    def _end(self, instance_id: str, region: str, code: str, text: str) -> None:
        from moto.backends import get_backend
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.ec2.models.instances import StateReason

        instance = get_backend("ec2")[DEFAULT_ACCOUNT_ID][region].get_instance(instance_id)
        instance.terminate()  # releases its network interfaces and volumes, as EC2 does
        instance.state_reason = StateReason(f"{code}: {text}", code)

    def raw_instances(self, job_id: str) -> list[dict[str, Any]]:
        """DescribeInstances entries tagged with the job (any state)."""
        ec2 = self.client("ec2")
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "tag:kplan-job", "Values": [job_id]}]
        )
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def leftovers(self, job_id: str) -> dict[str, list[str]]:
        """Everything still carrying the job's tag that costs money or blocks a name:
        instances not terminated, security groups, volumes."""
        ec2 = self.client("ec2")
        tag = [{"Name": "tag:kplan-job", "Values": [job_id]}]
        alive = [
            str(i["InstanceId"])
            for i in self.raw_instances(job_id)
            if i["State"]["Name"] != "terminated"
        ]
        groups = [g["GroupId"] for g in ec2.describe_security_groups(Filters=tag)["SecurityGroups"]]
        volumes = [v["VolumeId"] for v in ec2.describe_volumes(Filters=tag)["Volumes"]]
        return {"instances": alive, "security_groups": groups, "volumes": volumes}


def moto_config(server: MotoAws) -> AwsConfig:
    """The aws provider's settings against ``server``: the test instance profile, a fixed AMI,
    no placement groups (moto 5.2.1 has none), no backoff and short polls."""
    from kplan.launcher.providers.aws_common import AwsConfig

    return AwsConfig(
        region=REGION,
        endpoint_url=server.url,
        instance_profile=PROFILE,
        image_id="ami-12c6146b",
        placement_groups=False,
        backoff_s=0.0,
        poll_s=0.05,
        cleanup_timeout_s=5.0,
    )


def moto_backend(server: MotoAws) -> Backend:
    """The aws provider and ``s3://BUCKET/jobs`` against ``server``."""
    from kplan.launcher.providers import Backend
    from kplan.launcher.providers.aws import AwsProvider
    from kplan.launcher.providers.aws_storage import S3Storage

    config = moto_config(server)
    return Backend(AwsProvider(config), S3Storage(f"s3://{BUCKET}/jobs", config))


@contextmanager
def moto_server() -> Iterator[MotoAws]:
    """A fresh moto server with the nodes' instance profile and the job bucket :data:`BUCKET`."""
    server = MotoAws()
    try:
        with pytest.MonkeyPatch.context() as env:
            fake_credentials(env)
            server.instance_profile()
            server.client("s3").create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()
