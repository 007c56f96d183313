"""A job started on a poor configuration (too small a batch), with and without adaptation.

Runs ``kplan launch --cloud local`` twice, one after the other in one run, on the same example
and the same statistical target: ``KPLAN_EPOCHS_BY=progress`` makes both jobs train until the
same number of base-batch-equivalent steps (AdaScale progress), so a larger batch is credited
only with the progress its measured gradient noise scale allows. ``static`` keeps the batch it
was given; ``adapt`` runs with ``--explore --adapt`` (trials of batch sizes chosen by Bayesian
optimisation through the control file, then re-planning). Both pay the same start-up.

Printed: wall seconds from launch to exit, the batch each ended on, the final training loss
(mean of the last 20 steps' loss), and the ratio static / adapt.

    python -m bench.adapt_local [--batch 16] [--epochs 3] [--samples 20000] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "kplan" / "examples" / "mlp_regression.py"
KPLAN = Path(sys.executable).with_name("kplan")


def run(mode: str, args: argparse.Namespace, home: Path, tag: str) -> dict[str, Any]:
    job = f"kp-bench-{mode}-{tag}"
    argv = [str(KPLAN), "launch", "--cloud", "local", str(SCRIPT), "--budget", "0"]
    argv += ["--nodes", "1", "--check-interval", "1", "--job-id", job, "--json"]
    if mode == "adapt":
        argv += ["--explore", "--adapt", "--replan-interval", "5"]
    argv += ["--", "--batch-size", str(args.batch), "--epochs", str(args.epochs)]
    argv += ["--samples", str(args.samples)]
    env = {
        **os.environ,
        "KPLAN_HOME": str(home),
        "KPLAN_EPOCHS_BY": "progress",
        "OMP_NUM_THREADS": str(args.threads),
    }
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    records = []
    for line in (home / "jobs" / job / "metrics" / "rank-0.jsonl").read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    steps = [r for r in records if "event" not in r and "step" in r]
    losses = [r["loss"] for r in steps[-20:] if r.get("loss") is not None]
    from kplan.launcher.state import StateDB

    with StateDB.open(home / "kplan.db") as db:
        changes = [
            f"{e.kind}: {e.message}"
            for e in db.events(job)
            if e.kind in ("explore", "batch", "replan", "resize", "model")
        ]
    return {
        "changes": changes,
        "mode": mode,
        "wall_s": wall,
        "steps": len(steps),
        "final_batch": steps[-1]["global_batch"],
        "progress": steps[-1].get("progress"),
        "loss": statistics.fmean(losses) if losses else float("nan"),
        "gns": steps[-1].get("gns"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16, help="the too-small global batch")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of the worker")
    p.add_argument("--repeat", type=int, default=1, help="pairs of runs (static, adapt)")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="kplan-bench-") as tmp:
        for i in range(args.repeat):
            for mode in ("static", "adapt"):
                home = Path(tmp) / f"{mode}-{i}"
                rows.append(run(mode, args, home, str(i)))
                r = rows[-1]
                print(
                    f"{mode:<7} wall {r['wall_s']:7.1f} s  steps {r['steps']:6d}  batch "
                    f"{args.batch} -> {r['final_batch']:5d}  progress {r['progress']:.0f}  "
                    f"loss {r['loss']:.4f}  gns {r['gns']}",
                    flush=True,
                )
                for line in r["changes"]:
                    print(f"    {line}", flush=True)
    for i in range(args.repeat):
        static, adapt = rows[2 * i], rows[2 * i + 1]
        print(f"pair {i}: static / adapt wall = {static['wall_s'] / adapt['wall_s']:.2f}x")


if __name__ == "__main__":
    main()
