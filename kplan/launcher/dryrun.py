"""``kplan launch --dry-run``: every request the launch would send, and none sent.

Builds the same ``ClusterSpec`` and ``InstanceSpec`` objects as :func:`run_job` (the head with
its own rendezvous, the other nodes pointing at ``<head private ip>``) and the storage writes,
without calling a single provider verb or storage write. On a cloud, ``code`` says what the
code upload would hold (:class:`~kplan.launcher.packing.PackedCode`: every file with its size,
the secret-looking files and the links left out).

It also says what stops the job if every kplan process dies (kplan/launcher/hardstop.py): the
lease period, each instance's cap (``max_run_s`` in every ``run_instances`` request) and the
worst-case spend they allow.

The answer is a :class:`DryRun` record: the terminal view reads its requests and fields, and
``--json`` prints its :meth:`DryRun.to_dict`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from kplan.launcher.bootstrap import (
    CODE_KEY,
    WheelUpload,
    cluster_spec,
    instance_name,
    instance_spec,
    job_key,
    notice_stop_s,
    rendezvous,
    watches_notice,
    wheel_upload,
)
from kplan.launcher.controller_node import ControllerSite, controller_spec
from kplan.launcher.guard import Decision, Guard
from kplan.launcher.hardstop import cap_seconds, outlives_s, worst_case_usd
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.ledger import BillingRule
from kplan.launcher.packing import PackedCode, pack_code
from kplan.launcher.provider import ClusterSpec, InstanceSpec

HEAD_PLACEHOLDER = "<head-private-ip>"


def _instance_doc(spec: InstanceSpec) -> dict[str, object]:
    doc: dict[str, object] = asdict(spec)
    doc["env"] = dict(spec.env)
    doc["tags"] = dict(spec.tags)
    return doc


@dataclass(frozen=True)
class CodePut:
    """The job's code archive written to storage (``packed`` says what it holds)."""

    key: str
    packed: PackedCode

    def to_dict(self) -> dict[str, object]:
        return {"call": "storage.put_bytes", "key": self.key, "bytes": self.packed.archive_bytes}


@dataclass(frozen=True)
class WheelPut:
    """kplan's wheel written to storage for the nodes to install."""

    upload: WheelUpload

    def to_dict(self) -> dict[str, object]:
        return dict(self.upload)


@dataclass(frozen=True)
class Prepare:
    """The provider's job-wide preparation (security group, placement, storage)."""

    cluster: ClusterSpec

    def to_dict(self) -> dict[str, object]:
        return {"call": "provider.prepare", "cluster": asdict(self.cluster)}


@dataclass(frozen=True)
class RunInstances:
    """One batch of instances started (the head first, then the nodes that point at it)."""

    instances: tuple[InstanceSpec, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "call": "provider.run_instances",
            "instances": [_instance_doc(s) for s in self.instances],
        }


Request = CodePut | WheelPut | Prepare | RunInstances


@dataclass(frozen=True)
class ControllerCost:
    """Where a detached job's controller runs and what it adds to the job's cost: its price
    (the catalog's, with the source) times the plan's hours (None: the plan has none)."""

    where: str  # "instance" or "here"
    reason: str
    instance_type: str | None
    usd_per_hour: float
    price_source: str | None
    predicted_hours: float | None
    predicted_usd: float | None


def controller_cost(spec: JobSpec, site: ControllerSite) -> ControllerCost:
    hours = spec.predicted.hours
    offer = site.offer
    return ControllerCost(
        where=site.where,
        reason=site.reason,
        instance_type=None if offer is None else offer.instance_type,
        usd_per_hour=site.usd_per_hour,
        price_source=None if offer is None else offer.source,
        predicted_hours=hours,
        predicted_usd=None if hours is None else hours * site.usd_per_hour,
    )


@dataclass(frozen=True)
class MovePrice:
    """One region the job may move to (``--move-region``) and what a move there costs: the
    checkpoint's egress and copy time, and how long every node must have paid on demand (or
    stalled) in a dry spell before the move pays (``spotmove.break_even_s``; None: never, spot
    there is no cheaper than on demand here)."""

    region: str
    egress_usd: float
    copy_s: float
    break_even_s: float | None


def move_prices(spec: JobSpec) -> tuple[MovePrice, ...]:
    """The move rule's price of each region the job may move to from where it starts."""
    from kplan.planner.spotmove import MoveTerms, break_even_s, copy_cost

    moves = spec.moves
    here = moves.region(spec.region)
    if here is None:
        return ()
    types = [n.instance_type for n in spec.nodes]
    od_here = here.mean_usd_per_hour(types, "on-demand")
    cost = copy_cost(
        MoveTerms(spec.cloud, moves.checkpoint_gb, moves.copy_gbps), here.egress_usd_gb
    )
    out = []
    for there in moves.others(spec.region):
        spot_there = there.mean_usd_per_hour(types, "spot")
        t = (
            None
            if od_here is None or spot_there is None
            else break_even_s(cost, len(types), od_here, spot_there)
        )
        out.append(
            MovePrice(
                there.region,
                cost.egress_usd,
                cost.copy_s,
                None if t is None or t == float("inf") else t,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class DryRun:
    """What ``kplan launch --dry-run`` found: the requests, in order, and the guard's answer."""

    job: str
    cloud: str
    region: str
    requests: tuple[Request, ...]
    code: PackedCode | None  # what the upload holds (None: local, nothing uploaded)
    usd_per_hour: float
    budget_usd: float
    budget_hours: float | None  # None: the cluster is free
    first_check_usd: float
    startable: bool
    guard: str
    price_notes: tuple[str, ...]  # the plan's prices against the catalog's
    # The hard stop (kplan/launcher/hardstop.py): the lease period, each first instance's cap
    # and what the job may cost if every kplan process dies (budget + one lease of the cluster)
    lease_s: float = 0.0
    max_run_s: int | None = None
    worst_case_usd: float = 0.0
    outlives_s: float = 0.0  # how long a node runs on after the last renewal it saw, at most
    controller: ControllerCost | None = None  # a detached job's controller (None: foreground)
    moves: tuple[MovePrice, ...] = ()  # the regions it may move to (--move-region)
    # the spot nodes' notice watch (kplan/launcher/spot_notice.py): the workers stop with a
    # checkpoint this long before a preemption; None: no spot node on a cloud
    notice_stop_s: float | None = None

    def to_dict(self) -> dict[str, object]:
        """The ``--json`` document (the code lists every file, and the secrets left out)."""
        return {
            "job": self.job,
            "cloud": self.cloud,
            "region": self.region,
            "requests": [r.to_dict() for r in self.requests],
            "code": None if self.code is None else self.code.to_dict(),
            "usd_per_hour": self.usd_per_hour,
            "budget_usd": self.budget_usd,
            "budget_hours": self.budget_hours,
            "first_check_usd": self.first_check_usd,
            "startable": self.startable,
            "guard": self.guard,
            "price_notes": list(self.price_notes),
            "hard_stop": {
                "lease_s": self.lease_s,
                "max_run_s": self.max_run_s,
                "worst_case_usd": self.worst_case_usd,
                "outlives_s": self.outlives_s,
            },
            "controller": None if self.controller is None else asdict(self.controller),
            "moves": [asdict(m) for m in self.moves],
            "notice_stop_s": self.notice_stop_s,
        }


def first_check(spec: JobSpec, billing: BillingRule, extra: Sequence[float] = ()) -> Decision:
    """What the guard says before anything starts: can the budget pay for the whole cluster
    (and ``extra``: a controller instance's price) until the first check plus teardown, its
    boot disks, and the data's egress, and does the deadline leave that long (``run_job`` asks
    the same before it uploads; a --deadline of 1e-300 h was a job created and stopped, exit 1,
    and a dry run that said it could start)."""
    deadline = None if spec.deadline_h is None else spec.deadline_h * 3600  # from now = 0
    guard = Guard(spec.budget_usd, deadline, spec.horizon_s, billing, spec.costs.disk_usd_node_h)
    return guard.check(
        spec.costs.egress_usd, [], 0.0, [*(n.usd_per_hour for n in spec.nodes), *extra]
    )


def dry_run(
    spec: JobSpec, storage_uri: str, billing: BillingRule, site: ControllerSite | None = None
) -> DryRun:
    """The requests, in order, and what the guard would allow (nothing is sent). ``site``: a
    detached job's controller; on an instance, its request comes before the nodes' and its
    price is in the guard's first check and in ``controller``."""
    requests: list[Request] = []
    code: PackedCode | None = None
    if spec.cloud != "local":  # local runs the script in place: nothing is uploaded
        code = pack_code(Path(spec.script))
        requests.append(CodePut(job_key(spec.job_id, CODE_KEY), code))
        wheel = wheel_upload(spec)  # the kplan the nodes install
        if wheel is not None:
            requests.append(WheelPut(wheel))
    requests.append(Prepare(cluster_spec(spec, storage_uri)))
    head = spec.nodes[0]
    deadline = None if spec.deadline_h is None else spec.deadline_h * 3600
    on_instance = site is not None and site.where == "instance"
    extra = [site.usd_per_hour] if site is not None and on_instance else []
    if site is not None and on_instance:
        ctl_cap = cap_seconds(spec, 0.0, [], extra, 0.0, deadline)
        if ctl_cap is not None:
            ctl_cap += int(spec.timing.grace_s + spec.timing.teardown_s)
        ctl = controller_spec(spec, site, storage_uri, {}, ctl_cap)  # no forwarded settings
        requests.append(RunInstances((ctl,)))
    cap = cap_seconds(spec, 0.0, [], [n.usd_per_hour for n in spec.nodes], 0.0, deadline)
    head_spec = instance_spec(
        spec, head, instance_name(spec.job_id, 0, 0), rendezvous(spec, 0, None), storage_uri, cap
    )
    requests.append(RunInstances((head_spec,)))
    rest = tuple(
        instance_spec(
            spec,
            node,
            instance_name(spec.job_id, node.node_rank, 0),
            rendezvous(spec, 0, HEAD_PLACEHOLDER),
            storage_uri,
            cap,
        )
        for node in spec.nodes[1:]
    )
    if rest:
        requests.append(RunInstances(rest))
    first = first_check(spec, billing, extra)
    per_hour = spec.usd_per_hour
    return DryRun(
        job=spec.job_id,
        cloud=spec.cloud,
        region=spec.region,
        requests=tuple(requests),
        code=code,
        usd_per_hour=per_hour,
        budget_usd=spec.budget_usd,
        budget_hours=None if per_hour == 0 else spec.budget_usd / per_hour,
        first_check_usd=first.projected_usd,
        startable=not first.stop,
        guard=first.message,
        price_notes=tuple(spec.predicted.price_notes),
        lease_s=spec.timing.lease_period_s,
        max_run_s=head_spec.max_run_s,
        worst_case_usd=worst_case_usd(spec),
        outlives_s=outlives_s(spec),
        controller=None if site is None else controller_cost(spec, site),
        moves=move_prices(spec),
        notice_stop_s=notice_stop_s(spec)
        if any(watches_notice(spec, n) for n in spec.nodes)
        else None,
    )
