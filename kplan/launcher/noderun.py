"""torchrun as kplan's nodes run it: ``python -m kplan.launcher.noderun TORCHRUN_ARGS...``.

It is ``torch.distributed.run`` (same flags, same elastic agent) with two differences:

- **The node's exit status is the training script's.** torchrun exits 1 whatever its worker
  returned; here a worker that exits 3 makes the node exit 3 (the first failure torchrun saw,
  its root cause). A worker killed by signal N makes the node exit 1 after the line
  ``kplan: worker rank R was killed by signal N`` (the launcher reserves codes >= 128 for a
  node that got a signal itself); torchrun killed by signal N (a spot notice, ``kplan down``)
  exits 128 + N.
- **The restart policy** (``--max-restarts`` is still the most restarts): a worker group that
  fails before the job's first step (no step record in the job's metrics, ``KPLAN_METRICS_PATH``)
  is restarted :data:`EARLY_RESTARTS` time(s) (a peer lost while the group started), not more: a
  script that cannot import or start fails the same way every time. A group that fails
  :data:`SAME_LIMIT` times in a row with the same exit codes and no step in between is not
  restarted again. A node joining or leaving is not a failure and counts for neither.

Imports torch only inside :func:`main` (the launcher itself never imports this module's torch).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from kplan.core.records import STEP_TIME_KEY

EARLY_RESTARTS = 1
SAME_LIMIT = 3
_STEP = f'"{STEP_TIME_KEY}"'.encode()  # a key only step records have (kplan/core/records.py)
_CHUNK = 1 << 20


class RestartPolicy:
    """Whether torchrun may restart a failed worker group (see the module's docstring)."""

    def __init__(
        self,
        metrics: Path | None,
        early_restarts: int = EARLY_RESTARTS,
        same_limit: int = SAME_LIMIT,
    ) -> None:
        self.metrics = metrics
        self.early_restarts = early_restarts
        self.same_limit = same_limit
        self.offsets: dict[Path, int] = {}
        self.stepped = metrics is None  # without metrics: as if the job had made steps
        self.early = 0  # failures before the job's first step
        self.last: tuple[int, ...] | None = None
        self.same = 0  # failures in a row with ``last``'s exit codes and no step between

    def retry(self, codes: tuple[int, ...]) -> bool:
        """A worker group failed with exit ``codes``: True if it may be restarted."""
        new_steps = self._new_steps()
        if new_steps:
            self.stepped = True
            self.same = 0
        if not self.stepped:
            self.early += 1
            return self.early <= self.early_restarts
        self.same = self.same + 1 if codes == self.last and not new_steps else 1
        self.last = codes
        return self.same < self.same_limit

    def _files(self) -> list[Path]:
        if self.metrics is None:
            return []
        if self.metrics.suffix == ".jsonl":
            return [self.metrics]
        try:
            return sorted(self.metrics.glob("rank-*.jsonl"))
        except OSError:
            return []

    def _new_steps(self) -> bool:
        """Whether a step record was written since the last call (since the start: any)."""
        found = False
        for path in self._files():
            start = self.offsets.get(path, 0)
            try:
                with path.open("rb") as f:
                    f.seek(start)
                    tail = b""
                    while not found:
                        chunk = f.read(_CHUNK)
                        if not chunk:
                            break
                        found = _STEP in tail + chunk
                        tail = chunk[-len(_STEP) :]
                    self.offsets[path] = f.seek(0, os.SEEK_END)
            except OSError:
                continue
        return found


def exit_code(exitcode: int, rank: int) -> int:
    """The node's exit status for a worker's ``exitcode`` (negative: killed by that signal)."""
    if exitcode > 0:
        return min(exitcode, 255)
    if exitcode < 0:
        print(f"kplan: worker rank {rank} was killed by signal {-exitcode}", file=sys.stderr)
    return 1


def _install(policy: RestartPolicy) -> None:
    """Make torchrun's agents ask ``policy`` before restarting a failed worker group."""
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.launcher import api

    base: Any = getattr(api, "LocalElasticAgent")  # noqa: B009 (torch does not export it)

    class Agent(base):  # type: ignore[misc]
        _remaining_restarts: int

        def _monitor_workers(self, worker_group: Any) -> Any:
            result = super()._monitor_workers(worker_group)
            failed = result.state in {WorkerState.FAILED, WorkerState.UNHEALTHY}
            if failed and self._remaining_restarts > 0:
                codes = tuple(sorted(f.exitcode for f in result.failures.values()))
                if not policy.retry(codes):
                    print(
                        "kplan: not restarting the workers: "
                        + (
                            "they failed before the job's first step"
                            if not policy.stepped
                            else f"they failed {policy.same} times in a row the same way"
                        ),
                        file=sys.stderr,
                    )
                    self._remaining_restarts = 0
            return result

    setattr(api, "LocalElasticAgent", Agent)  # noqa: B010 (launch_agent creates it by name)


def main(argv: list[str]) -> int:
    import torch.distributed.run

    torchrun: Any = torch.distributed.run
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from kplan.runtime.env import metrics_path

    _install(RestartPolicy(metrics_path()))
    try:
        torchrun.run(torchrun.parse_args(argv))
    except ChildFailedError as err:
        rank, failure = err.get_first_failure()
        return exit_code(int(failure.exitcode), rank)
    except SignalException as err:
        return 128 + int(err.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
