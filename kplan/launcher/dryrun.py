"""``kplan launch --dry-run``: every request the launch would send, and none sent.

Builds the same ``ClusterSpec`` and ``InstanceSpec`` objects as :func:`run_job` (the head with
its own rendezvous, the other nodes pointing at ``<head private ip>``) and the storage writes,
without calling a single provider verb or storage write. On a cloud, ``code`` says what the
code upload would hold (:class:`~kplan.launcher.packing.PackedCode`: every file with its size,
the secret-looking files and the links left out).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kplan.launcher.bootstrap import (
    CODE_KEY,
    cluster_spec,
    instance_name,
    instance_spec,
    job_key,
    rendezvous,
    wheel_upload,
)
from kplan.launcher.guard import Decision, Guard
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.ledger import BillingRule
from kplan.launcher.packing import pack_code
from kplan.launcher.provider import InstanceSpec

HEAD_PLACEHOLDER = "<head-private-ip>"


def _instance_doc(spec: InstanceSpec) -> dict[str, object]:
    doc: dict[str, object] = asdict(spec)
    doc["env"] = dict(spec.env)
    doc["tags"] = dict(spec.tags)
    return doc


def first_check(spec: JobSpec, billing: BillingRule) -> Decision:
    """What the guard says before anything starts: can the budget pay for the whole cluster
    until the first check plus teardown (``run_job`` asks the same before it uploads)."""
    guard = Guard(spec.budget_usd, None, spec.horizon_s, billing)
    return guard.check(0.0, [], 0.0, [n.usd_per_hour for n in spec.nodes])


def dry_run(spec: JobSpec, storage_uri: str, billing: BillingRule) -> dict[str, Any]:
    """The requests, in order, and what the guard would allow (nothing is sent)."""
    requests: list[Mapping[str, object]] = []
    code: dict[str, object] | None = None
    if spec.cloud != "local":  # local runs the script in place: nothing is uploaded
        packed = pack_code(Path(spec.script))
        code = packed.to_dict()
        requests.append(
            {
                "call": "storage.put_bytes",
                "key": job_key(spec.job_id, CODE_KEY),
                "bytes": packed.archive_bytes,
            }
        )
        wheel = wheel_upload(spec)  # the kplan the nodes install
        if wheel is not None:
            requests.append(wheel)
    cluster = cluster_spec(spec, storage_uri)
    requests.append({"call": "provider.prepare", "cluster": asdict(cluster)})
    head = spec.nodes[0]
    head_spec = instance_spec(
        spec, head, instance_name(spec.job_id, 0, 0), rendezvous(spec, 0, None), storage_uri
    )
    requests.append({"call": "provider.run_instances", "instances": [_instance_doc(head_spec)]})
    rest = [
        instance_spec(
            spec,
            node,
            instance_name(spec.job_id, node.node_rank, 0),
            rendezvous(spec, 0, HEAD_PLACEHOLDER),
            storage_uri,
        )
        for node in spec.nodes[1:]
    ]
    if rest:
        requests.append(
            {"call": "provider.run_instances", "instances": [_instance_doc(s) for s in rest]}
        )
    first = first_check(spec, billing)
    per_hour = spec.usd_per_hour
    return {
        "job": spec.job_id,
        "cloud": spec.cloud,
        "region": spec.region,
        "requests": requests,
        "code": code,  # what the upload holds: every file, and the secrets left out
        "usd_per_hour": per_hour,
        "budget_usd": spec.budget_usd,
        "budget_hours": None if per_hour == 0 else spec.budget_usd / per_hour,
        "first_check_usd": first.projected_usd,
        "startable": not first.stop,
        "guard": first.message,
        "price_notes": list(spec.predicted.price_notes),  # the plan's prices against the catalog's
    }
