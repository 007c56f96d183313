"""``kplan check``: one line per check, a hint under each problem, exit 0 when ready and 2 with
problems (issue 26, item 3). No credentials (environment cleared, HOME a temporary folder),
fake ones, and the real SDKs against moto and the local Compute and Storage servers."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from tests.aws_server import REGION, MotoAws, fake_credentials
from tests.gcp_http import Json, serve_http
from tests.gcp_server import FakeCompute
from tests.gcs_server import FakeGCS
from tests.test_credentials import clear_credentials

BUCKET = "kplan-check-bucket"
Reply = tuple[int, bytes, str]


def check(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, ["check", *args])
    return result.exit_code, result.output.splitlines()


def line(lines: list[str], scope: str, name: str) -> str:
    hits = [x for x in lines if x.split()[:1] == [scope] and f" {name} " in x]
    assert len(hits) == 1, (scope, name, lines)
    return hits[0]


def hint_after(lines: list[str], text: str) -> str:
    return lines[lines.index(text) + 1].strip()


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clear_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("NO_GCE_CHECK", "true")  # no metadata-server probe


# --- no credentials ---------------------------------------------------------------------------


@pytest.mark.usefixtures("no_credentials")
def test_no_credentials_is_one_problem_line_per_cloud_and_exit_2() -> None:
    code, lines = check()
    assert code == 2
    aws = line(lines, "aws", "credentials")
    assert "problem" in aws and "no AWS credentials found" in aws
    assert hint_after(lines, aws).startswith("hint: run `aws configure`")
    gcp = line(lines, "gcp", "credentials")
    assert "problem" in gcp and "no Google credentials found" in gcp
    assert "gcloud auth application-default login" in hint_after(lines, gcp)
    assert "ok" in line(lines, "aws", "sdk boto3")
    assert lines[-1] == "ready: none; not ready: aws, gcp"
    # the checks that need credentials are left out, not reported as passing
    assert not any(" quota" in x or " storage " in x for x in lines)


@pytest.mark.usefixtures("no_credentials")
def test_json_lists_the_same_checks() -> None:
    result = CliRunner().invoke(app, ["check", "--cloud", "gcp", "--json"])
    assert result.exit_code == 2
    doc = json.loads(result.output)
    assert doc["ready"] == [] and doc["checked"] == ["gcp"] and doc["exit_code"] == 2
    levels = {(c["scope"], c["check"]): c["level"] for c in doc["checks"]}
    assert levels[("gcp", "credentials")] == "problem"
    assert levels[("kplan", "sdk torch")] in ("ok", "note")


def test_a_missing_sdk_is_a_problem_with_the_install_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "boto3", None)  # not importable
    code, lines = check("--cloud", "aws")
    assert code == 2
    sdk = line(lines, "aws", "sdk boto3")
    assert "problem" in sdk and "not installed" in sdk
    assert "scripts/setup.sh aws" in hint_after(lines, sdk)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cloud", "azure"], "--cloud 'azure' is not one of aws, gcp"),
        (["--storage", "s3://b/k"], "--storage needs --cloud"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["check", *args])
    assert result.exit_code == 2
    assert message in result.output


# --- fake credentials ---------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_fake_aws_credentials_that_no_server_accepts_are_a_problem(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_credentials(monkeypatch)
    monkeypatch.setenv("KPLAN_AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    code, lines = check("--cloud", "aws")
    assert code == 2
    cred = line(lines, "aws", "credentials")
    assert "problem" in cred and "could not check the credentials" in cred
    assert "network" in hint_after(lines, cred)


@pytest.fixture
def token_url() -> Iterator[str]:
    """An OAuth token endpoint that grants any signed assertion a token."""

    def respond(
        method: str, path: str, query: dict[str, str], raw: bytes
    ) -> tuple[int, bytes, str]:
        body = {"access_token": "kplan-test-token", "expires_in": 3600, "token_type": "Bearer"}
        return 200, json.dumps(body).encode(), "application/json"

    with serve_http(respond) as url:
        yield f"{url}/token"


def _key_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, token_url: str) -> None:
    """A service-account key file with a fresh RSA key. The Compute client signs its own
    tokens with it (self-signed JWT); Cloud Storage's session trades it at ``token_url``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    doc = {
        "type": "service_account",
        "project_id": "kplan-check-project",
        "private_key_id": "kplan-test-key",
        "private_key": pem,
        "client_email": "kplan-check@kplan-check-project.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": token_url,
    }
    path = tmp_path / "key.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))


# --- the real SDKs against local servers --------------------------------------------------------


class ComputeWithRegions(FakeCompute):
    """The test Compute server plus ``regions.get`` with the region's quotas."""

    def __init__(self) -> None:
        super().__init__()
        self.quotas: list[Json] = []

    def _route(self, method: str, path: str, query: dict[str, str], body: Json | None) -> Json:
        parts = path.split("/")  # /compute/v1/projects/P/regions/R
        if method == "GET" and len(parts) == 7 and parts[5] == "regions":
            return {"kind": "compute#region", "name": parts[6], "quotas": self.quotas}
        return super()._route(method, path, query, body)


@pytest.fixture
def gcp(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_credentials: None
) -> Iterator[ComputeWithRegions]:
    compute, gcs = ComputeWithRegions(), FakeGCS(BUCKET)
    with compute.serve() as compute_url, gcs.serve() as gcs_url:
        monkeypatch.setenv("KPLAN_GCP_ENDPOINT", compute_url)
        monkeypatch.setenv("KPLAN_GCS_ENDPOINT", gcs_url)
        yield compute


def test_gcp_credentials_that_compute_refuses_are_a_problem(
    gcp: ComputeWithRegions, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, token_url: str
) -> None:
    _key_file(monkeypatch, tmp_path, token_url)
    # what Compute answers for a key it does not know (the local server cannot verify one),
    # to every try (google-auth refreshes the token and asks again after a 401)
    gcp.fail("GET", "/regions/", 401, "authError", "Request had invalid credentials.", times=9)
    code, lines = check("--cloud", "gcp")
    assert code == 2
    cred = line(lines, "gcp", "credentials")
    assert "problem" in cred and "401 authError" in cred
    assert hint_after(lines, cred).startswith("hint:")
    assert not any(" quota" in x for x in lines)


def test_gcp_ready_with_quotas_per_family_and_the_bucket(
    gcp: ComputeWithRegions, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, token_url: str
) -> None:
    _key_file(monkeypatch, tmp_path, token_url)
    monkeypatch.setenv("KPLAN_GCP_STORAGE_URI", f"gs://{BUCKET}/kplan")
    gcp.quotas = [
        {"metric": "NVIDIA_T4_GPUS", "limit": 4.0, "usage": 1.0},
        {"metric": "PREEMPTIBLE_NVIDIA_T4_GPUS", "limit": 8.0},
        {"metric": "NVIDIA_A100_80GB_GPUS", "limit": 0.0},
        {"metric": "NVIDIA_T4_VWS_GPUS", "limit": 4.0},
        {"metric": "CPUS", "limit": 24.0},
    ]
    code, lines = check("--cloud", "gcp", "--region", "europe-west4")
    assert code == 0, lines
    cred = line(lines, "gcp", "credentials")
    assert "ok" in cred and "GOOGLE_APPLICATION_CREDENTIALS" in cred
    assert "europe-west4: 4 on-demand (1 in use), 8 spot GPUs" in line(lines, "gcp", "quota T4")
    a100 = line(lines, "gcp", "quota A100-80GB")
    assert "note" in a100  # 0 while T4 has room: worth knowing, not a problem
    assert not any("VWS" in x or "CPUS" in x for x in lines)
    assert "reachable" in line(lines, "gcp", "storage")
    assert lines[-1] == "ready: gcp"
    regions = [s for s in gcp.requests if "/regions/" in s.path]
    assert [s.path for s in regions] == [
        "/compute/v1/projects/kplan-check-project/regions/europe-west4"
    ]


def test_gcp_zero_gpu_quota_and_a_missing_bucket_are_problems(
    gcp: ComputeWithRegions, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KPLAN_GCP_ANONYMOUS", "1")
    monkeypatch.setenv("KPLAN_GCP_PROJECT", "kplan-check-project")
    gcp.quotas = [{"metric": "NVIDIA_L4_GPUS", "limit": 0.0}]
    code, lines = check("--cloud", "gcp", "--storage", "gs://no-such-bucket/kplan")
    assert code == 2
    quota = line(lines, "gcp", "quota L4")
    assert "problem" in quota and "0 on-demand GPUs" in quota
    assert "quota increase" in hint_after(lines, quota)
    storage = line(lines, "gcp", "storage")
    assert "problem" in storage and "404" in storage


def test_gcp_without_a_bucket_setting_is_a_problem(
    gcp: ComputeWithRegions, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KPLAN_GCP_ANONYMOUS", "1")
    monkeypatch.setenv("KPLAN_GCP_PROJECT", "kplan-check-project")
    code, lines = check("--cloud", "gcp")
    assert code == 2
    assert "no GPU quota" in line(lines, "gcp", "quotas")
    storage = line(lines, "gcp", "storage")
    assert "no job bucket set" in storage
    assert "KPLAN_GCP_STORAGE_URI" in hint_after(lines, storage)


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoAws]:
    server = MotoAws()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def aws(moto: MotoAws, monkeypatch: pytest.MonkeyPatch) -> MotoAws:
    moto.reset()
    fake_credentials(monkeypatch)
    monkeypatch.setenv("KPLAN_AWS_ENDPOINT_URL", moto.url)
    return moto


def _ec2_quotas(monkeypatch: pytest.MonkeyPatch, values: dict[str, float]) -> None:
    """moto's Service Quotas knows only VPC quotas: give it EC2's GPU quotas (in process)."""
    from moto.servicequotas.exceptions import NoSuchResource
    from moto.servicequotas.models import ServiceQuotasBackend

    def get(self: Any, service_code: str, quota_code: str) -> dict[str, Any]:
        if service_code != "ec2" or quota_code not in values:
            raise NoSuchResource
        return {"QuotaCode": quota_code, "ServiceCode": "ec2", "Value": values[quota_code]}

    monkeypatch.setattr(ServiceQuotasBackend, "get_service_quota", get)


def test_aws_against_moto_is_ready_and_says_what_the_api_does_not_give(aws: MotoAws) -> None:
    code, lines = check("--cloud", "aws")
    assert code == 0, lines
    cred = line(lines, "aws", "credentials")
    assert "ok" in cred and "valid: account 123456789012" in cred
    spot = line(lines, "aws", "quota G/VT spot")
    assert "note" in spot and "not given by the API (L-3819A6DF)" in spot
    storage = line(lines, "aws", "storage")
    assert f"s3://kplan-123456789012-{REGION}/jobs: not there yet" in storage
    assert lines[-1] == "ready: aws"


def test_aws_quotas_per_family_and_a_given_bucket(
    aws: MotoAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ec2_quotas(monkeypatch, {"L-DB2E81BA": 64.0, "L-3819A6DF": 0.0, "L-417A185B": 0.0})
    aws.client("s3").create_bucket(Bucket=BUCKET)
    code, lines = check("--cloud", "aws", "--storage", f"s3://{BUCKET}/kplan")
    assert code == 0, lines
    assert "ok      us-east-1: 64 vCPUs" in line(lines, "aws", "quota G/VT on-demand")
    assert "note    us-east-1: 0 vCPUs (L-3819A6DF)" in line(lines, "aws", "quota G/VT spot")
    assert "not given by the API" in line(lines, "aws", "quota P spot")
    assert f"s3://{BUCKET}/kplan: reachable" in line(lines, "aws", "storage")


def test_aws_no_gpu_quota_and_a_missing_bucket_are_problems(
    aws: MotoAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ec2_quotas(monkeypatch, dict.fromkeys(("L-DB2E81BA", "L-3819A6DF"), 0.0))
    code, lines = check("--cloud", "aws", "--storage", "s3://no-such-bucket/kplan")
    assert code == 2
    quota = line(lines, "aws", "quota G/VT on-demand")
    assert "problem" in quota and "Service Quotas" in hint_after(lines, quota)
    storage = line(lines, "aws", "storage")
    assert "problem" in storage and "NoSuchBucket" in storage
    assert "create the bucket" in hint_after(lines, storage)


def test_aws_image_python_from_the_catalog_and_from_describe_images(
    aws: MotoAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, lines = check("--cloud", "aws")
    assert code == 0
    assert "(Ubuntu 24.04, Python 3.12: fits)" in line(lines, "aws", "image")
    ec2 = aws.client("ec2")
    base = ec2.describe_images()["Images"][0]["ImageId"]
    run = ec2.run_instances(ImageId=base, MinCount=1, MaxCount=1, InstanceType="t3.micro")
    made = ec2.create_image(
        InstanceId=run["Instances"][0]["InstanceId"],
        Name="Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20261006",
        Description="Supported EC2 instances: G4dn, G5, P4d",
    )["ImageId"]
    monkeypatch.setenv("KPLAN_AWS_IMAGE", made)
    code, lines = check("--cloud", "aws")
    assert code == 0  # the bootstrap brings Python 3.11: a note, not a problem
    image = line(lines, "aws", "image")
    assert "note" in image and "(Ubuntu 22.04, Python 3.10, below 3.11" in image
    assert "--image with python3 >= 3.11" in hint_after(lines, image)
    monkeypatch.setenv("KPLAN_AWS_IMAGE", "ami-00000000000000000")
    code, lines = check("--cloud", "aws")
    assert code == 2
    missing = line(lines, "aws", "image")
    assert "problem" in missing and "InvalidAMIID" in missing


def test_gcp_image_python_is_a_note_when_the_bootstrap_must_bring_it(
    gcp: ComputeWithRegions, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KPLAN_GCP_ANONYMOUS", "1")
    monkeypatch.setenv("KPLAN_GCP_PROJECT", "kplan-check-project")
    monkeypatch.delenv("KPLAN_GCP_IMAGE", raising=False)
    _, lines = check("--cloud", "gcp")
    image = line(lines, "gcp", "image")
    assert "note" in image and "common-cu124-debian-11 (Debian 11, Python 3.9, below 3.11" in image
