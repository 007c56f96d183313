"""The GCP provider's configuration, derived names, credential guard and Cloud Storage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kplan.core.errors import CloudError, InputError
from kplan.launcher.provider import InstanceSpec
from kplan.launcher.providers import ProviderSettings, get_backend
from kplan.launcher.providers.gcp_build import refuse_credentials, split_instance_type
from kplan.launcher.providers.gcp_config import (
    LABEL_VALUE_RE,
    NAME_RE,
    GcpConfig,
    firewall_names,
    label_value,
    network_tag,
)
from kplan.launcher.providers.gcp_storage import GCSStorage
from tests.gcs_server import FakeGCS


def test_config_is_validated_with_the_bad_value_echoed() -> None:
    for kwargs, message in (
        ({"project": "My Project"}, "'My Project' is not a valid project id"),
        ({"termination_action": "KILL"}, "'KILL' is neither STOP nor DELETE"),
        ({"service_account": "robot"}, "'robot' is not an email"),
        ({"disk_size_gb": 5}, "5 GB is below"),
        ({"poll_interval_s": 0}, "poll_interval_s=0 must be positive"),
        ({"extra_labels": {"Team": "ml"}}, "Team='ml' breaks the label rules"),
    ):
        with pytest.raises(InputError, match=message):
            GcpConfig(**{"project": "kplan-test-1", **kwargs})  # type: ignore[arg-type]
    ok = GcpConfig(
        project="kplan-test-1", service_account="sa@kplan-test-1.iam.gserviceaccount.com"
    )
    assert ok.network_path() == "projects/kplan-test-1/global/networks/default"
    assert ok.subnetwork_path("us-central1") is None


def test_nodes_scopes_are_storage_and_logging_only() -> None:
    config = GcpConfig(project="kplan-test-1")
    assert config.scopes == (
        "https://www.googleapis.com/auth/devstorage.read_write",
        "https://www.googleapis.com/auth/logging.write",
    )
    assert config.external_ip and config.network == "default"


def test_network_subnet_and_external_ip_from_the_environment() -> None:
    env = {
        "KPLAN_GCP_PROJECT": "kplan-test-1",
        "KPLAN_GCP_NETWORK": "projects/shared-vpc-1/global/networks/ml",
        "KPLAN_GCP_SUBNETWORK": "projects/shared-vpc-1/regions/us-central1/subnetworks/ml-a",
        "KPLAN_GCP_EXTERNAL_IP": "0",
    }
    config = GcpConfig.from_env(env)
    assert config.network_path() == "projects/shared-vpc-1/global/networks/ml"
    assert config.subnetwork_path("us-central1") == env["KPLAN_GCP_SUBNETWORK"]
    assert config.external_ip is False
    with pytest.raises(InputError, match="KPLAN_GCP_EXTERNAL_IP='maybe' is not 0 or 1"):
        GcpConfig.from_env({**env, "KPLAN_GCP_EXTERNAL_IP": "maybe"})
    with pytest.raises(InputError, match="'ml vpc' is not a network name"):
        GcpConfig.from_env({**env, "KPLAN_GCP_NETWORK": "ml vpc"})
    # the credentials' project fills in when no variable names one; a variable wins
    assert GcpConfig.from_env({}, default_project="adc-project-1").project == "adc-project-1"
    assert GcpConfig.from_env(env, default_project="adc-project-1").project == "kplan-test-1"


def test_config_from_the_environment() -> None:
    with pytest.raises(InputError, match="no GCP project"):
        GcpConfig.from_env({})
    config = GcpConfig.from_env(
        {
            "GOOGLE_CLOUD_PROJECT": "kplan-test-1",
            "KPLAN_GCP_SERVICE_ACCOUNT": "none",
            "KPLAN_GCP_TERMINATION_ACTION": "delete",
            "KPLAN_GCP_SUBNETWORK": "train",
        }
    )
    assert (config.project, config.service_account, config.termination_action) == (
        "kplan-test-1",
        None,
        "DELETE",
    )
    assert config.subnetwork_path("europe-west4") == (
        "projects/kplan-test-1/regions/europe-west4/subnetworks/train"
    )


@pytest.mark.parametrize("job", ["kp-261122-050000-ab12", "My_Job.2026/11", "x" * 90])
def test_derived_names_follow_the_compute_naming_rules(job: str) -> None:
    assert LABEL_VALUE_RE.fullmatch(label_value(job))
    for name in (network_tag(job), *firewall_names(job)):
        assert NAME_RE.fullmatch(name), name
    assert label_value(job) == label_value(job)  # deterministic: found again from the id alone
    if job.startswith("kp-"):
        assert label_value(job) == job and network_tag(job) == f"kplan-{job}"
    assert label_value("Job-A") != label_value("job-a")


def test_catalog_names_map_to_machine_types_and_accelerators() -> None:
    assert split_instance_type("n1-standard-16+2xT4") == ("n1-standard-16", 2, "nvidia-tesla-t4")
    assert split_instance_type("n1-standard-8+1xv100") == ("n1-standard-8", 1, "nvidia-tesla-v100")
    assert split_instance_type("a3-highgpu-8g") == ("a3-highgpu-8g", 0, None)
    assert split_instance_type("g2-standard-8") == ("g2-standard-8", 0, None)


@pytest.mark.parametrize(
    "leak",
    [
        "-----BEGIN PRIVATE KEY-----\nMIIE...",
        '{"type": "service_account", "private_key": "x"}',
        "export TOKEN=ya29.a0AfB_byC9x8t7s6r5q4p3o2n1m0",
    ],
)
def test_credentials_never_go_into_metadata(leak: str) -> None:
    spec = InstanceSpec(
        job_id="kp-261122-050000-ab12",
        name="kp-261122-050000-ab12-n0-r0",
        cloud="gcp",
        region="us-central1",
        zone="us-central1-a",
        instance_type="g2-standard-8",
        market="spot",
        node_rank=0,
        user_data="#!/bin/bash\n",
    )
    refuse_credentials(spec)
    for where in ("user_data", "env", "tags"):
        value = {"user_data": leak} if where == "user_data" else {where: {"KEY": leak}}
        bad = InstanceSpec(**{**spec.__dict__, **value})
        with pytest.raises(InputError, match="refusing to send a Google credential"):
            refuse_credentials(bad)


@pytest.fixture
def gcs() -> Iterator[tuple[FakeGCS, str]]:
    fake = FakeGCS("kplan-bucket")
    with fake.serve() as url:
        yield fake, url


def make_storage(url: str, uri: str = "gs://kplan-bucket/jobs") -> GCSStorage:
    from google.auth.credentials import AnonymousCredentials

    credentials = AnonymousCredentials()  # type: ignore[no-untyped-call]
    return GCSStorage(uri, credentials=credentials, endpoint=url, backoff_s=0.001)


def test_gcs_storage_round_trip(gcs: tuple[FakeGCS, str]) -> None:
    fake, url = gcs
    store = make_storage(url)
    assert store.uri == "gs://kplan-bucket/jobs"
    store.put_bytes("j1/status/node-0.json", b'{"exit_code": 0}')
    store.put_bytes("j1/status/node-1.json", b"{}")
    store.put_bytes("j1/statusx", b"other")
    store.put_bytes("j1/code/job.tar.gz", bytes(range(256)))
    assert (("kplan-bucket", "jobs/j1/status/node-0.json")) in fake.objects
    assert store.get_bytes("j1/code/job.tar.gz") == bytes(range(256))
    assert store.get_bytes("j1/nothing") is None
    fake.page_size = 2
    assert store.list_keys("j1/status") == ["j1/status/node-0.json", "j1/status/node-1.json"]
    assert len(store.list_keys("")) == 4
    store.delete_prefix("j1/status/")
    assert store.list_keys("j1/status/") == []
    assert store.get_bytes("j1/statusx") == b"other"
    with pytest.raises(ValueError, match="not a plain relative key"):
        store.get_bytes("../escape")


def test_gcs_errors_are_cloud_errors(gcs: tuple[FakeGCS, str]) -> None:
    _, url = gcs
    with pytest.raises(CloudError, match="bucket does not exist") as info:
        make_storage(url, "gs://missing-bucket/x").put_bytes("a", b"1")
    assert "Check that" in info.value.hint
    with pytest.raises(InputError, match="not a gs:// URI"):
        make_storage(url, "s3://kplan-bucket")


USER_ADC = (
    '{"type": "authorized_user", "client_id": "kplan-test.apps.googleusercontent.com", '
    '"client_secret": "not-a-secret", "refresh_token": "not-a-token"}'
)


def test_factory_needs_a_project_and_a_bucket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("KPLAN_GCP_PROJECT", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("KPLAN_GCP_STORAGE_URI", raising=False)
    monkeypatch.delenv("KPLAN_GCP_ANONYMOUS", raising=False)
    key = tmp_path / "adc.json"  # user credentials: loading them needs no network
    key.write_text(USER_ADC)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    with pytest.raises(InputError, match="no GCP project"):
        get_backend("gcp", ProviderSettings(home=tmp_path))
    monkeypatch.setenv("KPLAN_GCP_PROJECT", "kplan-test-1")
    with pytest.raises(InputError, match="no Cloud Storage location"):
        get_backend("gcp", ProviderSettings(home=tmp_path))
    backend = get_backend("gcp", ProviderSettings(home=tmp_path, storage_uri="gs://b-1/k"))
    assert backend.provider.name == "gcp" and backend.storage.uri == "gs://b-1/k"
