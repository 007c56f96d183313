"""``kplan check --cloud gcp``: the SDK, Application Default Credentials, the project, one cheap
Compute call (``regions.get``, which proves the credentials and the API and carries the region's
GPU quotas) and the job bucket, one :class:`CheckLine` each."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from kplan.core.errors import KplanError
from kplan.launcher.providers import gcp_errors
from kplan.launcher.providers.envvars import setting
from kplan.launcher.providers.gcp_auth import MISSING_SDK_HINT
from kplan.launcher.readiness import CheckLine, Level, image_line, sdk_line

DEFAULT_REGION = "us-central1"
STORAGE_HINT = (
    "set KPLAN_GCP_STORAGE_URI=gs://BUCKET/PREFIX, a bucket the instances' service account can "
    "write (kplan makes no bucket on GCP)"
)
QUOTA_HINT = "request a GPU quota increase for the region (IAM & Admin > Quotas)"
# regions.get quota metrics: NVIDIA_T4_GPUS (on-demand), PREEMPTIBLE_NVIDIA_T4_GPUS (spot and
# preemptible), COMMITTED_... (reservations, left out), ..._VWS_GPUS (workstations, left out).
_GPU_METRIC = re.compile(r"(PREEMPTIBLE_)?NVIDIA_(?P<family>[A-Z0-9_]+?)_GPUS")


def gcp_checks(
    region: str | None = None,
    storage_uri: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[CheckLine]:
    """Every GCP check, in order; a failed step leaves out the checks that need it."""
    env = os.environ if environ is None else environ
    sdk = sdk_line("gcp", "google.cloud.compute_v1", "google-cloud-compute", MISSING_SDK_HINT)
    if sdk.level != "ok":
        return [sdk]
    lines = [sdk]
    try:
        credentials, project, how = _credentials(env)
    except KplanError as err:
        return [*lines, CheckLine("gcp", "credentials", "problem", err.message, err.hint or "")]
    from kplan.launcher.providers.gcp_config import GcpConfig

    try:
        config = GcpConfig.from_env(env, default_project=project)
    except KplanError as err:
        lines.append(CheckLine("gcp", "credentials", "ok", f"found: {how}"))
        return [*lines, CheckLine("gcp", "project", "problem", err.message, err.hint or "")]
    chosen = region or DEFAULT_REGION
    try:
        quotas = _region_quotas(config, credentials, chosen)
    except KplanError as err:
        return [*lines, CheckLine("gcp", "credentials", "problem", err.message, err.hint or "")]
    lines.append(
        CheckLine("gcp", "credentials", "ok", f"valid: {how}; Compute answers for {config.project}")
    )
    lines.extend(quota_lines(quotas, chosen))
    lines.append(image_line("gcp", config.image))
    uri = storage_uri or setting("KPLAN_GCP_STORAGE_URI", env)
    lines.append(storage_line(uri, credentials, env))
    return lines


def _credentials(env: Mapping[str, str]) -> tuple[Any, str | None, str]:
    """(credentials, their project, where they came from in words)."""
    if env.get("KPLAN_GCP_ANONYMOUS") == "1":  # a local test server takes none
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials(), None, "anonymous (KPLAN_GCP_ANONYMOUS=1)"  # type: ignore[no-untyped-call]
    from kplan.launcher.providers.gcp_auth import adc_file, find_credentials

    credentials, project = find_credentials(env)
    path = env.get("GOOGLE_APPLICATION_CREDENTIALS")
    if path:
        how = f"GOOGLE_APPLICATION_CREDENTIALS ({path})"
    elif adc_file(env).is_file():
        how = f"gcloud's file {adc_file(env)}"
    else:
        how = "the Compute Engine metadata server"
    return credentials, project, how


def _region_quotas(config: Any, credentials: Any, region: str) -> dict[str, tuple[float, float]]:
    """``metric -> (limit, usage)`` of ``region`` (regions.get, one try plus one retry)."""
    from kplan.launcher.clock import SystemClock
    from kplan.launcher.providers.gcp_api import ComputeApi

    api = ComputeApi(config, credentials, SystemClock())
    client = api.client("RegionsClient")
    got = gcp_errors.call(
        lambda: client.get(project=config.project, region=region, retry=None, timeout=30.0),
        f"regions.get {region}",
        retries=1,
        backoff_s=0.5,
    )
    return {str(q.metric): (float(q.limit), float(q.usage)) for q in got.quotas}


def quota_lines(quotas: Mapping[str, tuple[float, float]], region: str) -> list[CheckLine]:
    """One line per GPU family the region has a quota for: on-demand and spot GPUs."""
    families: dict[str, dict[str, tuple[float, float]]] = {}
    for metric, (limit, usage) in quotas.items():
        match = _GPU_METRIC.fullmatch(metric)
        if match is None or match["family"].endswith("_VWS"):
            continue
        market = "spot" if match[1] else "on-demand"
        families.setdefault(match["family"], {})[market] = (limit, usage)
    if not families:
        return [CheckLine("gcp", "quotas", "note", f"{region}: the API gives no GPU quota")]
    any_gpu = any(limit > 0 for f in families.values() for limit, _ in f.values())
    lines = []
    for family, markets in sorted(families.items()):
        parts = [
            f"{limit:g} {market}" + (f" ({usage:g} in use)" if usage else "")
            for market, (limit, usage) in sorted(markets.items())
        ]
        room = any(limit > 0 for limit, _ in markets.values())
        level: Level = "ok" if room else ("note" if any_gpu else "problem")
        hint = "" if room else QUOTA_HINT
        name = f"quota {family.replace('_', '-')}"
        lines.append(CheckLine("gcp", name, level, f"{region}: {', '.join(parts)} GPUs", hint))
    return lines


def storage_line(uri: str | None, credentials: Any, env: Mapping[str, str]) -> CheckLine:
    """The job bucket (KPLAN_GCP_STORAGE_URI or --storage): required on GCP, and listable."""
    if not uri:
        return CheckLine("gcp", "storage", "problem", "no job bucket set", STORAGE_HINT)
    from kplan.launcher.providers.gcp_storage import GCSStorage

    try:
        storage = GCSStorage(
            uri,
            credentials=credentials,
            endpoint=setting("KPLAN_GCS_ENDPOINT", env),
            retries=1,
            backoff_s=0.5,
            timeout_s=30.0,
        )
        storage.list_keys("kplan-check")  # a folder no job uses: an empty answer, or an error
    except KplanError as err:
        return CheckLine("gcp", "storage", "problem", err.message, err.hint or STORAGE_HINT)
    return CheckLine("gcp", "storage", "ok", f"{uri}: reachable")
