"""Run a small priced 2-node local job through the real lifecycle (for the report demo).

Used by the headless-Chromium check in docs/report.md; not part of the test suite. The job's
state goes to ``$KPLAN_HOME`` (default here: /tmp/rep/home).
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path


def main() -> None:
    home = Path(os.environ.setdefault("KPLAN_HOME", "/tmp/rep/home"))
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("KPLAN_CHECKPOINT_INTERVAL", "1")
    from kplan.launcher.jobspec import JobSpec
    from kplan.launcher.lifecycle import run_job
    from kplan.launcher.providers import ProviderSettings, get_backend
    from kplan.launcher.state import StateDB
    from kplan.launching import free_port

    script = Path(__file__).resolve().parents[1] / "examples" / "mlp_regression.py"
    spec = JobSpec.local(
        str(script), ("--epochs", "2", "--samples", "6000"), nodes=2, job_id="kp-html-demo",
        python=sys.executable, rdzv_port=free_port(), check_interval_s=0.5,
    )  # fmt: skip
    nodes = tuple(
        replace(n, usd_per_hour=price, market=market, zone=f"local-{n.node_rank}")
        for n, price, market in zip(spec.nodes, [1.8, 0.9], ["spot", "on-demand"], strict=True)
    )
    spec = replace(spec, nodes=nodes, budget_usd=5.0)
    backend = get_backend("local", ProviderSettings(home, None, None))
    with StateDB.open(home / "kplan.db") as db:
        print(run_job(spec, backend, db).status)


if __name__ == "__main__":
    main()
