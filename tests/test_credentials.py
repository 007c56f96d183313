"""Cloud credentials: a launch without them fails with one line, before any job exists, and
leaves no job; ``kplan launch --dry-run`` needs neither credentials nor a cloud SDK (issue 10,
item 5). How long the refusal takes is measured by bench/failfast.py, not asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kplan.cli.main import app
from kplan.core.errors import InputError
from kplan.launcher.providers.aws_common import AwsConfig, check_credentials
from kplan.launcher.providers.gcp_auth import find_credentials

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "kplan" / "examples" / "mlp_regression.py"
PLAN_ARGS = ["--example-profile", "cifar10-resnet18", "--budget", "50"]
CREDENTIAL_VARS = ("AWS_", "GOOGLE_", "CLOUDSDK_", "GCE_", "KPLAN_AWS_", "KPLAN_GCP_", "KPLAN_GCS_")
SDK_MODULES = (
    "boto3",
    "botocore",
    "google.auth",
    "google.api_core",
    "google.cloud.compute_v1",
    "google.cloud.storage",
)
USER_ADC = (
    '{"type": "authorized_user", "client_id": "kplan-test.apps.googleusercontent.com", '
    '"client_secret": "not-a-secret", "refresh_token": "not-a-token"}'
)


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment without any cloud credential or setting, with a fresh HOME (no
    ~/.aws, no gcloud folder) and KPLAN_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CREDENTIAL_VARS)}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), KPLAN_HOME=str(tmp_path / "kplan"), PYTHONPATH=str(ROOT.parent))
    env.update(extra)
    return env


def clear_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(CREDENTIAL_VARS):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


# The CLI in a subprocess; ``block`` makes the cloud SDKs unimportable (a planner-only install)
# and ``refuse`` any provider construction an error.
_RUN = """
import sys
for name in {block!r}:
    sys.modules[name] = None
if {refuse!r}:
    import kplan.launcher.providers as providers

    def refuse(*args, **kwargs):
        raise SystemExit("a dry run constructed a provider")

    providers.get_backend = refuse
from kplan.cli.main import main
sys.argv = ["kplan", *{args!r}]
main()
"""


def kplan(
    args: list[str], env: dict[str, str], *, block: tuple[str, ...] = (), refuse: bool = False
) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh process (the timeout only keeps a hang from blocking the suite)."""
    return subprocess.run(
        [sys.executable, "-c", _RUN.format(block=block, refuse=refuse, args=args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
        cwd=ROOT,
    )


# --- the checks themselves ------------------------------------------------------------------


def test_aws_without_credentials_names_the_chain_it_tried(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clear_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(InputError, match="no AWS credentials found") as info:
        check_credentials(AwsConfig(region="us-east-1"))
    for source in ("AWS_ACCESS_KEY_ID", "~/.aws/credentials", "~/.aws/config", "SSO"):
        assert source in info.value.message
    assert "\n" not in info.value.message
    assert "aws configure" in info.value.hint and "--dry-run" in info.value.hint


def test_aws_credentials_from_the_environment_pass(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clear_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAKPLANTEST0000000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "kplan-test-secret-key")
    check_credentials(AwsConfig(region="us-east-1"))  # no error, no network


def test_aws_unknown_profile_is_one_line_with_a_hint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clear_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    with pytest.raises(InputError, match=r"AWS profile not found.*no-such-profile") as info:
        check_credentials(AwsConfig(region="us-east-1"))
    assert "AWS_PROFILE" in info.value.hint


def test_gcp_without_credentials_fails_at_once_naming_the_chain(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import google.auth

    from kplan.launcher.providers import gcp_auth

    clear_credentials(monkeypatch, tmp_path)
    probes: list[float] = []
    real_probe = gcp_auth.metadata_server

    def probe(environ: Any, timeout_s: float = gcp_auth.PROBE_TIMEOUT_S) -> bool:
        probes.append(timeout_s)
        return real_probe(environ, timeout_s)

    def default(*args: object, **kwargs: object) -> None:
        raise AssertionError("google.auth.default() probes the metadata server for ~10 s")

    monkeypatch.setattr(gcp_auth, "metadata_server", probe)
    monkeypatch.setattr(google.auth, "default", default)
    with pytest.raises(InputError, match="no Google credentials found") as info:
        find_credentials()
    assert len(probes) <= 1 and all(t <= 1.0 for t in probes)  # one short try at most
    message = info.value.message
    assert "GOOGLE_APPLICATION_CREDENTIALS (unset)" in message
    assert str(tmp_path / ".config/gcloud/application_default_credentials.json") in message
    assert "metadata server" in message
    assert "gcloud auth application-default login" in info.value.hint


def test_gcp_credentials_file_that_is_missing_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clear_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "gone.json"))
    with pytest.raises(InputError, match=r"no usable Google credentials.*gone\.json"):
        find_credentials()


def test_gcp_credentials_from_gclouds_file_are_found(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    clear_credentials(monkeypatch, tmp_path)
    adc = tmp_path / ".config" / "gcloud" / "application_default_credentials.json"
    adc.parent.mkdir(parents=True)
    adc.write_text(USER_ADC)
    credentials, project = find_credentials()
    assert credentials is not None and project is None


# --- through the CLI: fail fast, leave nothing ----------------------------------------------


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_a_launch_without_credentials_fails_with_one_line_and_records_no_job(
    cloud: str, tmp_path: Path
) -> None:
    env = clean_env(
        tmp_path, KPLAN_GCP_PROJECT="kplan-test-1", KPLAN_GCP_STORAGE_URI="gs://kplan-test/jobs"
    )
    done = kplan(["launch", str(SCRIPT), "--cloud", cloud, *PLAN_ARGS], env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[0].startswith("error: no ") and "credentials found" in lines[0], lines
    assert len(lines) == 2 and lines[1].startswith("hint: "), lines
    assert "Traceback" not in done.stderr + done.stdout
    status = kplan(["status", "--json"], env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout) == []  # no job, so nothing to clean


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_a_launch_on_a_planner_only_install_says_which_extra_to_install(
    cloud: str, tmp_path: Path
) -> None:
    env = clean_env(tmp_path, KPLAN_GCP_PROJECT="kplan-test-1")
    done = kplan(["launch", str(SCRIPT), "--cloud", cloud, *PLAN_ARGS], env, block=SDK_MODULES)
    assert done.returncode == 2, done.stderr
    assert f"scripts/setup.sh {cloud}" in done.stderr
    assert "not installed" in done.stderr and "Traceback" not in done.stderr
    status = kplan(["status", "--json"], env)
    assert json.loads(status.stdout) == []


# --- dry run: offline, no credentials, no SDK -----------------------------------------------


@pytest.mark.parametrize(
    ("cloud", "placeholders", "extra"),
    [
        ("aws", ["<aws-account-id>"], "scripts/setup.sh aws"),
        ("gcp", ["<gcp-project>", "gs://<your-bucket>/kplan"], "scripts/setup.sh gcp"),
    ],
)
def test_dry_run_works_offline_without_credentials_or_sdk(
    cloud: str, placeholders: list[str], extra: str, tmp_path: Path
) -> None:
    env = clean_env(tmp_path)
    args = ["launch", str(SCRIPT), "--cloud", cloud, *PLAN_ARGS, "--dry-run"]
    done = kplan([*args, "--json"], env, block=SDK_MODULES, refuse=True)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    target = doc["target"]
    assert target["placeholders"] == placeholders
    assert extra in target["needs"]
    prepare = next(r for r in doc["requests"] if r["call"] == "provider.prepare")
    assert prepare["cluster"]["storage_uri"] == target["storage_uri"]
    assert placeholders[-1] in target["storage_uri"]
    text = kplan(args, env, block=SDK_MODULES, refuse=True)
    assert text.returncode == 0, text.stderr
    assert "placeholders, not real values: " + ", ".join(placeholders) in text.stdout
    assert f"a real launch needs: {extra}" in text.stdout


def test_dry_run_uses_the_given_project_and_bucket_and_shows_the_nodes_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "kplan"))
    monkeypatch.setenv("KPLAN_GCP_PROJECT", "kplan-test-1")
    account = "kplan-nodes@kplan-test-1.iam.gserviceaccount.com"
    flags = ["--service-account", account, "--network", "ml", "--subnet", "ml-a"]
    args = ["launch", str(SCRIPT), "--cloud", "gcp", *PLAN_ARGS, "--dry-run", "--json"]
    res = CliRunner().invoke(app, [*args, *flags, "--no-external-ip", "--storage", "gs://b-1/k"])
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    target = doc["target"]
    assert target["placeholders"] == []
    assert (target["project"], target["storage_uri"]) == ("kplan-test-1", "gs://b-1/k")
    assert target["service_account"] == account
    assert target["scopes"] == [
        "https://www.googleapis.com/auth/devstorage.read_write",
        "https://www.googleapis.com/auth/logging.write",
    ]
    assert (target["network"], target["subnet"], target["external_ip"]) == ("ml", "ml-a", False)
    cluster = next(r for r in doc["requests"] if r["call"] == "provider.prepare")["cluster"]
    assert (cluster["service_account"], cluster["external_ip"]) == (account, False)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--cloud", "aws", "--network", "ml"], "--network: for --cloud gcp only"),
        (["--cloud", "aws", "--no-external-ip"], "--no-external-ip: for --cloud gcp only"),
        (["--cloud", "gcp", "--service-account", "robot"], "'robot' is not an email"),
        (["--cloud", "gcp", "--network", "ML VPC"], "'ML VPC' is not a network"),
        (["--cloud", "gcp", "--subnet", "a/b"], "'a/b' is not a subnetwork"),
        (["--cloud", "gcp", "--storage", "s3://b-1/k"], "not a gs:// URI"),
    ],
)
def test_placement_flags_are_checked_with_one_line_and_exit_2(
    flags: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_credentials(monkeypatch, tmp_path)
    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "kplan"))
    res = CliRunner().invoke(app, ["launch", str(SCRIPT), *PLAN_ARGS, *flags, "--dry-run"])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output


def test_the_gcp_placement_survives_the_jobs_round_trip_and_reaches_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kplan.app.launching import GcpPlacement, LaunchRequest, build_spec
    from kplan.launcher.bootstrap import cluster_spec
    from kplan.launcher.jobspec import JobSpec

    monkeypatch.setenv("KPLAN_HOME", str(tmp_path / "kplan"))
    req = LaunchRequest(
        script=SCRIPT,
        budget_usd=50,
        cloud="gcp",
        example_profile="cifar10-resnet18",
        gcp=GcpPlacement(
            network="ml",
            subnet="ml-a",
            service_account="kplan-nodes@kplan-test-1.iam.gserviceaccount.com",
            external_ip=False,
        ),
    )
    spec = build_spec(req)
    again = JobSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    cluster = cluster_spec(again, "gs://b-1/k")
    assert (cluster.network, cluster.subnet, cluster.external_ip) == ("ml", "ml-a", False)
    assert cluster.service_account == req.gcp.service_account
