"""Deadline-safe spot: the one rule the launcher, the Monte-Carlo and the replay follow.

A job with a deadline runs on spot only while its **slack** covers the worst a preemption can
do; otherwise it runs on demand, and it goes back to spot when capacity returns only if the
slack still covers the worst preemption after the switch's own restart. With on-demand
capacity at hand (the premise: the job's region has the type on demand), the job then
finishes by the deadline whatever the spot market does, so the time bound holds by
construction and the cost becomes the uncertain quantity.

Definitions (seconds; ``t = 0`` when the job asks for its nodes, as in ``spotsim``):

- **remaining wall time** of ``r`` seconds of work from the last checkpoint: ``r`` plus a
  checkpoint write after every whole interval of progress (the closed form of ``costs.py``);
- **slack** of a cluster that will be up (booted, checkpoint reloaded) at ``up_s``:
  ``deadline_s - up_s - remaining wall time``. While the cluster trains it stays constant;
  waits, restarts and lost work use it up; on demand it never grows or shrinks;
- **reserve**: what one preemption can cost, ``restart_s + checkpoint_interval_s +
  checkpoint_s`` (the replacement boots and reloads; at most one interval of progress and its
  checkpoint write are lost), plus ``margin_s``.

The rule (``spot_ok``): a cluster may (re)start or keep running on spot when its slack with
the spot nodes up is at least the reserve. Checked at the start, at every loss (the lost
nodes' replacements up a restart after the loss) and whenever spot capacity returns to an
on-demand node (the switch's restart included). When it says no at a loss, every node of the
cluster goes on demand (the survivors too: a spot survivor could still be preempted) until the
end. In a capacity outage (no spot in the region) the job waits, which costs nothing, while
its committed progress is ahead of a straight line to the whole work at the deadline less the
reserve (Can't Be Late's uniform progress) and the slack leaves the reserve and one more
restart (the way back to spot): ``on_demand_by_s``; then it runs on demand until capacity
returns. Why it holds: a preemption
while training with slack ``S >= reserve`` leaves a slack above ``S - reserve >= margin_s >= 0``
for the on-demand restart that follows, and a loss during a restart costs at most one restart
with no work at risk.

The outage wait was first the slack floor alone (wait as long as the deadline allows); on the
held-out replays of ``bench/spot_deadline.py`` uniform progress cost 0-2% less on the mean per
trace (it keeps slack for later preemptions), so it is the rule; the benchmark sets the rule
against the hindsight optimum, greedy and on-demand only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

Array = NDArray[np.float64]
EPS = 1e-9
MARGIN_S = 60.0  # beyond the reserve: the launcher's clock ticks and a late boot


@dataclass(frozen=True)
class DeadlineRule:
    """The rule's constants: the recovery times it guards against, and the deadline."""

    deadline_s: float  # from the job's start
    restart_s: float
    checkpoint_interval_s: float
    checkpoint_s: float
    margin_s: float = MARGIN_S

    def __post_init__(self) -> None:
        if not (self.deadline_s > 0 and self.checkpoint_interval_s > 0):
            raise ValueError("the deadline and the checkpoint interval must be > 0")
        if not (self.restart_s >= 0 and self.checkpoint_s >= 0 and self.margin_s >= 0):
            raise ValueError("restart, checkpoint and margin times must be >= 0")

    @property
    def reserve_s(self) -> float:
        r = reserve_s(self.restart_s, self.checkpoint_interval_s, self.checkpoint_s, self.margin_s)
        return float(r)

    def spot_ok(self, up_s: float, remaining_work_s: float) -> bool:
        return bool(
            spot_ok(
                self.deadline_s,
                up_s,
                remaining_work_s,
                self.restart_s,
                self.checkpoint_interval_s,
                self.checkpoint_s,
                self.margin_s,
            )
        )


def reserve_s(
    restart_s: ArrayLike, interval_s: ArrayLike, checkpoint_s: ArrayLike, margin_s: float = MARGIN_S
) -> Array:
    """What one preemption can cost: a restart, an interval of lost progress and its write."""
    out: Array = (
        np.asarray(restart_s, dtype=float)
        + np.asarray(interval_s, dtype=float)
        + np.asarray(checkpoint_s, dtype=float)
        + margin_s
    )
    return out


def remaining_wall_s(
    remaining_work_s: ArrayLike, interval_s: ArrayLike, checkpoint_s: ArrayLike
) -> Array:
    """Wall time of ``remaining_work_s`` of progress from a checkpoint, its writes included."""
    r = np.maximum(np.asarray(remaining_work_s, dtype=float), 0.0)
    out: Array = r + np.asarray(checkpoint_s) * np.floor(r / np.asarray(interval_s) + EPS)
    return out


def progress_in(e: Array, cycle: Array, interval: Array) -> Array:
    """Progress in ``e`` seconds of training from a checkpoint, counting every write (a
    checkpoint of ``cycle - interval`` seconds after each ``interval`` of progress), up to a
    checkpoint taken at ``e`` (no lost work)."""
    k = np.floor(e / cycle + EPS)
    out: Array = k * interval + np.minimum(e - k * cycle, interval)
    return out


def slack_s(
    deadline_s: ArrayLike,
    up_s: ArrayLike,
    remaining_work_s: ArrayLike,
    interval_s: ArrayLike,
    checkpoint_s: ArrayLike,
) -> Array:
    """Deadline less the time the cluster is up less the remaining wall time."""
    wall = remaining_wall_s(remaining_work_s, interval_s, checkpoint_s)
    out: Array = np.asarray(deadline_s, dtype=float) - np.asarray(up_s, dtype=float) - wall
    return out


def spot_ok(
    deadline_s: ArrayLike,
    up_s: ArrayLike,
    remaining_work_s: ArrayLike,
    restart_s: ArrayLike,
    interval_s: ArrayLike,
    checkpoint_s: ArrayLike,
    margin_s: float = MARGIN_S,
) -> NDArray[np.bool_]:
    """The rule: spot where the slack with the spot nodes up at ``up_s`` covers the reserve.
    Vectorised (every argument broadcasts); an infinite deadline (none) always allows spot."""
    d = np.asarray(deadline_s, dtype=float)
    with np.errstate(invalid="ignore"):
        slack = slack_s(d, up_s, remaining_work_s, interval_s, checkpoint_s)
        ok: NDArray[np.bool_] = ~np.isfinite(d) | (
            slack >= reserve_s(restart_s, interval_s, checkpoint_s, margin_s) - EPS
        )
    return ok


def on_demand_by_s(
    deadline_s: ArrayLike,
    remaining_work_s: ArrayLike,
    restart_s: ArrayLike,
    interval_s: ArrayLike,
    checkpoint_s: ArrayLike,
    margin_s: float = MARGIN_S,
    total_work_s: ArrayLike | None = None,
) -> Array:
    """In a capacity outage, the latest time to launch on demand: when the committed progress
    falls behind a straight line from none at the start to all of ``total_work_s`` at the
    deadline less the reserve (Can't Be Late's uniform progress), and at the latest when, up a
    restart later, the slack still covers the reserve and one more restart (the switch back
    to spot when capacity returns). Without ``total_work_s``, only the latter. An infinite
    deadline never needs on demand."""
    reserve = reserve_s(restart_s, interval_s, checkpoint_s, margin_s)
    d = np.asarray(deadline_s, dtype=float)
    wall = remaining_wall_s(remaining_work_s, interval_s, checkpoint_s)
    out: Array = d - wall - reserve - 2.0 * np.asarray(restart_s, dtype=float)
    if total_work_s is not None:
        total = np.maximum(np.asarray(total_work_s, dtype=float), EPS)
        done = np.clip(total - np.asarray(remaining_work_s, dtype=float), 0.0, None) / total
        with np.errstate(invalid="ignore"):  # no deadline: inf * 0
            line = np.where(np.isfinite(d), done * (d - reserve), np.inf)
        out = np.minimum(out, line)
    return out
