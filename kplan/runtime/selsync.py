"""Selective synchronisation (SelSync, Tyagi & Sharma 2023): skip the gradient all-reduce on steps
whose update is insignificant, take a local step instead, and average the parameters
periodically. No torch here: the decision is over numbers every rank already has.

``KPLAN_SYNC_POLICY`` / ``RuntimeConfig(sync_policy=...)``: ``every`` (default) or
``selective:DELTA[:AVG_EVERY]``.

The criterion is the relative update significance of each worker's own (local, unreduced)
gradient, ``s_i = lr x |g_i| / |w|``, with ``lr`` the learning rate applied at that step and
``w`` the parameters before it (SelSync's alternative criterion, the relative gradient change,
is not used). Step ``t`` synchronises when ``max_i s_i(t-1) >= DELTA``, i.e. when any worker's
previous update was significant; the values travel in the per-step statistics all-gather that
every step has anyway (step_end.py), so the decision needs no extra collective and a
synchronised step keeps DDP's overlap of all-reduce and backward. (SelSync decides on the
current step's gradient with an extra flag all-reduce before the exchange; deciding one step
late is the price of keeping the overlap.) Step 0 always synchronises. A skipped step applies
each worker's local mean gradient; replicas then differ, so the parameters are averaged
(weighted by the step's batch shares b_i/B) after every ``AVG_EVERY``-th step (default 10) when
any step since the last average was skipped. Optimizer state (momentum) stays per worker.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, TypedDict

from kplan.core.errors import InputError

DEFAULT_AVG_EVERY = 10
_HINT = "use every or selective:DELTA[:AVG_EVERY] (DELTA > 0, e.g. selective:0.001:10)"


@dataclass(frozen=True)
class SyncPolicy:
    mode: Literal["every", "selective"] = "every"
    delta: float = 0.0
    avg_every: int = DEFAULT_AVG_EVERY

    def spec(self) -> str:
        return "every" if self.mode == "every" else f"selective:{self.delta:g}:{self.avg_every}"


def parse_sync_policy(text: str, source: str = "sync_policy") -> SyncPolicy:
    """Parse ``every`` or ``selective:DELTA[:AVG_EVERY]``."""
    parts = text.strip().lower().split(":")

    def bad(why: str) -> InputError:
        return InputError(f"{source}={text!r}: {why}", _HINT)

    if parts == ["every"]:
        return SyncPolicy()
    if parts[0] != "selective":
        raise bad(f"{parts[0]!r} is not a sync policy")
    if len(parts) not in (2, 3):
        raise bad("expected selective:DELTA[:AVG_EVERY]")
    try:
        delta = float(parts[1])
    except ValueError:
        delta = math.nan
    if not (math.isfinite(delta) and delta > 0):
        raise bad(f"DELTA {parts[1]!r} is not a number > 0")
    every = DEFAULT_AVG_EVERY
    if len(parts) == 3:
        if not parts[2].isdigit() or int(parts[2]) < 1:
            raise bad(f"AVG_EVERY {parts[2]!r} is not an integer >= 1")
        every = int(parts[2])
    return SyncPolicy("selective", delta, every)


class SelSyncState(TypedDict):
    """A :class:`SelSync`'s part of a checkpoint."""

    next_sync: bool
    synced_steps: int
    skipped_steps: int
    averages: int
    diverged: bool


class SelSync:
    """The per-step decision and its counters (identical on every rank)."""

    def __init__(self, policy: SyncPolicy) -> None:
        self.policy = policy
        self.next_sync = True
        """Whether the next step all-reduces its gradients."""
        self.synced_steps = 0
        self.skipped_steps = 0
        self.averages = 0
        self.diverged = False
        """Some step since the last parameter average was skipped (replicas differ)."""
        self.last_significance: float | None = None

    @property
    def active(self) -> bool:
        return self.policy.mode == "selective"

    def after_step(self, step: int, synced: bool, significance: list[float]) -> bool:
        """Count step ``step``, decide the next one; True when the parameters must be averaged.

        ``significance``: every worker's ``lr |g_i| / |w|`` of this step (all-gathered).
        """
        if synced:
            self.synced_steps += 1
        else:
            self.skipped_steps += 1
            self.diverged = True
        finite = [s for s in significance if math.isfinite(s)]
        top = max(finite) if finite else math.inf
        self.last_significance = top
        self.next_sync = not self.active or top >= self.policy.delta
        average = self.active and self.diverged and (step + 1) % self.policy.avg_every == 0
        if average:
            self.averages += 1
            self.diverged = False
        return average

    def state_dict(self) -> SelSyncState:
        return {
            "next_sync": self.next_sync,
            "synced_steps": self.synced_steps,
            "skipped_steps": self.skipped_steps,
            "averages": self.averages,
            "diverged": self.diverged,
        }

    def load_state_dict(self, state: SelSyncState) -> None:
        self.next_sync = bool(state["next_sync"])
        self.synced_steps = int(state["synced_steps"])
        self.skipped_steps = int(state["skipped_steps"])
        self.averages = int(state["averages"])
        self.diverged = bool(state["diverged"])
