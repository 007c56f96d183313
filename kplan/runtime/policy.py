"""Online adaptation inside the job: the policy API, the launcher's control file, built-ins.

A policy is a :class:`Policy` with four hooks, ``before_epoch``, ``after_epoch``,
``before_step`` and ``after_step``; each gets a :class:`Monitor` (what the job measured, the
same values on every rank) and an :class:`Actions` (what the policy may ask for).

Consistency: every rank runs every policy on the same Monitor, but only rank 0's requests
count. ``set_global_batch`` and ``stop`` ride in rank 0's slots of the per-step statistics
vector (step_end.py) and every rank applies them at the end of the same step: a request made
in ``after_step`` of step s travels with step s+1 and takes effect from the first step the data
loader has not fetched yet. ``resize`` and ``replace_node`` are requests to the launcher,
written by rank 0 as ``policy`` events at once. Calls on other ranks only validate.

The launcher talks back through the control file (``KPLAN_CONTROL_PATH``): rank 0 re-reads it
at most once per second when its mtime or size changed; its spend, budget, price and deadline
reach every rank in the statistics vector, and its ``global_batch``/``stop`` commands (applied
once per ``seq``) are requests of the pseudo-policy ``launcher``.

The built-in behaviours are policies too (builtin_policies.py): ``GoodputBatch`` (`goodput`)
and ``StragglerReplace`` (`straggler`); policy_registry.py turns ``KPLAN_POLICIES`` items into
instances. This module imports no torch.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kplan.core.errors import InputError
from kplan.runtime import env

# --- what a policy sees ------------------------------------------------------------------------


@dataclass(frozen=True)
class Monitor:
    """The job's state after a step, identical on every rank (read-only).

    Timings lag one step: ``local_batches`` and ``compute_times`` are those of step
    ``timed_step`` (they travel with the next step's statistics). ``step_time``, ``throughput``
    and ``sync_time`` are means over the last ``window`` timed steps at the global batch now in
    force (reset when it changes; None until one exists). Money and time come from the
    launcher's control file (None without one).
    """

    step: int
    """Optimizer steps completed (the index of the next step)."""
    epoch: int
    progress: float
    """Base-batch-equivalent steps done (AdaScale gain summed; = steps at B = B0)."""
    progress_target: float | None
    """Progress at which ``job.epochs(E)`` ends (``KPLAN_EPOCHS_BY=progress``), else None."""
    global_batch: int
    base_batch: int
    accum_steps: int
    world_size: int
    local_world_size: int
    dataset_size: int
    max_local_batches: tuple[int | None, ...]
    """Per-rank bound of one micro-step's batch (``KPLAN_MAX_LOCAL_BATCH``), None: none."""
    pid: bool
    """True when the PID controller balances the split (else it is equal)."""
    timed_step: int | None
    local_batches: tuple[int, ...]
    """Samples per rank in step ``timed_step`` (all micro-steps)."""
    compute_times: tuple[float, ...] | None
    """Seconds per rank from the start of step ``timed_step`` to the end of its backward."""
    step_time: float | None
    throughput: float | None
    """Samples per second over the same window as ``step_time``."""
    sync_time: float | None
    """Mean of step time minus the slowest rank's compute time (communication, optimizer)."""
    gns: float | None
    grad_sqr: float | None
    grad_var: float | None
    loss: float | None
    lr: float | None
    elapsed_s: float
    """Rank 0's seconds since the job (this process) started."""
    spend_usd: float | None
    """The job's spend so far, extrapolated to now at ``usd_per_hour``."""
    budget_usd: float | None
    usd_per_hour: float | None
    deadline_s_left: float | None

    @property
    def nodes(self) -> int:
        return max(self.world_size // max(self.local_world_size, 1), 1)

    def batch_bounds(self) -> tuple[int, int]:
        """The smallest and largest global batch this world can run (multiples of accum)."""
        return batch_bounds(
            self.world_size, self.accum_steps, self.max_local_batches, self.dataset_size
        )


def batch_bounds(
    world_size: int, accum_steps: int, caps: Sequence[int | None], dataset_size: int
) -> tuple[int, int]:
    """[lo, hi]: one sample per worker and micro-step, up to the memory bounds and the data."""
    per_micro = math.inf if any(c is None for c in caps) else float(sum(c or 0 for c in caps))
    hi = min(per_micro * accum_steps, float(dataset_size))
    hi_int = int(hi) // accum_steps * accum_steps
    return world_size * accum_steps, max(hi_int, world_size * accum_steps)


# --- what a policy can do ----------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A pending ``set_global_batch`` (``batch``) or ``stop`` (``batch`` 0) on rank 0."""

    batch: int
    policy: str
    reason: str


_REPEAT_S = 60.0
"""An identical launcher request (resize, replace) from one policy is written once a minute."""


class Requests:
    """Rank 0's pending requests and the writer of launcher requests (one per job)."""

    def __init__(self, rank0: bool, write_event: Callable[..., None]) -> None:
        self.rank0 = rank0
        self.write_event = write_event
        self.monitor: Monitor | None = None
        self.batch: Request | None = None
        self.stop: Request | None = None
        self._written: dict[tuple[Any, ...], float] = {}

    def launcher_request(self, key: tuple[Any, ...], **fields: Any) -> None:
        now = time.monotonic()
        if now - self._written.get(key, -math.inf) < _REPEAT_S:
            return
        self._written[key] = now
        self.write_event(**fields)


class Actions:
    """What one policy may ask for; only rank 0's calls take effect (see the module docstring)."""

    def __init__(self, requests: Requests, policy: str) -> None:
        self._requests = requests
        self.policy = policy

    def set_global_batch(self, batch: int, reason: str = "") -> None:
        """Run global batch ``batch`` (LR scaled by KPLAN_LR_SCALING) from the next steps."""
        m = self._requests.monitor
        if isinstance(batch, bool) or not isinstance(batch, int):
            raise InputError(
                f"{self.policy}: set_global_batch({batch!r}) needs an integer",
                "pass an int, e.g. int(batch)",
            )
        if m is not None:
            lo, hi = m.batch_bounds()
            if not lo <= batch <= hi or batch % m.accum_steps:
                raise InputError(
                    f"{self.policy}: global batch {batch} is not a multiple of "
                    f"{m.accum_steps} in [{lo}, {hi}]",
                    "stay within Monitor.batch_bounds() (memory bounds and dataset size)",
                )
        if self._requests.rank0:
            self._requests.batch = Request(batch, self.policy, reason)

    def stop(self, reason: str = "") -> None:
        """Checkpoint and end the training loop normally (``done`` with ``stopped``)."""
        if self._requests.rank0 and self._requests.stop is None:
            self._requests.stop = Request(0, self.policy, reason or "stopped by a policy")

    def resize(
        self,
        nodes: int | None = None,
        workers_per_node: int | None = None,
        instance_type: str | None = None,
        reason: str = "",
    ) -> None:
        """Ask the launcher for another cluster (it decides, restarts from a checkpoint)."""
        for name, value in (("nodes", nodes), ("workers_per_node", workers_per_node)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise InputError(
                    f"{self.policy}: resize({name}={value!r}) needs >= 1",
                    "a count of 1 or more, or None to keep it",
                )
        if nodes is None and workers_per_node is None and instance_type is None:
            raise InputError(f"{self.policy}: resize() without a change", "name what to change")
        if self._requests.rank0:
            m = self._requests.monitor
            self._requests.launcher_request(
                ("resize", self.policy, nodes, workers_per_node, instance_type),
                action="resize",
                policy=self.policy,
                reason=reason,
                step=None if m is None else m.step,
                nodes=nodes,
                workers_per_node=workers_per_node,
                instance_type=instance_type,
            )

    def replace_node(self, node_rank: int, reason: str = "") -> None:
        """Ask the launcher to replace node ``node_rank`` (e.g. a straggler)."""
        m = self._requests.monitor
        if isinstance(node_rank, bool) or not isinstance(node_rank, int) or node_rank < 0:
            raise InputError(
                f"{self.policy}: replace_node({node_rank!r}) needs an int >= 0",
                "a node rank from 0 to Monitor.nodes - 1",
            )
        if m is not None and node_rank >= m.nodes:
            raise InputError(
                f"{self.policy}: node {node_rank} of {m.nodes} does not exist",
                "a node rank from 0 to Monitor.nodes - 1",
            )
        if self._requests.rank0:
            self._requests.launcher_request(
                ("replace", self.policy, node_rank),
                action="replace",
                policy=self.policy,
                reason=reason,
                step=None if m is None else m.step,
                node_rank=node_rank,
            )


class Policy:
    """Base class of adaptation policies: override any of the four hooks (defaults do nothing).

    Hooks run on every rank with identical arguments; keep a policy deterministic (no clocks,
    no randomness without a fixed seed) so that every rank's copy holds the same state.
    """

    def before_epoch(self, m: Monitor, act: Actions) -> None:
        """Before the first step of each epoch ``m.epoch``."""

    def after_epoch(self, m: Monitor, act: Actions) -> None:
        """After epoch ``m.epoch`` ended (also a partial last epoch)."""

    def before_step(self, m: Monitor, act: Actions) -> None:
        """Before step ``m.step`` (its data not fetched yet); ``m`` is the last step's view."""

    def after_step(self, m: Monitor, act: Actions) -> None:
        """After each optimizer step (``m.step`` steps are done)."""


# --- the runner: policies, window, control file (one per job) ----------------------------------


class ControlWatcher:
    """Rank 0's view of the control file: re-read when it changed, at most once per interval."""

    def __init__(self, path: Path, interval: float = 1.0) -> None:
        self.path = path
        self.interval = interval
        self.control: env.Control | None = None
        self._signature: tuple[int, int] | None = None
        self._checked = -math.inf

    def poll(self, now: float) -> env.Control | None:
        """The last good control (a partial or invalid file keeps the previous one)."""
        if now - self._checked < self.interval:
            return self.control
        self._checked = now
        try:
            st = os.stat(self.path)
        except OSError:
            return self.control
        signature = (st.st_mtime_ns, st.st_size)
        if signature == self._signature:
            return self.control
        try:
            self.control = env.parse_control(self.path.read_text())
            self._signature = signature
        except (OSError, UnicodeDecodeError, InputError):
            self._signature = None  # read again at the next poll
        return self.control


class PolicyRunner:
    """Runs the policies' hooks and carries rank 0's requests and launcher values (see top)."""

    def __init__(
        self,
        policies: Sequence[Policy],
        *,
        rank0: bool,
        write_event: Callable[..., None],
        control_path: Path | None = None,
        window: int = 20,
    ) -> None:
        self.policies = list(policies)
        self.requests = Requests(rank0, write_event)
        self.actions = [Actions(self.requests, type(p).__name__) for p in self.policies]
        self.launcher = Actions(self.requests, "launcher")
        self.watcher = None if control_path is None or not rank0 else ControlWatcher(control_path)
        self.control_seq = -1
        """The last control ``seq`` whose commands were taken (checkpointed)."""
        self.monitor: Monitor | None = None
        self._window: deque[tuple[float, float, float]] = deque(maxlen=window)
        self._window_batch = 0
        self._timed = 0

    def timing(self, batches: Sequence[float], times: Sequence[float], wall: float) -> None:
        """One timed step: per-rank samples and compute times, rank 0's wall step time."""
        total = sum(batches)
        self._timed += 1
        if self._timed == 1 or wall <= 0.0 or total <= 0:  # the first step holds the set-up
            return
        if total != self._window_batch:
            self._window.clear()
            self._window_batch = int(total)
        self._window.append((total, wall, wall - max(times)))

    def window_stats(self, global_batch: int) -> tuple[float | None, float | None, float | None]:
        """(step time, samples/s, sync time) over the window, if it is at ``global_batch``."""
        if not self._window or self._window_batch != global_batch:
            return None, None, None
        n = len(self._window)
        walls = sum(w for _, w, _ in self._window)
        samples = sum(b for b, _, _ in self._window)
        sync = sum(max(s, 0.0) for _, _, s in self._window) / n
        return walls / n, samples / walls, sync

    def poll_control(self, now: float) -> env.Control | None:
        """Rank 0: read the control file; new ``seq`` commands become launcher requests."""
        if self.watcher is None:
            return None
        control = self.watcher.poll(now)
        if control is not None and control.seq > self.control_seq:
            self.control_seq = control.seq
            if control.global_batch is not None:
                reason = f"control file seq {control.seq}"
                self.requests.batch = Request(control.global_batch, "launcher", reason)
            if control.stop is not None:
                self.launcher.stop(control.stop)
        return control

    def money(self, now: float) -> list[float]:
        """[spend now, budget, price, deadline seconds left]; NaN where unknown."""
        nan = math.nan
        control = None if self.watcher is None else self.watcher.control
        if control is None:
            return [nan, nan, nan, nan]
        hours = max(now - control.time, 0.0) / 3600.0
        return [
            control.spend_usd + control.usd_per_hour * hours,
            nan if control.budget_usd is None else control.budget_usd,
            control.usd_per_hour,
            nan if control.deadline_time is None else control.deadline_time - now,
        ]

    def call(self, hook: str, monitor: Monitor) -> None:
        """Run ``hook`` of every policy with ``monitor``."""
        self.monitor = monitor
        self.requests.monitor = monitor
        for policy, act in zip(self.policies, self.actions, strict=True):
            getattr(policy, hook)(monitor, act)


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
