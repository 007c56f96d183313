"""S3Storage and the registered aws factory, with the real boto3 client against a moto server."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kplan.core.errors import CloudError, InputError
from kplan.launcher.providers import ProviderSettings, get_backend
from kplan.launcher.providers.aws import AwsProvider
from kplan.launcher.providers.aws_common import AwsConfig
from kplan.launcher.providers.aws_storage import S3Storage, parse_s3_uri
from kplan.launcher.storage import read_json
from tests.aws_server import REGION, MotoAws, fake_credentials

_buckets = itertools.count(1)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoAws]:
    server = MotoAws()
    yield server
    server.stop()


@pytest.fixture
def config(moto: MotoAws, monkeypatch: pytest.MonkeyPatch) -> AwsConfig:
    fake_credentials(monkeypatch)
    return AwsConfig(region=REGION, endpoint_url=moto.url, backoff_s=0.0)


@pytest.fixture
def bucket(moto: MotoAws, config: AwsConfig) -> str:
    name = f"kplan-test-{next(_buckets)}"
    moto.client("s3").create_bucket(Bucket=name)
    return name


def test_objects_round_trip_under_the_prefix(moto: MotoAws, config: AwsConfig, bucket: str) -> None:
    storage = S3Storage(f"s3://{bucket}/runs/", config)
    assert storage.uri == f"s3://{bucket}/runs"
    job = "kp-261122-130000-5eed"
    status = {"exit_code": 0, "time": 1.5, "node_rank": 1}
    storage.put_bytes(f"{job}/status/node-1.json", json.dumps(status).encode())
    storage.put_bytes(f"{job}/status/node-0.json", b'{"exit_code": 3, "time": 2.0}')
    storage.put_bytes(f"{job}/code/job.tar.gz", b"\x1f\x8b" + bytes(2000))
    assert read_json(storage, f"{job}/status/node-1.json") == status
    assert storage.get_bytes(f"{job}/status/node-7.json") is None
    assert storage.list_keys(f"{job}/status/") == [
        f"{job}/status/node-0.json",
        f"{job}/status/node-1.json",
    ]
    assert len(storage.list_keys("")) == 3
    objects = moto.client("s3").list_objects_v2(Bucket=bucket)["Contents"]
    assert all(o["Key"].startswith(f"runs/{job}/") for o in objects)

    storage.delete_prefix(f"{job}/status/")
    assert storage.list_keys(f"{job}/") == [f"{job}/code/job.tar.gz"]
    storage.delete_prefix(f"{job}/status/")  # nothing left: not an error


def test_listing_and_deleting_go_page_by_page(config: AwsConfig, bucket: str) -> None:
    storage = S3Storage(f"s3://{bucket}", config, page_size=3)
    for i in range(8):
        storage.put_bytes(f"j/metrics/{i:04d}.jsonl", b"{}")
    keys = storage.list_keys("j/metrics/")
    assert keys == [f"j/metrics/{i:04d}.jsonl" for i in range(8)]
    storage.delete_prefix("j/")
    assert storage.list_keys("j/") == []


def test_keys_and_uris_are_validated() -> None:
    assert parse_s3_uri("s3://my.bucket-1/a/b/") == ("my.bucket-1", "a/b")
    with pytest.raises(InputError, match="not an s3:// URI"):
        parse_s3_uri("gs://bucket/x")
    with pytest.raises(InputError, match="no valid bucket"):
        parse_s3_uri("s3://Bad_Bucket/x")
    # a prefix with a newline, a tab or a space (``kplan controller --storage``): refused, for
    # S3 and Cloud Storage alike, where it read and wrote keys under ``jobs\n/``
    from kplan.launcher.providers.gcp_storage import parse_gs_uri

    for parse, scheme in ((parse_s3_uri, "s3"), (parse_gs_uri, "gs")):
        for prefix in ("jobs\n", "jo bs", "jobs\t/x", "a\x1b[31m"):
            with pytest.raises(InputError, match="space or a control character in its prefix"):
                parse(f"{scheme}://bucket-ok/{prefix}")
    storage = S3Storage("s3://bucket/x", AwsConfig(region=REGION))
    for bad in ("../escape", "/abs", "a/../../b"):
        with pytest.raises(InputError, match="not a relative path"):
            storage.put_bytes(bad, b"")


def test_a_missing_bucket_is_a_cloud_error_with_a_hint(config: AwsConfig) -> None:
    storage = S3Storage("s3://kplan-no-such-bucket/x", config)
    with pytest.raises(CloudError, match="NoSuchBucket") as err:
        storage.put_bytes("j/code/job.tar.gz", b"x")
    assert "create the bucket" in err.value.hint


def test_the_factory_builds_provider_and_default_bucket_from_the_environment(
    moto: MotoAws, config: AwsConfig, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KPLAN_AWS_ENDPOINT_URL", moto.url)
    monkeypatch.setenv("KPLAN_AWS_INSTANCE_PROFILE", "kplan-node")
    backend = get_backend("aws", ProviderSettings(home=tmp_path, region=None))
    assert isinstance(backend.provider, AwsProvider)
    assert backend.provider.config.instance_profile == "kplan-node"
    assert backend.storage.uri == f"s3://kplan-123456789012-{REGION}/jobs"
    # The default bucket does not exist until the first write, which makes it private and tagged.
    assert backend.storage.get_bytes("j/status/node-0.json") is None
    assert backend.storage.list_keys("j/") == []
    backend.storage.put_bytes("j/status/node-0.json", b"{}")
    s3 = moto.client("s3")
    bucket = f"kplan-123456789012-{REGION}"
    block = s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]
    assert all(block.values())
    assert s3.get_bucket_tagging(Bucket=bucket)["TagSet"] == [
        {"Key": "kplan-managed", "Value": "true"}
    ]
    assert backend.storage.list_keys("j/") == ["j/status/node-0.json"]

    explicit = get_backend(
        "aws", ProviderSettings(home=tmp_path, region=REGION, storage_uri="s3://other/p")
    )
    assert explicit.storage.uri == "s3://other/p"
