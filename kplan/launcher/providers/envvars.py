"""The providers' settings from the environment, each checked as its flag is, in one place.

A ``KPLAN_<CLOUD>_...`` variable that mirrors a flag (``KPLAN_AWS_IMAGE`` and
``KPLAN_GCP_IMAGE`` mirror ``kplan launch --image``; ``KPLAN_GCP_NETWORK``, ``_SUBNETWORK`` and
``_SERVICE_ACCOUNT`` mirror ``--network``, ``--subnet`` and ``--service-account``) goes through
the flag's own check, defined here; every other setting is a name or URL, so it is one line of
printable characters without spaces. An unset or empty variable is no setting (None).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping

from kplan.core.errors import InputError

_MAX_LEN = 1024

# Compute Engine resource names (RFC 1035), and the network paths --network/--subnet accept.
NAME_RE = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_EMAIL_RE = re.compile(r"[^@\s]+@[^@\s]+\.[a-z]+")
_NETWORK_PATH = re.compile(r"projects/[-a-z0-9.:]+/global/networks/[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_SUBNET_PATH = re.compile(
    r"projects/[-a-z0-9.:]+/regions/[a-z0-9-]+/subnetworks/[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
)

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


# An AWS image: an AMI id, or an SSM parameter EC2 resolves at launch. A GCP image: a path
# with ``images/`` in it (projects/P/global/images/NAME, .../images/family/F, global/images/...,
# or the full URL), as Compute Engine's sourceImage takes it.
_AWS_IMAGE = re.compile(r"ami-[0-9a-fA-F]+|resolve:ssm:\S+")
_IMAGE_KIND = {
    "aws": "an AMI id (ami-...) or resolve:ssm:<parameter>",
    "gcp": "a GCP image or family path (projects/PROJECT/global/images/[family/]NAME)",
}


def check_cloud_image(cloud: str, value: str, source: str) -> str:
    """``check_image``, and an image of ``cloud``'s kind: ``--image projects/x/global/images/y``
    on AWS, ``ami-...`` or an empty ``resolve:ssm:`` were taken and sent to the cloud."""
    check_image(value, source)
    if cloud == "aws":
        ok = _AWS_IMAGE.fullmatch(value) is not None
    elif cloud == "gcp":
        ok = "images/" in value and not value.startswith(("ami-", "resolve:ssm:"))
    else:
        return value
    if not ok:
        raise InputError(
            f"{source} {value[:80]!r} is not an image of {cloud}",
            hint=f"{cloud}: {_IMAGE_KIND[cloud]}{_unset(source)}",
        )
    return value


def _aws_image(value: str, source: str) -> str:
    return check_cloud_image("aws", value, source)


def _gcp_image(value: str, source: str) -> str:
    return check_cloud_image("gcp", value, source)


def check_token(value: str, source: str) -> str:
    """``value`` unless it is empty, holds a space or a control character, or is over 1 KiB
    (an instance profile, a VPC, subnet or key name, an endpoint or storage URL, a project)."""
    if not _is_token(value):
        raise InputError(
            f"{source} {value[:80]!r} is not a name or URL (spaces, control characters?)",
            hint=f"set {source} to one name or URL on one line{_unset(source)}",
        )
    return value


def check_service_account(account: str, source: str = "GCP service account") -> None:
    """InputError unless ``account`` is an email address or ``default`` (``--service-account``,
    ``KPLAN_GCP_SERVICE_ACCOUNT``)."""
    if account != "default" and not _EMAIL_RE.fullmatch(account):
        raise InputError(
            f"{source} {account[:80]!r} is not an email address",
            "Give the account's email (NAME@PROJECT.iam.gserviceaccount.com), or 'default' "
            "for the Compute Engine default account.",
        )


def check_network(
    network: str,
    subnetwork: str | None,
    source: tuple[str, str] = ("GCP network", "GCP subnetwork"),
) -> None:
    """InputError unless ``network`` (and ``subnetwork``) are a resource name or path
    (``--network``/``--subnet``, ``KPLAN_GCP_NETWORK``/``KPLAN_GCP_SUBNETWORK``)."""
    if not (NAME_RE.fullmatch(network) or _NETWORK_PATH.fullmatch(network)):
        raise InputError(
            f"{source[0]} {network[:80]!r} is not a network name or path",
            "Give a VPC network name (e.g. --network kplan-vpc) or "
            "projects/PROJECT/global/networks/NAME.",
        )
    if subnetwork is not None and not (
        NAME_RE.fullmatch(subnetwork) or _SUBNET_PATH.fullmatch(subnetwork)
    ):
        raise InputError(
            f"{source[1]} {subnetwork[:80]!r} is not a subnetwork name or path",
            "Give a subnetwork name in the job's region (e.g. --subnet kplan-us-central1) or "
            "projects/PROJECT/regions/REGION/subnetworks/NAME.",
        )


def _network(value: str, source: str) -> str:
    check_network(value, None, (source, source))
    return value


def _subnetwork(value: str, source: str) -> str:
    check_network("default", value, (source, source))
    return value


def _service_account(value: str, source: str) -> str:
    if value.lower() != "none":  # none: the instances run without an account
        check_service_account(value, source)
    return value


Check = Callable[[str, str], str]

# The variables that mirror a flag, with the flag's own check; any other is a token.
MIRRORS: dict[str, Check] = {
    "KPLAN_AWS_IMAGE": _aws_image,
    "KPLAN_GCP_IMAGE": _gcp_image,
    "KPLAN_GCP_NETWORK": _network,
    "KPLAN_GCP_SUBNETWORK": _subnetwork,
    "KPLAN_GCP_SERVICE_ACCOUNT": _service_account,
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
