"""The spot interruption notice: how long before a preemption the workers stop with a checkpoint.

Both clouds warn a spot instance before they take it: AWS two minutes ahead, naming the time
(the instance metadata's ``spot/instance-action``); GCP 30 seconds ahead (``instance/preempted``
turns ``TRUE`` and the guest gets an ACPI soft-off). A node of a kplan job watches for the
notice (``kplan/launcher/spot_notice.py``) and, at ``stop_before_s`` before the named time,
sends the workers SIGTERM: they finish the step in flight, write a checkpoint and the node
uploads it (``kplan/launcher/bootstrap.py``). A preemption then loses the progress of the last
``stop_before_s`` seconds at most, instead of everything since the last periodic checkpoint.

The **lead** a node needs: one poll of the metadata, two steps (the one in flight, and one for
a slow straggler), two checkpoint times (the write, and the upload to the bucket, priced at
the planner's checkpoint bandwidth, ``costs.checkpoint_seconds``) and a margin. Where the lead
does not fit in the notice less a poll (a long step, a large checkpoint, GCP's 30 s) the notice
is not counted on: the models keep the periodic checkpoints' loss. On AWS the stop is as late as
the lead allows (the notice names the time); on GCP it is at once (the models count the
progress to the notice itself, the earliest the watch can see it).

The notice is the clouds' best effort (AWS: "in rare cases" a notice may not come), so the
deadline rule's reserve keeps its whole checkpoint interval of lost work
(``kplan/planner/deadline.py``); only the expected loss of the models uses the notice.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

NOTICE_S = {"aws": 120.0, "gcp": 30.0}  # the clouds' documented warnings
POLL_S = 5.0  # the node's watcher reads the metadata this often
MARGIN_S = 10.0  # the signal, torchrun's forwarding, a slow write


def lead_s(step_s: float, checkpoint_s: float) -> float:
    """Seconds a node needs from the notice's stop to a checkpoint in the bucket."""
    return float(_lead(np.asarray(step_s, dtype=float), checkpoint_s))


def _lead(step_s: NDArray[np.float64], checkpoint_s: float) -> NDArray[np.float64]:
    out: NDArray[np.float64] = POLL_S + 2.0 * step_s + 2.0 * checkpoint_s + MARGIN_S
    return out


def stop_before_s(cloud: str, step_s: float, checkpoint_s: float) -> float | None:
    """How long before a preemption the workers stop with a checkpoint, or None where the
    notice is too short for the lead (or the cloud gives none: the local provider)."""
    if not (step_s >= 0 and checkpoint_s >= 0):
        return None
    stop = float(notice_stops(cloud, np.array([step_s], dtype=float), checkpoint_s)[0])
    return stop if math.isfinite(stop) else None


def notice_stops(
    cloud: str, step_s: NDArray[np.float64], checkpoint_s: float
) -> NDArray[np.float64]:
    """``stop_before_s`` for every step time of ``step_s``, inf where it is None (the closed
    form's input, ``costs.time_and_cost``)."""
    notice = NOTICE_S.get(cloud)
    if notice is None:
        return np.full(np.shape(step_s), np.inf)
    lead = _lead(np.asarray(step_s, dtype=float), checkpoint_s)
    # AWS names the time: stop as late as the lead allows. GCP names none: the watch stops at
    # once, at most a poll after the notice, so the progress is counted to the notice itself.
    stop = lead if cloud == "aws" else np.full(np.shape(lead), notice)
    out: NDArray[np.float64] = np.where(lead <= notice - POLL_S, stop, np.inf)  # a poll late
    return out
