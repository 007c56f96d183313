"""How much one pair of runs tells: the spread of ``kplan report JOB --against DENSE`` over
repeated pairs.

Each pair is two real local jobs of ``examples/mlp_regression.py`` on two workers (gloo), launched
through the launcher's lifecycle like ``kplan launch``: a dense job for ``--dense-epochs`` and a
compressed one (``--compression``) for ``--epochs`` (long enough to reach the dense job's loss), at
data seed ``i`` (the model starts from the runtime's fixed seed, so the pairs differ by their data:
how far one pair's figure carries to another job of the same kind). Every pair's multiplier comes
from launcher/statcost.py as the report computes it; the script prints each and their geometric
mean and log-space standard deviation: the uncertainty of one pair, which ``kplan estimate
--compression-steps`` assumes (``planner.compression.MEASURED_SIGMA``).

    .venv/bin/python bench/statcost_pairs.py --compression topk:0.05:ag --pairs 8   # ~2 minutes
    .venv/bin/python bench/statcost_pairs.py --compression powersgd:4 --pairs 8
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kplan.launcher.statcost import Curve

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FAST: dict[str, Any] = {
    "check_interval_s": 0.5,
    "grace_s": 2.0,
    "teardown_s": 10.0,
    "finish_grace_s": 10.0,
}


def run_pair(
    home: Path,
    seed: int,
    compression: str,
    dense_epochs: int,
    epochs: int,
    ids: tuple[str, str] = ("kp-dense", "kp-comp"),
) -> None:
    """Run the dense job ``ids[0]`` and the compressed one ``ids[1]`` in the kplan home ``home``
    (its state database and storage; ``KPLAN_HOME`` must name it), at data seed ``seed``."""
    from kplan.app.launching import free_port
    from kplan.launcher.jobspec import JobSpec
    from kplan.launcher.lifecycle import run_job
    from kplan.launcher.providers import ProviderSettings, get_backend
    from kplan.launcher.state import StateDB

    backend = get_backend("local", ProviderSettings(home, None, None))
    script = str(REPO / "kplan" / "examples" / "mlp_regression.py")
    for job_id, comp, n in ((ids[0], "none", dense_epochs), (ids[1], compression, epochs)):
        args = ("--samples", "4096", "--batch-size", "128", "--lr", "3e-3", "--epochs", str(n),
                "--seed", str(seed))  # fmt: skip
        spec = JobSpec.local(
            script, args, nodes=2, job_id=job_id, budget_usd=1.0, python=sys.executable,
            rdzv_port=free_port(), compression=comp, **FAST,
        )  # fmt: skip
        with StateDB.open(home / "kplan.db") as db:
            run_job(spec, backend, db)


def pair_curves(home: Path, ids: tuple[str, str] = ("kp-dense", "kp-comp")) -> list[Curve]:
    """The two succeeded jobs' loss curves from their own metrics files, as the report reads
    them (kplan/launcher/statcost.py)."""
    from kplan.cli.commands.report import _storage
    from kplan.launcher import statcost
    from kplan.launcher.metrics_read import read_records
    from kplan.launcher.state import StateDB

    curves = []
    with StateDB.open(home / "kplan.db") as db:
        for job_id in ids:
            rec = db.job(job_id)
            assert rec is not None and rec.status == "succeeded", rec
            storage, why = _storage(rec)
            assert storage is not None, why
            curves.append(statcost.curve(read_records(storage, job_id), job_id))
    return curves


def one_pair(seed: int, compression: str, dense_epochs: int, epochs: int) -> float | None:
    """The multiplier of one pair at data seed ``seed`` (None: the job never reached the loss)."""
    from kplan.launcher import statcost

    home = Path(tempfile.mkdtemp(prefix="kplan-pairs-"))
    os.environ["KPLAN_HOME"] = str(home)
    run_pair(home, seed, compression, dense_epochs, epochs)
    dense, comp = pair_curves(home)
    return statcost.steps_against("kp-comp", comp, "kp-dense", dense).multiplier


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compression", default="topk:0.05:ag")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--dense-epochs", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=12, help="the compressed job's epochs")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mults = []
    for seed in range(args.pairs):
        m = one_pair(seed, args.compression, args.dense_epochs, args.epochs)
        print(f"seed {seed}: x{m:.3f}" if m else f"seed {seed}: did not reach", flush=True)
        if m:
            mults.append(m)
    logs = [math.log(m) for m in mults]
    sd = statistics.stdev(logs) if len(logs) > 1 else float("nan")
    print(
        f"{args.compression}: {len(mults)} of {args.pairs} pairs reached the dense loss; "
        f"x{min(mults, default=float('nan')):.2f}-{max(mults, default=float('nan')):.2f}, "
        f"geometric mean x{math.exp(statistics.fmean(logs)) if logs else float('nan'):.3f}, "
        f"log sd {sd:.3f} (one pair's uncertainty)"
    )


if __name__ == "__main__":
    main()
