"""The providers' settings from the environment, each checked as its flag is, in one place.

A ``KPLAN_<CLOUD>_...`` variable that mirrors a flag (``KPLAN_AWS_IMAGE`` and
``KPLAN_GCP_IMAGE`` mirror ``kplan launch --image``) goes through the flag's own check; every
other setting is a name or URL, so it is at least one line of printable characters without
spaces (``KPLAN_GCP_NETWORK``, ``_SUBNETWORK`` and ``_SERVICE_ACCOUNT`` then meet the checks of
``--network``, ``--subnet`` and ``--service-account`` in ``GcpConfig``). An unset or empty
variable is no setting (None).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping

from kplan.core.errors import InputError

_MAX_LEN = 1024

IMAGE_HINT = "an AMI id (ami-...) or resolve:ssm:<parameter>; a GCP image or family path"


def _is_token(value: str) -> bool:
    return 0 < len(value) <= _MAX_LEN and all(c.isprintable() and not c.isspace() for c in value)


def _unset(source: str) -> str:
    return f"; or unset {source}" if source.startswith("KPLAN_") else ""


def check_image(value: str, source: str) -> str:
    """``value`` unless it is no image name (empty, spaces, a control character, > 1 KiB);
    ``source`` names where it came from (``--image``, ``KPLAN_AWS_IMAGE``)."""
    if not _is_token(value):
        raise InputError(
            f"{source} {value[:80]!r} is not an image name", hint=IMAGE_HINT + _unset(source)
        )
    return value


def check_token(value: str, source: str) -> str:
    """``value`` unless it is empty, holds a space or a control character, or is over 1 KiB
    (an instance profile, a VPC, subnet or key name, an endpoint or storage URL, a project)."""
    if not _is_token(value):
        raise InputError(
            f"{source} {value[:80]!r} is not a name or URL (spaces, control characters?)",
            hint=f"set {source} to one name or URL on one line{_unset(source)}",
        )
    return value


Check = Callable[[str, str], str]

# The variables with a check of their own here (their flag's); any other is a token first. The
# GCP network, subnetwork and service account then meet their flags' checks (check_network,
# check_service_account) in GcpConfig itself, which every GcpConfig goes through.
MIRRORS: dict[str, Check] = {
    "KPLAN_AWS_IMAGE": check_image,
    "KPLAN_GCP_IMAGE": check_image,
}


def setting(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of provider setting ``name`` from ``environ`` (default: the process's), checked;
    None when it is unset or empty."""
    env = os.environ if environ is None else environ
    value = env.get(name)
    if not value:
        return None
    return MIRRORS.get(name, check_token)(value, name)


# Every KPLAN_<CLOUD>_ setting read by ``setting`` (the 0/1 switches and the GCP project and
# termination action are checked where their configs read them).
_AWS = ("ENDPOINT_URL", "INSTANCE_PROFILE", "IMAGE", "VPC", "SUBNET", "KEY_NAME", "STORAGE_URI")
_GCP = ("ENDPOINT", "NETWORK", "SUBNETWORK", "IMAGE", "SERVICE_ACCOUNT", "STORAGE_URI")
SETTINGS: dict[str, tuple[str, ...]] = {
    "aws": tuple(f"KPLAN_AWS_{n}" for n in _AWS),
    "gcp": (*(f"KPLAN_GCP_{n}" for n in _GCP), "KPLAN_GCS_ENDPOINT"),
}


def check_environment(clouds: Iterable[str], environ: Mapping[str, str] | None = None) -> None:
    """Check every setting of ``clouds`` now (``kplan launch`` does, before it plans), so a bad
    variable is refused at once rather than after the plan is made."""
    for cloud in clouds:
        for name in SETTINGS.get(cloud, ()):
            setting(name, environ)
