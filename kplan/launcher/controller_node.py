"""The controller node: a job's controller on an instance of its own, away from the user's machine.

``kplan launch --detach`` runs the job's controller (the loop of kplan/launcher/lifecycle.py)
where :func:`choose_site` says:

- ``instance`` (the default for cloud jobs): a small on-demand instance of the job
  (``data/controllers.csv``: t3.small on AWS, e2-small on GCP, priced with its source). The
  cluster's head is no home for it: on spot it may be preempted, and a preempted head would take
  the controller, the one process that replaces it, with it.
- ``here``: a daemon on this machine (kplan/app/controlling.py); the default for local jobs.

The controller node is created through the job's own provider like any node (``run_instances``;
node rank :data:`CONTROLLER_RANK`, tagged with the job, named ``<job>-ctl-r<k>``). Its bootstrap
(:func:`controller_user_data`) arms the same hard stop as the nodes (AWS: a shutdown timer of its
cap; the lease watchdog), installs the kplan wheel the nodes install, and runs ``kplan
controller JOB`` against the job's storage: the controller imports the job from
``<job>/controller.json`` (written by the launcher before it asks for the node) and runs it.
On the local provider the controller node is a local process started as local nodes are, with
this machine's ``KPLAN_HOME``.

The controller instance is one of the job's instances in the ledger: billed from its request to
its end as its own row, counted by the guard (``_live``), never observed as a node, never
terminated by its own controller's teardown: once the job's nodes are gone and its final status
written, the controller closes its own row and ends its own instance
(:func:`end_own_instance`), and ``kplan down JOB`` ends it like any instance of the job.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from kplan.catalogs.controllers import ControllerOffer, controller_offer, controller_offers
from kplan.core.errors import InputError
from kplan.launcher.bootstrap import (
    CLOUD_ROOT,
    _cloud_tools,
    cloud_hard_stop,
    install_kplan,
    local_root,
)
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.provider import CONTROLLER_RANK, TAG_JOB, TAG_MANAGED, TAG_NODE, InstanceSpec
from kplan.launcher.storage import Storage
from kplan.launcher.wheel import sdk_requirements

SITES = ("instance", "here")
LOCAL_OFFER = ControllerOffer("local", "local", "local", 0, 0.0, 0.0, "local: free")
# Non-secret provider settings the controller node needs as the launcher has them (names,
# never credentials; the node reaches the cloud with its own role or service account).
FORWARDED = (
    "KPLAN_AWS_IMAGE",
    "KPLAN_AWS_INSTANCE_PROFILE",
    "KPLAN_AWS_KEY_NAME",
    "KPLAN_AWS_PLACEMENT_GROUPS",
    "KPLAN_AWS_SUBNET",
    "KPLAN_AWS_VPC",
    "KPLAN_GCP_EXTERNAL_IP",
    "KPLAN_GCP_IMAGE",
    "KPLAN_GCP_NETWORK",
    "KPLAN_GCP_PROJECT",
    "KPLAN_GCP_SERVICE_ACCOUNT",
    "KPLAN_GCP_SUBNETWORK",
    "KPLAN_GCP_TERMINATION_ACTION",
)
OWN_ENV = "KPLAN_CONTROLLER_NAME"  # on the controller node: the name of its own instance
LOG_NAME = "controller.log"  # in <job>/logs/ of the job's storage (`kplan logs` shows it)
_MAIN = "from kplan.cli.main import main; main()"


@dataclass(frozen=True)
class ControllerSite:
    """Where a detached job's controller runs, why, and what it costs (``here``: nothing)."""

    where: str  # "instance" or "here"
    reason: str
    offer: ControllerOffer | None  # the instance type and its price (None: here)

    @property
    def usd_per_hour(self) -> float:
        return 0.0 if self.offer is None else self.offer.usd_per_hour

    def summary(self) -> str:
        """One line for the dry run and the launch."""
        if self.offer is None:
            return f"controller: on this machine ({self.reason})"
        o = self.offer
        if o.cloud == "local":
            return f"controller: a local process started as the local nodes are ({self.reason})"
        return (
            f"controller: its own {o.instance_type} on-demand instance, ${o.usd_per_hour:.4f}/h "
            f"(catalog price: {o.source}) ({self.reason})"
        )


def choose_site(spec: JobSpec, asked: str | None) -> ControllerSite:
    """The rule: ``asked`` (``--controller``) when given; else a cloud job's controller gets
    its own instance (on this machine where the catalog has no controller type for the region)
    and a local job's stays on this machine."""
    if asked is not None and asked not in SITES:
        raise InputError(f"--controller {asked!r} is not one of: {', '.join(SITES)}", hint="fix it")
    where = asked or ("here" if spec.cloud == "local" else "instance")
    if where == "here":
        why = "--controller here" if asked else "local jobs keep their controller here"
        return ControllerSite("here", why, None)
    if spec.cloud == "local":
        return ControllerSite("instance", "--controller instance", LOCAL_OFFER)
    known = {(o.cloud, o.region) for o in controller_offers()}
    if asked is None and (spec.cloud, spec.region) not in known:  # the default, without a type
        why = f"the catalog has no controller type for {spec.cloud} {spec.region}"
        return ControllerSite("here", why, None)
    spot = any(n.market == "spot" for n in spec.nodes)
    why = (
        "--controller instance"
        if asked
        else "the head is spot: a preemption would take a controller on it along"
        if spot
        else "the head may be replaced or re-planned away: the controller outlives it"
    )
    return ControllerSite("instance", why, controller_offer(spec.cloud, spec.region))


def controller_name(job_id: str, launch: int = 0) -> str:
    """``<job>-ctl-r<k>``: the k-th controller instance of the job."""
    return f"{job_id}-ctl-r{launch}"


def is_controller(node_rank: int) -> bool:
    return node_rank == CONTROLLER_RANK


def forwarded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The :data:`FORWARDED` settings ``environ`` has (set and not empty)."""
    return {k: environ[k] for k in FORWARDED if environ.get(k)}


def controller_argv(spec: JobSpec, python: str) -> list[str]:
    """``kplan controller JOB`` as the controller node runs it."""
    return [
        python,
        "-c",
        _MAIN,
        "controller",
        spec.job_id,
        "--cloud",
        spec.cloud,
        "--region",
        spec.region,
        "--storage",
        spec.storage_uri or "",
        "--mode",
        "detached",  # its events as plain lines go to the controller's log
    ]


def local_controller_data(spec: JobSpec, name: str, storage_uri: str) -> str:
    """The local provider's command line: ``kplan controller JOB`` in the foreground of the
    local instance (its output to ``<job>/logs/controller.log``)."""
    q = shlex.quote
    log = local_root(storage_uri) / spec.job_id / "logs" / "controller.log"
    argv = " ".join(q(a) for a in controller_argv(spec, spec.install.python))
    return (
        f"# kplan local controller: job {spec.job_id} ({name})\n"
        f"mkdir -p {q(str(log.parent))} || exit 1\n"
        f"exec {argv} >> {q(str(log))} 2>&1 < /dev/null\n"
    )


def controller_user_data(
    spec: JobSpec,
    name: str,
    storage_uri: str,
    environ: Mapping[str, str],
    max_run_s: int | None,
    node_root: str = CLOUD_ROOT,
) -> str:
    """The controller node's cloud-init / startup-script (bash), with no credentials in it:
    the hard stop, kplan from the job's wheel and the cloud's SDK (the launcher's version, from
    the node's index), then ``kplan controller JOB``; its log goes to
    ``<job>/logs/controller.log`` in the bucket every minute and at the end; then it powers off
    (AWS: terminated on power-off)."""
    q = shlex.quote
    cp, _, _ = _cloud_tools(storage_uri)
    store = f"{storage_uri.rstrip('/')}/{spec.job_id}"
    env = {**forwarded_env(environ), "KPLAN_HOME": f"{node_root}/home", OWN_ENV: name}
    exports = "".join(f"export {k}={q(v)}\n" for k, v in sorted(env.items()))
    argv = " ".join(q(a) for a in controller_argv(spec, "@PY@")).replace("@PY@", '"$PY"')
    sdk = " ".join(q(r) for r in sdk_requirements(spec.cloud))  # the provider's SDK
    return f"""#!/bin/bash
# kplan controller bootstrap: job {spec.job_id} ({name}). Generated; holds no credentials:
# the cloud and the bucket are reached with the instance's own role / service account.
set -uo pipefail
umask 077
{exports}W={q(node_root)}
STORE={q(store)}
mkdir -p "$W/home" "$W/logs"
PY=python3
LOG="$W/logs/{LOG_NAME}"
exec >>"$LOG" 2>&1
{cloud_hard_stop(spec, storage_uri, max_run_s)}push() {{ {cp} "$LOG" "$STORE/logs/{LOG_NAME}"; }}
fail() {{ push; poweroff; exit "$1"; }}
{install_kplan(_without_torch(spec), cp)}"$PY" -m pip install --quiet {sdk} || fail 97
( while sleep 60; do push; done ) &
syncer=$!
{argv} < /dev/null
code=$?
kill "$syncer" 2>/dev/null
echo "kplan controller exited with code $code"
push
poweroff
"""


def _without_torch(spec: JobSpec) -> JobSpec:
    """The controller runs no training: kplan's wheel without torch (a t3.small has 2 GB)."""
    reqs = tuple(r for r in spec.install.requirements if not r.lower().startswith("torch"))
    return replace(spec, install=replace(spec.install, requirements=reqs))


def controller_spec(
    spec: JobSpec,
    site: ControllerSite,
    storage_uri: str,
    environ: Mapping[str, str],
    max_run_s: int | None,
    launch: int = 0,
) -> InstanceSpec:
    """The request for the controller instance (on-demand, in the head's zone)."""
    if site.offer is None:
        raise InputError("the controller runs on this machine: no instance", hint="a bug")
    name = controller_name(spec.job_id, launch)
    local = spec.cloud == "local"
    data = (
        local_controller_data(spec, name, storage_uri)
        if local
        else controller_user_data(spec, name, storage_uri, environ, max_run_s)
    )
    return InstanceSpec(
        job_id=spec.job_id,
        name=name,
        cloud=spec.cloud,
        region=spec.region,
        zone=spec.nodes[0].zone,
        instance_type=site.offer.instance_type,
        market="on-demand",
        node_rank=CONTROLLER_RANK,
        user_data=data,
        image=spec.install.image,
        env={"KPLAN_HOME": str(local_root(storage_uri).parent), OWN_ENV: name} if local else {},
        tags={TAG_JOB: spec.job_id, TAG_NODE: str(CONTROLLER_RANK), TAG_MANAGED: "true"},
        max_run_s=None if local else max_run_s,
    )


def ship_code(spec: JobSpec, storage: Storage) -> list[tuple[str, dict[str, object]]]:
    """Upload the job's packed code and kplan's wheel (what the nodes, and a controller node,
    fetch); the events to record, as (message, data)."""
    from kplan.launcher.bootstrap import CODE_KEY, job_key, ship_wheel
    from kplan.launcher.packing import pack_code

    code = pack_code(Path(spec.script))
    storage.put_bytes(job_key(spec.job_id, CODE_KEY), code.data)
    said: list[tuple[str, dict[str, object]]] = [
        (
            f"uploaded the code: {len(code.files):,} file(s), {code.total_bytes:,} bytes "
            f"({code.archive_bytes:,} packed); left out {len(code.skipped_secrets)} "
            "secret-looking path(s)",
            {"files": len(code.files), "skipped_secrets": list(code.skipped_secrets)},
        )
    ]
    shipped = ship_wheel(spec, storage)  # the kplan the nodes install
    if shipped is not None:
        said.append((shipped, {}))
    return said


def code_in_storage(script: str, keys: list[str], code_key: str) -> bool:
    """Whether the controller runs away from the job's code: the script is not on this machine
    and the launcher already put the packed code (``code_key``) in the job's storage."""
    return not Path(script).is_file() and code_key in keys
