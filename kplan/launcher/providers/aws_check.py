"""``kplan check --cloud aws``: the SDK, credentials (found, then valid by STS), the GPU vCPU
quotas of the region (Service Quotas) and the job storage bucket, one :class:`CheckLine` each.

Each call is tried at most twice: a check reports, it does not wait out an outage.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from kplan.core.errors import KplanError
from kplan.launcher.providers.aws_common import (
    MISSING_SDK_HINT,
    AwsConfig,
    ClientFactory,
    Retry,
    Tolerated,
    call,
    check_credentials,
    make_client_factory,
)
from kplan.launcher.providers.envvars import setting
from kplan.launcher.readiness import CheckLine, Level, image_line, sdk_line

DEFAULT_REGION = "us-east-1"
# EC2's GPU instance quotas (Service Quotas, service code "ec2"), counted in vCPUs per region.
# Codes as AWS lists them (`aws service-quotas list-service-quotas --service-code ec2`).
GPU_QUOTAS = (
    ("L-DB2E81BA", "G/VT on-demand"),  # Running On-Demand G and VT instances
    ("L-3819A6DF", "G/VT spot"),  # All G and VT Spot Instance Requests
    ("L-417A185B", "P on-demand"),  # Running On-Demand P instances
    ("L-7212CCBC", "P spot"),  # All P Spot Instance Requests
)
QUOTA_HINT = (
    "request an increase in the Service Quotas console (EC2, counted in vCPUs: a g4dn.xlarge "
    "needs 4)"
)
_RETRY = Retry(attempts=2, base_s=0.5)


def aws_checks(
    region: str | None = None,
    storage_uri: str | None = None,
    environ: Mapping[str, str] | None = None,
    client_factory: ClientFactory | None = None,
) -> list[CheckLine]:
    """Every AWS check, in order; a failed step leaves out the checks that need it."""
    env = os.environ if environ is None else environ
    sdk = sdk_line("aws", "boto3", "boto3", MISSING_SDK_HINT)
    if sdk.level != "ok":
        return [sdk]
    from kplan.launcher.providers.aws import config_from_env

    chosen = region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
    try:
        config = config_from_env(chosen, env)
    except KplanError as err:
        return [sdk, CheckLine("aws", "settings", "problem", err.message, err.hint or "")]
    lines = [sdk]
    try:
        check_credentials(config)
    except KplanError as err:
        return [*lines, CheckLine("aws", "credentials", "problem", err.message, err.hint or "")]
    factory = client_factory or make_client_factory(config)
    try:
        who = call(_RETRY, "check the credentials", factory("sts").get_caller_identity)
    except KplanError as err:
        return [*lines, CheckLine("aws", "credentials", "problem", err.message, err.hint or "")]
    account = str(who.get("Account", "?"))
    lines.append(
        CheckLine("aws", "credentials", "ok", f"valid: account {account} ({who.get('Arn', '?')})")
    )
    lines.extend(quota_lines(factory, config.region))
    lines.append(aws_image_line(factory, config.image_id))
    uri = storage_uri or setting("KPLAN_AWS_STORAGE_URI", env)
    lines.append(storage_line(config, factory, uri, account))
    return lines


def quota_lines(factory: ClientFactory, region: str) -> list[CheckLine]:
    """One line per GPU quota of ``region``; a quota the API does not give is a note."""
    try:
        client = factory("service-quotas")
    except KplanError as err:
        return [CheckLine("aws", "quotas", "note", err.message, err.hint or "")]
    found: list[tuple[str, float | None, str]] = []
    for code, label in GPU_QUOTAS:
        try:
            got = call(
                _RETRY,
                f"read the quota {code}",
                client.get_service_quota,
                tolerate=("NoSuchResourceException",),
                ServiceCode="ec2",
                QuotaCode=code,
            )
        except KplanError as err:
            return [
                CheckLine(
                    "aws",
                    "quotas",
                    "note",
                    f"not readable in {region}: {err.message}",
                    "allow servicequotas:GetServiceQuota to see them here; a launch still works",
                )
            ]
        if isinstance(got, Tolerated):
            found.append((label, None, code))
        else:
            found.append((label, float(got["Quota"]["Value"]), code))
    any_gpu = any(value for _, value, _ in found)
    lines = []
    for label, value, code in found:
        name = f"quota {label}"
        if value is None:
            lines.append(CheckLine("aws", name, "note", f"{region}: not given by the API ({code})"))
        elif value > 0:
            lines.append(CheckLine("aws", name, "ok", f"{region}: {value:g} vCPUs"))
        else:
            # one family at 0 is fine while another has room; all at 0 stops every GPU launch
            level: Level = "note" if any_gpu else "problem"
            lines.append(CheckLine("aws", name, level, f"{region}: 0 vCPUs ({code})", QUOTA_HINT))
    return lines


def aws_image_line(factory: ClientFactory, image: str) -> CheckLine:
    """The nodes' AMI (KPLAN_AWS_IMAGE, else the default) and its Python: an AMI id is looked
    up (``ec2:DescribeImages``: its name and description say its system)."""
    if not image.startswith("ami-"):
        return image_line("aws", image)
    try:
        got = call(_RETRY, f"describe the image {image}", factory("ec2").describe_images,
                   ImageIds=[image])  # fmt: skip
    except KplanError as err:
        return CheckLine("aws", "image", "problem", err.message, "set KPLAN_AWS_IMAGE to an AMI "
                         "of this region, or unset it for the default")  # fmt: skip
    found = got.get("Images") or [{}]
    said = f"{found[0].get('Name', '')} {found[0].get('Description', '')}".strip()
    line = image_line("aws", image, said)
    return (
        line
        if not said
        else CheckLine(line.scope, line.name, line.level, f"{line.detail} [{said[:80]}]", line.hint)
    )


def storage_line(
    config: AwsConfig, factory: ClientFactory, uri: str | None, account: str
) -> CheckLine:
    """The job bucket: the one given (KPLAN_AWS_STORAGE_URI or --storage) must exist and be
    listable; the default one (``kplan-<account>-<region>``) is made by the first launch."""
    from kplan.launcher.providers.aws_storage import parse_s3_uri

    given = uri is not None
    where = uri or f"s3://kplan-{account}-{config.region}/jobs"
    try:
        bucket, prefix = parse_s3_uri(where)
        got = call(
            _RETRY,
            f"list {where}",
            factory("s3").list_objects_v2,
            tolerate=() if given else ("NoSuchBucket",),
            Bucket=bucket,
            Prefix=f"{prefix}/" if prefix else "",
            MaxKeys=1,
        )
    except KplanError as err:
        return CheckLine("aws", "storage", "problem", err.message, err.hint or "")
    if isinstance(got, Tolerated):
        return CheckLine(
            "aws", "storage", "ok", f"{where}: not there yet; the first launch makes it"
        )
    return CheckLine("aws", "storage", "ok", f"{where}: reachable")
