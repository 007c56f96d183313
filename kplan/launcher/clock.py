"""The launcher's clock: real time for users, simulated time for tests.

Everything in the launcher that reads the time or waits goes through a :class:`Clock`, so a test
can run hours of a simulated job in milliseconds. Providers that simulate instances (the fake
providers in the tests, the local provider's chaos schedule) may take the same clock.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Epoch seconds."""

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (non-positive: return at once)."""


class SystemClock:
    """Wall-clock time."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class FakeClock:
    """Simulated time: ``sleep`` advances ``now`` at once."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.t = float(start)

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.t += seconds

    def advance(self, seconds: float) -> None:
        self.sleep(seconds)
