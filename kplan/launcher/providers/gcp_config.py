"""The GCP provider's typed configuration and the names it derives from a job.

No google.cloud import here: the CLI may build a ``GcpConfig`` (and print the names a launch
would use) without paying for the SDK's import.

Compute Engine's naming rules, which every derived name follows:

- resource names (instances, firewall rules) and network tags: RFC 1035,
  ``[a-z]([-a-z0-9]{0,61}[a-z0-9])?``;
- label keys ``[a-z][-_a-z0-9]{0,62}`` and label values ``[-_a-z0-9]{0,63}`` (lowercase only).

A job id that already follows a rule is used as it is; otherwise it is lowercased, its other
characters become ``-`` and a short hash of the original keeps two such ids apart. The mapping
is deterministic, so ``query_instances`` and ``cleanup`` find a job's resources again from its
id alone.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from kplan.core.errors import InputError
from kplan.launcher.providers.envvars import (  # the --network/--service-account checks
    NAME_RE,
    check_network,
    check_service_account,
    setting,
)

TerminationAction = Literal["STOP", "DELETE"]

LABEL_KEY_RE = re.compile(r"[a-z][-_a-z0-9]{0,62}")
LABEL_VALUE_RE = re.compile(r"[-_a-z0-9]{0,63}")
PROJECT_ENV = ("KPLAN_GCP_PROJECT", "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")

# Deep Learning VM images ship the NVIDIA driver installer (metadata install-nvidia-driver) and
# a CUDA toolkit; kplan's bootstrap installs torch itself. Override with GcpConfig.image.
DEFAULT_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11"
# What the bootstrap needs and no more: read the code and write status, logs and checkpoints in
# the job's bucket (gsutil), and write logs. Not cloud-platform, which lets anything on the VM
# use every API the service account's IAM roles allow.
STORAGE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
LOGGING_SCOPE = "https://www.googleapis.com/auth/logging.write"
NODE_SCOPES = (STORAGE_SCOPE, LOGGING_SCOPE)


@dataclass(frozen=True)
class GcpConfig:
    """Where and how the GCP provider creates a job's resources."""

    project: str
    """The Google Cloud project id that owns (and pays for) every resource."""
    network: str = "default"
    """VPC network: a name in ``project`` or a ``projects/.../global/networks/...`` path
    (``kplan launch --network``). The job's firewall rules are made in it."""
    subnetwork: str | None = None
    """Subnetwork name (in the instance's region, of ``network``) or path; None: the network's
    auto subnet (``kplan launch --subnet``)."""
    image: str = DEFAULT_IMAGE
    """Boot image or image family path, used when an ``InstanceSpec`` names none."""
    disk_size_gb: int = 200
    disk_type: str = "pd-balanced"
    service_account: str | None = "default"
    """Email of the service account the instances run as ("default": the project's Compute
    Engine default account; None: none, so the instances cannot reach Cloud Storage). Its
    access comes from IAM: no key or credential ever goes into instance metadata. Give a
    dedicated account with roles/storage.objectAdmin on the job's bucket only
    (``kplan launch --service-account``, ``KPLAN_GCP_SERVICE_ACCOUNT``)."""
    scopes: tuple[str, ...] = NODE_SCOPES
    """OAuth scopes of the instances' token: an upper bound on what IAM lets them do."""
    termination_action: TerminationAction = "STOP"
    """What GCP does to a preempted spot instance. STOP (default) keeps the stopped instance,
    labels and all, until kplan deletes it, so ``query_instances`` reports the preemption
    from any process; DELETE has GCP delete it, which only the process that saw it running can
    tell apart from a deletion (the disk is billed while stopped, for the seconds until kplan
    replaces the node)."""
    external_ip: bool = True
    """Give each instance an ephemeral public IP (package downloads need one without Cloud NAT);
    the firewall rules decide what may reach it. False (``--no-external-ip``): the subnet then
    needs Cloud NAT (for the package index) and Private Google Access (for the bucket)."""
    api_endpoint: str | None = None
    """Compute API endpoint; None: Google's. Tests point it at a local server."""
    request_timeout_s: float = 60.0
    operation_timeout_s: float = 600.0
    poll_interval_s: float = 5.0
    retries: int = 4
    """Attempts after the first for named transient errors (429, 500, 502, 503, 504)."""
    backoff_s: float = 1.0
    """First retry delay; doubles on each attempt."""
    extra_labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][-a-z0-9.:]{4,61}[a-z0-9]", self.project):
            raise InputError(
                f"GCP project id {self.project!r} is not a valid project id",
                "Use the project's id (lowercase, e.g. 'my-project-123'), not its name or number.",
            )
        if self.termination_action not in ("STOP", "DELETE"):
            raise InputError(
                f"GCP termination action {self.termination_action!r} is neither STOP nor DELETE",
                "Set termination_action to 'STOP' (default) or 'DELETE'.",
            )
        if self.service_account is not None:
            check_service_account(self.service_account)
        if self.disk_size_gb < 10:
            raise InputError(
                f"GCP boot disk size {self.disk_size_gb} GB is below the 10 GB minimum",
                "Set disk_size_gb to at least 10 (the default is 200).",
            )
        for name, seconds in (
            ("request_timeout_s", self.request_timeout_s),
            ("operation_timeout_s", self.operation_timeout_s),
            ("poll_interval_s", self.poll_interval_s),
        ):
            if not seconds > 0:
                raise InputError(f"GCP {name}={seconds!r} must be positive", f"Set {name} > 0.")
        if self.retries < 0 or self.backoff_s < 0:
            raise InputError(
                f"GCP retries={self.retries} and backoff_s={self.backoff_s} must be >= 0",
                "Set retries and backoff_s to zero or more.",
            )
        for key, value in self.extra_labels.items():
            check_label(key, value)
        check_network(self.network, self.subnetwork)

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, default_project: str | None = None
    ) -> GcpConfig:
        """A config from the environment: the project from KPLAN_GCP_PROJECT (or
        GOOGLE_CLOUD_PROJECT, CLOUDSDK_CORE_PROJECT; else ``default_project``, the one of the
        credentials), and optionally KPLAN_GCP_ENDPOINT, KPLAN_GCP_NETWORK,
        KPLAN_GCP_SUBNETWORK, KPLAN_GCP_IMAGE, KPLAN_GCP_SERVICE_ACCOUNT (an email, ``default``
        or ``none``), KPLAN_GCP_EXTERNAL_IP (``0`` for none) and KPLAN_GCP_TERMINATION_ACTION
        (STOP, DELETE)."""
        env = os.environ if environ is None else environ
        project = next((env[var] for var in PROJECT_ENV if env.get(var)), default_project)
        if project is None:
            raise InputError(
                "no GCP project given",
                f"Set {PROJECT_ENV[0]} (or GOOGLE_CLOUD_PROJECT) to your project id.",
            )
        external = env.get("KPLAN_GCP_EXTERNAL_IP", "1").strip().lower()
        if external not in ("0", "1", "true", "false", "yes", "no"):
            raise InputError(
                f"KPLAN_GCP_EXTERNAL_IP={external!r} is not 0 or 1",
                "Set KPLAN_GCP_EXTERNAL_IP=0 for instances without a public IP, or unset it.",
            )
        account = setting("KPLAN_GCP_SERVICE_ACCOUNT", env) or "default"
        action = env.get("KPLAN_GCP_TERMINATION_ACTION", "STOP").upper()
        return cls(
            project=project,
            api_endpoint=setting("KPLAN_GCP_ENDPOINT", env),
            network=setting("KPLAN_GCP_NETWORK", env) or "default",
            subnetwork=setting("KPLAN_GCP_SUBNETWORK", env),
            image=setting("KPLAN_GCP_IMAGE", env) or DEFAULT_IMAGE,
            service_account=None if account.lower() == "none" else account,
            termination_action=action,  # type: ignore[arg-type]  # checked in __post_init__
            external_ip=external in ("1", "true", "yes"),
        )

    def network_path(self) -> str:
        if "/" in self.network:
            return self.network
        return f"projects/{self.project}/global/networks/{self.network}"

    def subnetwork_path(self, region: str) -> str | None:
        if self.subnetwork is None or "/" in self.subnetwork:
            return self.subnetwork
        return f"projects/{self.project}/regions/{region}/subnetworks/{self.subnetwork}"


def check_label(key: str, value: str) -> None:
    """Raise InputError unless ``key``/``value`` are a valid Compute Engine label."""
    if not LABEL_KEY_RE.fullmatch(key) or not LABEL_VALUE_RE.fullmatch(value):
        raise InputError(
            f"GCP label {key}={value!r} breaks the label rules",
            "Label keys: a lowercase letter then up to 62 of [-_a-z0-9]; "
            "values: up to 63 of [-_a-z0-9].",
        )


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _slug(text: str, allowed: str, limit: int) -> str:
    """Lowercase ``text``, other characters to '-', cut to ``limit`` and add a hash of it."""
    body = re.sub(f"[^{allowed}]", "-", text.lower())
    return f"{body[: limit - 9]}-{_digest(text)}"


def label_value(text: str) -> str:
    """``text`` as a label value (itself when already valid)."""
    if LABEL_VALUE_RE.fullmatch(text):
        return text
    return _slug(text, "-_a-z0-9", 63)


def resource_name(text: str, *, suffix: str = "") -> str:
    """``text`` + ``suffix`` as a resource name or network tag (itself when already valid)."""
    whole = text + suffix
    if NAME_RE.fullmatch(whole):
        return whole
    name = _slug(text, "-a-z0-9", 63 - len(suffix)) + suffix
    return name if name[0].isalpha() else "k" + name[1:]


def network_tag(job_id: str) -> str:
    """The network tag on every instance of the job: the firewall rules' source and target."""
    return resource_name(f"kplan-{job_id}")


def firewall_names(job_id: str) -> tuple[str, str]:
    """The job's two firewall rules: node-to-node ports, and SSH (made only when asked)."""
    tag = network_tag(job_id)
    return resource_name(tag, suffix="-nodes"), resource_name(tag, suffix="-ssh")


def instance_name(spec_name: str) -> str:
    return resource_name(spec_name)


def check_cidr(cidr: str) -> str:
    """A valid IPv4/IPv6 network, normalised; InputError otherwise."""
    try:
        return str(ipaddress.ip_network(cidr, strict=False))
    except ValueError:
        raise InputError(
            f"SSH source {cidr!r} is not a CIDR block",
            "Give a network such as 203.0.113.7/32 (your address) or leave SSH closed.",
        ) from None
