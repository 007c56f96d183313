"""Profile mode: which local batch to run at each step (the contract is in kplan/runtime/API.md).

Phases: one ``sweep`` phase per listed local batch (``warmup_steps + steps_per_batch`` steps),
then one ``gns`` phase (``gns_steps`` steps at ``gns_batch``, or at the largest size that fitted
if that is smaller). An out-of-memory error in the sweep ends the sweep: the failed size and all
larger ones are skipped. This class is pure bookkeeping; the job runs the steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from kplan.runtime.env import ProfileSchedule

OOM_MESSAGES = ("out of memory", "outofmemory", "cuda error: out of memory")


def is_oom(exc: BaseException) -> bool:
    """True for CUDA OOM, ``MemoryError`` and RuntimeErrors that mention running out of memory."""
    if isinstance(exc, MemoryError):
        return True
    if isinstance(exc, RuntimeError):  # torch.cuda.OutOfMemoryError is a RuntimeError
        text = str(exc).lower()
        return type(exc).__name__ == "OutOfMemoryError" or any(m in text for m in OOM_MESSAGES)
    return False


@dataclass(frozen=True)
class Phase:
    name: str
    """``sweep`` or ``gns``."""
    local_batch: int
    steps: int
    warmup: int


class ProfileRun:
    """The phase sequence and progress through it."""

    def __init__(self, schedule: ProfileSchedule) -> None:
        self.schedule = schedule
        steps = schedule.warmup_steps + schedule.steps_per_batch
        self.phases: list[Phase] = [
            Phase("sweep", b, steps, schedule.warmup_steps) for b in schedule.local_batches
        ]
        self.index = 0
        self.steps_in_phase = 0
        self.largest_fit: int | None = None
        self.oom_batch: int | None = None
        self._gns_added = False
        self._add_gns_if_sweep_done()

    @property
    def done(self) -> bool:
        return self.index >= len(self.phases)

    @property
    def phase(self) -> Phase:
        return self.phases[self.index]

    @property
    def warmup(self) -> bool:
        """Whether the current step is a warm-up step of its phase."""
        return self.steps_in_phase < self.phase.warmup

    def _add_gns_if_sweep_done(self) -> None:
        if self._gns_added or self.index < len(self.phases):
            return
        self._gns_added = True
        if self.schedule.gns_steps == 0 or self.largest_fit is None:
            return
        batch = min(self.schedule.gns_batch, self.largest_fit)
        self.phases.append(Phase("gns", batch, self.schedule.gns_steps, 0))

    def trace_now(self) -> bool:
        """Whether the step about to run is the one whose operator graph is traced: the first of
        the GNS phase (the base local batch); with no GNS phase (``gns_steps`` 0), the first of
        the sweep phase at the largest size not above ``gns_batch`` (a warm-up step when there
        are any, so that the tracer's overhead is in no timed step)."""
        if self.done or self.steps_in_phase != 0:
            return False
        phase = self.phase
        if self.schedule.gns_steps > 0:
            return phase.name == "gns"
        sizes = self.schedule.local_batches
        below = [b for b in sizes if b <= self.schedule.gns_batch]
        return phase.name == "sweep" and phase.local_batch == max(below or sizes[:1])

    def step_done(self) -> bool:
        """Count one finished step; True when it ended a phase (the batch may change)."""
        self.steps_in_phase += 1
        if self.steps_in_phase < self.phase.steps:
            return False
        if self.phase.name == "sweep":
            self.largest_fit = self.phase.local_batch
        self.index += 1
        self.steps_in_phase = 0
        self._add_gns_if_sweep_done()
        return True

    def out_of_memory(self) -> None:
        """The current sweep size failed: skip it and every larger size."""
        self.oom_batch = self.phase.local_batch
        self.phases = self.phases[: self.index]
        self.steps_in_phase = 0
        self._add_gns_if_sweep_done()
