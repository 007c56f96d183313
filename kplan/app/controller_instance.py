"""``kplan launch --detach`` with the controller on an instance of its own (the default for cloud
jobs: kplan/launcher/controller_node.py says where and why).

:func:`start_on_instance` records the job, puts in the job's storage what the controller node
needs (the packed code and kplan's wheel, a first lease, and ``<job>/controller.json`` with the
job's spec), creates the controller instance through the job's provider, bills it in the ledger
from its request as its own row, and returns: the job is the controller node's from then on
(``kplan controller JOB`` in its bootstrap). :func:`wait_for_own` is that command's first step
on the node: it waits until the launcher's document lists the node's own instance, so the
controller bills itself from the row the launcher opened, never twice.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace

from kplan.core.errors import CloudError, InputError
from kplan.launcher.bootstrap import cluster_spec
from kplan.launcher.controller import ControllerDoc, read_controller, write_controller
from kplan.launcher.controller_node import ControllerSite, controller_spec, ship_code
from kplan.launcher.hardstop import cap_seconds, write_lease
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.journal import Journal, instance_doc
from kplan.launcher.ledger import Ledger, billing_for
from kplan.launcher.providers import Backend
from kplan.launcher.state import InstanceRecord, StateDB
from kplan.launcher.storage import Storage

WAIT_OWN_S = 120.0  # how long the controller node waits for the launcher's record of it


def start_on_instance(spec: JobSpec, backend: Backend, db: StateDB, site: ControllerSite) -> str:
    """Start job ``spec`` with its controller on its own instance; returns the instance's id."""
    from kplan.launcher.lifecycle import record_job

    storage, provider = backend.storage, backend.provider
    spec = replace(spec, storage_uri=storage.uri)
    record_job(spec, backend, db)
    journal = Journal.for_job(db.path.parent, spec.job_id)
    now = time.time()
    if spec.cloud != "local":
        for message, data in ship_code(spec, storage):
            db.add_event(spec.job_id, now, "code", message, data or None)
    provider.prepare(cluster_spec(spec, storage.uri))
    write_lease(storage, spec, now)  # the controller node's watchdog counts from it
    deadline = None if spec.deadline_h is None else spec.deadline_h * 3600
    cap = cap_seconds(spec, 0.0, [], [site.usd_per_hour], 0.0, deadline)
    if cap is not None:  # it outlives the nodes' caps by their teardown
        cap += int(spec.timing.grace_s + spec.timing.teardown_s)
    request = controller_spec(spec, site, storage.uri, os.environ, cap)
    journal.write("intent", now, names=[request.name])
    made = provider.run_instances(cluster_spec(spec, storage.uri), [request])
    if len(made) != 1:
        raise CloudError(
            f"the provider made {len(made)} controller instances, not 1",
            hint=f"`kplan down {spec.job_id}` ends whatever it made",
        )
    inst = made[0]
    rec = InstanceRecord(
        id=inst.id,
        job=spec.job_id,
        name=request.name,
        node_rank=request.node_rank,
        cloud=spec.cloud,
        region=spec.region,
        zone=inst.zone,
        type=request.instance_type,
        market="on-demand",
        price=site.usd_per_hour,
        state=inst.state,
        launched_at=now,
    )
    journal.write("created", now, instances=[instance_doc(rec)])
    with db.transaction():
        db.add_instance(rec)
        Ledger(db, spec.job_id, billing_for(spec.cloud)).open(rec)
        db.add_event(
            spec.job_id,
            now,
            "controller",
            f"controller instance {inst.id} ({request.instance_type}, "
            f"${site.usd_per_hour:.4f}/h): {site.reason}",
            {"instance": inst.id, "usd_per_hour": site.usd_per_hour, "max_run_s": cap},
        )
    write_controller(storage, _first_doc(spec, rec, now))
    return inst.id


def _first_doc(spec: JobSpec, rec: InstanceRecord, now: float) -> ControllerDoc:
    """``<job>/controller.json`` as the controller node finds it: the job, not yet run."""
    return ControllerDoc(
        job=spec.job_id,
        host=rec.name,
        pid=0,
        mode="detached",
        started_at=now,
        heartbeat_at=now,
        check_interval_s=spec.timing.check_interval_s,
        job_started_at=now,
        generation=0,
        spec=spec.to_dict(),
        instances=(rec,),
    )


def wait_for_own(storage: Storage, job_id: str, own: str, timeout_s: float = WAIT_OWN_S) -> None:
    """On the controller node: wait until the launcher's ``controller.json`` lists this node's
    instance (``own``), so the controller bills the row the launcher opened."""
    limit = time.monotonic() + timeout_s
    while time.monotonic() < limit:
        doc = read_controller(storage, job_id)
        if doc is not None and any(r.name == own for r in doc.instances):
            return
        time.sleep(1.0)
    raise InputError(
        f"job {job_id}: the launcher never recorded this controller instance {own} "
        f"in {timeout_s:.0f} s",
        hint=f"`kplan down {job_id}` ends the job's instances",
    )
