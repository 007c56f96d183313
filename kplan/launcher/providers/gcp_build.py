"""Compute Engine request bodies from kplan's specs, and kplan ``Instance``s from API resources.

Pure functions (no network). ``google.cloud.compute_v1`` is imported inside them: building the
proto-plus messages lets the client check every field name before anything is sent.

Catalog names map to machine types so: ``n1-standard-16+2xT4`` is machine type
``n1-standard-16`` with two ``nvidia-tesla-t4`` attached as ``guestAccelerators``; a2, a3, a4 and
g2 types (``a2-highgpu-1g``, ``g2-standard-8``) carry their GPUs already and attach none.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kplan.core.errors import InputError
from kplan.launcher.provider import (
    TAG_JOB,
    TAG_MANAGED,
    TAG_NODE,
    ClusterSpec,
    Instance,
    InstanceSpec,
    InstanceState,
)
from kplan.launcher.providers.gcp_config import (
    LABEL_KEY_RE,
    GcpConfig,
    check_cidr,
    firewall_names,
    instance_name,
    label_value,
    network_tag,
)

# Catalog GPU name -> Compute Engine accelerator type (attached GPUs, N1 only).
ACCELERATORS = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
}
_GPU_NAMES = {v: k for k, v in ACCELERATORS.items()}
BUNDLED_FAMILIES = ("a2-", "a3-", "a4-", "g2-", "g4-")  # machine types with their GPUs built in
_ATTACHED = re.compile(r"(?P<machine>[a-z0-9]+-[a-z0-9-]+)\+(?P<count>\d+)x(?P<gpu>[A-Za-z0-9]+)")

# Compute Engine instance status -> kplan state (preemption is decided from more than status).
STATES: dict[str, InstanceState] = {
    "PENDING": "pending",
    "PROVISIONING": "pending",
    "STAGING": "pending",
    "REPAIRING": "pending",
    "RUNNING": "running",
    "PENDING_STOP": "stopping",
    "STOPPING": "stopping",
    "SUSPENDING": "stopping",
    "DEPROVISIONING": "stopping",
    "STOPPED": "terminated",
    "SUSPENDED": "terminated",
    "TERMINATED": "terminated",
}
STOPPED_STATES = frozenset({"stopping", "terminated"})

# What a Google credential looks like in text: a service account key file (its private key, its
# JSON fields), an authorized-user file's refresh token, an OAuth 2.0 access token.
_CREDENTIALS = (
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r'"(?:private_key|private_key_id|refresh_token|client_secret)"\s*:'),
    re.compile(r"\bya29\.[0-9A-Za-z_-]{20,}"),
)


def refuse_credentials(spec: InstanceSpec) -> None:
    """InputError if the metadata or labels would carry a Google credential. Metadata is
    readable by every process on the instance and by anyone who may read the instance; the
    instance gets its access from its service account instead."""
    texts = [("startup-script", spec.user_data)]
    texts += [(f"environment variable {k}", f"{k}={v}") for k, v in spec.env.items()]
    texts += [(f"tag {k}", f"{k}={v}") for k, v in spec.tags.items()]
    for where, text in texts:
        if any(p.search(text) for p in _CREDENTIALS):
            raise InputError(
                f"refusing to send a Google credential to instance {spec.name} (in its {where})",
                "Instances reach Cloud Storage through their service account "
                "(KPLAN_GCP_SERVICE_ACCOUNT); remove keys and tokens from the job's script, "
                "environment and tags.",
            )


def split_instance_type(instance_type: str) -> tuple[str, int, str | None]:
    """``(machine type, GPU count, accelerator type)`` of a catalog instance type name."""
    match = _ATTACHED.fullmatch(instance_type)
    if match is None:
        if "+" in instance_type or not re.fullmatch(r"[a-z0-9]+-[a-z0-9-]+", instance_type):
            raise InputError(
                f"GCP instance type {instance_type!r} is not a machine type",
                "Use a machine type (a2-highgpu-1g, g2-standard-8) or an N1 type with attached "
                "GPUs written like n1-standard-16+2xT4.",
            )
        return instance_type, 0, None
    machine, count, gpu = match["machine"], int(match["count"]), match["gpu"].upper()
    if machine.startswith(BUNDLED_FAMILIES):
        raise InputError(
            f"GCP instance type {instance_type!r} attaches GPUs to {machine}, which has its own",
            f"Use {machine} alone: its GPUs come with the machine type.",
        )
    if gpu not in ACCELERATORS or count < 1:
        raise InputError(
            f"GCP instance type {instance_type!r} names GPU {gpu!r} x{count}",
            f"Attach 1 or more of: {', '.join(sorted(ACCELERATORS))}.",
        )
    return machine, count, ACCELERATORS[gpu]


def catalog_type(machine_type_url: str, accelerators: list[tuple[str, int]]) -> str:
    """The catalog name back from an instance's machine type URL and accelerators."""
    machine = machine_type_url.rsplit("/", 1)[-1]
    for accel_url, count in accelerators:
        accel = accel_url.rsplit("/", 1)[-1]
        return f"{machine}+{count}x{_GPU_NAMES.get(accel, accel)}"
    return machine


def _label_key(key: str) -> str:
    key = re.sub(r"[^-_a-z0-9]", "_", key.lower())[:63]
    return key if LABEL_KEY_RE.fullmatch(key) else ("k" + key)[:63]


def _label_text(value: str) -> str:
    """A user tag's value as a label value: lowercased, other characters to '_'."""
    return re.sub(r"[^-_a-z0-9]", "_", value.lower())[:63]


def labels_for(spec: InstanceSpec, config: GcpConfig) -> dict[str, str]:
    """Extra tags, config labels, then kplan's own (which always win)."""
    labels = {_label_key(k): _label_text(v) for k, v in spec.tags.items()}
    labels.update(config.extra_labels)
    labels.update(
        {
            TAG_JOB: label_value(spec.job_id),
            TAG_NODE: str(spec.node_rank),
            TAG_MANAGED: "true",
        }
    )
    return labels


def build_instance(spec: InstanceSpec, config: GcpConfig) -> Any:
    """The ``compute_v1.Instance`` to insert for ``spec``."""
    from google.cloud import compute_v1

    refuse_credentials(spec)
    machine, gpus, accel = split_instance_type(spec.instance_type)
    zone = spec.zone
    labels = labels_for(spec, config)
    spot = spec.market == "spot"
    gpu_machine = gpus > 0 or machine.startswith(BUNDLED_FAMILIES)
    scheduling = compute_v1.Scheduling(
        provisioning_model="SPOT" if spot else "STANDARD",
        # GPU VMs cannot live-migrate; a Spot VM must neither migrate nor restart by itself.
        on_host_maintenance="TERMINATE" if spot or gpu_machine else "MIGRATE",
        automatic_restart=not spot,
    )
    if spot:
        scheduling.instance_termination_action = config.termination_action
    if spec.max_run_s is not None:  # the hard stop (kplan/launcher/hardstop.py): deleted then
        scheduling.max_run_duration = compute_v1.Duration(seconds=spec.max_run_s)
        scheduling.instance_termination_action = "DELETE"
    metadata = [compute_v1.Items(key="startup-script", value=spec.user_data)]
    if spec.env:
        metadata.append(compute_v1.Items(key="kplan-env", value=json.dumps(dict(spec.env))))
    if gpu_machine:  # Deep Learning VM images install the driver on first boot when asked
        metadata.append(compute_v1.Items(key="install-nvidia-driver", value="True"))
    nic = compute_v1.NetworkInterface(network=config.network_path())
    subnet = config.subnetwork_path(spec.region)
    if subnet:
        nic.subnetwork = subnet
    if config.external_ip:
        nic.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
    disk = compute_v1.AttachedDisk(
        boot=True,
        auto_delete=True,
        initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=spec.image or config.image,
            disk_size_gb=config.disk_size_gb,
            disk_type=f"zones/{zone}/diskTypes/{config.disk_type}",
            labels=labels,
        ),
    )
    instance = compute_v1.Instance(
        name=instance_name(spec.name),
        machine_type=f"zones/{zone}/machineTypes/{machine}",
        labels=labels,
        tags=compute_v1.Tags(items=[network_tag(spec.job_id)]),
        metadata=compute_v1.Metadata(items=metadata),
        disks=[disk],
        network_interfaces=[nic],
        scheduling=scheduling,
    )
    if accel:
        instance.guest_accelerators = [
            compute_v1.AcceleratorConfig(
                accelerator_type=f"zones/{zone}/acceleratorTypes/{accel}",
                accelerator_count=gpus,
            )
        ]
    if config.service_account is not None:
        instance.service_accounts = [
            compute_v1.ServiceAccount(email=config.service_account, scopes=list(config.scopes))
        ]
    return instance


def build_firewalls(cluster: ClusterSpec, config: GcpConfig) -> list[Any]:
    """The job's firewall rules: its port range between its own instances (by network tag),
    and SSH from ``cluster.ssh_cidr`` only when one is given. Never a 0.0.0.0/0 default: an
    ingress rule without a source would get one from the API."""
    from google.cloud import compute_v1

    low, high = cluster.ports
    if not 1 <= low <= high <= 65535:
        raise InputError(
            f"port range {low}-{high} is not within 1-65535", "Give ports as (low, high)."
        )
    tag = network_tag(cluster.job_id)
    nodes_name, ssh_name = firewall_names(cluster.job_id)
    about = f"kplan job {cluster.job_id} ({TAG_MANAGED})"
    rules = [
        compute_v1.Firewall(
            name=nodes_name,
            description=f"{about}: rendezvous and collectives between the job's nodes",
            network=config.network_path(),
            direction="INGRESS",
            priority=1000,
            allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=[f"{low}-{high}"])],
            source_tags=[tag],
            target_tags=[tag],
        )
    ]
    if cluster.ssh_cidr is not None:
        rules.append(
            compute_v1.Firewall(
                name=ssh_name,
                description=f"{about}: SSH from {cluster.ssh_cidr}",
                network=config.network_path(),
                direction="INGRESS",
                priority=1000,
                allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=["22"])],
                source_ranges=[check_cidr(cluster.ssh_cidr)],
                target_tags=[tag],
            )
        )
    return rules


def _epoch(stamp: str) -> float | None:
    try:
        return datetime.fromisoformat(stamp).timestamp() if stamp else None
    except ValueError:
        return None


def to_instance(
    resource: Any,
    job_id: str,
    *,
    preempted: str | None = None,
) -> Instance:
    """A kplan ``Instance`` from a ``compute_v1.Instance``; ``preempted`` is the reason when
    the caller found evidence of a preemption (then the state is ``preempted``)."""
    zone = resource.zone.rsplit("/", 1)[-1]
    labels: Mapping[str, str] = resource.labels
    state: InstanceState = STATES.get(resource.status, "pending")
    reason = resource.status_message or None
    if preempted is not None and state in STOPPED_STATES:
        state, reason = "preempted", preempted
    nic = resource.network_interfaces[0] if resource.network_interfaces else None
    public = nic.access_configs[0].nat_i_p if nic and nic.access_configs else ""
    sched = resource.scheduling
    spot = sched.provisioning_model == "SPOT" or bool(sched.preemptible)
    try:
        rank = int(labels.get(TAG_NODE, "-1"))
    except ValueError:
        rank = -1
    return Instance(
        id=f"{zone}/{resource.name}",
        job_id=job_id,
        name=resource.name,
        cloud="gcp",
        region=zone.rsplit("-", 1)[0],
        zone=zone,
        instance_type=catalog_type(
            resource.machine_type,
            [(a.accelerator_type, a.accelerator_count) for a in resource.guest_accelerators],
        ),
        market="spot" if spot else "on-demand",
        state=state,
        node_rank=rank,
        private_ip=(nic.network_i_p or None) if nic else None,
        public_ip=public or None,
        launched_at=_epoch(resource.last_start_timestamp or resource.creation_timestamp),
        reason=reason,
    )
