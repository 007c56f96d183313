"""What torchrun starts in each worker during a profile: the user's script, then the
all-reduce microbenchmark and (rank 0) the compression codec benchmark
(``python -m kplan.profiler.worker SCRIPT [ARGS...]``). A single worker runs through it too, for
the operator-graph tracer it registers with the runtime before the script starts.

The script runs as ``__main__`` with its own argv and its folder first on ``sys.path``, as if
started directly; an exception in it ends the worker with the usual traceback and exit 1.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

from kplan.profiler import codec
from kplan.profiler.allreduce import bench_after_job
from kplan.profiler.opgraph_trace import install_job_tracer
from kplan.runtime.env import METRICS_PATH


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m kplan.profiler.worker SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    script = Path(argv[0]).resolve()
    sys.argv = [str(script), *argv[1:]]
    sys.path.insert(0, str(script.parent))
    install_job_tracer()
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise
    metrics = os.environ.get(METRICS_PATH)
    if metrics and "WORLD_SIZE" in os.environ:  # started by torchrun (one worker runs alone)
        bench_after_job(Path(metrics))
        codec.bench_after_job(Path(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
