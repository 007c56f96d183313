"""``kplan check`` as a library call: is this machine ready to launch on each cloud?

The checks themselves live with the providers (``launcher/providers/aws_check.py``,
``gcp_check.py``); this runs the ones asked for and decides the exit status.

Exit status: 0 when the cloud asked for (``--cloud``) has no problem, or, with no ``--cloud``,
when at least one cloud has none; 2 otherwise (:data:`EXIT_PROBLEM`). Notes never change it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kplan.core.errors import InputError
from kplan.launcher.readiness import CheckLine, ready, torch_line

CLOUDS = ("aws", "gcp")
EXIT_PROBLEM = 2


@dataclass(frozen=True)
class CheckRequest:
    cloud: str | None = None  # None: every cloud
    region: str | None = None  # None: AWS_REGION/AWS_DEFAULT_REGION or us-east-1; us-central1
    storage_uri: str | None = None  # None: KPLAN_AWS_STORAGE_URI / KPLAN_GCP_STORAGE_URI


@dataclass(frozen=True)
class CheckResult:
    lines: list[CheckLine]
    clouds: tuple[str, ...]  # the clouds checked

    @property
    def ready_clouds(self) -> list[str]:
        return [c for c in self.clouds if ready(self.lines, c)]

    @property
    def exit_code(self) -> int:
        return 0 if self.ready_clouds else EXIT_PROBLEM

    def to_dict(self) -> dict[str, object]:
        return {
            "ready": self.ready_clouds,
            "checked": list(self.clouds),
            "exit_code": self.exit_code,
            "checks": [line.to_dict() for line in self.lines],
        }


def run_checks(req: CheckRequest, environ: Mapping[str, str] | None = None) -> CheckResult:
    """Every check of the clouds asked for, and torch on this machine."""
    if req.cloud is not None and req.cloud not in CLOUDS:
        raise InputError(f"--cloud {req.cloud!r} is not a cloud kplan checks", "aws or gcp")
    if req.storage_uri is not None and req.cloud is None:
        raise InputError("--storage needs --cloud", "e.g. --cloud aws --storage s3://bucket/kplan")
    scheme = {"aws": "s3://", "gcp": "gs://"}.get(req.cloud or "", "")
    if req.storage_uri is not None and not req.storage_uri.startswith(scheme):
        raise InputError(
            f"--storage {req.storage_uri[:80]!r} is not a {scheme} URI",
            f"give the {req.cloud} bucket as {scheme}BUCKET/PREFIX",
        )
    clouds = CLOUDS if req.cloud is None else (req.cloud,)
    lines: list[CheckLine] = []
    for cloud in clouds:
        if cloud == "aws":
            from kplan.launcher.providers.aws_check import aws_checks

            lines += aws_checks(req.region, req.storage_uri, environ)
        else:
            from kplan.launcher.providers.gcp_check import gcp_checks

            lines += gcp_checks(req.region, req.storage_uri, environ)
    lines.append(torch_line())
    return CheckResult(lines, clouds)
