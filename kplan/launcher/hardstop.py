"""The hard stop: what ends a job's instances when every kplan process is gone.

Two layers, both set up by the launcher and enforced without it:

- **The cap**, fixed when an instance is created: the longest it may run before the budget (or
  the deadline) is spent, assuming the whole cluster keeps billing at its rate
  (:func:`cap_seconds`). GCP enforces it server-side (``scheduling.maxRunDuration`` with
  ``instanceTerminationAction=DELETE``); EC2 has no run limit of its own, so the node's
  bootstrap arms ``shutdown -h +N`` and the instance, launched with
  ``InstanceInitiatedShutdownBehavior=terminate``, is terminated when it powers off.
- **The lease**: the launcher's monitor writes ``<job>/lease.json`` into the job's storage at
  every check (:func:`write_lease`); a watchdog on each node (:func:`watchdog_sh`) reads it
  every :data:`POLL_S` seconds and powers the node off (a local node: ends its worker group)
  when its content has not changed for one lease period by the node's own clock (so the
  clocks of the launcher and the node need not agree). A node that never sees a lease (its
  launcher died before it booted) ends one lease period after its bootstrap started.

With both, a job whose every kplan process died costs at most its budget plus one lease's
worth of the cluster (:func:`worst_case_usd`), plus a node's boot before its watchdog runs. A
controller that outlives the launcher renews the same ``lease.json``: nothing on the node
needs to change for it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass

from kplan.launcher.guard import Running
from kplan.launcher.jobspec import JobSpec
from kplan.launcher.storage import Storage

LEASE_KEY = "lease.json"
POLL_S = 30  # how often a node reads the lease
MIN_CAP_S = 60  # a cap is never shorter (GCP takes >= 30 s; shutdown counts in minutes)
MAX_CAP_S = 120 * 86400  # GCP's longest maxRunDuration (120 days); longer caps are clipped


@dataclass(frozen=True)
class LeaseDoc:
    """``<job>/lease.json``: the node reads only whether it changed; the fields are for people
    and for a controller taking over."""

    job: str
    renewed_at: float  # the writer's clock
    expires_at: float
    lease_s: float
    writer: str = "launcher"

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "job": self.job,
                "renewed_at": self.renewed_at,
                "expires_at": self.expires_at,
                "lease_s": self.lease_s,
                "writer": self.writer,
            },
            sort_keys=True,
        ).encode()


def lease_key(job_id: str) -> str:
    return f"{job_id}/{LEASE_KEY}"


def write_lease(storage: Storage, spec: JobSpec, now: float, writer: str = "launcher") -> LeaseDoc:
    """Renew the job's lease (raises what the storage raises: the caller reports it)."""
    period = spec.timing.lease_period_s
    doc = LeaseDoc(spec.job_id, now, now + period, period, writer)
    storage.put_bytes(lease_key(spec.job_id), doc.to_json())
    return doc


def cap_seconds(
    spec: JobSpec,
    closed_usd: float,
    live: Iterable[Running],
    new_prices: Iterable[float],
    now: float,
    deadline_at: float | None,
) -> int | None:
    """The hard cap of an instance created at ``now``: seconds until the budget is spent if
    every live and new instance kept running at the larger of the plan's cluster rate and the
    live one, or until the deadline, whichever is first (None: a free job with no deadline).

    Instances created later get caps from the spend they find, so the caps end together while
    the cluster ran whole; a replacement after a gap ends later by what the missing node did not
    spend (at the cluster's rate), so the sum stays within the budget."""
    live = list(live)
    rate = max(spec.usd_per_hour, sum(r.usd_per_hour for r in live) + sum(new_prices))
    spent = closed_usd + sum(r.usd_per_hour * max(now - r.start, 0.0) / 3600 for r in live)
    caps: list[float] = []
    if rate > 0:
        caps.append((spec.budget_usd - spent) / rate * 3600)
    if deadline_at is not None:
        caps.append(deadline_at - now)
    if not caps:
        return None
    return int(min(max(math.floor(min(caps)), MIN_CAP_S), MAX_CAP_S))


def cap_minutes(cap_s: int) -> int:
    """``shutdown -h +N``'s minutes for a cap: rounded down, at least 1."""
    return max(1, cap_s // 60)


def outlives_s(spec: JobSpec) -> float:
    """The longest a node runs after the last renewal it could see: the lease period plus two
    polls (the renewal is seen at the next poll; the lapse is noticed at a poll)."""
    return spec.timing.lease_period_s + 2 * POLL_S


def worst_case_usd(spec: JobSpec) -> float:
    """What the job may cost if every kplan process dies: its budget plus one lease (and the
    watchdog's polls) of the whole cluster at its rate; a node's boot before its watchdog
    starts and the cloud's own shutdown are not counted."""
    return spec.budget_usd + outlives_s(spec) / 3600 * spec.usd_per_hour


def timer_sh(cap_s: int) -> str:
    """Bash arming the in-guest hard stop (AWS): the instance powers off ``cap_s`` seconds
    from now (``shutdown`` counts whole minutes; without it, a background sleep)."""
    minutes = cap_minutes(cap_s)
    return (
        f'echo "kplan: hard stop armed: power off in {minutes} min (budget/deadline cap)"\n'
        f'shutdown -h +{minutes} "kplan hard stop" 2>/dev/null \\\n'
        f"  || {{ ( sleep {minutes * 60}; poweroff ) & }}\n"
    )


def watchdog_sh(fetch: str, lease_s: float, stop: str, poll_s: float = POLL_S) -> str:
    """POSIX sh that starts the lease watchdog in the background (``$!`` is its pid).

    ``fetch``: a command writing the lease's current content to stdout (fails or writes
    nothing: no lease seen); ``stop``: what ends the node. Every ``poll_s`` seconds the watchdog
    compares what it reads with what it read last (``cksum``), so only a renewal by the writer
    counts, measured on the node's own clock; it leaves within a second of the script that
    started it (``$$``)."""
    period = math.ceil(lease_s)
    poll = max(1, math.ceil(poll_s))
    return (
        "( last=$(date +%s); seen=none; n=0\n"
        "  while kill -0 $$ 2>/dev/null; do\n"
        "    sleep 1; n=$((n + 1))\n"
        f'    [ "$n" -ge {poll} ] || continue\n'
        "    n=0\n"
        f"    got=$({fetch} 2>/dev/null | cksum)\n"
        '    case "$got" in "4294967295 0"|"") got=none;; esac\n'
        '    if [ "$got" != none ] && [ "$got" != "$seen" ]; then seen=$got; last=$(date +%s); fi\n'
        f"    if [ $(( $(date +%s) - last )) -ge {period} ]; then\n"
        f'      echo "kplan: lease not renewed for {period} s: the launcher is gone; stopping"\n'
        f"      {stop}\n"
        "      break\n"
        "    fi\n"
        "  done ) &\n"
    )
