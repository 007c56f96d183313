"""Compute time of one step: from its start to the end of this worker's backward pass, and (in
a profile's sweep) how much of it the backward passes took: the rest, forward and the input,
overlaps no gradient exchange (kplan/planner/compression.py's bucket pipeline).

On CPU the clock is ``time.perf_counter``. On CUDA two events on the current stream bracket the
step's work, so the time is what the GPU spent (including waiting for the input when the GPU ran
dry), not when the CPU happened to launch it; reading it waits for the end event.
"""

from __future__ import annotations

import time

import torch  # noqa: TID253 (torch is the runtime's core dependency)


class StepClock:
    """One step's start and compute-end marks."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._t0 = 0.0
        self._t1: float | None = None
        self._ev0: torch.cuda.Event | None = None
        self._ev1: torch.cuda.Event | None = None
        self._backward_s = 0.0  # CPU: the backward passes' seconds so far this step
        self._backward_t0: float | None = None
        self._backward_ev: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._backward_open: torch.cuda.Event | None = None

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._t1 = None
        self._ev1 = None
        self._backward_s = 0.0
        self._backward_t0 = None
        self._backward_ev = []
        self._backward_open = None
        if self.cuda:
            self._ev0 = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._ev0.record()

    def mark_compute_end(self) -> None:
        """Called at the end of local gradient computation (repeatable: the last one counts)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            self._ev1 = event
        else:
            self._t1 = time.perf_counter()

    def backward_begin(self) -> None:
        """Called before a micro-step's backward pass (the sweep's: no exchange inside it)."""
        if self.cuda:
            self._backward_open = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            self._backward_open.record()
        else:
            self._backward_t0 = time.perf_counter()

    def backward_end(self) -> None:
        """Called after it: the pair is added to the step's backward time."""
        if self.cuda:
            if self._backward_open is not None:
                event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                event.record()
                self._backward_ev.append((self._backward_open, event))
                self._backward_open = None
        elif self._backward_t0 is not None:
            self._backward_s += time.perf_counter() - self._backward_t0
            self._backward_t0 = None

    def backward_time(self) -> float | None:
        """Seconds of this step's bracketed backward passes (None: none bracketed; waits on
        CUDA)."""
        if self.cuda:
            if not self._backward_ev:
                return None
            self._backward_ev[-1][1].synchronize()
            return sum(float(a.elapsed_time(b)) for a, b in self._backward_ev) / 1000.0
        return self._backward_s if self._backward_s > 0 else None

    @property
    def marked(self) -> bool:
        return (self._ev1 if self.cuda else self._t1) is not None

    def compute_time(self) -> float:
        """Seconds from :meth:`start` to the last :meth:`mark_compute_end` (waits on CUDA)."""
        if self.cuda:
            if self._ev0 is None or self._ev1 is None:
                return float("nan")
            self._ev1.synchronize()
            return float(self._ev0.elapsed_time(self._ev1)) / 1000.0
        if self._t1 is None:
            return float("nan")
        return self._t1 - self._t0
